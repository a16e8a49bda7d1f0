#include "ops/l2norm/l2norm.h"
#include "ops/common/math.h"
#include <algorithm>
#include <cmath>

namespace lrnn::ops {

template <class T>
void l2norm_forward(T* y, T* rstd, const T* x, int N, int D, double eps, int heads, int ldx, int ldy) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const T* xr = x + size_t(n) * ldx + size_t(h) * D;
      T* yr = y + size_t(n) * ldy + size_t(h) * D;
      const T ss = tree_sum<T>([&](size_t d) { return xr[d] * xr[d]; }, size_t(D));
      T r = T(1) / std::sqrt(ss + T(eps));
      rstd[size_t(n) * heads + h] = r;
      for (int d = 0; d < D; ++d) yr[d] = xr[d] * r;
    }
}

template <class T>
void l2norm_backward(T* dx, const T* dy, const T* y, const T* rstd, int N, int D, int heads, int ldx, int ldy,
                     bool accumulate) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const T* yr = y + size_t(n) * ldy + size_t(h) * D;
      const T* g = dy + size_t(n) * ldy + size_t(h) * D;
      T* dxr = dx + size_t(n) * ldx + size_t(h) * D;
      const T r = rstd[size_t(n) * heads + h];
      const T dot = tree_sum<T>([&](size_t d) { return yr[d] * g[d]; }, size_t(D));
      // overwrite = exactly zero-fill + accumulate (0 + v), without a memset a row
      for (int d = 0; d < D; ++d) dxr[d] = (accumulate ? dxr[d] : T(0)) + r * (g[d] - yr[d] * dot);
    }
}

#define INST(T)                                                                                  \
  template void l2norm_forward<T>(T*, T*, const T*, int, int, double, int, int, int);           \
  template void l2norm_backward<T>(T*, const T*, const T*, const T*, int, int, int, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
