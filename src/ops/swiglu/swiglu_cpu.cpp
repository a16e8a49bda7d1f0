#include "ops/swiglu/swiglu.h"
#include <algorithm>
#include "ops/common/math.h"

namespace lrnn::ops {

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int N, int I, int ld) {
  if (!ld) ld = I;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* __restrict g = gate + size_t(n) * ld;
    const T* __restrict u = up + size_t(n) * ld;
    T* __restrict o = out + size_t(n) * I;
#pragma omp simd
    for (int i = 0; i < I; ++i) o[i] = silu(g[i]) * u[i];
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N, int I, int ld,
                     bool accumulate) {
  if (!ld) ld = I;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* __restrict g = gate + size_t(n) * ld;
    const T* __restrict u = up + size_t(n) * ld;
    const T* __restrict d = dout + size_t(n) * I;
    T* __restrict dg = dgate + size_t(n) * ld;
    T* __restrict du = dup + size_t(n) * ld;
    // Overwrite: the row is zeroed (while in cache) before the unchanged accumulating loop, so
    // the result is bit for bit the zero-filled + accumulate one, whatever the compiler does.
    if (!accumulate) {
      std::fill_n(dg, I, T(0));
      std::fill_n(du, I, T(0));
    }
#pragma omp simd
    for (int i = 0; i < I; ++i) {
      const T x = g[i], s = sigmoid(x);
      dg[i] += d[i] * u[i] * s * (T(1) + x * (T(1) - s));
      du[i] += d[i] * x * s;
    }
  }
}

#define INST(T)                                                                       \
  template void swiglu_forward<T>(T*, const T*, const T*, int, int, int);            \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
