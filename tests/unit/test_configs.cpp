// Every shipped config loads and validates, and its resolved form round-trips.
#include <gtest/gtest.h>
#include <filesystem>
#include "core/check.h"
#include "train/config.h"
#include "train/sweep.h"
#include "../lm/lm_util.h"

using namespace lrnn;
namespace fs = std::filesystem;

TEST(Configs, EveryShippedConfigValidates) {
  int n = 0;
  for (auto& e : fs::recursive_directory_iterator(fs::path(LRNN_SOURCE_DIR) / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    if (e.path().parent_path().filename() == "grids") continue;  // sweep grids: checked below
    SCOPED_TRACE(e.path().string());
    std::vector<std::string> sets;
    // Language-model configs name a corpus the user makes (scripts/demo_lm.sh): validate them on a
    // small one made here from the test corpus.
    if (YAML::LoadFile(e.path().string())["task"]["name"].as<std::string>("") == "lm") {
      static const fs::path corpus = [] {
        fs::path d = lrnn::test::temp_dir("configs_lm");
        fs::path tok = lrnn::test::train_small_tokenizer(d, 512, 2);
        auto files = lrnn::test::corpus_files();
        files.resize(2);
        lrnn::test::RunResult r = lrnn::test::run_lrnn("tokenize --tokenizer '" + tok.string() + "' --input" +
                                                       lrnn::test::join_paths(files) + " --text-unit blank-line --val-fraction 0.2 --out '" +
                                                       (d / "data").string() + "'");
        EXPECT_EQ(r.code, 0) << r.out;
        return d / "data";
      }();
      sets.push_back("task.data=" + corpus.string());
    }
    ExperimentConfig c = ExperimentConfig::load(e.path().string(), sets);
    // Writing the resolved config and reading it back gives the same config.
    ExperimentConfig again = ExperimentConfig::from_yaml(c.to_yaml(), "resolved");
    EXPECT_EQ(YAML::Dump(again.to_yaml()), YAML::Dump(c.to_yaml()));
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(Configs, OverridesApplyAndAreValidated) {
  fs::path f = fs::path(LRNN_SOURCE_DIR) / "configs/chomsky/parity_delta_net_2.yaml";
  ExperimentConfig c = ExperimentConfig::load(f.string(), {"training.lr=3e-4", "task.eval_len=[40, 512]", "model.num_heads=8"});
  EXPECT_DOUBLE_EQ(c.training.lr, 3e-4);
  EXPECT_EQ(c.task.eval_len[1], 512);
  EXPECT_EQ(c.model["num_heads"].as<int>(), 8);
  EXPECT_THROW(ExperimentConfig::load(f.string(), {"training.lr=abc"}), UserError);
  EXPECT_THROW(ExperimentConfig::load(f.string(), {"training.nope=1"}), UserError);
  EXPECT_THROW(ExperimentConfig::load(f.string(), {"lr=1"}), UserError);
  EXPECT_THROW(ExperimentConfig::load(f.string(), {"training.min_lr=1"}), UserError);  // above lr
}

TEST(Configs, EveryShippedGridValidates) {
  // Grids name configs relative to the repository root.
  fs::path cwd = fs::current_path();
  fs::current_path(LRNN_SOURCE_DIR);
  int n = 0;
  for (auto& e : fs::directory_iterator(fs::path(LRNN_SOURCE_DIR) / "configs" / "grids")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(sweep::Grid::load(e.path()));
    ++n;
  }
  fs::current_path(cwd);
  EXPECT_GE(n, 2);
}
