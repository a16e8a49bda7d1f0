// Scalar helpers shared by the CPU references. Templated so every op also runs in double.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lrnn::ops {

// exp that the compiler can vectorise: e^x = 2^k e^r, k = round(x log2 e), r = x - k ln 2 in
// [-ln2/2, ln2/2] (Cody-Waite: ln 2 in two parts, k * kLn2Hi exact for |k| <= 128, so r is
// accurate without a fused multiply-add), e^r by its degree-7 Taylor polynomial (truncation
// < 6e-9). Relative error <= 1e-7 over [-87, 88] with and without FMA contraction (measured:
// 9.9e-8 without, 7.7e-8 with; an earlier base-2 reduction reached 4e-6 at |x| ~ 80 without FMA).
// Used for float only; double keeps std::exp so gradient checks stay exact.
inline float fast_expf(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float k = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (int32_t(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

template <class T> inline T exp_(T x) { return std::exp(x); }
template <> inline float exp_<float>(float x) { return fast_expf(x); }

template <class T> inline T sigmoid(T x) { return T(1) / (T(1) + exp_(-x)); }
template <class T> inline T silu(T x) { return x * sigmoid(x); }
// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)
template <class T> inline T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// sum over c in [0, n) of term(c), in 16 partial sums (lane l takes the terms l, l + 16, ...)
// that are then added as a tree: a fixed order, deterministic on every machine. Written out
// because the compiler keeps a reduction in source order (no -ffast-math): a plain loop is a chain
// of n dependent scalar adds, and even under `omp simd reduction` a short loop that is unrolled
// and vectorised as straight code ends in 16 dependent adds (at head dim 32 that chain per row was
// the delta rule backward's largest cost under perf).
template <class T, class Term>
[[gnu::always_inline]] inline T tree_sum(Term term, size_t n) {
  constexpr int L = 16;
  T p[L] = {};
  size_t c = 0;
  for (; c + L <= n; c += L) {
#pragma omp simd
    for (int l = 0; l < L; ++l) p[l] += term(c + l);
  }
  for (int l = 0; c + l < n; ++l) p[l] += term(c + l);
  for (int w = L / 2; w >= 1; w /= 2) {
#pragma omp simd
    for (int l = 0; l < w; ++l) p[l] += p[l + w];
  }
  return p[0];
}

// Eigenvalue range of a transition: [0,1] (β = σ(·)) or [-1,1] (β = 2σ(·)). One enum, used as a
// parameter by every kernel that has a transition, never as a reason to copy a kernel.
enum class EigenRange { Unit, Signed };
inline double beta_scale(EigenRange r) { return r == EigenRange::Signed ? 2.0 : 1.0; }

}  // namespace lrnn::ops

#include <vector>

namespace lrnn::ops {

// Per-thread scratch memory that only grows, so kernels called every step allocate nothing (and
// take no page faults). Contents are undefined on entry. `Slot` separates buffers of one kernel.
template <class T, int Slot>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace lrnn::ops
