// CUDA (gated) delta rule with n_h Householder sub-steps: the contract of delta_rule.h (device
// pointers, fp32 state and accumulators, same layouts and token strides, eigenvalue range as a
// parameter), launched on cuda::stream(). Backward accumulates into dq, dk, dv, dbeta_logit, dg.
// The chunk-start states (ckpt) use the CPU layout [B*H][ceil(T/C)][Dk*Dv], C = kDeltaChunk.
#pragma once
#include "ops/delta_rule/delta_rule.h"
namespace lrnn::ops::cuda {
void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                        const float* g, const DeltaRuleDims& d, float* ckpt = nullptr);
void delta_rule_backward(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                         const float* q, const float* k, const float* v, const float* beta_logit, const float* g,
                         const DeltaRuleDims& d, const float* ckpt = nullptr);
}  // namespace lrnn::ops::cuda
