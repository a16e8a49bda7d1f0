// mLSTM and sLSTM LMs through the real `lrnn` binary: train two steps, checkpoint with the xlstm
// package's state_dict names and an xLSTMLMModelConfig config.json, eval, and predict, whose logits
// must equal the checkpoint run in-process.
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
  num_steps: 2
  batch_size: 8
  lr: 3.0e-3
  warmup_steps: 1
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
  log_every: 1
  progress: none
)";
}

void train_predict(const std::string& name, const std::string& model_yaml, const std::vector<std::string>& some_names,
                   const std::function<void(const nlohmann::json&)>& check_config) {
  auto dir = temp_dir("cli_" + name);
  write_text(dir / "c.yaml", config(model_yaml));
  auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto cfg = nlohmann::json::parse(read_text(dir / "run" / "config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json({"xLSTMLMModel"}));
  EXPECT_EQ(cfg["vocab_size"], 3);  // from the task
  check_config(cfg);

  // The checkpoint holds exactly the layout's tensors, under the package's names and shapes.
  ExperimentConfig ec = ExperimentConfig::load((dir / "run" / "config.yaml").string(), {});
  auto m = create_model<float>(ec.model, "test", 0);
  auto st = io::read_safetensors(dir / "run" / "model.safetensors");
  std::set<std::string> names;
  for (auto& t : st.tensors) {
    names.insert(t.name);
    EXPECT_EQ(t.shape, m->layout().at(t.name).shape) << t.name;
  }
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
  // Training moved the weights away from the initialisation.
  auto fresh = create_model<float>(ec.model, "test", 3);
  double moved = 0;
  for (size_t i = 0; i < m->params.size(); ++i) moved = std::max(moved, double(std::abs(m->params[i] - fresh->params[i])));
  EXPECT_GT(moved, 1e-4);
  fs::remove_all(dir);
}

}  // namespace

TEST(CliXLSTM, MlstmTrainsTwoStepsAndPredicts) {
  train_predict("mlstm", "  model_type: mlstm\n  embedding_dim: 16\n  num_blocks: 2\n  num_heads: 2\n",
                {"token_embedding.weight", "lm_head.weight", "xlstm_block_stack.post_blocks_norm.weight",
                 "xlstm_block_stack.blocks.1.xlstm.mlstm_cell.fgate.bias", "xlstm_block_stack.blocks.0.xlstm.q_proj.weight",
                 "xlstm_block_stack.blocks.0.xlstm.conv1d.conv.bias", "xlstm_block_stack.blocks.0.xlstm.learnable_skip"},
                [](const nlohmann::json& c) {
                  EXPECT_EQ(c["model_type"], "mlstm");
                  EXPECT_EQ(c["embedding_dim"], 16);
                  EXPECT_EQ(c["mlstm_block"]["mlstm"]["num_heads"], 2);
                  EXPECT_EQ(c["slstm_at"], nlohmann::json::array());
                });
}

TEST(CliXLSTM, SlstmTrainsTwoStepsAndPredicts) {
  train_predict("slstm", "  model_type: slstm\n  embedding_dim: 16\n  num_blocks: 2\n  num_heads: 2\n",
                {"xlstm_block_stack.blocks.0.xlstm.slstm_cell._recurrent_kernel_",
                 "xlstm_block_stack.blocks.1.xlstm.slstm_cell._bias_", "xlstm_block_stack.blocks.0.xlstm.fgate.weight",
                 "xlstm_block_stack.blocks.0.ffn.proj_up.weight", "xlstm_block_stack.blocks.1.ffn_norm.weight"},
                [](const nlohmann::json& c) {
                  EXPECT_EQ(c["model_type"], "slstm");
                  EXPECT_EQ(c["slstm_at"], "all");
                  EXPECT_EQ(c["slstm_block"]["slstm"]["num_heads"], 2);
                  EXPECT_TRUE(c["mlstm_block"].is_null());
                });
}
