// The baselines through the real `lrnn` binary: train, checkpoint names (HF Llama / torch.nn.LSTM),
// config.json, eval, and predict, whose logits must equal the checkpoint run in-process.
#include <gtest/gtest.h>
#include "roundtrip_util.h"

using namespace lrnn::test;

namespace {

void train_predict_roundtrip(const std::string& name, const std::string& model_yaml, const std::string& model_type,
                             const std::vector<std::string>& some_names) {
  const std::string training = "  num_steps: 12\n  warmup_steps: 2\n  checkpoint_every: 4\n";
  train_eval_predict(name, parity_config(training, model_yaml, 4), some_names,
                     [&](const nlohmann::json& cfg) { EXPECT_EQ(cfg["model_type"], model_type); });
}

}  // namespace

TEST(CliBaselines, TransformerTrainEvalPredict) {
  train_predict_roundtrip("llama",
                          "  model_type: llama\n  hidden_size: 16\n  num_hidden_layers: 2\n  num_attention_heads: 2\n"
                          "  intermediate_size: 32",
                          "llama",
                          {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
                           "model.layers.0.post_attention_layernorm.weight", "lm_head.weight"});
}

TEST(CliBaselines, LstmTrainEvalPredict) {
  train_predict_roundtrip("lstm", "  model_type: lstm\n  hidden_size: 16\n  num_layers: 2\n  embedding_dim: 8", "lstm",
                          {"embedding.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l1", "lstm.bias_ih_l1",
                           "lstm.bias_hh_l0", "head.weight", "head.bias"});
}
