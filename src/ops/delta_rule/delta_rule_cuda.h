// CUDA (gated) delta rule with n_h Householder sub-steps: the contract of delta_rule.h (device
// pointers, fp32 state and accumulators, same layouts and token strides, eigenvalue range as a
// parameter), launched on cuda::stream(). Backward accumulates into dq, dk, dv, dbeta_logit, dg
// (accumulate = true) or overwrites them (false).
// The chunk-start states (ckpt) use the CPU layout [B*H][ceil(T/C)][Dk*Dv], C = kDeltaChunk.
#pragma once
#include "ops/delta_rule/delta_rule.h"
namespace lrnn::ops::cuda {
void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                        const float* g, const DeltaRuleDims& d, float* ckpt = nullptr,
                        float* state = nullptr);  // state: CPU-only for now (must be null)
void delta_rule_backward(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                         const float* q, const float* k, const float* v, const float* beta_logit, const float* g,
                         const DeltaRuleDims& d, const float* ckpt = nullptr, bool accumulate = true);

// Which kernels run. Auto: the lane kernels (one warp per (b,h), a state column per lane) where
// they apply (Dk <= 32 and Dv <= 32), the tiled kernels elsewhere. Tiled: always the tiled
// kernels (lets the tests check both on the same shapes). Process-wide; not for concurrent use.
enum class DeltaKernel { Auto, Tiled };
void set_delta_rule_kernel(DeltaKernel k);
}  // namespace lrnn::ops::cuda
