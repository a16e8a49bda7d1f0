// The baselines through the real `lrnn` binary: train, checkpoint names (HF Llama / torch.nn.LSTM),
// config.json, eval, and predict, whose logits must equal the checkpoint run in-process.
#include <gtest/gtest.h>
#include <cmath>
#include <set>
#include <nlohmann/json.hpp>
#include "cli_util.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/config.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

std::string config(const std::string& model) {
  return R"(training:
  num_steps: 12
  batch_size: 8
  lr: 3.0e-3
  warmup_steps: 2
  checkpoint_every: 4
  seed: 3
  num_threads: 2
model:
)" + model + R"(
task:
  name: parity
  train_len: [3, 12]
  eval_len: [12, 14]
  eval_samples: 12
logging:
  log_every: 4
  progress: none
)";
}

void train_predict_roundtrip(const std::string& name, const std::string& model_yaml, const std::string& model_type,
                             const std::vector<std::string>& some_names) {
  auto dir = temp_dir("cli_" + name);
  write_text(dir / "c.yaml", config(model_yaml));
  auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto cfg = nlohmann::json::parse(read_text(dir / "run" / "config.json"));
  EXPECT_EQ(cfg["model_type"], model_type);

  // The checkpoint holds exactly the layout's tensors, under the public names.
  ExperimentConfig ec = ExperimentConfig::load((dir / "run" / "config.yaml").string(), {});
  auto m = create_model<float>(ec.model, "test", 0);
  auto st = io::read_safetensors(dir / "run" / "model.safetensors");
  std::set<std::string> names;
  for (auto& t : st.tensors) names.insert(t.name);
  std::set<std::string> expected;
  for (auto& e : m->layout().entries()) expected.insert(e.name);
  EXPECT_EQ(names, expected);
  for (auto& n : some_names) EXPECT_TRUE(names.count(n)) << n;

  auto e = run_lrnn("eval --run " + (dir / "run").string() + " --set task.eval_len=[20,21] --json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(nlohmann::json::parse(e.out.substr(e.out.find('{')))["lengths"], nlohmann::json({20, 21}));

  auto p = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 2 2 1 2\"");
  ASSERT_EQ(p.code, 0) << p.out;
  auto pj = nlohmann::json::parse(p.out);
  ASSERT_EQ(pj["positions"].size(), 5u);
  load_params(dir / "run" / "model.safetensors", *m);
  std::vector<int32_t> tok{1, 2, 2, 1, 2};
  m->forward(tok.data(), nullptr, 1, 5);
  for (int t = 0; t < 5; ++t) {
    auto lg = pj["positions"][t]["logits"];
    ASSERT_EQ(lg.size(), 3u);
    int best = 0;
    for (int v = 0; v < 3; ++v) {
      EXPECT_NEAR(double(lg[v]), m->logits()[t * 3 + v], 1e-5 * (1 + std::abs(m->logits()[t * 3 + v])));
      if (m->logits()[t * 3 + v] > m->logits()[t * 3 + best]) best = v;
    }
    EXPECT_EQ(pj["positions"][t]["predicted"], best);
  }
  fs::remove_all(dir);
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
