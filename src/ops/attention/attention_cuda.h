// CUDA causal softmax attention: the contract of attention.h (layouts [B,T,H,D] with token
// strides ldq, ldk, ldv, ldo; lse [B,H,T] log-sum-exp of every score row, may be null in the
// forward), launched on cuda::stream(). Backward recomputes the probabilities from lse and
// accumulates into dq, dk, dv (same strides as q, k, v), without atomics.
// A simple kernel (one block per (b, h, row), the row's scores in shared memory): T up to
// kAttnCudaMaxT (the shared memory of one block).
#pragma once
#include "ops/attention/attention.h"
namespace lrnn::ops::cuda {
constexpr int kAttnCudaMaxT = 4096;
void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, const AttentionDims& d);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* o, const float* lse, const AttentionDims& d);
}  // namespace lrnn::ops::cuda
