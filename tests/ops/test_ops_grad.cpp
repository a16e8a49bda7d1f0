// Every op's backward against central finite differences in double.
#include <cmath>
#include <cstring>
#include "gradcheck.h"
#include "ops/common/math.h"
#include "ops/adamw/adamw.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/embedding/embedding.h"
#include "ops/l2norm/l2norm.h"
#include "ops/linear/linear.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/short_conv/short_conv.h"
#include "ops/swiglu/swiglu.h"

using namespace lrnn;
using namespace lrnn::ops;
using namespace lrnn::test;

TEST(OpGrad, Linear) {
  const int N = 7, IC = 5, OC = 4;
  auto x = randn(N * IC, 1), W = randn(OC * IC, 2), b = randn(OC, 3);
  GradCase c{{"x", "W", "b"}, {&x, &W, &b}, size_t(N * OC)};
  c.forward = [&](auto& out) { linear_forward(out.data(), x.data(), W.data(), b.data(), N, IC, OC); };
  c.backward = [&](auto& d, auto& g) {
    linear_backward(g[0].data(), g[1].data(), g[2].data(), d.data(), x.data(), W.data(), N, IC, OC);
  };
  run_gradcheck(c);
}

TEST(OpGrad, Embedding) {
  const int N = 9, C = 3, V = 4;
  std::vector<int32_t> tok{0, 1, 3, 3, 2, 0, 1, 1, 3};
  auto W = randn(V * C, 4);
  GradCase c{{"W"}, {&W}, size_t(N * C)};
  c.forward = [&](auto& out) { embedding_forward(out.data(), tok.data(), W.data(), N, C, V); };
  c.backward = [&](auto& d, auto& g) { embedding_backward(g[0].data(), d.data(), tok.data(), N, C, V); };
  run_gradcheck(c);
  std::vector<int32_t> bad{0, 4};
  std::vector<double> out(2 * C);
  EXPECT_THROW(embedding_forward(out.data(), bad.data(), W.data(), 2, C, V), Error);
  std::vector<double> dW(V * C, 0.0);
  EXPECT_THROW(embedding_backward(dW.data(), out.data(), bad.data(), 2, C, V), Error);
}

TEST(OpGrad, RMSNorm) {
  const int N = 6, C = 8;
  auto x = randn(N * C, 5, 2.0), w = randn(C, 6, 0.3, 1.0);
  std::vector<double> rstd(N);
  GradCase c{{"x", "w"}, {&x, &w}, size_t(N * C)};
  c.forward = [&](auto& out) { rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6); };
  c.backward = [&](auto& d, auto& g) {
    rmsnorm_backward(g[0].data(), g[1].data(), d.data(), x.data(), w.data(), rstd.data(), N, C);
  };
  run_gradcheck(c);
}

TEST(OpGrad, RMSNormTinyInputs) {
  // Near-zero rows: eps dominates; the gradient must stay finite and correct.
  const int N = 3, C = 4;
  auto x = randn(N * C, 7, 1e-4), w = randn(C, 8, 0.3, 1.0);
  std::vector<double> rstd(N);
  GradCase c{{"x", "w"}, {&x, &w}, size_t(N * C)};
  c.h = 1e-9;
  c.tol = 1e-5;
  c.forward = [&](auto& out) { rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6); };
  c.backward = [&](auto& d, auto& g) {
    rmsnorm_backward(g[0].data(), g[1].data(), d.data(), x.data(), w.data(), rstd.data(), N, C);
  };
  run_gradcheck(c);
}

TEST(OpGrad, ShortConvSiLU) {
  for (int K : {4, 2, 0}) {
    const int B = 2, T = 9, C = 3;
    auto x = randn(B * T * C, 9), w = randu(C * std::max(K, 1), 10, -0.8, 0.8);
    GradCase c{{"x", "w"}, {&x, &w}, size_t(B * T * C)};
    if (K == 0) c.names.pop_back(), c.inputs.pop_back();
    c.forward = [&](auto& out) { short_conv_forward(out.data(), x.data(), w.data(), B, T, C, K); };
    c.backward = [&](auto& d, auto& g) {
      short_conv_backward(g[0].data(), K ? g[1].data() : nullptr, d.data(), x.data(), w.data(), B, T, C, K);
    };
    SCOPED_TRACE(K);
    run_gradcheck(c);
  }
}

TEST(OpGrad, L2Norm) {
  const int N = 5, D = 6;
  auto x = randn(N * D, 11, 3.0);
  std::vector<double> y(N * D), rstd(N);
  GradCase c{{"x"}, {&x}, size_t(N * D)};
  c.forward = [&](auto& out) { l2norm_forward(out.data(), rstd.data(), x.data(), N, D, 1e-6); y = out; };
  c.backward = [&](auto& d, auto& g) { l2norm_backward(g[0].data(), d.data(), y.data(), rstd.data(), N, D); };
  run_gradcheck(c);
}

TEST(OpGrad, SwiGLU) {
  const int N = 5, I = 8;
  auto a = randn(N * I, 12, 3.0), u = randn(N * I, 13);
  GradCase c{{"gate", "up"}, {&a, &u}, size_t(N * I)};
  c.forward = [&](auto& out) { swiglu_forward(out.data(), a.data(), u.data(), N, I); };
  c.backward = [&](auto& d, auto& g) { swiglu_backward(g[0].data(), g[1].data(), d.data(), a.data(), u.data(), N, I); };
  run_gradcheck(c);
}

TEST(OpGrad, CrossEntropyIgnoreIndex) {
  const int N = 6, V = 5;
  auto x = randn(N * V, 14, 2.0);
  std::vector<int32_t> labels{0, -1, 4, 2, -1, 1};
  GradCase c{{"logits"}, {&x}, 1};
  c.forward = [&](auto& out) { out[0] = cross_entropy_forward<double>(nullptr, x.data(), labels.data(), N, V); };
  c.backward = [&](auto& d, auto& g) {
    std::vector<double> dl(N * V);
    cross_entropy_backward(dl.data(), x.data(), labels.data(), N, V, d[0]);
    for (int i = 0; i < N * V; ++i) g[0][i] += dl[i];
  };
  run_gradcheck(c);
  // Known value: uniform logits give log(V) per counted position.
  std::vector<double> z(N * V, 0.0);
  EXPECT_NEAR(cross_entropy_forward<double>(nullptr, z.data(), labels.data(), N, V), std::log(5.0), 1e-12);
  std::vector<int32_t> none(N, -1);
  EXPECT_EQ(cross_entropy_forward<double>(nullptr, z.data(), none.data(), N, V), 0.0);
}

// ---- delta rule: realistic and extreme regimes ----

struct DeltaInputs {
  DeltaRuleDims d;
  std::vector<double> q, k, v, bl, g;
  bool gated = false;
};

static void normalise_rows(std::vector<double>& x, int D) {
  for (size_t r = 0; r < x.size() / D; ++r) {
    double s = 0;
    for (int i = 0; i < D; ++i) s += x[r * D + i] * x[r * D + i];
    for (int i = 0; i < D; ++i) x[r * D + i] /= std::sqrt(s);
  }
}

static DeltaInputs make_delta(int B, int T, int H, int Dk, int Dv, int nh, EigenRange r, bool gated,
                              uint64_t seed, double beta_logit_mean = 0.0, double g_lo = -3.0,
                              double g_hi = -0.01) {
  DeltaInputs in;
  in.d = {B, T, H, Dk, Dv, nh, r, 0};
  in.q = randn(size_t(B) * T * H * Dk, seed);
  in.k = randn(size_t(B) * T * nh * H * Dk, seed + 1);
  normalise_rows(in.q, Dk);
  normalise_rows(in.k, Dk);
  in.v = randn(size_t(B) * T * nh * H * Dv, seed + 2);
  in.bl = randn(size_t(B) * T * nh * H, seed + 3, 1.5, beta_logit_mean);
  in.gated = gated;
  if (gated) in.g = randu(size_t(B) * T * H, seed + 4, g_lo, g_hi);
  return in;
}

static void check_delta(DeltaInputs& in, double tol = 1e-6) {
  auto& d = in.d;
  GradCase c{{"q", "k", "v", "beta_logit"}, {&in.q, &in.k, &in.v, &in.bl},
             size_t(d.B) * d.T * d.H * d.Dv};
  if (in.gated) c.names.push_back("g"), c.inputs.push_back(&in.g);
  c.tol = tol;
  const double* gp = nullptr;
  c.forward = [&](auto& out) {
    gp = in.gated ? in.g.data() : nullptr;
    delta_rule_forward(out.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), gp, d);
  };
  c.backward = [&](auto& dout, auto& g) {
    delta_rule_backward(g[0].data(), g[1].data(), g[2].data(), g[3].data(),
                        in.gated ? g[4].data() : nullptr, dout.data(), in.q.data(), in.k.data(),
                        in.v.data(), in.bl.data(), in.gated ? in.g.data() : nullptr, d);
  };
  run_gradcheck(c);
}

TEST(DeltaRuleGrad, DeltaNetUnitRange) {
  auto in = make_delta(2, 21, 2, 4, 3, 1, EigenRange::Unit, false, 20);
  check_delta(in);
}
TEST(DeltaRuleGrad, DeltaNetSignedRange) {
  auto in = make_delta(2, 37, 2, 4, 5, 1, EigenRange::Signed, false, 21);
  check_delta(in);
}
TEST(DeltaRuleGrad, BetaSaturatedAtTwo) {
  // logits ~ +30: beta == 2 to double precision, every transition is a reflection.
  auto in = make_delta(1, 33, 2, 4, 4, 1, EigenRange::Signed, false, 22, 30.0);
  check_delta(in);
}
TEST(DeltaRuleGrad, DeltaProductTwoAndThreeSteps) {
  for (int nh : {2, 3}) {
    auto in = make_delta(1, 19, 2, 3, 4, nh, EigenRange::Signed, false, 23 + nh);
    SCOPED_TRACE(nh);
    check_delta(in);
  }
}
TEST(DeltaRuleGrad, GatedNearZeroAndNearMinusTwenty) {
  auto near0 = make_delta(1, 25, 2, 4, 3, 2, EigenRange::Signed, true, 26, 0.0, -1e-3, 0.0);
  check_delta(near0);
  auto deep = make_delta(1, 25, 2, 4, 3, 1, EigenRange::Unit, true, 27, 0.0, -20.0, -15.0);
  check_delta(deep);
}
TEST(DeltaRuleGrad, SeveralHundredSteps) {
  // Long sequence across many backward chunks, reflections included.
  auto in = make_delta(1, 300, 1, 4, 3, 1, EigenRange::Signed, false, 28, 2.0);
  check_delta(in, 2e-6);
}

// The kernel against a plain matrix implementation S_t = a (I - b k k^T)...(I - b k k^T) S + ...
// Head dims 16/32/64/128 take compile-time-specialised loops, others the generic ones: both are
// checked against the explicit matrices.
class DeltaRuleDimsTest : public ::testing::TestWithParam<std::pair<int, int>> {};
INSTANTIATE_TEST_SUITE_P(HeadDims, DeltaRuleDimsTest,
                         ::testing::Values(std::pair{5, 4}, std::pair{16, 16}, std::pair{32, 32}));

TEST_P(DeltaRuleDimsTest, MatchesExplicitHouseholderProducts) {
  const int B = 2, T = 30, H = 3, Dk = GetParam().first, Dv = GetParam().second, nh = 3;
  auto in = make_delta(B, T, H, Dk, Dv, nh, EigenRange::Signed, true, 40);
  std::vector<double> o(size_t(B) * T * H * Dv);
  delta_rule_forward(o.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.g.data(), in.d);
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::vector<double> S(Dk * Dv, 0.0);
      for (int t = 0; t < T; ++t) {
        double a = std::exp(in.g[(b * T + t) * H + h]);
        for (auto& s : S) s *= a;
        for (int j = 0; j < nh; ++j) {
          const double* k = &in.k[(((size_t(b) * T + t) * nh + j) * H + h) * Dk];
          const double* v = &in.v[(((size_t(b) * T + t) * nh + j) * H + h) * Dv];
          double beta = 2.0 / (1.0 + std::exp(-in.bl[((size_t(b) * T + t) * nh + j) * H + h]));
          std::vector<double> N(Dk * Dv, 0.0);  // (I - beta k k^T) S + beta k v^T
          for (int i = 0; i < Dk; ++i)
            for (int c = 0; c < Dv; ++c) {
              double acc = S[i * Dv + c] + beta * k[i] * v[c];
              for (int l = 0; l < Dk; ++l) acc -= beta * k[i] * k[l] * S[l * Dv + c];
              N[i * Dv + c] = acc;
            }
          S = N;
        }
        const double* q = &in.q[((size_t(b) * T + t) * H + h) * Dk];
        for (int c = 0; c < Dv; ++c) {
          double acc = 0;
          for (int i = 0; i < Dk; ++i) acc += q[i] * S[i * Dv + c];
          acc /= std::sqrt(double(Dk));
          worst = std::max(worst, std::abs(acc - o[((size_t(b) * T + t) * H + h) * Dv + c]));
        }
      }
    }
  EXPECT_LT(worst, 1e-12);
}

TEST(DeltaRule, FloatAgreesWithDoubleOverLongReflections) {
  // fp32 state with beta = 2 (orthogonal transitions) stays close to fp64 over 2000 steps.
  auto in = make_delta(1, 2000, 2, 8, 8, 1, EigenRange::Signed, false, 41, 30.0);
  std::vector<double> od(size_t(2000) * 2 * 8);
  delta_rule_forward(od.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), (const double*)nullptr, in.d);
  auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  auto q = f(in.q), k = f(in.k), v = f(in.v), bl = f(in.bl);
  std::vector<float> of(od.size());
  delta_rule_forward(of.data(), q.data(), k.data(), v.data(), bl.data(), (const float*)nullptr, in.d);
  double worst = 0, mag = 0;
  for (size_t i = 0; i < od.size(); ++i) {
    worst = std::max(worst, std::abs(od[i] - of[i]));
    mag = std::max(mag, std::abs(od[i]));
  }
  EXPECT_LT(worst, 1e-3 * mag);
}

// ---- optimizer ----

TEST(AdamW, MatchesTorchFormulaForTwoSteps) {
  std::vector<double> p{1.0, -2.0}, g{0.5, -0.25}, m(2, 0.0), v(2, 0.0);
  std::vector<uint8_t> mask{1, 0};
  AdamWParams a{0.1, 0.9, 0.999, 1e-8, 0.5, 1};
  adamw_update(p.data(), g.data(), m.data(), v.data(), mask.data(), 2, a);
  // step 1: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2 -> update = lr * sign(g) (eps aside)
  EXPECT_NEAR(p[0], 1.0 * (1 - 0.05) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-12);
  EXPECT_NEAR(p[1], -2.0 + 0.1 * 0.25 / (0.25 + 1e-8), 1e-12);
  a.step = 2;
  double p0 = p[0];
  adamw_update(p.data(), g.data(), m.data(), v.data(), mask.data(), 2, a);
  double m2 = 0.9 * 0.05 + 0.1 * 0.5, v2 = 0.999 * 0.001 * 0.25 + 0.001 * 0.25;
  double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.999 * 0.999);
  EXPECT_NEAR(p[0], p0 * 0.95 - 0.1 * mh / (std::sqrt(vh) + 1e-8), 1e-12);
}

TEST(Clip, GlobalNormAndClipFactor) {
  std::vector<double> g{3.0, 4.0};
  double n = global_norm(g.data(), 2);
  EXPECT_DOUBLE_EQ(n, 5.0);
  double f = clip_by_global_norm(g.data(), 2, n, 1.0);
  EXPECT_NEAR(f, 1.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_NEAR(global_norm(g.data(), 2), 1.0, 1e-6);
  EXPECT_EQ(clip_by_global_norm(g.data(), 2, 0.5, 1.0), 1.0);
  std::vector<double> bad{1.0, NAN};
  EXPECT_TRUE(std::isnan(global_norm(bad.data(), 2)));
}

// tree_sum's order is its contract (the CPU ops' sums are deterministic on every machine): lane l
// of 16 adds the terms l, l + 16, ... in turn, then the lanes are added as a tree (l + 8 into l,
// then + 4, + 2, + 1). Checked bit for bit in float against that order written out, at lengths
// around the multiples of 16 (tails of every size), and against the plain sum in double.
TEST(TreeSum, FixedOrderAtEveryLength) {
  for (size_t n : {size_t(0), size_t(1), size_t(5), size_t(15), size_t(16), size_t(17), size_t(31), size_t(32),
                   size_t(33), size_t(100), size_t(1024), size_t(1031)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto xd = randn(n, 40 + n);
    std::vector<float> x(xd.begin(), xd.end());
    float lane[16] = {};
    for (size_t c = 0; c < n; ++c) lane[c % 16] += x[c];
    for (int w = 8; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
    const float got = tree_sum<float>([&](size_t c) { return x[c]; }, n);
    EXPECT_EQ(std::memcmp(&got, &lane[0], sizeof got), 0) << got << " vs " << lane[0];
    double plain = 0;
    for (double v : xd) plain += v;
    EXPECT_NEAR(tree_sum<double>([&](size_t c) { return xd[c]; }, n), plain, 1e-12 * (1.0 + std::sqrt(double(n))));
  }
}

// add_tree_sums16 (sixteen rows' tree_sums at once, their final trees by shuffles) must give each
// row tree_sum's bits: out[r] + f * tree_sum(row r), in float, for rows of 16, 32 and 128 terms with
// a term of the delta rule backward's form (a difference of products), f = 1 and f = 0.37; and in
// double, where it is tree_sum row by row.
TEST(TreeSum, SixteenRowsAtOnceEqualEachRow) {
  for (size_t n : {size_t(16), size_t(32), size_t(128)})
    for (float f : {1.0f, 0.37f}) {
      SCOPED_TRACE("n " + std::to_string(n) + " f " + std::to_string(f));
      const auto ad = randn(16 * n, 7 + n), bd = randn(n, 8 + n), cd = randn(16 * n, 9 + n), ed = randn(n, 10 + n);
      const auto od = randn(16, 11 + n);
      std::vector<float> a(ad.begin(), ad.end()), b(bd.begin(), bd.end()), c(cd.begin(), cd.end()), e(ed.begin(), ed.end());
      auto term = [&](int r, size_t k) { return a[r * n + k] * b[k] - c[r * n + k] * e[k]; };
      std::vector<float> got(od.begin(), od.end()), want(od.begin(), od.end());
      add_tree_sums16<float>(got.data(), f, term, n);
      for (int r = 0; r < 16; ++r) want[r] += f * tree_sum<float>([&](size_t k) { return term(r, k); }, n);
      for (int r = 0; r < 16; ++r) EXPECT_EQ(std::memcmp(&got[r], &want[r], sizeof(float)), 0) << "row " << r << ": " << got[r] << " vs " << want[r];
      std::vector<double> gd(od.begin(), od.end()), wd(od.begin(), od.end());
      auto termd = [&](int r, size_t k) { return ad[r * n + k] * bd[k] - cd[r * n + k] * ed[k]; };
      add_tree_sums16<double>(gd.data(), 0.37, termd, n);
      for (int r = 0; r < 16; ++r) wd[r] += 0.37 * tree_sum<double>([&](size_t k) { return termd(r, k); }, n);
      for (int r = 0; r < 16; ++r) EXPECT_EQ(gd[r], wd[r]);
    }
}

TEST(DeltaRule, BackwardWithForwardCheckpointsEqualsRecompute) {
  auto in = make_delta(2, 53, 2, 4, 3, 2, EigenRange::Signed, true, 50);
  auto& d = in.d;
  std::vector<double> o(size_t(d.B) * d.T * d.H * d.Dv), ck(delta_rule_ckpt_size(d));
  delta_rule_forward(o.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.g.data(), d, ck.data());
  auto dout = randn(o.size(), 51);
  auto grads = [&](const double* saved) {
    std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), db(in.bl.size()), dg(in.g.size());
    delta_rule_backward(dq.data(), dk.data(), dv.data(), db.data(), dg.data(), dout.data(), in.q.data(),
                        in.k.data(), in.v.data(), in.bl.data(), in.g.data(), d, saved);
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    dq.insert(dq.end(), db.begin(), db.end());
    dq.insert(dq.end(), dg.begin(), dg.end());
    return dq;
  };
  EXPECT_EQ(grads(nullptr), grads(ck.data()));
}

TEST(DeltaRuleGrad, SpecialisedHeadDim16) {
  auto in = make_delta(1, 20, 2, 16, 16, 2, EigenRange::Signed, true, 60);
  check_delta(in);
}

// Reading q|k|v|beta out of one wide buffer (token strides) gives what the packed layout gives,
// and gradients land in the same places, with nothing written into the gaps.
TEST(DeltaRule, TokenStridesMatchPackedLayout) {
  const int B = 2, T = 9, H = 2, D = 3;
  auto in = make_delta(B, T, H, D, D, 1, EigenRange::Signed, false, 70);
  auto& d = in.d;
  const int C = H * D, W = 3 * C + H + 1;  // one spare column that must stay untouched
  std::vector<double> wide(size_t(B) * T * W, 0.5);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c) {
      wide[n * W + c] = in.q[n * C + c];
      wide[n * W + C + c] = in.k[n * C + c];
      wide[n * W + 2 * C + c] = in.v[n * C + c];
      if (c < H) wide[n * W + 3 * C + c] = in.bl[n * H + c];
    }
  DeltaRuleDims s = d;
  s.ldq = s.ldk = s.ldv = s.ldb = W;
  std::vector<double> o1(size_t(B) * T * C), o2(o1.size());
  delta_rule_forward(o1.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), (const double*)nullptr, d);
  delta_rule_forward(o2.data(), wide.data(), wide.data() + C, wide.data() + 2 * C, wide.data() + 3 * C,
                     (const double*)nullptr, s);
  EXPECT_EQ(o1, o2);
  auto dout = randn(o1.size(), 71);
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), db(in.bl.size()), dw(wide.size());
  delta_rule_backward(dq.data(), dk.data(), dv.data(), db.data(), (double*)nullptr, dout.data(), in.q.data(),
                      in.k.data(), in.v.data(), in.bl.data(), (const double*)nullptr, d);
  delta_rule_backward(dw.data(), dw.data() + C, dw.data() + 2 * C, dw.data() + 3 * C, (double*)nullptr, dout.data(),
                      wide.data(), wide.data() + C, wide.data() + 2 * C, wide.data() + 3 * C, (const double*)nullptr, s);
  for (int n = 0; n < B * T; ++n) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(dw[n * W + c], dq[n * C + c]);
      EXPECT_EQ(dw[n * W + C + c], dk[n * C + c]);
      EXPECT_EQ(dw[n * W + 2 * C + c], dv[n * C + c]);
    }
    for (int h = 0; h < H; ++h) EXPECT_EQ(dw[n * W + 3 * C + h], db[n * H + h]);
    EXPECT_EQ(dw[n * W + W - 1], 0.0);
  }
}

// accumulate = false writes the gradients (over NaN) exactly as zero-filled + accumulate does,
// and leaves the gaps of a strided layout alone.
TEST(DeltaRule, OverwriteEqualsZeroThenAccumulate) {
  auto in = make_delta(2, 21, 2, 4, 3, 2, EigenRange::Signed, true, 80);
  auto& d = in.d;
  std::vector<double> o(size_t(d.B) * d.T * d.H * d.Dv);
  delta_rule_forward(o.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.g.data(), d);
  const auto dout = randn(o.size(), 81);
  auto grads = [&](double init, bool accumulate) {
    std::vector<double> dq(in.q.size(), init), dk(in.k.size(), init), dv(in.v.size(), init),
        db(in.bl.size(), init), dg(in.g.size(), init);
    delta_rule_backward(dq.data(), dk.data(), dv.data(), db.data(), dg.data(), dout.data(), in.q.data(),
                        in.k.data(), in.v.data(), in.bl.data(), in.g.data(), d, (const double*)nullptr, accumulate);
    for (auto* v : {&dk, &dv, &db, &dg}) dq.insert(dq.end(), v->begin(), v->end());
    return dq;
  };
  const auto want = grads(0.0, true), got = grads(std::nan(""), false);
  EXPECT_EQ(got, want);
  for (double x : want) ASSERT_TRUE(std::isfinite(x));
}
