#include "ops/rmsnorm/rmsnorm.h"
#include "ops/common/math.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include <omp.h>

namespace lrnn::ops {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + size_t(n) * C;
    T* o = out + size_t(n) * C;
    const T ss = tree_sum<T>([&](size_t c) { return xr[c] * xr[c]; }, size_t(C));
    T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) o[c] = xr[c] * r * w[c];
  }
}

// y = x r w, r = (mean x^2 + eps)^-1/2  =>  dx = r w dy - x r^3/C * sum(dy w x),  dw = sum_n dy x r
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N, int C,
                      bool accumulate) {
  int nt = omp_get_max_threads();
  // Per-thread partial dw, summed in thread order: deterministic for a fixed thread count.
  std::vector<T> part(dw ? size_t(nt) * C : 0, T(0));
#pragma omp parallel num_threads(nt)
  {
    T* mine = dw ? part.data() + size_t(omp_get_thread_num()) * C : nullptr;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const T* xr = x + size_t(n) * C;
      const T* d = dout + size_t(n) * C;
      T* g = dx + size_t(n) * C;
      const T r = rstd[n], dot = tree_sum<T>([&](size_t c) { return d[c] * w[c] * xr[c]; }, size_t(C));
      T k = dot * r * r * r / T(C);
      // overwrite = exactly zero-fill + accumulate (0 + v), without a memset a row
      for (int c = 0; c < C; ++c) g[c] = (accumulate ? g[c] : T(0)) + (r * w[c] * d[c] - xr[c] * k);
      if (mine)
        for (int c = 0; c < C; ++c) mine[c] += d[c] * xr[c] * r;
    }
  }
  if (dw)
    for (int t = 0; t < nt; ++t)
      for (int c = 0; c < C; ++c) dw[c] += part[size_t(t) * C + c];
}

#define INST(T)                                                                                \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, double);             \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
