#include "ops/short_conv/short_conv.h"
#include <algorithm>
#include <vector>
#include <omp.h>
#include "ops/common/math.h"
#include "ops/l2norm/l2norm.h"

namespace lrnn::ops {

// Rows are tokens, columns channels: every inner loop runs over contiguous channels. The
// weights are transposed to wt[j][c] once per call so those loops vectorise.
template <class T>
static std::vector<T> transpose_weights(const T* w, int C, int K) {
  std::vector<T> wt(size_t(K) * C);
  for (int c = 0; c < C; ++c)
    for (int j = 0; j < K; ++j) wt[size_t(j) * C + c] = w[c * K + j];
  return wt;
}

// pre[c] = bias[c] + sum_j wt[j][c] * x[t-(K-1)+j][c] for one token row (bias may be null). Rows
// before the sequence's first are zero, or the rows of pb [K-1, C] when given.
template <class T>
static inline void conv_row(T* __restrict pre, const T* xb, const T* wt, const T* bias, int t, int C, int K,
                            int ldx, const T* pb = nullptr) {
  if (K == 0) {
    const T* __restrict xr = xb + size_t(t) * ldx;
    if (bias) {
#pragma omp simd
      for (int c = 0; c < C; ++c) pre[c] = xr[c] + bias[c];
    } else {
      std::copy_n(xr, C, pre);
    }
    return;
  }
  if (bias) std::copy_n(bias, C, pre);
  else std::fill_n(pre, C, T(0));
  for (int j = pb ? 0 : std::max(0, K - 1 - t); j < K; ++j) {
    const int r = t - (K - 1) + j;
    const T* __restrict xr = r >= 0 ? xb + size_t(r) * ldx : pb + size_t(K - 1 + r) * C;
    const T* __restrict wr = wt + size_t(j) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) pre[c] += wr[c] * xr[c];
  }
}

template <class T>
void short_conv_forward(T* out, const T* x, const T* w, int B, int T_, int C, int K, int ldx, int ldo,
                        const T* bias, const T* prev) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  std::vector<T> wt = K ? transpose_weights(w, C, K) : std::vector<T>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t) {
      T* o = out + (size_t(b) * T_ + t) * ldo;
      conv_row(o, x + size_t(b) * T_ * ldx, wt.data(), bias, t, C, K, ldx,
               prev && K > 1 ? prev + size_t(b) * (K - 1) * C : nullptr);
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = silu(o[c]);
    }
}

template <class T>
void short_conv_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, int B, int T_, int C, int K,
                         int ldx, int ldo, const T* bias, T* dbias, bool accumulate) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  std::vector<T> wt = K ? transpose_weights(w, C, K) : std::vector<T>();
  const int nt = omp_get_max_threads();
  std::vector<T> part(dw ? size_t(nt) * C * K : 0, T(0));  // per-thread dw, as wt layout [K][C]
  std::vector<T> part_b(dbias ? size_t(nt) * C : 0, T(0));  // per-thread dbias
#pragma omp parallel num_threads(nt)
  {
    T* mine = dw ? part.data() + size_t(omp_get_thread_num()) * C * K : nullptr;
    T* __restrict mine_b = dbias ? part_b.data() + size_t(omp_get_thread_num()) * C : nullptr;
    std::vector<T> pre(C);
#pragma omp for schedule(static)
    for (int b = 0; b < B; ++b) {
      const T* xb = x + size_t(b) * T_ * ldx;
      T* dxb = dx + size_t(b) * T_ * ldx;
      // Overwrite: clear this sequence's rows of dx (their first C elements), then accumulate.
      if (!accumulate)
        for (int t = 0; t < T_; ++t) std::fill_n(dxb + size_t(t) * ldx, C, T(0));
      for (int t = 0; t < T_; ++t) {
        const T* __restrict d = dout + (size_t(b) * T_ + t) * ldo;
        conv_row(pre.data(), xb, wt.data(), bias, t, C, K, ldx);
        T* __restrict dp = pre.data();
#pragma omp simd
        for (int c = 0; c < C; ++c) dp[c] = d[c] * silu_grad(dp[c]);  // pre becomes d pre
        if (mine_b) {
#pragma omp simd
          for (int c = 0; c < C; ++c) mine_b[c] += dp[c];
        }
        if (K == 0) {
          T* __restrict g = dxb + size_t(t) * ldx;
#pragma omp simd
          for (int c = 0; c < C; ++c) g[c] += dp[c];
          continue;
        }
        for (int j = std::max(0, K - 1 - t); j < K; ++j) {
          const size_t row = size_t(t - (K - 1) + j) * ldx;
          T* __restrict g = dxb + row;
          const T* __restrict wr = wt.data() + size_t(j) * C;
#pragma omp simd
          for (int c = 0; c < C; ++c) g[c] += wr[c] * dp[c];
          if (mine) {
            T* __restrict m = mine + size_t(j) * C;
            const T* __restrict xr = xb + row;
#pragma omp simd
            for (int c = 0; c < C; ++c) m[c] += dp[c] * xr[c];
          }
        }
      }
    }
  }
  if (dw)
    for (int t = 0; t < nt; ++t)
      for (int j = 0; j < K; ++j)
        for (int c = 0; c < C; ++c) dw[c * K + j] += part[size_t(t) * C * K + size_t(j) * C + c];
  if (dbias)
    for (int t = 0; t < nt; ++t)
      for (int c = 0; c < C; ++c) dbias[c] += part_b[size_t(t) * C + c];
}

template <class T>
void short_conv_l2norm_forward(T* out, T* y, T* rstd, const T* x, const T* w, int B, int T_, int C, int K, int ldx,
                               int ldo, int Cn, int D, double eps, int ldn, const T* prev) {
  short_conv_forward<T>(out, x, w, B, T_, C, K, ldx, ldo, nullptr, prev);
  l2norm_forward<T>(y, rstd, out, B * T_, D, eps, Cn / D, ldo ? ldo : C, ldn);
}

template <class T>
void short_conv_advance_tail(T* tail, const T* x, int B, int T_, int C, int K, int ldx) {
  if (!ldx) ldx = C;
  const int keep = K - 1;
  if (keep <= 0) return;
  for (int b = 0; b < B; ++b) {
    T* tb = tail + size_t(b) * keep * C;
    const int from_x = std::min(T_, keep), from_tail = keep - from_x;
    // rows [0, from_tail) <- the tail's last from_tail rows (in increasing order: row r + T_ is
    // read before it is written); then the last from_x rows of x
    for (int r = 0; r < from_tail; ++r) std::copy_n(tb + size_t(r + T_) * C, C, tb + size_t(r) * C);
    for (int r = 0; r < from_x; ++r)
      std::copy_n(x + (size_t(b) * T_ + size_t(T_ - from_x + r)) * ldx, C, tb + size_t(from_tail + r) * C);
  }
}

#define INST(T)                                                                          \
  template void short_conv_forward<T>(T*, const T*, const T*, int, int, int, int, int, int, const T*, const T*); \
  template void short_conv_l2norm_forward<T>(T*, T*, T*, const T*, const T*, int, int, int, int, int, int, int, int, \
                                             double, int, const T*);                                               \
  template void short_conv_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int, int, int, \
                                       const T*, T*, bool);                                                 \
  template void short_conv_advance_tail<T>(T*, const T*, int, int, int, int, int);
INST(float)
INST(double)
}  // namespace lrnn::ops
