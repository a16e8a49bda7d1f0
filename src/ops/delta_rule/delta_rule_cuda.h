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
                        float* state = nullptr);
void delta_rule_backward(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                         const float* q, const float* k, const float* v, const float* beta_logit, const float* g,
                         const DeltaRuleDims& d, const float* ckpt = nullptr, bool accumulate = true);

// Variable-length sequences packed in one row: the contract of delta_rule.h's _varlen functions
// (cu_seqlens on the host, d.B = 1, each sequence from a zero state or its own carried one). Each
// sequence runs through the two functions above on offset pointers, one after the other, on the
// kernels its own length picks; its checkpoints lie back to back in `ckpt`
// (delta_rule_varlen_ckpt_size(d, gated, ...) elements: the layouts of those kernels). So a row
// of many short documents costs a launch of each kernel per document.
size_t delta_rule_varlen_ckpt_size(const DeltaRuleDims& d, bool gated, const int64_t* cu_seqlens, int N);
void delta_rule_forward_varlen(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                               const float* g, const DeltaRuleDims& d, const int64_t* cu_seqlens, int N,
                               float* ckpt = nullptr, float* state = nullptr);
void delta_rule_backward_varlen(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                                const float* q, const float* k, const float* v, const float* beta_logit,
                                const float* g, const DeltaRuleDims& d, const int64_t* cu_seqlens, int N,
                                const float* ckpt = nullptr, bool accumulate = true);

// Which kernels run. Auto: the chunked form on tensor cores where it pays
// (delta_rule_chunked_cuda_pays: T >= 128 at head dims >= 128, T >= 512 at head dims 64-127),
// else the lane kernels (one warp per (b,h), a state column per lane) where they apply (Dk <= 32
// and Dv <= 32), else the tiled kernels (head key dims up to 256). Tiled / Chunked: always those (the tests check every
// path on the same shapes).
// Process-wide; not for concurrent use.
enum class DeltaKernel { Auto, Tiled, Chunked };
void set_delta_rule_kernel(DeltaKernel k);

// The chunked (WY) form on tensor cores (delta_rule_chunked_cuda.cu): the same contract, for
// head dims that are multiples of 16 whose per-chunk tiles fit shared memory (up to 128) and
// n_h <= 64. Its checkpoints use their own layout in the same buffer (delta_rule.h), so forward
// and backward must take the same path (the choice depends only on the dims and whether there is
// a gate). A carried state (inference) goes through either form: the chunked one where it pays.
bool delta_rule_chunked_cuda_applies(const DeltaRuleDims& d);
// The checkpoint buffer the training forward needs on the GPU: the layout of the path the op will
// take for these dims (the chunked form's is ~3x smaller at head dim 128), or, while a kernel
// family is forced (set_delta_rule_kernel), the larger of the two (ops::delta_rule_ckpt_size).
size_t delta_rule_ckpt_size(const DeltaRuleDims& d, bool gated);
bool delta_rule_chunked_cuda_pays(const DeltaRuleDims& d, bool gated);
// Whether the chunked forward's state walk under the current GEMM precision takes one block per
// sequence and head (all value columns) rather than blocks of 64 columns: where the latter would
// take more waves of the GPU's SMs (the same results, bit for bit).
bool delta_rule_chunked_state_walk_wide(const DeltaRuleDims& d);
// The same for the backward's walk (dS).
bool delta_rule_chunked_dstate_walk_wide(const DeltaRuleDims& d);
void delta_rule_forward_chunked(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                                const float* g, const DeltaRuleDims& d, float* ckpt, float* state);
void delta_rule_backward_chunked(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                                 const float* q, const float* k, const float* v, const float* beta_logit,
                                 const float* g, const DeltaRuleDims& d, const float* ckpt, bool accumulate);
}  // namespace lrnn::ops::cuda
