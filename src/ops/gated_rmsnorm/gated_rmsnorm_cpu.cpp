#include "ops/gated_rmsnorm/gated_rmsnorm.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include <omp.h>
#include "ops/common/math.h"

namespace lrnn::ops {

template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* g, const T* w, int N, int heads, int D,
                           double eps, int ldg) {
  if (!ldg) ldg = heads * D;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const size_t r = size_t(n) * heads + h;
      const T* xr = x + r * D;
      const T* gr = g + size_t(n) * ldg + size_t(h) * D;
      T* yr = y + r * D;
      T ss = 0;
      for (int c = 0; c < D; ++c) ss += xr[c] * xr[c];
      const T rs = T(1) / std::sqrt(ss / T(D) + T(eps));
      rstd[r] = rs;
      for (int c = 0; c < D; ++c) yr[c] = xr[c] * rs * w[c] * silu(gr[c]);
    }
}

template <class T>
void gated_rmsnorm_backward(T* dx, T* dg, T* dw, const T* dy, const T* x, const T* g, const T* w,
                            const T* rstd, int N, int heads, int D, int ldg, bool accumulate) {
  if (!ldg) ldg = heads * D;
  const int nt = omp_get_max_threads();
  std::vector<T> part(dw ? size_t(nt) * D : 0, T(0));
#pragma omp parallel num_threads(nt)
  {
    T* mine = dw ? part.data() + size_t(omp_get_thread_num()) * D : nullptr;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < heads; ++h) {
        const size_t r = size_t(n) * heads + h;
        const T* xr = x + r * D;
        const T* d = dy + r * D;
        const T* gr = g + size_t(n) * ldg + size_t(h) * D;
        T* dgr = dg + size_t(n) * ldg + size_t(h) * D;
        T* dxr = dx + r * D;
        const T rs = rstd[r];
        // Overwrite: the row's dx and dg are zeroed (while in cache) before the unchanged
        // accumulating loops: bit for bit the zero-filled + accumulate result.
        if (!accumulate) {
          std::fill_n(dgr, D, T(0));
          std::fill_n(dxr, D, T(0));
        }
        T dot = 0;  // sum e * x
        for (int c = 0; c < D; ++c) {
          const T s = silu(gr[c]);
          dgr[c] += d[c] * xr[c] * rs * w[c] * silu_grad(gr[c]);
          dot += d[c] * s * w[c] * xr[c];
          if (mine) mine[c] += d[c] * s * xr[c] * rs;
        }
        const T k = dot * rs * rs * rs / T(D);
        for (int c = 0; c < D; ++c) dxr[c] += rs * w[c] * silu(gr[c]) * d[c] - xr[c] * k;
      }
  }
  if (dw)
    for (int t = 0; t < nt; ++t)
      for (int c = 0; c < D; ++c) dw[c] += part[size_t(t) * D + c];
}

#define INST(T)                                                                                   \
  template void gated_rmsnorm_forward<T>(T*, T*, const T*, const T*, const T*, int, int, int, double, \
                                         int);                                                    \
  template void gated_rmsnorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,      \
                                          const T*, int, int, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
