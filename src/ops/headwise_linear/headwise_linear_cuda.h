// CUDA block-diagonal (per head) linear map: the same contract as headwise_linear.h (device
// pointers, fp32, cuda::stream()). Backward accumulates into dx, dW, dbias (each may be null).
#pragma once
namespace lrnn::ops::cuda {
void headwise_linear_forward(float* y, const float* x, const float* W, const float* bias, int N, int H, int I, int O,
                             int ldx = 0, int ldy = 0);
void headwise_linear_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x, const float* W,
                              int N, int H, int I, int O, int ldx = 0, int ldy = 0);
}  // namespace lrnn::ops::cuda
