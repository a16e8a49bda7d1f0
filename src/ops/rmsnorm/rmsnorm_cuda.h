// CUDA RMSNorm: the same contract as rmsnorm.h (device pointers, fp32, cuda::stream()).
// Backward accumulates into dx and dw.
#pragma once
namespace lrnn::ops::cuda {
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, double eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int N, int C);
}  // namespace lrnn::ops::cuda
