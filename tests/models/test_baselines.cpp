// The baselines (Llama-style Transformer, LSTM LM): parameter tables with the public names,
// whole-model finite-difference gradient checks in double, causality, config errors.
#include <gtest/gtest.h>
#include <cmath>
#include "model_test_util.h"
#include "models/model.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

std::unique_ptr<Model<double>> tiny(const std::string& block, uint64_t seed = 3, double jitter = 0.2) {
  return jittered(YAML::Load(block), seed, jitter);  // norm weights away from 1, larger projections
}

const char* kTinyLlama =
    "{model_type: llama, vocab_size: 5, hidden_size: 8, num_hidden_layers: 2, num_attention_heads: 2,"
    " intermediate_size: 12, initializer_range: 0.5, rope_theta: 50.0}";
const char* kTinyLstm = "{model_type: lstm, vocab_size: 5, embedding_dim: 3, hidden_size: 4, num_layers: 2}";

}  // namespace

TEST(Llama, HfNamesShapesAndCountOfP1Model) {
  auto m = create_model<float>(YAML::Load("{model_type: llama, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2,"
                                          " num_attention_heads: 4}"), "test", 0);
  // embed 3*128 + per layer (2*128 norms + 4*128^2 attention + 3*512*128 MLP) + 128 + 3*128 head
  EXPECT_EQ(m->layout().count(), size_t(384 + 2 * (256 + 4 * 16384 + 3 * 65536) + 128 + 384));
  for (const char* n : {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                        "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                        "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                        "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
                        "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                        "model.norm.weight", "lm_head.weight"})
    EXPECT_NE(m->layout().find(n), nullptr) << n;
  EXPECT_EQ(m->layout().at("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{128, 512}));
  EXPECT_FALSE(m->layout().at("model.layers.0.input_layernorm.weight").weight_decay);
  EXPECT_TRUE(m->layout().at("lm_head.weight").weight_decay);
  auto j = m->hf_config();
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["intermediate_size"], 512);
  EXPECT_EQ(j["num_key_value_heads"], 4);
  EXPECT_EQ(j["rope_theta"], 10000.0);
}

TEST(Llama, InitFollowsHf) {
  auto m = create_model<float>(YAML::Load("{model_type: llama, vocab_size: 3, hidden_size: 128, num_attention_heads: 4}"), "test", 7);
  auto rms = [&](const std::string& name) { return stats(*m, name).rms; };
  EXPECT_NEAR(rms("model.layers.0.self_attn.q_proj.weight"), 0.02, 0.001);
  EXPECT_NEAR(rms("model.layers.1.mlp.down_proj.weight"), 0.02, 0.001);  // HF: no depth scaling
  EXPECT_NEAR(rms("model.embed_tokens.weight"), 0.02, 0.003);
  EXPECT_EQ(rms("model.norm.weight"), 1.0);
}

TEST(Llama, WholeModelGradient) {
  auto m = tiny(kTinyLlama);
  whole_model_gradcheck(*m, 2, 7, 1e-5);
}

TEST(Llama, WholeModelGradientAcrossAttentionRowBlocks) {
  // T = 70 > 64 queries per attention block; one layer keeps it quick.
  auto m = tiny("{model_type: llama, vocab_size: 4, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2,"
                " intermediate_size: 8, initializer_range: 0.5}");
  whole_model_gradcheck(*m, 1, 70, 1e-5);
}

TEST(Llama, Causal) {
  auto m = tiny(kTinyLlama);
  check_causal(*m);
}

TEST(Llama, RejectsBadConfig) {
  auto bad = [](const std::string& y) { return create_model<float>(YAML::Load(y), "x.yaml", 0); };
  EXPECT_THROW(bad("{model_type: llama, hidden_size: 10, num_attention_heads: 4}"), UserError);
  EXPECT_THROW(bad("{model_type: llama, hidden_size: 12, num_attention_heads: 4}"), UserError);  // head dim 3: odd
  EXPECT_THROW(bad("{model_type: llama, num_heads: 4}"), UserError);                            // fla's name, not HF's
  EXPECT_THROW(bad("{model_type: llama, rope_theta: 0}"), UserError);
  try {
    bad("{model_type: llama, hidden_size: 12, num_attention_heads: 4}");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("x.yaml: model.num_attention_heads: head dim"), std::string::npos) << e.what();
  }
}

TEST(Lstm, TorchNamesShapesAndCount) {
  auto m = create_model<float>(YAML::Load("{model_type: lstm, vocab_size: 3, hidden_size: 128, num_layers: 2}"), "test", 0);
  // embedding 3*128; per layer 4H*(in + H) + 2*4H; head 3*128 + 3
  EXPECT_EQ(m->layout().count(), size_t(384 + 2 * (512 * 256 + 1024) + 384 + 3));
  EXPECT_EQ(m->layout().at("lstm.weight_ih_l0").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(m->layout().at("lstm.weight_hh_l1").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(m->layout().at("lstm.bias_ih_l1").shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(m->layout().at("lstm.bias_hh_l0").shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(m->layout().at("head.weight").shape, (std::vector<int64_t>{3, 128}));
  EXPECT_EQ(m->layout().at("head.bias").shape, (std::vector<int64_t>{3}));
  EXPECT_FALSE(m->layout().at("lstm.bias_ih_l0").weight_decay);
  EXPECT_TRUE(m->layout().at("lstm.weight_hh_l0").weight_decay);
  auto e = create_model<float>(YAML::Load("{model_type: lstm, vocab_size: 3, embedding_dim: 16, hidden_size: 32, num_layers: 1}"), "t", 0);
  EXPECT_EQ(e->layout().at("lstm.weight_ih_l0").shape, (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(e->hf_config()["embedding_dim"], 16);
}

TEST(Lstm, InitFollowsTorchDefaults) {
  auto m = create_model<float>(YAML::Load("{model_type: lstm, vocab_size: 3, hidden_size: 64, num_layers: 1}"), "test", 1);
  for (const char* n : {"lstm.weight_hh_l0", "lstm.bias_ih_l0", "head.weight"}) {
    const Stats s = stats(*m, n);
    EXPECT_LE(s.max_abs, 0.125) << n;  // U(-1/sqrt(H), 1/sqrt(H)), H = 64
    EXPECT_NEAR(s.rms, 0.125 / std::sqrt(3.0), 0.012) << n;
  }
}

TEST(Lstm, WholeModelGradient) {
  auto m = tiny(kTinyLstm);
  whole_model_gradcheck(*m, 2, 7, 1e-5);
}

TEST(Lstm, WholeModelGradientLongSequence) {
  auto m = tiny("{model_type: lstm, vocab_size: 3, embedding_dim: 2, hidden_size: 3, num_layers: 1}", 4, 1.0);
  whole_model_gradcheck(*m, 1, 120, 1e-5);
}

TEST(Lstm, Causal) {
  auto m = tiny(kTinyLstm);
  check_causal(*m);
}

TEST(Lstm, RejectsBadConfig) {
  auto bad = [](const std::string& y) { return create_model<float>(YAML::Load(y), "x.yaml", 0); };
  EXPECT_THROW(bad("{model_type: lstm, num_hidden_layers: 2}"), UserError);  // torch's name is num_layers
  EXPECT_THROW(bad("{model_type: lstm, hidden_size: 0}"), UserError);
  EXPECT_THROW(bad("{model_type: lstm, embedding_dim: -1}"), UserError);
}
