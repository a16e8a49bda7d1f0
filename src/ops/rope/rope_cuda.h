// CUDA rotary position embedding: the contract of rope.h (HF rotate_half convention, layouts
// [B,T,H,D] with token strides ldx, ldo, angles computed in double and rounded to float),
// launched on cuda::stream(). Backward accumulates dx += R(t)^T dout.
#pragma once
#include "ops/rope/rope.h"
namespace lrnn::ops::cuda {
void rope_forward(float* out, const float* x, const RopeDims& d);
void rope_backward(float* dx, const float* dout, const RopeDims& d);
}  // namespace lrnn::ops::cuda
