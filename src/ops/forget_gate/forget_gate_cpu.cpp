#include "ops/forget_gate/forget_gate.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include <omp.h>
#include "ops/common/math.h"

namespace lrnn::ops {

namespace {
template <class T>
inline T softplus(T x) {
  return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x)));
}
}  // namespace

template <class T>
void forget_gate_forward(T* g, const T* a, const T* A_log, const T* dt_bias, int N, int H, int lda) {
  if (!lda) lda = H;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h)
      g[size_t(n) * H + h] = -std::exp(A_log[h]) * softplus(a[size_t(n) * lda + h] + dt_bias[h]);
}

template <class T>
void forget_gate_backward(T* da, T* dA_log, T* ddt_bias, const T* dg, const T* a, const T* A_log,
                          const T* dt_bias, int N, int H, int lda, bool accumulate) {
  if (!lda) lda = H;
  const int nt = omp_get_max_threads();
  // Per-thread partial sums [thread][dA_log H | ddt_bias H], added in thread order.
  std::vector<T> part(size_t(nt) * 2 * H, T(0));
#pragma omp parallel num_threads(nt)
  {
    T* mine = part.data() + size_t(omp_get_thread_num()) * 2 * H;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      // Overwrite: the token's da is zeroed before the unchanged accumulating loop (bit for bit
      // the zero-filled + accumulate result).
      if (!accumulate) std::fill_n(da + size_t(n) * lda, H, T(0));
      for (int h = 0; h < H; ++h) {
        const T x = a[size_t(n) * lda + h] + dt_bias[h], A = std::exp(A_log[h]), d = dg[size_t(n) * H + h];
        const T dx = -A * sigmoid(x) * d;  // d softplus / dx = sigmoid(x)
        da[size_t(n) * lda + h] += dx;
        mine[h] += -A * softplus(x) * d;   // dg/dA_log = g
        mine[H + h] += dx;
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int h = 0; h < H; ++h) {
      if (dA_log) dA_log[h] += part[size_t(t) * 2 * H + h];
      if (ddt_bias) ddt_bias[h] += part[size_t(t) * 2 * H + H + h];
    }
}

#define INST(T)                                                                              \
  template void forget_gate_forward<T>(T*, const T*, const T*, const T*, int, int, int);     \
  template void forget_gate_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, \
                                        int, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
