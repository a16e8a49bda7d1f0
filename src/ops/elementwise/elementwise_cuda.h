// CUDA versions of elementwise.h (device pointers, cuda::stream()).
#pragma once
#include <cstddef>
#include "core/dtype.h"
namespace lrnn::ops::cuda {
void add_inplace(float* y, const float* x, size_t n);
// y[i] += a * x[i]
void add_scaled(float* y, const float* x, float a, size_t n);
void zero(float* p, size_t n);
// y[i] *= *a, with the factor read from device memory when the kernel runs (so a captured graph
// picks up a factor written before each replay).
void scale_by(float* y, const float* a, size_t n);
// y = bf16(x), rounded to nearest even (NaN stays NaN): weights and gradients entering bf16 GEMMs.
void to_bf16(bf16* y, const float* x, size_t n);
// out[i] += the sum over p of part[p * n + i] (part: [parts][n]), in an order fixed by parts and n
// alone: the second pass of the ops' deterministic reductions.
void add_partials(float* out, const float* part, int parts, size_t n);
}  // namespace lrnn::ops::cuda
