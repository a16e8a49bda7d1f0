// CUDA LayerNorm over groups: the same contract as layernorm.h (device pointers, fp32,
// cuda::stream()). Backward accumulates into dx and dw (dw may be null).
#pragma once
namespace lrnn::ops::cuda {
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, int N, int C, int G,
                       double eps, double w_offset);
void layernorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, int N, int C, int G, double w_offset);
}  // namespace lrnn::ops::cuda
