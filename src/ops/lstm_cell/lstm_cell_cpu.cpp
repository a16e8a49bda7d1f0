#include "ops/lstm_cell/lstm_cell.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include "core/check.h"
#include "ops/common/math.h"
#include "ops/linear/linear.h"

namespace lrnn::ops {

namespace {

// tanh through the vectorisable exp_: sign(x) (1 - e) / (1 + e), e = exp(-2|x|), never overflows.
// (Absolute error ~1e-7 in float; double uses std::exp and is exact to rounding.)
template <class T>
inline T tanh_(T x) {
  const T e = exp_(T(-2) * std::abs(x));
  const T r = (T(1) - e) / (T(1) + e);
  return x < 0 ? -r : r;
}

void check(const LstmDims& d) {
  LRNN_CHECK(d.T > 0 && d.B > 0 && d.I > 0 && d.H > 0, "lstm: bad dims T={} B={} I={} H={}", d.T, d.B, d.I, d.H);
}

}  // namespace

template <class T>
void lstm_forward(T* h, T* c, T* gates, const T* x, const T* W_ih, const T* W_hh, const T* b_ih,
                  const T* b_hh, const LstmDims& d) {
  check(d);
  const int Tn = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
  const size_t N = size_t(Tn) * B;
  // z = x W_ih^T + (b_ih + b_hh) for every (t, b) at once.
  for (size_t n = 0; n < N; ++n) {
    T* z = gates + n * G;
    for (int j = 0; j < G; ++j) z[j] = b_ih[j] + b_hh[j];
  }
  gemm<T>(false, true, int(N), G, I, T(1), x, I, W_ih, I, T(1), gates, G);
  for (int t = 0; t < Tn; ++t) {
    T* z = gates + size_t(t) * B * G;
    if (t > 0) gemm<T>(false, true, B, G, H, T(1), h + size_t(t - 1) * B * H, H, W_hh, H, T(1), z, G);
    const T* cprev = t > 0 ? c + size_t(t - 1) * B * H : nullptr;
    T* ct = c + size_t(t) * B * H;
    T* ht = h + size_t(t) * B * H;
#pragma omp parallel for schedule(static) if (size_t(B) * H >= 4096)
    for (int b = 0; b < B; ++b) {
      T* zi = z + size_t(b) * G;
      T* zf = zi + H;
      T* zg = zi + 2 * H;
      T* zo = zi + 3 * H;
      const T* cp = cprev ? cprev + size_t(b) * H : nullptr;
      T* cb = ct + size_t(b) * H;
      T* hb = ht + size_t(b) * H;
#pragma omp simd
      for (int j = 0; j < H; ++j) {
        const T i = sigmoid(zi[j]), f = sigmoid(zf[j]), g = tanh_(zg[j]), o = sigmoid(zo[j]);
        zi[j] = i; zf[j] = f; zg[j] = g; zo[j] = o;
        const T cc = (cp ? f * cp[j] : T(0)) + i * g;
        cb[j] = cc;
        hb[j] = o * tanh_(cc);
      }
    }
  }
}

template <class T>
void lstm_backward(T* dx, T* dW_ih, T* dW_hh, T* db_ih, T* db_hh, const T* dh, const T* x,
                   const T* W_ih, const T* W_hh, const T* h, const T* c, const T* gates,
                   const LstmDims& d, T* work) {
  check(d);
  const int Tn = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
  const size_t N = size_t(Tn) * B;
  T* dz = work ? work : thread_scratch<T, 0>(N * G);                      // d loss / d pre-activations, every step
  T* dhr = work ? work + N * G : thread_scratch<T, 1>(size_t(B) * H);      // recurrent part of dh_t (from step t+1)
  T* dc = work ? dhr + size_t(B) * H : thread_scratch<T, 2>(size_t(B) * H);  // d loss / d c_t carried back through f
  std::fill_n(dhr, size_t(B) * H, T(0));
  std::fill_n(dc, size_t(B) * H, T(0));
  for (int t = Tn - 1; t >= 0; --t) {
    const T* a = gates + size_t(t) * B * G;
    T* dzt = dz + size_t(t) * B * G;
    const T* ct = c + size_t(t) * B * H;
    const T* cprev = t > 0 ? c + size_t(t - 1) * B * H : nullptr;
    const T* dht = dh + size_t(t) * B * H;
#pragma omp parallel for schedule(static) if (size_t(B) * H >= 4096)
    for (int b = 0; b < B; ++b) {
      const T* ai = a + size_t(b) * G;
      const T* af = ai + H;
      const T* ag = ai + 2 * H;
      const T* ao = ai + 3 * H;
      T* di = dzt + size_t(b) * G;
      T* df = di + H;
      T* dg = di + 2 * H;
      T* dO = di + 3 * H;
      const T* cb = ct + size_t(b) * H;
      const T* cp = cprev ? cprev + size_t(b) * H : nullptr;
      const T* gh = dht + size_t(b) * H;
      T* rh = dhr + size_t(b) * H;
      T* dcb = dc + size_t(b) * H;
#pragma omp simd
      for (int j = 0; j < H; ++j) {
        const T i = ai[j], f = af[j], g = ag[j], o = ao[j];
        const T tc = tanh_(cb[j]);
        const T dhj = gh[j] + rh[j];
        const T dcj = dcb[j] + dhj * o * (T(1) - tc * tc);
        const T cpj = cp ? cp[j] : T(0);
        di[j] = dcj * g * i * (T(1) - i);
        df[j] = dcj * cpj * f * (T(1) - f);
        dg[j] = dcj * i * (T(1) - g * g);
        dO[j] = dhj * tc * o * (T(1) - o);
        dcb[j] = dcj * f;
      }
    }
    if (t > 0) gemm<T>(false, false, B, H, G, T(1), dzt, G, W_hh, H, T(0), dhr, H);
  }
  // Parameter and input gradients, each one GEMM over all steps.
  if (Tn > 1) gemm<T>(true, false, G, H, int(N - B), T(1), dz + size_t(B) * G, G, h, H, T(1), dW_hh, H);
  gemm<T>(true, false, G, I, int(N), T(1), dz, G, x, I, T(1), dW_ih, I);
  if (dx) gemm<T>(false, false, int(N), I, G, T(1), dz, G, W_ih, I, T(1), dx, I);
  T* colsum = work ? dc + size_t(B) * H : thread_scratch<T, 3>(G);
  std::fill_n(colsum, G, T(0));
  for (size_t n = 0; n < N; ++n) {
    const T* r = dz + n * G;
#pragma omp simd
    for (int j = 0; j < G; ++j) colsum[j] += r[j];
  }
  for (int j = 0; j < G; ++j) {
    db_ih[j] += colsum[j];
    db_hh[j] += colsum[j];
  }
}

template <class T>
void lstm_time_major_ids(int32_t* out, const int32_t* in, int B, int T_) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t) out[size_t(t) * B + b] = in[size_t(b) * T_ + t];
}

template <class T>
void lstm_batch_major(T* out, const T* in, int B, int T_, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t)
      std::memcpy(out + (size_t(b) * T_ + t) * C, in + (size_t(t) * B + b) * C, sizeof(T) * C);
}

#define INST(T)                                                                                      \
  template void lstm_forward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,       \
                                const LstmDims&);                                                    \
  template void lstm_backward<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                 const T*, const T*, const T*, const LstmDims&, T*);            \
  template void lstm_time_major_ids<T>(int32_t*, const int32_t*, int, int);                          \
  template void lstm_batch_major<T>(T*, const T*, int, int, int);
INST(float)
INST(double)
}  // namespace lrnn::ops
