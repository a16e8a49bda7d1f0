#include "ops/selective_scan/selective_scan.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>
#include "core/check.h"

namespace lrnn::ops {

namespace {

// The state of one sequence is kept as h[n][c] (state index outer, channel inner): every inner
// loop runs over contiguous channels, so it vectorises without horizontal sums, and B[t,n],
// C[t,n] are broadcast scalars.

// log(1 + u) for u in [0, 1], vectorisable in float (no bit tricks, no branches):
// log(1 + u) = 2 atanh(s), s = u / (2 + u) in [0, 1/3], odd series to s^15 (truncation < 1e-9).
// Exact in relative terms for tiny u too (s = u/2 without forming 1 + u). Double keeps
// std::log1p so gradient checks stay exact.
template <class T> inline T log1p_unit(T u) { return std::log1p(u); }
template <> inline float log1p_unit<float>(float u) {
  // 2s + 2s * s^2 q(s^2): the leading term apart, so the series' roundings are scaled by s^2 <= 1/9.
  const float s = u / (2.0f + u), s2 = s * s;
  float q = 1.0f / 15.0f;
  q = q * s2 + 1.0f / 13.0f;
  q = q * s2 + 1.0f / 11.0f;
  q = q * s2 + 1.0f / 9.0f;
  q = q * s2 + 1.0f / 7.0f;
  q = q * s2 + 1.0f / 5.0f;
  q = q * s2 + 1.0f / 3.0f;
  const float t = 2.0f * s;
  return t + t * (s2 * q);
}

// softplus(x) = log(1 + e^x), PyTorch's threshold: x for x > 20.
template <class T> inline T softplus_(T x) {
  const T sp = (x > T(0) ? x : T(0)) + log1p_unit(exp_(-std::abs(x)));
  return x > T(20) ? x : sp;
}
// d softplus / dx: sigmoid(x), and 1 above the threshold (as PyTorch).
template <class T> inline T softplus_grad(T x) { return x > T(20) ? T(1) : sigmoid(x); }

// Pointers to one sequence's rows.
template <class T>
struct Rows {
  const SelectiveScanInputs<T>& in;
  size_t lx, ldt, lz, lbc, base;  // token strides; first token of the sequence
  Rows(const SelectiveScanInputs<T>& in_, const SelectiveScanDims& d, int b)
      : in(in_), lx(d.lx()), ldt(d.ldt()), lz(d.lz()), lbc(d.lbc()), base(size_t(b) * d.T) {}
  const T* x(int t) const { return in.x + (base + t) * lx; }
  const T* dt(int t) const { return in.dt + (base + t) * ldt; }
  const T* z(int t) const { return in.z ? in.z + (base + t) * lz : nullptr; }
  const T* B(int t) const { return in.B + (base + t) * lbc; }
  const T* C(int t) const { return in.C + (base + t) * lbc; }
};

// Advances h [N][Di] through one token. Writes delta [Di] and ypre = C.h + D x [Di]; with
// kSaveE also e = exp(delta A) [N][Di] (what the backward needs besides the states).
template <class T, int NS, EigenRange R, bool kSaveE>
[[gnu::always_inline]] inline void scan_step(T* __restrict h, T* __restrict delta, T* __restrict u,
                                             T* __restrict ypre, T* __restrict e_out,
                                             const T* __restrict At, const T* __restrict x,
                                             const T* __restrict dt, const T* __restrict bias,
                                             const T* __restrict Bt, const T* __restrict Ct,
                                             const T* __restrict Dk, int Di, int N_) {
  const int N = NS ? NS : N_;
  if (bias) {
#pragma omp simd
    for (int c = 0; c < Di; ++c) delta[c] = softplus_(dt[c] + bias[c]);
  } else {
#pragma omp simd
    for (int c = 0; c < Di; ++c) delta[c] = softplus_(dt[c]);
  }
#pragma omp simd
  for (int c = 0; c < Di; ++c) {
    u[c] = delta[c] * x[c];
    ypre[c] = Dk ? Dk[c] * x[c] : T(0);
  }
  for (int n = 0; n < N; ++n) {
    const T bn = Bt[n], cn = Ct[n];
    T* __restrict hn = h + size_t(n) * Di;
    const T* __restrict An = At + size_t(n) * Di;
    T* __restrict en = kSaveE ? e_out + size_t(n) * Di : nullptr;
#pragma omp simd
    for (int c = 0; c < Di; ++c) {
      const T e = exp_(delta[c] * An[c]);
      const T a = R == EigenRange::Signed ? T(2) * e - T(1) : e;
      hn[c] = a * hn[c] + u[c] * bn;
      ypre[c] += cn * hn[c];
      if constexpr (kSaveE) en[c] = e;
    }
  }
}

// A transposed to [N][Di]: At[n][c] = -exp(A_log[c][n]).
template <class T>
std::vector<T> make_At(const T* A_log, int Di, int N) {
  std::vector<T> At(size_t(N) * Di);
  for (int c = 0; c < Di; ++c)
    for (int n = 0; n < N; ++n) At[size_t(n) * Di + c] = -std::exp(A_log[size_t(c) * N + n]);
  return At;
}

void check_dims(const SelectiveScanDims& d) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.Di > 0 && d.N > 0, "selective scan: bad dims B={} T={} Di={} N={}", d.B,
             d.T, d.Di, d.N);
  LRNN_CHECK(d.lx() >= d.Di && d.ldt() >= d.Di && d.lz() >= d.Di && d.lbc() >= d.N,
             "selective scan: token strides smaller than rows");
}

}  // namespace

template <class T>
T scan_softplus(T x) { return softplus_(x); }

size_t selective_scan_ckpt_size(const SelectiveScanDims& d) {
  return size_t(d.B) * ((d.T + kScanChunk - 1) / kScanChunk) * d.N * d.Di;
}

template <class T, int NS, EigenRange R>
static void forward_impl(T* y, const SelectiveScanInputs<T>& in, const SelectiveScanDims& d, T* ckpt, T* state) {
  const int Tn = d.T, Di = d.Di, N = NS ? NS : d.N;
  const size_t SS = size_t(N) * Di;
  const int nchunks = (Tn + kScanChunk - 1) / kScanChunk;
  const std::vector<T> At = make_At(in.A_log, Di, N);
#pragma omp parallel if (d.B > 1)  // one sequence: no thread team to wake
  {
    T* h = thread_scratch<T, 20>(SS);
    T* delta = thread_scratch<T, 21>(Di);
    T* u = thread_scratch<T, 22>(Di);
#pragma omp for schedule(static)
    for (int b = 0; b < d.B; ++b) {
      Rows<T> r(in, d, b);
      T* carried = state ? state + size_t(b) * SS : nullptr;
      if (carried) std::copy_n(carried, SS, h);
      else std::fill_n(h, SS, T(0));
      for (int t = 0; t < Tn; ++t) {
        if (ckpt && t % kScanChunk == 0)
          std::copy_n(h, SS, ckpt + (size_t(b) * nchunks + t / kScanChunk) * SS);
        T* yr = y + (size_t(b) * Tn + t) * Di;  // ypre, then gated in place
        scan_step<T, NS, R, false>(h, delta, u, yr, nullptr, At.data(), r.x(t), r.dt(t), in.dt_bias, r.B(t),
                                   r.C(t), in.D, Di, N);
        if (const T* z = r.z(t)) {
#pragma omp simd
          for (int c = 0; c < Di; ++c) yr[c] *= silu(z[c]);
        }
      }
      if (carried) std::copy_n(h, SS, carried);
    }
  }
}

template <class T, int NS, EigenRange R>
static void backward_impl(const SelectiveScanGrads<T>& g, const T* dy, const SelectiveScanInputs<T>& in,
                          const SelectiveScanDims& d, const T* saved) {
  const int Tn = d.T, Di = d.Di, N = NS ? NS : d.N;
  const size_t SS = size_t(N) * Di;
  const int nchunks = (Tn + kScanChunk - 1) / kScanChunk;
  constexpr T s = R == EigenRange::Signed ? T(2) : T(1);  // d abar / d e
  const std::vector<T> At = make_At(in.A_log, Di, N);
  // Per-thread sums over sequences of the per-channel gradients, added in thread order at the
  // end (deterministic for a fixed thread count). dA is with respect to A (layout [N][Di]).
  const int nt = omp_get_max_threads();
  std::vector<T> dA_part(size_t(nt) * SS, T(0)), dD_part(size_t(nt) * Di, T(0)), dbias_part(size_t(nt) * Di, T(0));
  const std::vector<T> zero_bias(Di, T(0));
  const T* zeros = zero_bias.data();
#pragma omp parallel num_threads(nt) if (d.B > 1)
  {
    const int me = omp_get_thread_num();
    T* dA_mine = dA_part.data() + size_t(me) * SS;
    T* dD_mine = dD_part.data() + size_t(me) * Di;
    T* dbias_mine = dbias_part.data() + size_t(me) * Di;
    T* ck = thread_scratch<T, 23>(size_t(nchunks) * SS);        // state at each chunk start
    T* st = thread_scratch<T, 24>((kScanChunk + 1) * SS);       // states of one chunk: st[i] = h before token t0+i
    T* es = thread_scratch<T, 25>(kScanChunk * SS);             // e = exp(delta A) of one chunk
    T* dl = thread_scratch<T, 26>(size_t(kScanChunk) * Di);     // delta of one chunk
    T* yp = thread_scratch<T, 27>(size_t(kScanChunk) * Di);     // ypre of one chunk
    T* dh = thread_scratch<T, 28>(SS);
    T* u = thread_scratch<T, 29>(Di);
    T* gy = thread_scratch<T, 30>(Di);     // d ypre
    T* ddl = thread_scratch<T, 31>(Di);    // d delta
    T* dxs = thread_scratch<T, 32>(Di);    // sum_n dh B
    T* sink = thread_scratch<T, 33>(3 * size_t(Di));
#pragma omp for schedule(static)
    for (int b = 0; b < d.B; ++b) {
      Rows<T> r(in, d, b);
      const size_t row0 = size_t(b) * Tn;
      // Pass 1: states at chunk starts (from the forward when it saved them).
      if (saved) {
        std::copy_n(saved + size_t(b) * nchunks * SS, size_t(nchunks) * SS, ck);
      } else if (nchunks > 0) {
        std::fill_n(ck, SS, T(0));
        for (int c = 0; c + 1 < nchunks; ++c) {
          std::copy_n(ck + c * SS, SS, ck + (c + 1) * SS);
          for (int t = c * kScanChunk; t < (c + 1) * kScanChunk; ++t)
            scan_step<T, NS, R, false>(ck + (c + 1) * SS, dl, u, yp, nullptr, At.data(), r.x(t), r.dt(t),
                                       in.dt_bias, r.B(t), r.C(t), in.D, Di, N);
        }
      }
      // Pass 2: chunks in reverse; recompute the chunk's states, then walk back through it.
      std::fill_n(dh, SS, T(0));
      for (int c = nchunks - 1; c >= 0; --c) {
        const int t0 = c * kScanChunk, t1 = std::min(Tn, t0 + kScanChunk);
        std::copy_n(ck + c * SS, SS, st);
        for (int t = t0; t < t1; ++t) {
          const int i = t - t0;
          std::copy_n(st + i * SS, SS, st + (i + 1) * SS);
          scan_step<T, NS, R, true>(st + (i + 1) * SS, dl + size_t(i) * Di, u, yp + size_t(i) * Di, es + i * SS,
                                    At.data(), r.x(t), r.dt(t), in.dt_bias, r.B(t), r.C(t), in.D, Di, N);
        }
        for (int t = t1 - 1; t >= t0; --t) {
          const int i = t - t0;
          const T* __restrict hpost = st + (i + 1) * SS;
          const T* __restrict hprev = st + i * SS;
          const T* __restrict e = es + i * SS;
          const T* __restrict delta = dl + size_t(i) * Di;
          const T* __restrict ypre = yp + size_t(i) * Di;
          const T* __restrict x = r.x(t);
          const T* __restrict dyr = dy + (row0 + t) * Di;
          const T* __restrict Bt = r.B(t);
          const T* __restrict Ct = r.C(t);
          // Gradients nobody asked for go to a per-thread sink: no branches in the loops.
          T* __restrict dx = g.x ? g.x + (row0 + t) * d.lx() : sink;
          T* __restrict dz = g.z ? g.z + (row0 + t) * d.lz() : sink + Di;
          T* __restrict ddt = g.dt ? g.dt + (row0 + t) * d.ldt() : sink + 2 * Di;
          // y = ypre * silu(z):  dz = dy ypre silu'(z) ; d ypre = dy silu(z)
          if (const T* __restrict z = r.z(t)) {
#pragma omp simd
            for (int k = 0; k < Di; ++k) {
              const T sg = sigmoid(z[k]);
              dz[k] += dyr[k] * ypre[k] * sg * (T(1) + z[k] * (T(1) - sg));
              gy[k] = dyr[k] * z[k] * sg;
            }
          } else {
            std::copy_n(dyr, Di, gy);
          }
          // ypre = C.h + D x
          if (const T* __restrict Dk = in.D) {
#pragma omp simd
            for (int k = 0; k < Di; ++k) {
              dD_mine[k] += gy[k] * x[k];
              dx[k] += gy[k] * Dk[k];
            }
          }
#pragma omp simd
          for (int k = 0; k < Di; ++k) {
            ddl[k] = 0;
            dxs[k] = 0;
            u[k] = delta[k] * x[k];
          }
          for (int n = 0; n < N; ++n) {
            const T bn = Bt[n], cn = Ct[n];
            const T* __restrict hn = hpost + size_t(n) * Di;
            const T* __restrict pn = hprev + size_t(n) * Di;
            const T* __restrict en = e + size_t(n) * Di;
            const T* __restrict An = At.data() + size_t(n) * Di;
            T* __restrict dAn = dA_mine + size_t(n) * Di;
            T* __restrict dhn = dh + size_t(n) * Di;
            T dc = 0, db = 0;
#pragma omp simd reduction(+ : dc, db)
            for (int k = 0; k < Di; ++k) {
              dc += gy[k] * hn[k];
              // h = abar h_prev + u B:  d abar = dh h_prev ; d(delta A) = s e d abar
              const T dhv = dhn[k] + gy[k] * cn;
              const T dda = s * en[k] * dhv * pn[k];
              ddl[k] += dda * An[k] + dhv * bn * x[k];
              dAn[k] += dda * delta[k];
              db += dhv * u[k];
              dxs[k] += dhv * bn;
              const T a = R == EigenRange::Signed ? T(2) * en[k] - T(1) : en[k];
              dhn[k] = dhv * a;
            }
            if (g.C) g.C[(row0 + t) * d.lbc() + n] += dc;
            if (g.B) g.B[(row0 + t) * d.lbc() + n] += db;
          }
          // delta = softplus(dt + bias): d dt = d delta softplus'(dt + bias)
          const T* __restrict dtr = r.dt(t);
          const T* __restrict bias = in.dt_bias ? in.dt_bias : zeros;
#pragma omp simd
          for (int k = 0; k < Di; ++k) {
            dx[k] += delta[k] * dxs[k];
            const T gd = ddl[k] * softplus_grad(dtr[k] + bias[k]);
            ddt[k] += gd;
            dbias_mine[k] += gd;
          }
        }
      }
    }
  }
  // A = -exp(A_log):  dA_log = dA * A.
  if (g.A_log)
    for (int th = 0; th < nt; ++th)
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < Di; ++c)
          g.A_log[size_t(c) * N + n] += dA_part[size_t(th) * SS + size_t(n) * Di + c] * At[size_t(n) * Di + c];
  for (int th = 0; th < nt; ++th)
    for (int c = 0; c < Di; ++c) {
      if (g.D) g.D[c] += dD_part[size_t(th) * Di + c];
      if (g.dt_bias) g.dt_bias[c] += dbias_part[size_t(th) * Di + c];
    }
}

// The single place where the state size and the eigenvalue range become compile-time constants.
#define LRNN_SCAN_DISPATCH(FN, ...)                                                      \
  if (d.range == EigenRange::Signed) {                                                  \
    if (d.N == 16) return FN<T, 16, EigenRange::Signed>(__VA_ARGS__);                   \
    return FN<T, 0, EigenRange::Signed>(__VA_ARGS__);                                   \
  }                                                                                     \
  if (d.N == 16) return FN<T, 16, EigenRange::Unit>(__VA_ARGS__);                       \
  return FN<T, 0, EigenRange::Unit>(__VA_ARGS__);

template <class T>
void selective_scan_forward(T* y, const SelectiveScanInputs<T>& in, const SelectiveScanDims& d, T* ckpt,
                            T* state) {
  check_dims(d);
  LRNN_CHECK(!(ckpt && state), "selective_scan_forward: a carried state is for inference (no checkpoints)");
  LRNN_SCAN_DISPATCH(forward_impl, y, in, d, ckpt, state)
}

template <class T>
void selective_scan_backward(const SelectiveScanGrads<T>& grad, const T* dy, const SelectiveScanInputs<T>& in,
                             const SelectiveScanDims& d, const T* ckpt) {
  check_dims(d);
  LRNN_SCAN_DISPATCH(backward_impl, grad, dy, in, d, ckpt)
}

#define INST(T)                                                                                         \
  template T scan_softplus<T>(T);                                                                       \
  template void selective_scan_forward<T>(T*, const SelectiveScanInputs<T>&, const SelectiveScanDims&,  \
                                          T*, T*);                                                      \
  template void selective_scan_backward<T>(const SelectiveScanGrads<T>&, const T*,                      \
                                           const SelectiveScanInputs<T>&, const SelectiveScanDims&,     \
                                           const T*);
INST(float)
INST(double)
}  // namespace lrnn::ops
