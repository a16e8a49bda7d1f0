// mLSTM and sLSTM LMs through the real `lrnn` binary: train two steps, checkpoint with the xlstm
// package's state_dict names and an xLSTMLMModelConfig config.json, eval, and predict, whose logits
// must equal the checkpoint run in-process.
#include <gtest/gtest.h>
#include "roundtrip_util.h"

using namespace lrnn::test;

namespace {

void train_predict(const std::string& name, const std::string& model_yaml, const std::vector<std::string>& some_names,
                   const std::function<void(const nlohmann::json&)>& check_config) {
  train_eval_predict(name, parity_config("  num_steps: 2\n  warmup_steps: 1\n", model_yaml, 1), some_names,
                     [&](const nlohmann::json& cfg) {
                       EXPECT_EQ(cfg["architectures"], nlohmann::json({"xLSTMLMModel"}));
                       EXPECT_EQ(cfg["vocab_size"], 3);  // from the task
                       check_config(cfg);
                     });
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
