// CUDA embedding lookup: the same contract as embedding.h (device pointers, fp32, launched on
// cuda::stream()). Backward accumulates (atomic adds: tokens repeat).
#pragma once
#include <cstdint>
namespace lrnn::ops::cuda {
void embedding_forward(float* out, const int32_t* tok, const float* W, int N, int C, int V);
void embedding_backward(float* dW, const float* dout, const int32_t* tok, int N, int C);
}  // namespace lrnn::ops::cuda
