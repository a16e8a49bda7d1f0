// The overwrite mode (accumulate = false) of the rmsnorm, l2norm and short_conv backward (CPU
// reference, float and double): on a dx pre-filled with NaN it must give exactly what a
// zero-filled dx with accumulate = true gives, leave the padding of strided rows alone, and still
// accumulate the parameter gradients (dw, dbias) on top of their previous values.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/rng.h"
#include "ops/l2norm/l2norm.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/short_conv/short_conv.h"

using namespace lrnn;
using namespace lrnn::ops;

namespace {

template <class T>
std::vector<T> randn(size_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Rng r{seed, 91};
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(shift + scale * r.normal(i));
  return v;
}

// Starting dx buffers of `rows` rows of `ld` elements whose first `cols` belong to the op: the
// reference run gets zeros there, the overwrite run NaN; both keep the same random padding.
template <class T>
void starts(std::vector<T>& zero, std::vector<T>& nan, size_t rows, int cols, int ld, uint64_t seed) {
  zero = randn<T>(rows * ld, seed);
  nan = zero;
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      zero[r * ld + c] = T(0);
      nan[r * ld + c] = std::numeric_limits<T>::quiet_NaN();
    }
}

// Element for element equal (NaN never is).
template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at " << first
                     << ": got " << got[first] << ", want " << want[first];
}

// dw after a backward that started from dw0 really added to it: dw - dw0 is the backward's sum.
template <class T>
void expect_accumulated(const std::vector<T>& dw, const std::vector<T>& dw0, const std::vector<T>& from_zero,
                        const std::string& what) {
  ASSERT_EQ(dw.size(), from_zero.size());
  for (size_t i = 0; i < dw.size(); ++i)
    EXPECT_NEAR(double(dw[i]), double(dw0[i]) + double(from_zero[i]), 1e-4 * (1 + std::fabs(double(from_zero[i]))))
        << what << " at " << i;
}

template <class T>
void check_rmsnorm(int N, int C) {
  SCOPED_TRACE("rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C));
  auto x = randn<T>(size_t(N) * C, 1, 1.5), w = randn<T>(C, 2, 0.3, 1.0), dout = randn<T>(size_t(N) * C, 3);
  std::vector<T> out(size_t(N) * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  std::vector<T> dx_ref, dx;
  starts(dx_ref, dx, N, C, C, 4);
  const auto dw0 = randn<T>(C, 5);
  std::vector<T> dw_ref = dw0, dw = dw0, dw_zero(C, T(0));
  rmsnorm_backward(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, true);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, false);
  expect_same(dx, dx_ref, "rmsnorm dx");
  expect_same(dw, dw_ref, "rmsnorm dw");
  // dw still accumulates, and null dw works in overwrite mode.
  std::vector<T> unused, dx2;
  starts(unused, dx2, N, C, C, 4);
  std::vector<T> dx3 = dx2;
  rmsnorm_backward(dx2.data(), dw_zero.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, false);
  expect_same(dx2, dx_ref, "rmsnorm dx (second run)");
  expect_accumulated(dw, dw0, dw_zero, "rmsnorm dw");
  rmsnorm_backward(dx3.data(), static_cast<T*>(nullptr), dout.data(), x.data(), w.data(), rstd.data(), N, C, false);
  expect_same(dx3, dx_ref, "rmsnorm dx (dw null)");
}

template <class T>
void check_l2norm(int N, int D, int heads, int ldx, int ldy) {
  SCOPED_TRACE("l2norm N=" + std::to_string(N) + " D=" + std::to_string(D) + " heads=" + std::to_string(heads) +
               " ldx=" + std::to_string(ldx) + " ldy=" + std::to_string(ldy));
  const int lx = ldx ? ldx : heads * D, ly = ldy ? ldy : heads * D;
  auto x = randn<T>(size_t(N) * lx, 11, 2.0), dy = randn<T>(size_t(N) * ly, 12);
  std::vector<T> y = randn<T>(size_t(N) * ly, 13), rstd(size_t(N) * heads);
  l2norm_forward(y.data(), rstd.data(), x.data(), N, D, 1e-6, heads, ldx, ldy);
  std::vector<T> dx_ref, dx;
  starts(dx_ref, dx, N, heads * D, lx, 14);
  l2norm_backward(dx_ref.data(), dy.data(), y.data(), rstd.data(), N, D, heads, ldx, ldy, true);
  l2norm_backward(dx.data(), dy.data(), y.data(), rstd.data(), N, D, heads, ldx, ldy, false);
  expect_same(dx, dx_ref, "l2norm dx");
}

template <class T>
void check_short_conv(int B, int T_, int C, int K, int ldx, int ldo, bool with_bias) {
  SCOPED_TRACE("short_conv B=" + std::to_string(B) + " T=" + std::to_string(T_) + " C=" + std::to_string(C) +
               " K=" + std::to_string(K) + " ldx=" + std::to_string(ldx) + " ldo=" + std::to_string(ldo) +
               " bias=" + std::to_string(with_bias));
  const int lx = ldx ? ldx : C, lo = ldo ? ldo : C;
  const size_t N = size_t(B) * T_;
  auto x = randn<T>(N * lx, 21, 1.5), dout = randn<T>(N * lo, 22);
  auto w = randn<T>(size_t(C) * std::max(K, 1), 23, 0.7), bias = randn<T>(C, 24, 0.5);
  const T* wp = K ? w.data() : nullptr;
  const T* bp = with_bias ? bias.data() : nullptr;
  std::vector<T> dx_ref, dx;
  starts(dx_ref, dx, N, C, lx, 25);
  const auto dw0 = randn<T>(size_t(C) * K, 26), db0 = randn<T>(C, 27);
  std::vector<T> dw_ref = dw0, dw = dw0, db_ref = db0, db = db0;
  T* dbr = with_bias ? db_ref.data() : nullptr;
  T* dbp = with_bias ? db.data() : nullptr;
  short_conv_backward(dx_ref.data(), K ? dw_ref.data() : nullptr, dout.data(), x.data(), wp, B, T_, C, K, ldx, ldo,
                      bp, dbr, true);
  short_conv_backward(dx.data(), K ? dw.data() : nullptr, dout.data(), x.data(), wp, B, T_, C, K, ldx, ldo, bp, dbp,
                      false);
  expect_same(dx, dx_ref, "short_conv dx");
  expect_same(dw, dw_ref, "short_conv dw");
  expect_same(db, db_ref, "short_conv dbias");
  // dw / dbias still accumulate on top of their previous values.
  std::vector<T> unused, dx3, dw_zero(size_t(C) * K, T(0)), db_zero(C, T(0));
  starts(unused, dx3, N, C, lx, 25);  // the same padding as dx_ref
  short_conv_backward(dx3.data(), K ? dw_zero.data() : nullptr, dout.data(), x.data(), wp, B, T_, C, K, ldx, ldo,
                      bp, with_bias ? db_zero.data() : nullptr, false);
  expect_same(dx3, dx_ref, "short_conv dx (second run)");
  if (K) expect_accumulated(dw, dw0, dw_zero, "short_conv dw");
  if (with_bias) expect_accumulated(db, db0, db_zero, "short_conv dbias");
}

template <class T>
class Overwrite : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Overwrite, Types);

TYPED_TEST(Overwrite, RmsNorm) {
  check_rmsnorm<TypeParam>(37, 128);
  check_rmsnorm<TypeParam>(50, 32);
  check_rmsnorm<TypeParam>(9, 129);
  check_rmsnorm<TypeParam>(1, 5);
}

TYPED_TEST(Overwrite, L2Norm) {
  check_l2norm<TypeParam>(23, 32, 8, 384, 256);  // the benchmark's q|k in a fused q|k|v row
  check_l2norm<TypeParam>(17, 32, 4, 0, 0);
  check_l2norm<TypeParam>(9, 33, 3, 3 * 33 + 5, 0);
}

TYPED_TEST(Overwrite, ShortConv) {
  check_short_conv<TypeParam>(3, 40, 48, 4, 52, 48, false);  // the benchmark's layout, narrower
  for (int K : {0, 1, 3, 4, 9}) {
    check_short_conv<TypeParam>(2, 9, 7, K, 0, 0, true);
    check_short_conv<TypeParam>(2, 70, 12, K, 15, 13, true);  // strided, T > 64
    check_short_conv<TypeParam>(3, 1, 5, K, 0, 0, false);     // T = 1
  }
  check_short_conv<TypeParam>(2, 3, 6, 5, 0, 0, true);  // T < K
}

}  // namespace
