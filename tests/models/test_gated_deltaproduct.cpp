// (Gated) DeltaProduct and Gated DeltaNet LMs: fla's parameter table, init, whole-model
// finite-difference gradients in double for every switch, causality, equivalence with DeltaNet
// at n_h = 1 without gates, and config errors.
#include <gtest/gtest.h>
#include <cmath>
#include "core/rng.h"
#include "model_test_util.h"
#include "models/deltanet.h"
#include "models/gated_deltaproduct.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

std::unique_ptr<Model<double>> tiny(const std::string& type, const std::string& extra, uint64_t seed = 3) {
  auto block = YAML::Load("{model_type: " + type + ", vocab_size: 5, hidden_size: 8, num_hidden_layers: 2,"
                          " num_heads: 2, head_dim: 3, intermediate_size: 12, initializer_range: 0.5" + extra + "}");
  return jittered(block, seed, 0.2);  // norm weights away from 1 and larger projections
}

}  // namespace

TEST(GatedDeltaProduct, ParameterTableFollowsFla) {
  // n_h = 3, both gates, short conv, expand_v 2: every tensor under fla's name and shape.
  auto m = create_model<float>(YAML::Load("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 64,"
                                          " num_hidden_layers: 2, num_heads: 4, head_dim: 16, expand_v: 2,"
                                          " num_householder: 3, use_forget_gate: true, use_output_gate: true}"),
                               "test", 0);
  const auto& L = m->layout();
  const std::string p = "model.layers.1.attn.";
  using S = std::vector<int64_t>;
  EXPECT_EQ(L.at(p + "q_proj.weight").shape, (S{64, 64}));
  EXPECT_EQ(L.at(p + "k_proj.weight").shape, (S{3 * 64, 64}));
  EXPECT_EQ(L.at(p + "v_proj.weight").shape, (S{3 * 128, 64}));
  EXPECT_EQ(L.at(p + "b_proj.weight").shape, (S{3 * 4, 64}));
  EXPECT_EQ(L.at(p + "a_proj.weight").shape, (S{4, 64}));
  EXPECT_EQ(L.at(p + "g_proj.weight").shape, (S{128, 64}));
  EXPECT_EQ(L.at(p + "A_log").shape, (S{4}));
  EXPECT_EQ(L.at(p + "dt_bias").shape, (S{4}));
  EXPECT_EQ(L.at(p + "q_conv1d.weight").shape, (S{64, 1, 4}));
  EXPECT_EQ(L.at(p + "k_conv1d.weight").shape, (S{3 * 64, 1, 4}));
  EXPECT_EQ(L.at(p + "v_conv1d.weight").shape, (S{3 * 128, 1, 4}));
  EXPECT_EQ(L.at(p + "o_norm.weight").shape, (S{32}));
  EXPECT_EQ(L.at(p + "o_proj.weight").shape, (S{64, 128}));
  EXPECT_EQ(L.at("model.layers.0.mlp.gate_proj.weight").shape, (S{256, 64}));
  EXPECT_FALSE(L.at(p + "A_log").weight_decay);
  EXPECT_FALSE(L.at(p + "dt_bias").weight_decay);
  EXPECT_FALSE(L.at(p + "o_norm.weight").weight_decay);
  EXPECT_TRUE(L.at(p + "a_proj.weight").weight_decay);
  // Per layer: q,k,v,b,a,g,o projections + A_log, dt_bias + convs + 3 norms + MLP.
  const size_t d = 64, Kd = 64, Vd = 128, H = 4, n = 3, I = 256, V = 7;
  const size_t layer = d * (Kd + n * Kd + n * Vd + n * H + H + Vd) + Vd * d + 2 * H + 4 * (Kd + n * Kd + n * Vd) +
                       2 * d + Vd / H + 3 * I * d;
  EXPECT_EQ(L.count(), 2 * V * d + d + 2 * layer);
  auto j = m->hf_config();
  EXPECT_EQ(j["model_type"], "gated_deltaproduct");
  EXPECT_EQ(j["architectures"][0], "GatedDeltaProductForCausalLM");
  EXPECT_EQ(j["num_householder"], 3);
  EXPECT_EQ(j["use_forget_gate"], true);
  EXPECT_EQ(j["use_output_gate"], true);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["expand_v"], 2.0);
}

TEST(GatedDeltaProduct, P2StateTrackingModelHasNoGateOrConvTensors) {
  auto m = create_model<float>(YAML::Load("{model_type: gated_deltaproduct, vocab_size: 6, num_householder: 2,"
                                          " allow_neg_eigval: true, use_short_conv: false, use_forget_gate: false,"
                                          " use_output_gate: false}"),
                               "test", 0);
  const auto& L = m->layout();
  for (const char* t : {"a_proj.weight", "g_proj.weight", "A_log", "dt_bias", "q_conv1d.weight"})
    EXPECT_EQ(L.find(std::string("model.layers.0.attn.") + t), nullptr) << t;
  EXPECT_EQ(L.at("model.layers.0.attn.k_proj.weight").shape, (std::vector<int64_t>{2 * 256, 128}));
  EXPECT_EQ(L.at("model.layers.0.attn.b_proj.weight").shape, (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(L.find("model.layers.1.attn_norm.weight"), nullptr);  // one layer
}

TEST(GatedDeltaNet, ParameterTableAndConfigFollowFla) {
  auto m = create_model<float>(YAML::Load("{model_type: gated_deltanet, vocab_size: 5, hidden_size: 32, num_heads: 2,"
                                          " head_dim: 8, expand_v: 2}"),
                               "test", 0);
  const auto& L = m->layout();
  const std::string p = "model.layers.0.attn.";
  using S = std::vector<int64_t>;
  EXPECT_EQ(L.at(p + "k_proj.weight").shape, (S{16, 32}));
  EXPECT_EQ(L.at(p + "v_proj.weight").shape, (S{32, 32}));
  EXPECT_EQ(L.at(p + "b_proj.weight").shape, (S{2, 32}));
  EXPECT_EQ(L.at(p + "a_proj.weight").shape, (S{2, 32}));
  EXPECT_EQ(L.at(p + "g_proj.weight").shape, (S{32, 32}));  // use_gate defaults to true, as in fla
  EXPECT_EQ(L.at(p + "A_log").shape, (S{2}));
  auto j = m->hf_config();
  EXPECT_EQ(j["model_type"], "gated_deltanet");
  EXPECT_EQ(j["architectures"][0], "GatedDeltaNetForCausalLM");
  EXPECT_EQ(j["use_gate"], true);
  EXPECT_TRUE(j["num_v_heads"].is_null());
  EXPECT_FALSE(j.contains("num_householder"));
  auto r = m->resolved_config();
  EXPECT_EQ(r["model_type"].as<std::string>(), "gated_deltanet");
  EXPECT_EQ(r["head_dim"].as<int>(), 8);
}

TEST(GatedDeltaProduct, InitFollowsFla) {
  // A_log = log U(0,16], dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]; projections
  // xavier_uniform with gain 2^-2.5.
  auto m = create_model<float>(YAML::Load("{model_type: gated_deltaproduct, vocab_size: 3, num_heads: 64, head_dim: 2,"
                                          " num_householder: 2, use_forget_gate: true}"),
                               "test", 11);
  auto vals = [&](const std::string& n) {
    auto& e = m->layout().at(n);
    return std::vector<double>(m->params.begin() + e.offset, m->params.begin() + e.offset + e.numel);
  };
  double lo = 1e9, hi = -1e9;
  for (double a : vals("model.layers.0.attn.A_log")) lo = std::min(lo, a), hi = std::max(hi, a);
  EXPECT_LE(hi, std::log(16.0) + 1e-6);
  EXPECT_GT(hi, std::log(12.0));  // 64 draws of U(0,16]: the largest is near 16
  EXPECT_LT(lo, std::log(2.0));
  for (double b : vals("model.layers.0.attn.dt_bias")) {
    double dt = std::log1p(std::exp(b));  // softplus
    EXPECT_GE(dt, 1e-3 * (1 - 1e-5));
    EXPECT_LE(dt, 1e-1 * (1 + 1e-5));
  }
  // xavier bound 2^-2.5 * sqrt(6 / (fan_in + fan_out)) over the whole fused matrix (fla's layer:
  // k_proj [2*64*2, 128]); householder_init: per_step takes each sub-step's block (k_proj: 2
  // blocks of [64*2, 128]; b_proj: 2 of [64, 128]), as the DeltaProduct authors' code initialises
  // its separate projections.
  auto max_abs = [&](const std::string& n) {
    double mx = 0;
    for (double w : vals(n)) mx = std::max(mx, std::abs(w));
    return mx;
  };
  const double gain = std::pow(2.0, -2.5);
  const double fused = gain * std::sqrt(6.0 / (128 + 256)), mx = max_abs("model.layers.0.attn.k_proj.weight");
  EXPECT_LE(mx, fused * (1 + 1e-6));
  EXPECT_GT(mx, 0.95 * fused);
  m = create_model<float>(YAML::Load("{model_type: gated_deltaproduct, vocab_size: 3, num_heads: 64, head_dim: 2,"
                                     " num_householder: 2, use_forget_gate: true, householder_init: per_step}"),
                          "test", 11);
  for (auto [name, block_rows] : {std::pair{"k_proj", 128}, {"b_proj", 64}, {"q_proj", 128}}) {
    const double bound = gain * std::sqrt(6.0 / (128 + block_rows));
    const double got = max_abs(fmt::format("model.layers.0.attn.{}.weight", name));
    EXPECT_LE(got, bound * (1 + 1e-6)) << name;
    EXPECT_GT(got, 0.95 * bound) << name;
  }
}

struct GradCaseParam {
  const char* name;
  const char* type;
  const char* extra;
};

class WholeModelGrad : public ::testing::TestWithParam<GradCaseParam> {};

TEST_P(WholeModelGrad, MatchesFiniteDifferences) {
  auto m = tiny(GetParam().type, GetParam().extra);
  // Fourth-order central differences: the forget gate's exp(A_log) gives large higher
  // derivatives, which the plain 2-point stencil would mistake for gradient errors.
  std::string where;
  double worst = whole_model_fd_error(*m, 2, 7, &where, /*fourth_order=*/true);
  EXPECT_LT(worst, 1e-5) << "worst at " << where;
}

INSTANTIATE_TEST_SUITE_P(
    Switches, WholeModelGrad,
    ::testing::Values(
        GradCaseParam{"ProductTwoBothGatesConv", "gated_deltaproduct",
                      ", num_householder: 2, use_forget_gate: true, use_output_gate: true, allow_neg_eigval: true"},
        GradCaseParam{"ProductThreeSignedConvNoGates", "gated_deltaproduct",
                      ", num_householder: 3, allow_neg_eigval: true, use_output_gate: false"},
        GradCaseParam{"ProductTwoUnitNoConvExpandV", "gated_deltaproduct",
                      ", num_householder: 2, use_short_conv: false, expand_v: 2, use_forget_gate: true,"
                      " use_output_gate: false"},
        GradCaseParam{"GatedDeltaNet", "gated_deltanet", ", allow_neg_eigval: true"},
        GradCaseParam{"GatedDeltaNetNoOutputGateNoConv", "gated_deltanet", ", use_gate: false, use_short_conv: false"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GatedDeltaProduct, CausalAndBatchIndependent) {
  check_causal(*tiny("gated_deltaproduct", ", num_householder: 2, use_forget_gate: true, allow_neg_eigval: true"));
}

// With one sub-step, no gates and head_dim = hidden_size / num_heads, DeltaProduct is DeltaNet:
// the same tensors under the same names give the same logits and gradients.
TEST(GatedDeltaProduct, OneStepWithoutGatesIsDeltaNet) {
  for (bool conv : {true, false}) {
    SCOPED_TRACE(conv);
    std::string common = std::string(", vocab_size: 5, hidden_size: 8, num_hidden_layers: 2, num_heads: 2,"
                                     " intermediate_size: 12, allow_neg_eigval: true, use_short_conv: ") +
                         (conv ? "true" : "false") + "}";
    auto dn = create_model<double>(YAML::Load("{model_type: delta_net" + common), "t", 4);
    auto dp = create_model<double>(
        YAML::Load("{model_type: gated_deltaproduct, head_dim: 4, num_householder: 1, use_output_gate: false" + common),
        "t", 99);
    ASSERT_EQ(dn->layout().count(), dp->layout().count());
    Rng r{8, 1};
    for (auto& e : dn->layout().entries()) {
      auto& f = dp->layout().at(e.name);
      ASSERT_EQ(f.shape, e.shape) << e.name;
      for (size_t i = 0; i < e.numel; ++i) dn->params[e.offset + i] += 0.3 * r.normal(e.offset + i);
      for (size_t i = 0; i < e.numel; ++i) dp->params[f.offset + i] = dn->params[e.offset + i];
    }
    std::vector<int32_t> tok{1, 2, 3, 4, 0, 1, 2, 3, 4, 4, 4, 1, 2, 0, 0, 1}, lab{2, 3, -1, 0, 1, 1, 4, 2, 0, 1, 2, 3, -1, 4, 0, 1};
    std::fill(dn->grads.begin(), dn->grads.end(), 0.0);
    std::fill(dp->grads.begin(), dp->grads.end(), 0.0);
    EXPECT_EQ(dn->forward(tok.data(), lab.data(), 2, 8), dp->forward(tok.data(), lab.data(), 2, 8));
    for (int i = 0; i < 2 * 8 * 5; ++i) EXPECT_EQ(dn->logits()[i], dp->logits()[i]);
    dn->backward();
    dp->backward();
    for (auto& e : dn->layout().entries()) {
      auto& f = dp->layout().at(e.name);
      for (size_t i = 0; i < e.numel; ++i) EXPECT_EQ(dn->grads[e.offset + i], dp->grads[f.offset + i]) << e.name;
    }
  }
}

TEST(GatedDeltaProduct, RejectsBadConfig) {
  auto bad = [](const std::string& y) { return create_model<float>(YAML::Load(y), "cfg.yaml", 0); };
  EXPECT_THROW(bad("{model_type: gated_deltaproduct, num_householder: 0}"), UserError);
  EXPECT_THROW(bad("{model_type: gated_deltaproduct, expand_v: 0.3}"), UserError);  // 32 * 0.3 not an integer
  EXPECT_THROW(bad("{model_type: gated_deltaproduct, use_gate: true}"), UserError);  // that is gated_deltanet's key
  EXPECT_THROW(bad("{model_type: gated_deltanet, num_householder: 2}"), UserError);
  EXPECT_THROW(bad("{model_type: gated_deltanet, use_forget_gate: false}"), UserError);
  try {
    bad("{model_type: gated_deltaproduct, expand_v: 0.3}");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.yaml: model.expand_v"), std::string::npos) << e.what();
  }
}
