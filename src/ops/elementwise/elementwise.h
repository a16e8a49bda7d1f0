// Small elementwise helpers the models call between ops (residual adds, zeroing gradients).
#pragma once
#include <cstddef>
#include <cstring>

namespace lrnn::ops {

// y[i] += x[i]
template <class T>
void add_inplace(T* y, const T* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

// y[i] += a * x[i]
template <class T>
void add_scaled(T* y, const T* x, T a, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

template <class T>
void zero(T* p, size_t n) {
  if (n) std::memset(p, 0, n * sizeof(T));
}

}  // namespace lrnn::ops
