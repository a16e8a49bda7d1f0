// Exact parity tracker: hand-set weights, loaded into the real DeltaNet LM through its
// public parameter names, that make a 1-layer DeltaNet with eigenvalues in [-1,1]
// (allow_neg_eigval: beta = 2*sigmoid) compute the parity of every prefix, exactly, for 10,000
// steps in fp32 — in-process and through `lrnn predict`. The same weights with eigenvalues in
// [0,1] (beta = sigmoid) cannot, which shows the eigenvalue range is what matters.
//
// The construction (vocab 3: 0 = pad, 1 = bit 0, 2 = bit 1; d = 8, 2 heads of dim 4):
//
// Residual directions: e_A = dim 0 (a constant "bias" direction), e_B = dim 1 (the bit),
// e_C = dim 2 (where the layer writes the parity). Dims 3..7 stay 0.
//
// 1. Embeddings: e(bit 0) = c e_A - a e_B, e(bit 1) = c e_A + a e_B (pad: c e_A). Both bits have
//    the same norm, so attn_norm scales them identically: x1 = r1 (c e_A ± a e_B) with one r1.
// 2. q_proj = k_proj read only e_A, so their pre-activations are the same positive vector
//    kappa_h (entries 5..20) for every token; SiLU is ~identity there and the per-head L2 norm
//    makes q = k = kappa_h/|kappa_h| — one fixed unit vector per head, bitwise the same at every
//    position. v_proj reads only e_A too: v = SiLU(nu_h), a fixed vector (mixed signs).
//    With use_short_conv, every conv kernel is [0, 0, 0, 1]: the identity on the current token.
// 3. b_proj reads e_B with a large weight: the beta logit is +-50, so in fp32 sigmoid is exactly
//    1 for bit 1 and ~1e-22 for bit 0: beta = 2 (bit 1) or 0 (bit 0) with allow_neg_eigval.
// 4. The delta rule, state S (4x4 per head, S_0 = 0): S += beta k (v - S^T k)^T only changes S
//    along k, so S = k r^T for a row r = S^T k, and the update reads
//        r <- r + beta (v - r) = (1 - beta) r + beta v.
//    bit 1 (beta = 2, eigenvalue 1 - beta = -1):  r <- 2v - r   (a reflection through v)
//    bit 0 (beta = 0, eigenvalue 1):              r <- r
//    From r = 0, r alternates between 0 and 2v: r = 2v exactly when the prefix holds an odd
//    number of ones. With beta = sigmoid ([0,1]) bit 1 gives beta = 1 and r <- v: the state
//    forgets everything at every one, so it can only say "a one was seen".
// 5. Readout: o = Dk^-1/2 S^T q = (q.k) r / 2 = r / 2, i.e. 0 (even) or v (odd). The per-head
//    RMSNorm o_norm maps 0 to ~0 and v to the fixed vector w_h = v/sqrt(mean(v^2) + eps); o_proj (row e_C) is
//    m w_h / (H |w_h|^2) per head, so the layer adds m e_C for odd parity and ~0 for even.
// 6. The MLP is switched off (gate, up and down projections all 0), so the final residual is
//    h = c e_A ± a e_B + [odd] m e_C. model.norm rescales h by a positive factor (argmax is
//    invariant to it), and lm_head compares the e_C component against the e_A component:
//        logit_0 = -g x_A,   logit_1 = g x_A / c,   logit_2 = 2 g x_C / m.
//    Even: logit_1 = g r_f > logit_2 = 0 > logit_0.  Odd: logit_2 = 2 g r_f > logit_1 = g r_f.
//    The answer token (parity + 1) wins by g r_f (r_f = model.norm's 1/rms(h)); pad never wins.
//
// fp32 error: q, k, v and beta are bitwise the same at every position of a given bit, so the
// only approximate step is the state update, and it drifts. The key is L2-normalised in fp32, so
// |k|^2 = 1 + delta with delta a few ulps (here -1.6e-7), and the bit-1 update has the eigenvalue
// 1 - beta |k|^2 = -(1 + 2 delta) along k instead of -1: two ones take r to
// (1 + 2 delta)^2 r - 4 delta v, so the even-parity state is not 0 but ~ -2 delta n v after n ones:
// a drift linear in T (~1e-3 |v| after 10,000 steps), not a random walk. (Measured with the delta
// rule alone, in fp32 with and without fused multiply-adds.) The readout must not amplify it:
// o_norm divides o by sqrt(mean(o^2) + eps), and with the default eps = 1e-6 a drift of 1e-3 is
// already far above sqrt(eps), so o_norm blew it up to a full-size -w_h and the even margin lost
// up to 95% of its ideal (max |margin - ideal| 0.60 and 0.96 on the two test rows, where the
// bound is 0.13) in a build without FMA contraction (-O1, the sanitizer build); the FMA build's
// delta happened to be small enough. So the tracker sets norm_eps = 0.1 (a model key; every norm
// uses it and the construction and the ideal margins account for it): o_norm's gain on a near-zero
// o is then at most 1/sqrt(0.1) ~ 3.2 and the drift moves the margin by 2.2e-4 (FMA build) and
// 1.6e-2 (no FMA) of the ideal 6.5, inside the test's 2% bound by 8x. At odd positions r = 2v
// (1 + O(delta T)) and the margin is the ideal one to ~1e-4.
#include <gtest/gtest.h>
#include <cmath>
#include "ops/delta_rule/delta_rule.h"
#include "tracker_util.h"

using namespace lrnn;
using namespace lrnn::tracker;
using namespace lrnn::tracker::parity;

namespace {

constexpr int kD = 8, kH = 2, kDh = 4, kMlp = 8;
constexpr double kBetaLogit = 50.0;  // |b_proj x|: sigmoid saturates in fp32
constexpr double kEps = 0.1;         // norm_eps: bounds o_norm's gain on the drift (see the top)

// Per head: q/k pre-activations (positive, large: SiLU ~ identity) and v pre-activations.
const double kKappa[kH][kDh] = {{10, 20, 15, 5}, {6, 12, 8, 18}};
const double kNu[kH][kDh] = {{3, -1, 2, 1}, {-0.5, 2, 1, 4}};

double silu(double x) { return x / (1 + std::exp(-x)); }

YAML::Node model_block(bool neg_eigval, bool short_conv) {
  YAML::Node b;
  b["model_type"] = "delta_net";
  b["vocab_size"] = kV;
  b["hidden_size"] = kD;
  b["num_hidden_layers"] = 1;
  b["num_heads"] = kH;
  b["allow_neg_eigval"] = neg_eigval;
  b["use_short_conv"] = short_conv;
  b["conv_size"] = 4;
  b["intermediate_size"] = kMlp;
  b["norm_eps"] = kEps;
  return b;
}

// Builds the model from its YAML block (as the CLI does) and overwrites every parameter with the
// tracker's weights (see the comment at the top).
std::unique_ptr<Model<float>> make_tracker(bool neg_eigval, bool short_conv) {
  auto m = create_model<float>(model_block(neg_eigval, short_conv), "tracker", 1);
  std::fill(m->params.begin(), m->params.end(), 0.0f);  // everything not set below is 0
  const std::string p = "model.layers.0.";

  set_embeddings(param(*m, "model.embeddings.weight", {kV, kD}), kD);
  // attn_norm (weight 1) multiplies both bit embeddings by r1 = 1/sqrt(mean(e^2) + eps).
  const double r1 = 1.0 / std::sqrt((kc * kc + ka * ka) / kD + kEps);
  const double xA = kc * r1, xB = ka * r1;  // |components| of x1 along e_A and e_B
  float* an = param(*m, p + "attn_norm.weight", {kD});
  std::fill(an, an + kD, 1.0f);

  float* q = param(*m, p + "attn.q_proj.weight", {kD, kD});
  float* k = param(*m, p + "attn.k_proj.weight", {kD, kD});
  float* v = param(*m, p + "attn.v_proj.weight", {kD, kD});
  float* b = param(*m, p + "attn.b_proj.weight", {kH, kD});
  float* op = param(*m, p + "attn.o_proj.weight", {kD, kD});
  for (int h = 0; h < kH; ++h) {
    // w_h: what o_norm makes of the odd-parity readout o ∝ v = SiLU(nu_h).
    double s[kDh], ss = 0;
    for (int i = 0; i < kDh; ++i) s[i] = silu(kNu[h][i]), ss += s[i] * s[i];
    const double rms = std::sqrt(ss / kDh + kEps), w2 = ss / (rms * rms);  // |w_h|^2
    for (int i = 0; i < kDh; ++i) {
      const int row = h * kDh + i;
      q[row * kD + kA] = k[row * kD + kA] = float(kKappa[h][i] / xA);
      v[row * kD + kA] = float(kNu[h][i] / xA);
      op[kC * kD + row] = float(km / kH * (s[i] / rms) / w2);
    }
    b[h * kD + kB] = float(kBetaLogit / xB);
  }
  if (short_conv)
    for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
      float* w = param(*m, p + "attn." + n + ".weight", {kD, 1, 4});
      for (int c = 0; c < kD; ++c) w[c * 4 + 3] = 1.0f;  // kernel [0, 0, 0, 1]: identity
    }
  float* on = param(*m, p + "attn.o_norm.weight", {kDh});
  std::fill(on, on + kDh, 1.0f);
  float* mn = param(*m, p + "mlp_norm.weight", {kD});
  std::fill(mn, mn + kD, 1.0f);
  // gate_proj, up_proj, down_proj stay 0: the MLP adds exactly 0 to the residual.
  EXPECT_EQ(m->layout().at(p + "mlp.down_proj.weight").shape, (std::vector<int64_t>{kD, kMlp}));
  float* fn = param(*m, "model.norm.weight", {kD});
  std::fill(fn, fn + kD, 1.0f);
  set_head(param(*m, "lm_head.weight", {kV, kD}), kD);
  return m;
}

class ParityTracker : public ::testing::TestWithParam<bool> {};  // param: use_short_conv

TEST_P(ParityTracker, NegativeEigenvaluesTrackParityExactlyFor10kSteps) {
  const bool conv = GetParam();
  auto t0 = std::chrono::steady_clock::now();
  auto m = make_tracker(/*neg_eigval=*/true, conv);
  auto rows = test_rows();
  // The margin is ideal to ~1e-4 at odd positions and within 0.3% at even ones, with or without
  // FMA contraction (see the header): no drift beyond 1%, every margin within 2% of the ideal one.
  check_tracks_parity(forward_rows(*m, rows), rows, even_ideal(kD, kEps), odd_ideal(kD, kEps), /*drift=*/0.99,
                      /*dev=*/0.02, fmt::format("tracker conv={}", int(conv)));
  std::printf("[tracker] conv=%d: build + forward of %dx%d tokens in %.3f s\n", int(conv), int(rows.size()), kSteps,
              seconds_since(t0));
}

// The same through the delta rule's chunked (WY) form: 157 chunks of 64 tokens, each a triangular
// solve whose entries are beta k.k = 2 at every one (reflections): the state the solves rebuild
// must stay as exact as the recurrence's, with the same bounds.
TEST_P(ParityTracker, TracksParityThroughTheChunkedDeltaRule) {
  const bool conv = GetParam();
  ops::set_delta_rule_algorithm(ops::DeltaAlgorithm::Chunked);
  auto m = make_tracker(/*neg_eigval=*/true, conv);
  auto rows = test_rows();
  check_tracks_parity(forward_rows(*m, rows), rows, even_ideal(kD, kEps), odd_ideal(kD, kEps), /*drift=*/0.99,
                      /*dev=*/0.02, fmt::format("chunked tracker conv={}", int(conv)));
  ops::set_delta_rule_algorithm(ops::DeltaAlgorithm::Auto);
}

TEST_P(ParityTracker, SameWeightsWithEigenvaluesInUnitIntervalFail) {
  // beta = sigmoid(+-50) is 1 or 0: bit 1 sets r <- v (eigenvalue 0), so after the first one the
  // model answers "odd" forever — right only about half of the time.
  const bool conv = GetParam();
  auto m = make_tracker(/*neg_eigval=*/false, conv);
  check_fails(*m, fmt::format("tracker conv={}", int(conv)));
}

// Writes a run directory (config.yaml as `lrnn train` writes it, model.safetensors +
// config.json) and checks `lrnn predict` on 10,000 tokens answers the prefix parity everywhere.
TEST_P(ParityTracker, CliPredictTracksParityFor10kTokens) {
  const bool conv = GetParam();
  TempDir dir(fmt::format("lrnn_tracker_{}", int(conv)));
  YAML::Node task;
  task["name"] = "parity";
  write_run(dir.path, task, model_block(/*neg_eigval=*/true, conv), *make_tracker(/*neg_eigval=*/true, conv),
            "tracker test");
  Predictions r;
  ASSERT_NO_FATAL_FAILURE(check_cli_tracks_parity(dir.path, fmt::format("tracker conv={}", int(conv)), &r));
  for (int t = 0; t < kSteps; ++t) ASSERT_EQ(r.positions[t].at("position").get<int>(), t);
}

INSTANTIATE_TEST_SUITE_P(ShortConv, ParityTracker, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "WithShortConv" : "NoShortConv"; });

}  // namespace
