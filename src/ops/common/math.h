// Scalar helpers shared by the CPU references. Templated so every op also runs in double.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// tree_sum of 16 rows at once: out[r] += f * tree_sum(term(r, ·), n) for r in [0, 16), the same
// sums in the same order (bit for bit), but the rows' final trees are taken together — each level
// adds two vectors of lanes gathered from two rows' partial sums by shuffles — instead of one
// horizontal reduction a row (for rows of 32 floats, those reductions and their round trips
// through the stack were the delta rule backward's largest cost per row under perf). n a multiple
// of 16; float only (other types call tree_sum row by row).
template <class T, class Term>
[[gnu::always_inline]] inline void add_tree_sums16(T* out, T f, Term term, size_t n) {
  if constexpr (!std::is_same_v<T, float>) {
    for (int r = 0; r < 16; ++r) out[r] += f * tree_sum<T>([&](size_t c) { return term(r, c); }, n);
  } else {
    typedef float v16 __attribute__((vector_size(64)));
    v16 v[16];
    for (int r = 0; r < 16; ++r) {
      float p[16] = {};
      for (size_t c = 0; c < n; c += 16) {
#pragma omp simd
        for (int l = 0; l < 16; ++l) p[l] += term(r, c + l);
      }
      std::memcpy(&v[r], p, sizeof p);
    }
    // Level 8: rows 2i | 2i+1, lanes 0-7 each (p[l] + p[l + 8]).
    v16 u[8];
    for (int i = 0; i < 8; ++i)
      u[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
             __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    // Level 4: rows 4i .. 4i+3, four lanes each.
    v16 x[4];
    for (int i = 0; i < 4; ++i)
      x[i] = __builtin_shufflevector(u[2 * i], u[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             __builtin_shufflevector(u[2 * i], u[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    // Level 2: rows 8i .. 8i+7, two lanes each.
    v16 y[2];
    for (int i = 0; i < 2; ++i)
      y[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
             __builtin_shufflevector(x[2 * i], x[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    // Level 1: lane r is row r.
    const v16 z = __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
                  __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    v16 o;
    std::memcpy(&o, out, sizeof o);
    o += f * z;
    std::memcpy(out, &o, sizeof o);
  }
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
