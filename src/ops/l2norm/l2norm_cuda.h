// CUDA per-head L2 normalisation: the same contract as l2norm.h (device pointers, fp32,
// cuda::stream()). Backward adds to dx, or overwrites it when accumulate is false.
#pragma once
namespace lrnn::ops::cuda {
void l2norm_forward(float* y, float* rstd, const float* x, int N, int D, double eps, int heads = 1, int ldx = 0,
                    int ldy = 0);
void l2norm_backward(float* dx, const float* dy, const float* y, const float* rstd, int N, int D, int heads = 1,
                     int ldx = 0, int ldy = 0, bool accumulate = true);
}  // namespace lrnn::ops::cuda
