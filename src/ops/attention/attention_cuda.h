// CUDA causal softmax attention: the contract of attention.h (layouts [B,T,H,D] with token
// strides ldq, ldk, ldv, ldo; lse [B,H,T] log-sum-exp of every score row, may be null in the
// forward), launched on cuda::stream(). Backward recomputes the probabilities from lse and
// accumulates into dq, dk, dv (same strides as q, k, v), without atomics.
// Tile kernels (a block per (b, h) with Q, K, V and the T x T scores in shared memory) where
// they fit, at the papers' short sequences; else row kernels (a block per (b, h, row)), T up
// to kAttnCudaMaxT.
#pragma once
#include "ops/attention/attention.h"
namespace lrnn::ops::cuda {
constexpr int kAttnCudaMaxT = 4096;
void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, const AttentionDims& d);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* o, const float* lse, const AttentionDims& d);

// Which kernels run. Auto: the tile kernels where they fit, the row kernels elsewhere. Rows:
// always the row kernels (lets the tests check both on the same shapes). Process-wide.
enum class AttnKernel { Auto, Rows };
void set_attention_kernel(AttnKernel k);
}  // namespace lrnn::ops::cuda
