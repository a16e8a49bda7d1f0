// Variable-length sequences packed in one row (delta_rule_forward_varlen / _backward_varlen):
// every sequence against the recurrent reference run on a copy of that sequence alone (outputs,
// every gradient, carried states), through both CPU algorithms; a sequence never sees the one
// packed before it; bad cu_seqlens are refused.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <vector>
#include "gradcheck.h"
#include "ops/delta_rule/delta_rule.h"

using namespace lrnn;
using namespace lrnn::ops;
using lrnn::test::randn;
using lrnn::test::randu;

namespace {

// A packed row of T tokens with token strides wider than the data (a fused projection's rows).
struct Packed {
  DeltaRuleDims d;
  std::vector<int64_t> cu;
  std::vector<double> q, k, v, bl, g, dout;
  bool gated;
  Packed(std::vector<int> lens, int H, int Dk, int Dv, int nh, bool gated_, uint64_t seed) : gated(gated_) {
    cu.push_back(0);
    for (int n : lens) cu.push_back(cu.back() + n);
    d.B = 1, d.T = int(cu.back()), d.H = H, d.Dk = Dk, d.Dv = Dv, d.n_h = nh, d.range = EigenRange::Signed;
    d.ldq = H * Dk + 3, d.ldk = nh * H * Dk + 5, d.ldv = nh * H * Dv + 2, d.ldb = nh * H + 1;
    const size_t T = size_t(d.T);
    q = randn(T * d.lq(), seed);
    k = randn(T * d.lk(), seed + 1);
    v = randn(T * d.lv(), seed + 2);
    bl = randn(T * d.lb(), seed + 3, 2.0);
    if (gated) g = randu(T * H, seed + 4, -3.0, 0.0);
    dout = randn(T * H * Dv, seed + 5);
    for (size_t t = 0; t < T; ++t)  // unit keys, as the models feed them
      for (int j = 0; j < nh * H; ++j) {
        double* x = k.data() + t * d.lk() + size_t(j) * Dk;
        double s = 0;
        for (int i = 0; i < Dk; ++i) s += x[i] * x[i];
        for (int i = 0; i < Dk; ++i) x[i] /= std::sqrt(s);
      }
  }
  int N() const { return int(cu.size()) - 1; }
  const double* gp() const { return gated ? g.data() : nullptr; }
};

struct Grads {
  std::vector<double> o, dq, dk, dv, dbl, dg, state;
};

// Rows [t0, t0 + n) of a token-strided tensor, each `ld` elements.
std::vector<double> rows(const std::vector<double>& x, size_t t0, size_t n, size_t ld) {
  return std::vector<double>(x.begin() + t0 * ld, x.begin() + (t0 + n) * ld);
}

// The packed row through the varlen op (state0: inference from carried states instead).
Grads varlen(const Packed& p, const std::vector<double>* state0 = nullptr) {
  const DeltaRuleDims& d = p.d;
  Grads r;
  r.o.assign(size_t(d.T) * d.H * d.Dv, 0);
  if (state0) {
    r.state = *state0;
    delta_rule_forward_varlen(r.o.data(), p.q.data(), p.k.data(), p.v.data(), p.bl.data(), p.gp(), d, p.cu.data(),
                              p.N(), (double*)nullptr, r.state.data());
    return r;
  }
  std::vector<double> ckpt(delta_rule_varlen_ckpt_size(d, p.cu.data(), p.N()));
  delta_rule_forward_varlen(r.o.data(), p.q.data(), p.k.data(), p.v.data(), p.bl.data(), p.gp(), d, p.cu.data(),
                            p.N(), ckpt.data());
  r.dq.assign(p.q.size(), 7), r.dk.assign(p.k.size(), 7), r.dv.assign(p.v.size(), 7);  // overwritten, not added to
  r.dbl.assign(p.bl.size(), 7), r.dg.assign(p.g.size(), 7);
  delta_rule_backward_varlen(r.dq.data(), r.dk.data(), r.dv.data(), r.dbl.data(), p.gated ? r.dg.data() : nullptr,
                             p.dout.data(), p.q.data(), p.k.data(), p.v.data(), p.bl.data(), p.gp(), d, p.cu.data(),
                             p.N(), ckpt.data(), false);
  return r;
}

// Sequence i copied out on its own (B = 1, packed strides) through the recurrent reference.
Grads alone(const Packed& p, int i, const double* state0 = nullptr) {
  DeltaRuleDims d = p.d;
  const size_t t0 = size_t(p.cu[i]), n = size_t(p.cu[i + 1] - p.cu[i]);
  d.T = int(n);
  const auto q = rows(p.q, t0, n, d.lq()), k = rows(p.k, t0, n, d.lk()), v = rows(p.v, t0, n, d.lv());
  const auto bl = rows(p.bl, t0, n, d.lb()), dout = rows(p.dout, t0, n, size_t(d.H) * d.Dv);
  const auto g = p.gated ? rows(p.g, t0, n, d.H) : std::vector<double>();
  const double* gp = p.gated ? g.data() : nullptr;
  Grads r;
  r.o.assign(n * d.H * d.Dv, 0);
  if (state0) {
    r.state.assign(state0, state0 + size_t(d.H) * d.Dk * d.Dv);
    if (n) delta_rule_forward_recurrent(r.o.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, (double*)nullptr,
                                        r.state.data());
    return r;
  }
  std::vector<double> ckpt(delta_rule_ckpt_size(d));
  delta_rule_forward_recurrent(r.o.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
  r.dq.assign(q.size(), 0), r.dk.assign(k.size(), 0), r.dv.assign(v.size(), 0), r.dbl.assign(bl.size(), 0);
  r.dg.assign(g.size(), 0);
  delta_rule_backward_recurrent(r.dq.data(), r.dk.data(), r.dv.data(), r.dbl.data(), p.gated ? r.dg.data() : nullptr,
                                dout.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
  return r;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Every sequence's slice of the packed results against the sequence run alone. The padding
// columns of the strided gradients (never data) must hold what the overwrite left there: 0 where
// the row was cleared, so they are compared too.
void expect_matches(const Packed& p, const Grads& got, double tol) {
  const DeltaRuleDims& d = p.d;
  for (int i = 0; i < p.N(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    const size_t t0 = size_t(p.cu[i]), n = size_t(p.cu[i + 1] - p.cu[i]);
    const Grads want = alone(p, i);
    EXPECT_LT(max_diff(rows(got.o, t0, n, size_t(d.H) * d.Dv), want.o), tol) << "o";
    auto data_cols = [](std::vector<double> x, size_t ld, size_t cols) {  // zero the padding columns
      for (size_t r = 0; r < x.size() / ld; ++r) std::fill(x.begin() + r * ld + cols, x.begin() + (r + 1) * ld, 0.0);
      return x;
    };
    EXPECT_LT(max_diff(data_cols(rows(got.dq, t0, n, d.lq()), d.lq(), size_t(d.H) * d.Dk),
                       data_cols(want.dq, d.lq(), size_t(d.H) * d.Dk)), tol) << "dq";
    EXPECT_LT(max_diff(data_cols(rows(got.dk, t0, n, d.lk()), d.lk(), size_t(d.n_h) * d.H * d.Dk),
                       data_cols(want.dk, d.lk(), size_t(d.n_h) * d.H * d.Dk)), tol) << "dk";
    EXPECT_LT(max_diff(data_cols(rows(got.dv, t0, n, d.lv()), d.lv(), size_t(d.n_h) * d.H * d.Dv),
                       data_cols(want.dv, d.lv(), size_t(d.n_h) * d.H * d.Dv)), tol) << "dv";
    EXPECT_LT(max_diff(data_cols(rows(got.dbl, t0, n, d.lb()), d.lb(), size_t(d.n_h) * d.H),
                       data_cols(want.dbl, d.lb(), size_t(d.n_h) * d.H)), tol) << "dbeta_logit";
    if (p.gated) {
      EXPECT_LT(max_diff(rows(got.dg, t0, n, d.H), want.dg), tol) << "dg";
    }
  }
}

struct AlgorithmGuard {
  explicit AlgorithmGuard(DeltaAlgorithm a) { set_delta_rule_algorithm(a); }
  ~AlgorithmGuard() { set_delta_rule_algorithm(DeltaAlgorithm::Auto); }
};

}  // namespace

// Lengths that cross the recurrent form's 16-token checkpoints and the chunked form's chunks
// (64 / n_h tokens), with a sequence of one token and an empty one between others.
TEST(DeltaRuleVarlen, EachSequenceAsIfAlone) {
  for (DeltaAlgorithm alg : {DeltaAlgorithm::Recurrent, DeltaAlgorithm::Chunked}) {
    AlgorithmGuard guard(alg);
    for (int nh : {1, 2})
      for (bool gated : {false, true}) {
        SCOPED_TRACE(std::string(alg == DeltaAlgorithm::Chunked ? "chunked" : "recurrent") + " n_h " +
                     std::to_string(nh) + (gated ? " gated" : ""));
        const Packed p({37, 1, 0, 90, 16}, 2, 16, 8, nh, gated, 100 + nh + 10 * gated);
        expect_matches(p, varlen(p), 1e-10);
      }
  }
}

// Changing the first sequence's tokens leaves the second one's outputs and gradients exactly as
// they were, where the same row read as one sequence (no cu_seqlens) carries the state across.
TEST(DeltaRuleVarlen, ASequenceDoesNotSeeTheOneBefore) {
  Packed a({20, 30}, 2, 16, 16, 1, true, 7), b = a;
  for (size_t i = 0; i < size_t(20) * a.d.lv(); ++i) b.v[i] += 0.5;
  const Grads ra = varlen(a), rb = varlen(b);
  const size_t od = size_t(a.d.H) * a.d.Dv;
  EXPECT_EQ(rows(ra.o, 20, 30, od), rows(rb.o, 20, 30, od));
  EXPECT_EQ(rows(ra.dk, 20, 30, a.d.lk()), rows(rb.dk, 20, 30, a.d.lk()));
  EXPECT_EQ(rows(ra.dg, 20, 30, a.d.H), rows(rb.dg, 20, 30, a.d.H));
  EXPECT_GT(max_diff(rows(ra.o, 0, 20, od), rows(rb.o, 0, 20, od)), 1e-3);  // the first one did change
  // Without the boundary the second sequence's outputs do change.
  std::vector<double> oa(ra.o.size()), ob(ra.o.size());
  delta_rule_forward_recurrent(oa.data(), a.q.data(), a.k.data(), a.v.data(), a.bl.data(), a.gp(), a.d);
  delta_rule_forward_recurrent(ob.data(), b.q.data(), b.k.data(), b.v.data(), b.bl.data(), b.gp(), b.d);
  EXPECT_GT(max_diff(rows(oa, 20, 30, od), rows(ob, 20, 30, od)), 1e-3);
}

// Inference: each sequence starts from its own carried state and ends with its final one; an
// empty sequence's state passes through unchanged.
TEST(DeltaRuleVarlen, CarriedStatesPerSequence) {
  const Packed p({25, 0, 70}, 2, 16, 8, 2, true, 11);
  const size_t S = size_t(p.d.H) * p.d.Dk * p.d.Dv;
  const std::vector<double> state0 = randn(3 * S, 99, 0.3);
  for (DeltaAlgorithm alg : {DeltaAlgorithm::Recurrent, DeltaAlgorithm::Chunked}) {
    AlgorithmGuard guard(alg);
    const Grads got = varlen(p, &state0);
    for (int i = 0; i < p.N(); ++i) {
      SCOPED_TRACE(i);
      const Grads want = alone(p, i, state0.data() + i * S);
      const size_t t0 = size_t(p.cu[i]), n = size_t(p.cu[i + 1] - p.cu[i]);
      EXPECT_LT(max_diff(rows(got.o, t0, n, size_t(p.d.H) * p.d.Dv), want.o), 1e-10);
      EXPECT_LT(max_diff(std::vector<double>(got.state.begin() + i * S, got.state.begin() + (i + 1) * S), want.state),
                1e-10);
    }
    EXPECT_EQ(std::vector<double>(got.state.begin() + S, got.state.begin() + 2 * S),
              std::vector<double>(state0.begin() + S, state0.begin() + 2 * S));
  }
}

TEST(DeltaRuleVarlen, RefusesBadOffsets) {
  Packed p({5, 6}, 1, 8, 8, 1, false, 3);
  std::vector<double> o(size_t(p.d.T) * p.d.Dv);
  auto fwd = [&](const DeltaRuleDims& d, const std::vector<int64_t>& cu) {
    delta_rule_forward_varlen(o.data(), p.q.data(), p.k.data(), p.v.data(), p.bl.data(), (const double*)nullptr, d,
                              cu.data(), int(cu.size()) - 1);
  };
  EXPECT_NO_THROW(fwd(p.d, p.cu));
  EXPECT_ANY_THROW(fwd(p.d, {0, 5, 10}));   // does not end at T = 11
  EXPECT_ANY_THROW(fwd(p.d, {1, 5, 11}));   // does not start at 0
  EXPECT_ANY_THROW(fwd(p.d, {0, 7, 5, 11}));  // decreases
  DeltaRuleDims two = p.d;
  two.B = 2;
  EXPECT_ANY_THROW(fwd(two, p.cu));  // not one packed row
}
