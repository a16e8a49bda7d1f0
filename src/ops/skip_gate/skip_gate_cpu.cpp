#include "ops/skip_gate/skip_gate.h"
#include <cstddef>
#include <vector>
#include <omp.h>
#include "ops/common/math.h"

namespace lrnn::ops {

template <class T>
void skip_gate_forward(T* out, const T* h, const T* x, const T* skip, const T* z, int N, int I, int ldx, int ldz) {
  if (!ldx) ldx = I;
  if (!ldz) ldz = I;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* __restrict hn = h + size_t(n) * I;
    const T* __restrict xr = x + size_t(n) * ldx;
    const T* __restrict zr = z + size_t(n) * ldz;
    T* __restrict o = out + size_t(n) * I;
#pragma omp simd
    for (int c = 0; c < I; ++c) o[c] = (hn[c] + skip[c] * xr[c]) * silu(zr[c]);
  }
}

template <class T>
void skip_gate_backward(T* dh, T* dx, T* dskip, T* dz, const T* dout, const T* h, const T* x, const T* skip,
                        const T* z, int N, int I, int ldx, int ldz) {
  if (!ldx) ldx = I;
  if (!ldz) ldz = I;
  const int nt = omp_get_max_threads();
  std::vector<T> part(size_t(nt) * I, T(0));  // per-thread d skip, summed in thread order
#pragma omp parallel num_threads(nt)
  {
    T* __restrict mine = part.data() + size_t(omp_get_thread_num()) * I;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const T* __restrict hn = h + size_t(n) * I;
      const T* __restrict xr = x + size_t(n) * ldx;
      const T* __restrict zr = z + size_t(n) * ldz;
      const T* __restrict ds = dout + size_t(n) * I;
      T* __restrict dhn = dh + size_t(n) * I;
      T* __restrict dxr = dx + size_t(n) * ldx;
      T* __restrict dzr = dz + size_t(n) * ldz;
#pragma omp simd
      for (int c = 0; c < I; ++c) {
        const T sz = silu(zr[c]), g = ds[c] * sz;
        dhn[c] += g;
        mine[c] += g * xr[c];
        dxr[c] += g * skip[c];
        dzr[c] += ds[c] * (hn[c] + skip[c] * xr[c]) * silu_grad(zr[c]);
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int c = 0; c < I; ++c) dskip[c] += part[size_t(t) * I + c];
}

#define INST(T)                                                                                          \
  template void skip_gate_forward<T>(T*, const T*, const T*, const T*, const T*, int, int, int, int);    \
  template void skip_gate_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, \
                                      int, int, int);
INST(float)
INST(double)
}  // namespace lrnn::ops
