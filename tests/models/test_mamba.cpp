// Mamba LM: HF parameter table, initialisation, whole-model finite-difference gradient check in
// double (both eigenvalue ranges), causality, config errors.
#include <gtest/gtest.h>
#include <cmath>
#include "model_test_util.h"
#include "models/mamba.h"
#include "ops/selective_scan/selective_scan.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

YAML::Node p1_block() {
  return YAML::Load("{model_type: mamba, vocab_size: 3, hidden_size: 128, state_size: 16, num_hidden_layers: 2,"
                    " expand: 2, conv_kernel: 4}");
}

std::unique_ptr<Model<double>> tiny(const std::string& extra, uint64_t seed = 3) {
  auto block = YAML::Load("{model_type: mamba, vocab_size: 5, hidden_size: 8, state_size: 4, num_hidden_layers: 2,"
                          " expand: 2, conv_kernel: 3, time_step_rank: 2, initializer_range: 0.5" + extra + "}");
  return jittered(block, seed, 0.2);  // norm weights, D, biases away from their init values
}

}  // namespace

TEST(Mamba, ParameterTableOfP1Model) {
  auto m = create_model<float>(p1_block(), "test", 0);
  const auto& L = m->layout();
  // per layer: norm 128 + in_proj 512x128 + conv 256x1x4 + conv bias 256 + x_proj 40x256
  // + dt_proj 256x8 + dt bias 256 + A_log 256x16 + D 256 + out_proj 128x256 = 116,608
  EXPECT_EQ(L.count(), 2u * 116608 + 3 * 128 + 128 + 3 * 128);
  using S = std::vector<int64_t>;
  EXPECT_EQ(L.at("backbone.embeddings.weight").shape, (S{3, 128}));
  EXPECT_EQ(L.at("backbone.layers.1.norm.weight").shape, (S{128}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.in_proj.weight").shape, (S{512, 128}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.conv1d.weight").shape, (S{256, 1, 4}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.conv1d.bias").shape, (S{256}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.x_proj.weight").shape, (S{8 + 2 * 16, 256}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.dt_proj.weight").shape, (S{256, 8}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.dt_proj.bias").shape, (S{256}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.A_log").shape, (S{256, 16}));
  EXPECT_EQ(L.at("backbone.layers.0.mixer.D").shape, (S{256}));
  EXPECT_EQ(L.at("backbone.layers.1.mixer.out_proj.weight").shape, (S{128, 256}));
  EXPECT_EQ(L.at("backbone.norm_f.weight").shape, (S{128}));
  EXPECT_EQ(L.at("lm_head.weight").shape, (S{3, 128}));
  EXPECT_EQ(L.find("backbone.layers.0.mixer.in_proj.bias"), nullptr);  // use_bias: false
  for (const char* n : {"backbone.layers.0.mixer.A_log", "backbone.layers.0.mixer.D", "backbone.layers.0.mixer.dt_proj.bias",
                        "backbone.layers.0.mixer.conv1d.bias", "backbone.norm_f.weight"})
    EXPECT_FALSE(L.at(n).weight_decay) << n;
  EXPECT_TRUE(L.at("backbone.layers.0.mixer.in_proj.weight").weight_decay);
  auto hf = m->hf_config();
  EXPECT_EQ(hf["model_type"], "mamba");
  EXPECT_EQ(hf["time_step_rank"], 8);
  EXPECT_EQ(hf["intermediate_size"], 256);
  EXPECT_EQ(hf["tie_word_embeddings"], false);
  EXPECT_EQ(hf["allow_neg_eigval"], false);
  for (const char* k : {"state_size", "conv_kernel", "use_bias", "use_conv_bias", "layer_norm_epsilon", "expand",
                        "num_hidden_layers", "vocab_size", "hidden_size"})
    EXPECT_TRUE(hf.contains(k)) << k;
}

TEST(Mamba, InitFollowsHF) {
  auto m = create_model<float>(p1_block(), "test", 7);
  auto at = [&](const std::string& n) { return m->params.data() + m->layout().at(n).offset; };
  const float* A_log = at("backbone.layers.1.mixer.A_log");
  for (int c = 0; c < 256; c += 37)
    for (int n = 0; n < 16; ++n) EXPECT_FLOAT_EQ(A_log[c * 16 + n], std::log(float(n + 1)));
  const float* D = at("backbone.layers.0.mixer.D");
  const float* dtb = at("backbone.layers.0.mixer.dt_proj.bias");
  double lo = 1e9, hi = 0;
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(D[c], 1.0f);
    const double delta = ops::scan_softplus<double>(dtb[c]);  // the initial delta of channel c
    lo = std::min(lo, delta), hi = std::max(hi, delta);
  }
  EXPECT_GE(lo, 0.001 * 0.9999);
  EXPECT_LE(hi, 0.1 * 1.0001);
  EXPECT_LT(lo, 0.002);  // log-uniform over [0.001, 0.1]: both ends are reached
  EXPECT_GT(hi, 0.07);
  EXPECT_NEAR(stats(*m, "backbone.layers.0.mixer.in_proj.weight").rms, 0.1, 0.003);
  const Stats dt = stats(*m, "backbone.layers.0.mixer.dt_proj.weight");  // U(±8^-1/2)
  EXPECT_LE(dt.max_abs, 1 / std::sqrt(8.0));
  EXPECT_NEAR(dt.rms, 1 / std::sqrt(8.0) / std::sqrt(3.0), 0.01);
  EXPECT_LE(stats(*m, "backbone.layers.0.mixer.conv1d.weight").max_abs, 0.5);
  EXPECT_LE(stats(*m, "backbone.layers.0.mixer.out_proj.weight").max_abs, 1 / 16.0);
  EXPECT_EQ(stats(*m, "backbone.layers.0.mixer.conv1d.bias").max_abs, 0.0);
}

TEST(Mamba, WholeModelGradientSigned) { whole_model_gradcheck(*tiny(", allow_neg_eigval: true")); }
TEST(Mamba, WholeModelGradientUnitWithBiases) {
  whole_model_gradcheck(*tiny(", use_bias: true, use_conv_bias: false"));
}

TEST(Mamba, CausalAndBatchIndependent) { check_causal(*tiny(", allow_neg_eigval: true")); }

TEST(Mamba, RejectsBadConfig) {
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: mamba, state_sise: 4}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: mamba, expand: 0}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: mamba, time_step_init_scheme: normal}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: mamba, time_step_min: 0.5, time_step_max: 0.1}"), "x", 0),
               UserError);
  try {
    create_model<float>(YAML::Load("{model_type: mamba, allow_neg_eigval: maybe}"), "cfg.yaml", 0);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.yaml: model.allow_neg_eigval"), std::string::npos) << e.what();
  }
}
