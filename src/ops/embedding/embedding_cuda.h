// CUDA embedding lookup: the same contract as embedding.h (device pointers, fp32, launched on
// cuda::stream()). Backward accumulates; it is deterministic (a fixed summation order, the same
// bits on every run) for vocabularies up to kEmbDetMaxV rows (the state-tracking tasks' up to S5's
// 122) whose V x C floats the device scratch holds, and uses atomic adds (order varies between
// runs) otherwise (language-model vocabularies).
#pragma once
#include <cstdint>
namespace lrnn::ops::cuda {
void embedding_forward(float* out, const int32_t* tok, const float* W, int N, int C, int V);
constexpr int kEmbDetMaxV = 384;
void embedding_backward(float* dW, const float* dout, const int32_t* tok, int N, int C, int V);
}  // namespace lrnn::ops::cuda
