// CUDA token embedding lookup: the same contract as embedding.h (device pointers, fp32, launched on
// cuda::stream()). Backward accumulates, in a fixed summation order (the same bits on every run)
// wherever embedding_backward_deterministic says so: vocabularies up to kEmbDetMaxV rows whose
// V x C floats the device scratch holds (the state-tracking tasks' up to S5's 122), and any other
// vocabulary while the tokens' sort fits the scratch (~170k tokens at C 1024; language models).
// Beyond that it falls back to atomic adds, whose order varies between runs.
#pragma once
#include <cstdint>
namespace lrnn::ops::cuda {
void embedding_forward(float* out, const int32_t* tok, const float* W, int N, int C, int V);
constexpr int kEmbDetMaxV = 384;
void embedding_backward(float* dW, const float* dout, const int32_t* tok, int N, int C, int V);
bool embedding_backward_deterministic(int N, int C, int V);
}  // namespace lrnn::ops::cuda
