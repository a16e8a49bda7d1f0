// The chunked (WY) delta rule on the CPU (ops/delta_rule/delta_rule_chunked_cpu.cpp) against the
// recurrent reference: outputs, final state and every gradient in double on random inputs and the
// hard cases (beta = 2 exactly and beta -> 0, gates at 0 and at -20, T = 1, T not a multiple of the
// chunk, long sequences, head dims 32 to 256 (100 too) with k and v of different widths, n_h =
// 1..4, token strides, a carried initial state); the fp32 error of both forms against fp64 (the
// chunked one within twice the recurrent one's); its checkpoints; and the parity tracker through
// 10^4 tokens of chunks.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "gradcheck.h"
#include "group_trackers.h"
#include "ops/delta_rule/delta_rule.h"

using namespace lrnn;
using namespace lrnn::ops;
using lrnn::test::randn;
using lrnn::test::randu;

namespace {

// Inputs of one case in double; keys L2-normalised per head and sub-step, as the models feed them.
struct Inputs {
  DeltaRuleDims d;
  std::vector<double> q, k, v, bl, g, dout, state;
  bool gated = false;

  Inputs(DeltaRuleDims d_, uint64_t seed, bool gated_, double logit_scale = 2.0, double gate_lo = -3.0,
         double gate_hi = 0.0, int extra_stride = 0)
      : d(d_), gated(gated_) {
    const size_t N = size_t(d.B) * d.T;
    if (extra_stride) {  // rows wider than the data, as a fused projection's
      d.ldq = d.H * d.Dk + extra_stride;
      d.ldk = d.n_h * d.H * d.Dk + extra_stride;
      d.ldv = d.n_h * d.H * d.Dv + extra_stride;
      d.ldb = d.n_h * d.H + extra_stride;
    }
    q = randn(N * d.lq(), seed);
    k = randn(N * d.lk(), seed + 1);
    v = randn(N * d.lv(), seed + 2);
    bl = randn(N * d.lb(), seed + 3, logit_scale);
    if (gated) g = randu(N * d.H, seed + 4, gate_lo, gate_hi);
    dout = randn(N * d.H * d.Dv, seed + 5);
    for (size_t t = 0; t < N; ++t)
      for (int j = 0; j < d.n_h; ++j)
        for (int h = 0; h < d.H; ++h) {
          double* x = k.data() + t * d.lk() + (size_t(j) * d.H + h) * d.Dk;
          double s = 0;
          for (int i = 0; i < d.Dk; ++i) s += x[i] * x[i];
          for (int i = 0; i < d.Dk; ++i) x[i] /= std::sqrt(s);
        }
  }
  const double* gp() const { return gated ? g.data() : nullptr; }
};

struct Result {
  std::vector<double> o, state, dq, dk, dv, dbl, dg;
};

template <class Fwd, class Bwd>
Result run(const Inputs& in, Fwd fwd, Bwd bwd, const std::vector<double>* state0 = nullptr, bool with_ckpt = true) {
  const DeltaRuleDims& d = in.d;
  Result r;
  const size_t N = size_t(d.B) * d.T;
  r.o.assign(N * d.H * d.Dv, 0);
  if (state0) {
    r.state = *state0;
    fwd(r.o.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.gp(), d, nullptr, r.state.data());
    return r;
  }
  std::vector<double> ckpt(delta_rule_ckpt_size(d));
  fwd(r.o.data(), in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.gp(), d, with_ckpt ? ckpt.data() : nullptr,
      nullptr);
  r.dq.assign(in.q.size(), 0);
  r.dk.assign(in.k.size(), 0);
  r.dv.assign(in.v.size(), 0);
  r.dbl.assign(in.bl.size(), 0);
  r.dg.assign(in.g.size(), 0);
  bwd(r.dq.data(), r.dk.data(), r.dv.data(), r.dbl.data(), in.gated ? r.dg.data() : nullptr, in.dout.data(),
      in.q.data(), in.k.data(), in.v.data(), in.bl.data(), in.gp(), d, with_ckpt ? ckpt.data() : nullptr);
  return r;
}

Result chunked(const Inputs& in, const std::vector<double>* s0 = nullptr, bool ckpt = true) {
  return run(in, delta_rule_forward_chunked<double>, delta_rule_backward_chunked<double>, s0, ckpt);
}
Result recurrent(const Inputs& in, const std::vector<double>* s0 = nullptr, bool ckpt = true) {
  return run(in, delta_rule_forward_recurrent<double>, delta_rule_backward_recurrent<double>, s0, ckpt);
}

// max |a - b| / max |b| over a tensor (a tensor that is 0, e.g. the gate gradient of a first token
// that decays a zero state, is compared absolutely)
double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return d / std::max(s, 1e-30);
}

void expect_same(const Inputs& in, const std::string& what, double tol = 1e-10) {
  SCOPED_TRACE(what);
  const Result a = chunked(in), b = recurrent(in);
  EXPECT_LT(rel(a.o, b.o), tol) << "o";
  EXPECT_LT(rel(a.dq, b.dq), tol) << "dq";
  EXPECT_LT(rel(a.dk, b.dk), tol) << "dk";
  EXPECT_LT(rel(a.dv, b.dv), tol) << "dv";
  EXPECT_LT(rel(a.dbl, b.dbl), tol) << "dbeta_logit";
  if (in.gated) {
    EXPECT_LT(rel(a.dg, b.dg), tol) << "dg";
  }
}

DeltaRuleDims dims(int B, int T, int H, int Dk, int Dv, int nh, EigenRange r) {
  DeltaRuleDims d;
  d.B = B; d.T = T; d.H = H; d.Dk = Dk; d.Dv = Dv; d.n_h = nh; d.range = r;
  return d;
}

}  // namespace

TEST(DeltaRuleChunked, MatchesTheRecurrenceInDouble) {
  expect_same(Inputs(dims(2, 64, 2, 32, 32, 1, EigenRange::Unit), 1, false), "one chunk, [0,1]");
  expect_same(Inputs(dims(1, 150, 2, 32, 32, 1, EigenRange::Signed), 2, false), "T = 150 (two and a part), [-1,1]");
  expect_same(Inputs(dims(2, 100, 1, 64, 64, 1, EigenRange::Signed), 3, true), "gated, head dim 64");
  expect_same(Inputs(dims(1, 70, 2, 32, 48, 2, EigenRange::Signed), 4, true), "n_h = 2, Dv != Dk");
  expect_same(Inputs(dims(1, 65, 1, 32, 32, 3, EigenRange::Signed), 5, true), "n_h = 3");
  expect_same(Inputs(dims(1, 40, 1, 32, 32, 4, EigenRange::Signed), 6, true), "n_h = 4, T below a chunk");
  expect_same(Inputs(dims(1, 130, 1, 100, 100, 1, EigenRange::Unit), 7, true), "head dim 100");
  expect_same(Inputs(dims(1, 64, 1, 128, 128, 1, EigenRange::Signed), 8, false), "head dim 128");
  expect_same(Inputs(dims(1, 70, 1, 256, 256, 1, EigenRange::Signed), 17, true), "head dim 256");
  expect_same(Inputs(dims(1, 1, 2, 32, 32, 2, EigenRange::Signed), 9, true), "T = 1");
  expect_same(Inputs(dims(2, 80, 2, 32, 32, 2, EigenRange::Signed), 10, true, 2.0, -3.0, 0.0, 5), "token strides");
}

// beta at the ends of its range (logits of +-40: beta = 2 and 0 to double precision) and gates
// near 0 and at -20 (the decay underflows inside a chunk).
TEST(DeltaRuleChunked, HardCases) {
  expect_same(Inputs(dims(1, 130, 2, 32, 32, 1, EigenRange::Signed), 11, false, 40.0), "beta = 2 or 0");
  expect_same(Inputs(dims(1, 130, 2, 32, 32, 2, EigenRange::Signed), 12, true, 40.0, -1e-6, 0.0), "gates near 0");
  expect_same(Inputs(dims(1, 130, 2, 32, 32, 2, EigenRange::Signed), 13, true, 2.0, -20.0, -20.0), "gates at -20");
  expect_same(Inputs(dims(1, 130, 1, 32, 32, 1, EigenRange::Signed), 14, true, 2.0, -20.0, 0.0), "gates in [-20, 0]");
}

TEST(DeltaRuleChunked, LongSequence) {
  expect_same(Inputs(dims(1, 16384, 1, 32, 32, 1, EigenRange::Signed), 15, true, 2.0, -0.05, 0.0), "T = 16k", 1e-9);
}

// The forward that carries a state (reading a sequence piece by piece) starts from it and leaves
// the final state there; and a backward without the forward's checkpoints recomputes them.
TEST(DeltaRuleChunked, CarriedStateAndCheckpoints) {
  Inputs in(dims(2, 150, 2, 32, 40, 2, EigenRange::Signed), 16, true);
  const std::vector<double> s0 = randn(size_t(2) * 2 * 32 * 40, 99, 0.5);
  const Result a = chunked(in, &s0), b = recurrent(in, &s0);
  EXPECT_LT(rel(a.o, b.o), 1e-10);
  EXPECT_LT(rel(a.state, b.state), 1e-10);
  const Result with = chunked(in, nullptr, true), without = chunked(in, nullptr, false);
  EXPECT_LT(rel(without.dk, with.dk), 1e-12);
  EXPECT_LT(rel(without.dg, with.dg), 1e-12);
}

// The tolerance rule: in fp32 the chunked form's error against the fp64 reference is at most
// twice the recurrent loop's error at the same fp32 inputs (both measured here; the factors are
// printed). The chunked form sums each output over a chunk in BLAS order and solves a triangular
// system whose result is the recurrence's own u vectors (bounded, since every transition has norm
// <= 1 for unit keys), so its error grows with the chunk, not with T.
TEST(DeltaRuleChunked, Fp32ErrorWithinTwiceTheRecurrences) {
  for (int gated = 0; gated < 2; ++gated) {
    Inputs in(dims(2, 300, 2, 64, 64, 2, EigenRange::Signed), 20 + gated, gated, 3.0, -2.0, 0.0);
    const Result ref = recurrent(in);
    auto to_f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    std::vector<float> q = to_f(in.q), k = to_f(in.k), v = to_f(in.v), bl = to_f(in.bl), g = to_f(in.g),
                       dout = to_f(in.dout);
    auto run_f = [&](bool chunk) {
      std::vector<float> o(ref.o.size()), dq(q.size()), dk(k.size()), dv(v.size()), db(bl.size()), dg(g.size());
      std::vector<float> ckpt(delta_rule_ckpt_size(in.d));
      const float* gp = gated ? g.data() : nullptr;
      if (chunk) {
        delta_rule_forward_chunked<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), gp, in.d, ckpt.data());
        delta_rule_backward_chunked<float>(dq.data(), dk.data(), dv.data(), db.data(), gated ? dg.data() : nullptr,
                                           dout.data(), q.data(), k.data(), v.data(), bl.data(), gp, in.d, ckpt.data());
      } else {
        delta_rule_forward_recurrent<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), gp, in.d, ckpt.data());
        delta_rule_backward_recurrent<float>(dq.data(), dk.data(), dv.data(), db.data(), gated ? dg.data() : nullptr,
                                             dout.data(), q.data(), k.data(), v.data(), bl.data(), gp, in.d,
                                             ckpt.data());
      }
      auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
      return std::vector<double>{rel(d(o), ref.o), rel(d(dq), ref.dq), rel(d(dk), ref.dk), rel(d(dv), ref.dv),
                                 rel(d(db), ref.dbl), gated ? rel(d(dg), ref.dg) : 0.0};
    };
    const auto c = run_f(true), r = run_f(false);
    const char* names[] = {"o", "dq", "dk", "dv", "dbeta_logit", "dg"};
    for (size_t i = 0; i < c.size(); ++i) {
      if (!gated && i == 5) continue;
      std::printf("%s %-12s fp32 error: chunked %.2e, recurrent %.2e (factor %.2f)\n", gated ? "gated  " : "ungated",
                  names[i], c[i], r[i], c[i] / r[i]);
      // 2x the recurrent error, with a floor at a few fp32 ulps (some recurrent errors are ~1e-7).
      EXPECT_LE(c[i], std::max(2.0 * r[i], 4e-7)) << names[i];
    }
  }
}

// beta = 2 sigmoid(x) saturates in float from x ~ 17 on (beta = 2 exactly: a reflection), but its
// gradient d beta / dx = beta sigmoid(-x) does not vanish there: both fp32 backward forms must keep
// dbeta_logit within fp32 rounding of the fp64 one. (Formed as beta (1 - sigmoid(x)) it was 0:
// relative error 1.0, which this test gives for that form.)
TEST(DeltaRuleChunked, Fp32BetaGradientAtSaturatedLogits) {
  Inputs in(dims(1, 130, 2, 32, 32, 1, EigenRange::Signed), 23, true, 2.0, -1.0, 0.0);
  in.bl = randu(in.bl.size(), 24, 18.0, 40.0);
  const Result ref = recurrent(in);
  auto to_f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const std::vector<float> q = to_f(in.q), k = to_f(in.k), v = to_f(in.v), bl = to_f(in.bl), g = to_f(in.g),
                           dout = to_f(in.dout);
  for (const bool chunk : {false, true}) {
    SCOPED_TRACE(chunk ? "chunked" : "recurrent");
    std::vector<float> o(ref.o.size()), dq(q.size()), dk(k.size()), dv(v.size()), db(bl.size()), dg(g.size());
    std::vector<float> ckpt(delta_rule_ckpt_size(in.d));
    auto fwd = chunk ? delta_rule_forward_chunked<float> : delta_rule_forward_recurrent<float>;
    auto bwd = chunk ? delta_rule_backward_chunked<float> : delta_rule_backward_recurrent<float>;
    fwd(o.data(), q.data(), k.data(), v.data(), bl.data(), g.data(), in.d, ckpt.data(), nullptr);
    bwd(dq.data(), dk.data(), dv.data(), db.data(), dg.data(), dout.data(), q.data(), k.data(), v.data(), bl.data(),
        g.data(), in.d, ckpt.data());
    const double e = rel(std::vector<double>(db.begin(), db.end()), ref.dbl);
    std::printf("%s dbeta_logit at logits 18-40, fp32: relative error %.2e (max |dbeta_logit| %.2e)\n",
                chunk ? "chunked  " : "recurrent", e, *std::max_element(db.begin(), db.end(), [](float a, float b) {
                  return std::fabs(a) < std::fabs(b);
                }));
    EXPECT_LT(e, 1e-3);
  }
}

// The parity tracker through chunks: one key e_0 for every token, the state starting at e_0 e_0^T,
// values 0, beta = 2 (a reflection: the state's sign flips) for a 1 bit and 0 for a 0 bit. The
// read-out q = e_0 is +-1/sqrt(Dk) with the parity's sign, for 10^4 tokens, in fp32.
TEST(DeltaRuleChunked, ParityTrackerThroughTenThousandTokens) {
  const int T = 10000, D = 32;
  DeltaRuleDims d = dims(1, T, 1, D, D, 1, EigenRange::Signed);
  std::vector<float> q(size_t(T) * D, 0.f), k(size_t(T) * D, 0.f), v(size_t(T) * D, 0.f), bl(T), o(size_t(T) * D);
  Rng r{5, 5};
  std::vector<int> bits(T);
  for (int t = 0; t < T; ++t) {
    q[size_t(t) * D] = 1.f;
    k[size_t(t) * D] = 1.f;
    bits[t] = int(r.u32(uint64_t(t)) & 1u);
    bl[t] = bits[t] ? 40.f : -40.f;  // beta = 2 sigmoid(+-40): 2 and 4e-18
  }
  std::vector<float> state(size_t(D) * D, 0.f);
  state[0] = 1.f;
  delta_rule_forward_chunked<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), nullptr, d, nullptr, state.data());
  int parity = 0, wrong = 0;
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    parity ^= bits[t];
    const double want = (parity ? -1.0 : 1.0) / std::sqrt(double(D));
    worst = std::max(worst, std::abs(double(o[size_t(t) * D]) - want));
    wrong += (o[size_t(t) * D] > 0) != (want > 0);
  }
  std::printf("parity tracker, %d tokens in chunks: %d wrong signs, worst deviation %.2e\n", T, wrong, worst);
  EXPECT_EQ(wrong, 0);
  EXPECT_LT(worst, 1e-3);
}

// delta_rule_forward / delta_rule_backward choose by shape (delta_rule_chunked_pays): the chunked
// form for heads of 128 once a chunk is full, the recurrent loop otherwise (also at head dim 64 with a
// forget gate).
TEST(DeltaRuleChunked, TheOpChoosesByShape) {
  auto same_as = [](const Inputs& in, bool chunk) {
    const Result by_op = run(in, delta_rule_forward<double>,
                             [](double* dq, double* dk, double* dv, double* db, double* dg, const double* dout,
                                const double* q, const double* k, const double* v, const double* bl, const double* g,
                                const DeltaRuleDims& d, const double* ck) {
                               delta_rule_backward<double>(dq, dk, dv, db, dg, dout, q, k, v, bl, g, d, ck);
                             });
    const Result want = chunk ? chunked(in) : recurrent(in);
    return by_op.o == want.o && by_op.dk == want.dk && by_op.dg == want.dg;
  };
  EXPECT_TRUE(same_as(Inputs(dims(1, 64, 1, 128, 128, 1, EigenRange::Signed), 30, false), true));
  EXPECT_TRUE(same_as(Inputs(dims(1, 64, 1, 64, 64, 1, EigenRange::Signed), 31, true), false));
  EXPECT_TRUE(same_as(Inputs(dims(1, 64, 1, 64, 64, 1, EigenRange::Signed), 32, false), false));
  EXPECT_TRUE(same_as(Inputs(dims(1, 63, 1, 128, 128, 1, EigenRange::Signed), 33, false), false));
  EXPECT_TRUE(same_as(Inputs(dims(2, 200, 2, 32, 32, 2, EigenRange::Signed), 34, true), false));
  EXPECT_TRUE(same_as(Inputs(dims(1, 64, 1, 128, 128, 1, EigenRange::Signed), 35, true), true));
  EXPECT_TRUE(delta_rule_chunked_pays(dims(1, 32, 1, 128, 128, 2, EigenRange::Unit)));  // 32 tokens of 2 sub-steps
  EXPECT_EQ(delta_rule_chunk_tokens(1), 64);
  EXPECT_EQ(delta_rule_chunk_tokens(2), 32);
  EXPECT_EQ(delta_rule_chunk_tokens(3), 16);
  EXPECT_EQ(delta_rule_chunk_tokens(8), 16);
}

// The gradient of the exact trackers' last read-out carried back through 10^4 tokens
// (group_trackers.h: every value gradient against the exact reflections' in double), by the
// recurrent loop and the chunked form in fp32. The CUDA kernels are held to the same reference
// (tests/cuda/test_delta_rule_cuda.cpp). Measured on cpu2c (2026-11-28, this CPU's BLAS kernels
// and Haswell's on one thread alike), worst deviation relative to |q|, recurrent / chunked: parity
// 0 / 0, S3 2.7e-6 / 3.8e-4, Z5 as 5-cycles 4.1e-5 / 6.4e-4, S5 6.8e-6 / 5.5e-4, Z5 as rotations
// 3.7e-4 / 3.4e-4 (the chunked form's error is largest at the first events: it adds up backwards
// over the chunks). Bound 3e-3, 4.7x the worst.
TEST(DeltaRuleChunked, ExactTrackersBackwardThroughTenThousandTokens) {
  using lrnn::test::GroupWord;
  std::vector<GroupWord> groups = lrnn::test::exact_trackers();
  groups.push_back(lrnn::test::cyclic5());
  for (const GroupWord& g : groups)
    for (const bool chunked : {false, true}) {
      SCOPED_TRACE(std::string(g.name) + (chunked ? ", chunked" : ", recurrent"));
      const lrnn::test::TrackerInput in = lrnn::test::tracker_input(g, 10000, 32);
      const size_t NE = size_t(in.d.T) * g.n_h, D = size_t(in.d.Dv);
      const std::vector<float> dout = lrnn::test::last_readout_gradient(in);
      std::vector<float> dq(size_t(in.d.T) * D, 0.f), dk(NE * D, 0.f), dv(NE * D, 0.f), db(NE, 0.f);
      auto* backward = chunked ? &lrnn::ops::delta_rule_backward_chunked<float>
                               : &lrnn::ops::delta_rule_backward_recurrent<float>;
      backward(dq.data(), dk.data(), dv.data(), db.data(), nullptr, dout.data(), in.q.data(), in.k.data(),
               in.v.data(), in.bl.data(), nullptr, in.d, nullptr);
      const auto r = lrnn::test::value_gradient_deviation(g, in, dv);
      std::printf("  %s, %s: worst value-gradient deviation %.2e |q| (event %lld of %zu)\n", g.name,
                  chunked ? "chunked" : "recurrent", r.worst, (long long)r.event, NE);
      EXPECT_LT(r.worst, 3e-3);
    }
}
