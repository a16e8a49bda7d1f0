#include "ops/rope/rope.h"
#include <cmath>
#include <cstddef>
#include "core/check.h"
#include "ops/common/math.h"

namespace lrnn::ops {

namespace {

// cos and sin of every (position, frequency): [T, D/2] each, in per-thread scratch.
template <class T>
void tables(const RopeDims& d, T*& cs, T*& sn) {
  const int half = d.D / 2;
  cs = thread_scratch<T, 0>(size_t(d.T) * half);
  sn = thread_scratch<T, 1>(size_t(d.T) * half);
  for (int i = 0; i < half; ++i) {
    // HF: 1 / theta^(arange(0, D, 2) / D)
    const double inv_freq = 1.0 / std::pow(d.theta, double(2 * i) / double(d.D));
    for (int t = 0; t < d.T; ++t) {
      const double a = double(t + d.offset) * inv_freq;
      cs[size_t(t) * half + i] = T(std::cos(a));
      sn[size_t(t) * half + i] = T(std::sin(a));
    }
  }
}

void check(const RopeDims& d) {
  LRNN_CHECK(d.B > 0 && d.T > 0 && d.H > 0 && d.D > 0 && d.D % 2 == 0, "rope: bad dims B={} T={} H={} D={} (D must be even)",
             d.B, d.T, d.H, d.D);
}

}  // namespace

template <class T>
void rope_forward(T* out, const T* x, const RopeDims& d) {
  check(d);
  T *cs, *sn;
  tables(d, cs, sn);
  const int half = d.D / 2, H = d.H, D = d.D;
  const size_t lx = d.lx(), lo = d.lo();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.B * d.T; ++n) {
    const int t = n % d.T;
    const T* __restrict c = cs + size_t(t) * half;
    const T* __restrict s = sn + size_t(t) * half;
    for (int h = 0; h < H; ++h) {
      const T* xr = x + n * lx + size_t(h) * D;
      T* o = out + n * lo + size_t(h) * D;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const T a = xr[i], b = xr[i + half];
        o[i] = a * c[i] - b * s[i];
        o[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

template <class T>
void rope_backward(T* dx, const T* dout, const RopeDims& d) {
  check(d);
  T *cs, *sn;
  tables(d, cs, sn);
  const int half = d.D / 2, H = d.H, D = d.D;
  const size_t lx = d.lx(), lo = d.lo();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.B * d.T; ++n) {
    const int t = n % d.T;
    const T* __restrict c = cs + size_t(t) * half;
    const T* __restrict s = sn + size_t(t) * half;
    for (int h = 0; h < H; ++h) {
      const T* g = dout + n * lo + size_t(h) * D;
      T* dr = dx + n * lx + size_t(h) * D;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const T a = g[i], b = g[i + half];
        dr[i] += a * c[i] + b * s[i];
        dr[i + half] += b * c[i] - a * s[i];
      }
    }
  }
}

#define INST(T)                                                    \
  template void rope_forward<T>(T*, const T*, const RopeDims&);   \
  template void rope_backward<T>(T*, const T*, const RopeDims&);
INST(float)
INST(double)
}  // namespace lrnn::ops
