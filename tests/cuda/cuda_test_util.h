// Shared helpers for the CUDA tests: every test compares a CUDA op or model with the CPU
// reference on the same inputs, and is skipped (not failed) where no GPU is present.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>
#include "core/rng.h"
#include "cuda/runtime.h"

#define LRNN_REQUIRE_GPU()                                                   \
  do {                                                                       \
    if (!::lrnn::cuda::available()) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

namespace lrnn::testing {

// v[i] = f(i) for i < n, over the host's cores when n is large: the generators below are counters
// (value i depends only on seed, stream and i), so the values do not depend on the split. The
// timing cases draw hundreds of millions of values, which on one core took most of each timing
// run (about 2 minutes per pack on the H200 host, where the kernels take seconds).
template <class F>
void fill_parallel(std::vector<float>& v, F&& f) {
  const size_t n = v.size();
  const size_t parts = n < (size_t(1) << 20) ? 1 : std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t p = 1; p < parts; ++p)
    pool.emplace_back([&, p] {
      for (size_t i = n * p / parts; i < n * (p + 1) / parts; ++i) v[i] = f(i);
    });
  for (size_t i = 0; i < n / parts; ++i) v[i] = f(i);
  for (auto& t : pool) t.join();
}

// N(0, scale^2) values from Philox (seed, stream).
inline std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0, uint64_t stream = 0) {
  const Rng r{seed, stream};
  std::vector<float> v(n);
  fill_parallel(v, [&](size_t i) { return float(scale * r.normal(i)); });
  return v;
}
// U(lo, hi) values.
inline std::vector<float> randu(size_t n, uint64_t seed, double lo, double hi, uint64_t stream = 0) {
  const Rng r{seed, stream};
  std::vector<float> v(n);
  fill_parallel(v, [&](size_t i) { return float(lo + (hi - lo) * r.uniform(i)); });
  return v;
}

template <class T>
cuda::Buffer<T> to_device(const std::vector<T>& v) {
  cuda::Buffer<T> b;
  b.upload(v);
  return b;
}

// Every element within atol + rtol * |want|; reports the worst element and how many failed.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(double(got[i]) - double(want[i]));
    double tol = atol + rtol * std::fabs(double(want[i]));
    max_abs = std::max(max_abs, e);
    if (!(e <= tol)) ++bad;  // also catches NaN
    if (!(e - tol <= worst_excess)) worst_excess = e - tol, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; worst at " << worst
                     << ": got " << got[worst] << ", want " << want[worst] << " (max abs error " << max_abs << ")";
}

// expect_close with the tests' usual bound, scaled to the tensor's magnitude: every element
// within tol * max(1, max |want|) + tol * |want|.
inline void near(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  double scale = 1.0;
  for (float x : want) scale = std::max(scale, double(std::fabs(x)));
  expect_close(got, want, tol * scale, tol, what);
}

}  // namespace lrnn::testing
