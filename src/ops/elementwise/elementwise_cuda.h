// CUDA versions of elementwise.h (device pointers, cuda::stream()).
#pragma once
#include <cstddef>
namespace lrnn::ops::cuda {
void add_inplace(float* y, const float* x, size_t n);
void zero(float* p, size_t n);
}  // namespace lrnn::ops::cuda
