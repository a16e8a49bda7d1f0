// The overwrite mode of the backward ops (accumulate = false): linear, swiglu, geglu, gated
// RMSNorm and the forget gate, in float and double. For every op, overwriting input gradients
// that start out NaN must give exactly (==, element by element) what zero-filling them and
// accumulating gives — the models drop their zero fills on that promise — while the parameter
// gradients keep accumulating onto what they held. Elements of a strided layout that the op does
// not own (the other columns of a fused row) hold a sentinel and must keep it.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include "gradcheck.h"
#include "ops/forget_gate/forget_gate.h"
#include "ops/gated_rmsnorm/gated_rmsnorm.h"
#include "ops/geglu/geglu.h"
#include "ops/linear/linear.h"
#include "ops/swiglu/swiglu.h"

using namespace lrnn;
using namespace lrnn::ops;

namespace {

template <class T>
std::vector<T> rnd(size_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  auto d = test::randn(n, seed, scale, shift);
  return std::vector<T>(d.begin(), d.end());
}

// Every element equal (==: NaN never is); reports the first that is not.
template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      if (!bad) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at " << first
                     << ": got " << got[first] << ", want " << want[first];
}

// One op's backward: input gradient buffers (with the mask of the elements the op writes) and
// parameter gradient sizes; run(dins, dparams, accumulate) calls the op.
template <class T>
struct Case {
  std::string name;
  std::vector<std::vector<char>> written;  // per input gradient buffer
  std::vector<size_t> param_sizes;
  std::function<void(std::vector<std::vector<T>>&, std::vector<std::vector<T>>&, bool)> run;
};

// A row-major [rows, ld] mask with columns [c0, c1) set.
std::vector<char> cols(int rows, int ld, int c0, int c1) {
  std::vector<char> m(size_t(rows) * ld, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = c0; c < c1; ++c) m[size_t(r) * ld + c] = 1;
  return m;
}
std::vector<char> all(size_t n) { return std::vector<char>(n, 1); }

template <class T>
void check(const Case<T>& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const T nan = std::numeric_limits<T>::quiet_NaN(), sentinel = T(7.25);
  // Input gradients: 0 (reference, accumulate) or NaN (overwrite) where written, the sentinel elsewhere.
  auto inputs = [&](T fill) {
    std::vector<std::vector<T>> v;
    for (const auto& m : c.written) {
      std::vector<T> b(m.size());
      for (size_t i = 0; i < m.size(); ++i) b[i] = m[i] ? fill : sentinel;
      v.push_back(std::move(b));
    }
    return v;
  };
  std::vector<std::vector<T>> p0, pzero;
  for (size_t k = 0; k < c.param_sizes.size(); ++k) {
    p0.push_back(rnd<T>(c.param_sizes[k], seed + 100 + k));
    pzero.emplace_back(c.param_sizes[k], T(0));
  }
  auto ref_in = inputs(T(0)), got_in = inputs(nan), got0_in = inputs(nan);
  auto ref_p = p0, got_p = p0, got0_p = pzero;
  c.run(ref_in, ref_p, true);
  c.run(got_in, got_p, false);
  c.run(got0_in, got0_p, false);
  for (size_t k = 0; k < ref_in.size(); ++k) {
    expect_same(got_in[k], ref_in[k], "input gradient " + std::to_string(k));
    expect_same(got0_in[k], ref_in[k], "input gradient " + std::to_string(k) + " (zero parameter grads)");
    size_t nonzero = 0;
    for (size_t i = 0; i < ref_in[k].size(); ++i) nonzero += c.written[k][i] && ref_in[k][i] != T(0);
    EXPECT_GT(nonzero, 0u) << "input gradient " << k << " is all zero: the case checks nothing";
  }
  for (size_t k = 0; k < ref_p.size(); ++k) {
    // The same prefill and the same arithmetic as the accumulating call...
    expect_same(got_p[k], ref_p[k], "parameter gradient " + std::to_string(k));
    // ... which did accumulate: prefill + what the op adds to zeros.
    const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-10;
    size_t bad = 0, moved = 0;
    for (size_t i = 0; i < ref_p[k].size(); ++i) {
      const double want = double(p0[k][i]) + double(got0_p[k][i]);
      bad += !(std::fabs(double(got_p[k][i]) - want) <= tol * (1 + std::fabs(want)));
      moved += got0_p[k][i] != T(0);
    }
    EXPECT_EQ(bad, 0u) << "parameter gradient " << k << " did not accumulate onto its prefill";
    EXPECT_GT(moved, 0u) << "parameter gradient " << k << " got nothing: the case checks nothing";
  }
}

template <class T>
Case<T> linear_case(int N, int IC, int OC, bool bias, bool with_dW, uint64_t seed) {
  auto x = rnd<T>(size_t(N) * IC, seed), W = rnd<T>(size_t(OC) * IC, seed + 1, 0.3);
  auto dy = rnd<T>(size_t(N) * OC, seed + 2);
  Case<T> c;
  c.name = "linear N=" + std::to_string(N) + " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC) +
           (bias ? " bias" : "") + (with_dW ? "" : " no dW");
  c.written = {all(size_t(N) * IC)};
  if (with_dW) c.param_sizes.push_back(W.size());
  if (bias) c.param_sizes.push_back(size_t(OC));
  c.run = [=](auto& din, auto& dp, bool acc) {
    T* dW = with_dW ? dp[0].data() : nullptr;
    T* db = bias ? dp[with_dW ? 1 : 0].data() : nullptr;
    linear_backward<T>(din[0].data(), dW, db, dy.data(), x.data(), W.data(), N, IC, OC, acc);
  };
  return c;
}

// gate | up: two halves of one [N, ld] buffer (fused, ld >= 2I) or two [N, I] buffers (ld 0).
template <class T, class F>
Case<T> glu_case(const char* name, F backward, int N, int I, int ld, uint64_t seed) {
  const bool fused = ld >= 2 * I;
  const int l = ld ? ld : I;
  auto gate = rnd<T>(size_t(N) * l, seed, 2.0), up = fused ? std::vector<T>() : rnd<T>(size_t(N) * l, seed + 1);
  auto dout = rnd<T>(size_t(N) * I, seed + 2);
  Case<T> c;
  c.name = std::string(name) + " N=" + std::to_string(N) + " I=" + std::to_string(I) + " ld=" + std::to_string(ld);
  if (fused) c.written = {cols(N, l, 0, 2 * I)};
  else c.written = {cols(N, l, 0, I), cols(N, l, 0, I)};
  c.run = [=](auto& din, auto&, bool acc) {
    T* dgate = din[0].data();
    T* dup = fused ? din[0].data() + I : din[1].data();
    const T* upp = fused ? gate.data() + I : up.data();
    backward(dgate, dup, dout.data(), gate.data(), upp, N, I, ld, acc);
  };
  return c;
}

// The gate at column goff of [N, ldg] rows (ldg 0: packed [N, heads*D]).
template <class T>
Case<T> gated_rmsnorm_case(int N, int heads, int D, int ldg, int goff, bool with_dw, uint64_t seed) {
  const size_t R = size_t(N) * heads;
  const int lg = ldg ? ldg : heads * D;
  auto x = rnd<T>(R * D, seed), g = rnd<T>(size_t(N) * lg, seed + 1, 2.0), w = rnd<T>(D, seed + 2, 0.3, 1.0);
  auto dy = rnd<T>(R * D, seed + 3);
  std::vector<T> y(R * D), rstd(R);
  gated_rmsnorm_forward<T>(y.data(), rstd.data(), x.data(), g.data() + goff, w.data(), N, heads, D, 1e-6, ldg);
  Case<T> c;
  c.name = "gated_rmsnorm N=" + std::to_string(N) + " heads=" + std::to_string(heads) + " D=" + std::to_string(D) +
           " ldg=" + std::to_string(ldg) + (with_dw ? "" : " no dw");
  c.written = {all(R * D), cols(N, lg, goff, goff + heads * D)};
  if (with_dw) c.param_sizes = {size_t(D)};
  c.run = [=](auto& din, auto& dp, bool acc) {
    gated_rmsnorm_backward<T>(din[0].data(), din[1].data() + goff, with_dw ? dp[0].data() : nullptr, dy.data(),
                              x.data(), g.data() + goff, w.data(), rstd.data(), N, heads, D, ldg, acc);
  };
  return c;
}

// The logits at column aoff of [N, lda] rows (lda 0: packed [N, H]).
template <class T>
Case<T> forget_gate_case(int N, int H, int lda, int aoff, bool with_sums, uint64_t seed) {
  const int la = lda ? lda : H;
  auto a = rnd<T>(size_t(N) * la, seed, 2.0), A_log = rnd<T>(H, seed + 1, 0.5), dt_bias = rnd<T>(H, seed + 2);
  auto dg = rnd<T>(size_t(N) * H, seed + 3);
  Case<T> c;
  c.name = "forget_gate N=" + std::to_string(N) + " H=" + std::to_string(H) + " lda=" + std::to_string(lda) +
           (with_sums ? "" : " no sums");
  c.written = {cols(N, la, aoff, aoff + H)};
  if (with_sums) c.param_sizes = {size_t(H), size_t(H)};
  c.run = [=](auto& din, auto& dp, bool acc) {
    forget_gate_backward<T>(din[0].data() + aoff, with_sums ? dp[0].data() : nullptr,
                            with_sums ? dp[1].data() : nullptr, dg.data(), a.data() + aoff, A_log.data(),
                            dt_bias.data(), N, H, lda, acc);
  };
  return c;
}

}  // namespace

template <class T>
class Overwrite : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Overwrite, Types);

TYPED_TEST(Overwrite, Linear) {
  using T = TypeParam;
  check(linear_case<T>(7, 5, 4, true, true, 1), 1);
  check(linear_case<T>(37, 19, 23, false, true, 2), 2);
  check(linear_case<T>(37, 19, 23, true, false, 3), 3);     // dW null, dbias accumulates
  check(linear_case<T>(300, 129, 64, false, true, 4), 4);
  check(linear_case<T>(64, 48, 1000, true, true, 5), 5);    // long inner dimension (K-blocked GEMM)
  check(linear_case<T>(2000, 128, 512, false, true, 6), 6);  // the MLP's down projection, a slice of a batch
}

TYPED_TEST(Overwrite, SwiGlu) {
  using T = TypeParam;
  auto op = [](auto... a) { swiglu_backward<T>(a...); };
  check(glu_case<T>("swiglu", op, 9, 6, 0, 10), 10);          // separate buffers
  check(glu_case<T>("swiglu", op, 9, 6, 15, 11), 11);         // fused row, padded
  check(glu_case<T>("swiglu", op, 64, 128, 256, 12), 12);     // the MLP's layout
}

TYPED_TEST(Overwrite, GeGlu) {
  using T = TypeParam;
  auto op = [](auto... a) { geglu_backward<T>(a...); };
  check(glu_case<T>("geglu", op, 9, 6, 0, 20), 20);
  check(glu_case<T>("geglu", op, 33, 19, 41, 21), 21);
  check(glu_case<T>("geglu", op, 64, 128, 256, 22), 22);
}

TYPED_TEST(Overwrite, GatedRmsNorm) {
  using T = TypeParam;
  check(gated_rmsnorm_case<T>(13, 4, 8, 0, 0, true, 30), 30);
  check(gated_rmsnorm_case<T>(13, 4, 8, 0, 0, false, 31), 31);            // dw null
  check(gated_rmsnorm_case<T>(17, 4, 32, 4 * 32 * 5 + 3, 70, true, 32), 32);  // gate inside a fused row
}

TYPED_TEST(Overwrite, ForgetGate) {
  using T = TypeParam;
  check(forget_gate_case<T>(29, 4, 0, 0, true, 40), 40);
  check(forget_gate_case<T>(29, 4, 0, 0, false, 41), 41);  // dA_log, ddt_bias null
  check(forget_gate_case<T>(53, 3, 13, 5, true, 42), 42);  // logits inside a fused row
}
