// DeltaNet LM: parameter table, whole-model finite-difference gradient check in double.
#include <gtest/gtest.h>
#include <cmath>
#include "model_test_util.h"
#include "models/deltanet.h"

using namespace lrnn;
using namespace lrnn::test;

static std::unique_ptr<Model<double>> tiny(const std::string& extra, uint64_t seed = 3) {
  auto block = YAML::Load("{model_type: delta_net, vocab_size: 5, hidden_size: 8, num_hidden_layers: 2,"
                          " num_heads: 2, intermediate_size: 12, initializer_range: 0.5" + extra + "}");
  return jittered(block, seed, 0.2);  // norm weights away from 1 and larger projections
}

TEST(DeltaNet, ParameterCountOfP1ParityModel) {
  auto block = YAML::Load("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2, num_heads: 4}");
  auto m = create_model<float>(block, "test", 0);
  EXPECT_EQ(m->layout().count(), 529856u);
  EXPECT_EQ(m->layout().at("model.layers.1.attn.q_conv1d.weight").shape, (std::vector<int64_t>{128, 1, 4}));
  EXPECT_EQ(m->layout().at("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(m->layout().at("model.layers.0.attn.o_norm.weight").shape, (std::vector<int64_t>{32}));
  EXPECT_FALSE(m->layout().at("model.norm.weight").weight_decay);
  EXPECT_TRUE(m->layout().at("lm_head.weight").weight_decay);
  EXPECT_EQ(m->hf_config()["intermediate_size"], 512);
}

TEST(DeltaNet, InitFollowsFla) {
  auto block = YAML::Load("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2, num_heads: 4}");
  auto m = create_model<float>(block, "test", 7);
  // xavier_uniform, gain 2^-2.5, fan 128+128: bound = 2^-2.5 * sqrt(6/256) ~ 0.0271
  const Stats q = stats(*m, "model.layers.0.attn.q_proj.weight");
  EXPECT_LE(q.max_abs, 0.02707);
  EXPECT_NEAR(q.rms, 0.02707 / std::sqrt(3.0), 0.001);
  EXPECT_NEAR(stats(*m, "model.layers.0.mlp.up_proj.weight").rms, 0.02, 0.001);
  EXPECT_NEAR(stats(*m, "model.layers.0.mlp.down_proj.weight").rms, 0.01, 0.0006);  // 0.02 / sqrt(2L)
  EXPECT_EQ(stats(*m, "model.layers.1.mlp_norm.weight").rms, 1.0);
}

TEST(DeltaNet, WholeModelGradientSignedWithConv) { whole_model_gradcheck(*tiny(", allow_neg_eigval: true")); }
TEST(DeltaNet, WholeModelGradientUnitNoConv) { whole_model_gradcheck(*tiny(", use_short_conv: false")); }

TEST(DeltaNet, CausalAndBatchIndependent) { check_causal(*tiny(", allow_neg_eigval: true")); }

TEST(DeltaNet, RejectsBadConfig) {
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: delta_net, hidden_size: 10, num_heads: 4}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: delta_net, hiden_size: 10}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: mamba9}"), "x", 0), UserError);
  EXPECT_THROW(create_model<float>(YAML::Load("{model_type: delta_net, num_heads: -1}"), "x", 0), UserError);
  try {
    create_model<float>(YAML::Load("{model_type: delta_net, hidden_size: abc}"), "cfg.yaml", 0);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.yaml: model.hidden_size: expected an integer"), std::string::npos) << e.what();
  }
}
