// training.stop_at with training.stop_on: a run stops at the first periodic evaluation whose scaled
// accuracy on the named lengths reaches the threshold — on the training lengths (stop_on: train,
// the DeltaProduct authors' early stop on held-out sequences of the training length) even while
// the longer eval lengths are far from it — and then finishes as a completed run (final
// checkpoint, eval.json). A wrong value is refused.
#include <gtest/gtest.h>
#include <sstream>
#include <nlohmann/json.hpp>
#include "cli_util.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

// Products of two S3 elements (BOS, then the running product at each position): a one-layer
// DeltaProduct_2 [-1,1] of width 16 learns them in a few hundred steps; at length 64 it stays far
// from 0.99 in that time.
const char* kConfig = R"(training:
  num_steps: 3000
  batch_size: 64
  lr: 3.0e-3
  min_lr: 3.0e-3
  warmup_steps: 0
  val_every: 20
  stop_at: 0.99
  stop_on: train
  checkpoint_every: 0
  seed: 0
  num_threads: 2
model:
  model_type: gated_deltaproduct
  hidden_size: 16
  num_hidden_layers: 1
  num_heads: 2
  head_dim: 8
  num_householder: 2
  allow_neg_eigval: true
  use_short_conv: false
  use_forget_gate: false
  use_output_gate: false
task:
  name: word_problem
  group: S3
  bos: true
  train_len: [2, 2]
  eval_len: [64, 64]
  eval_samples: 256
  train_pool: 0
logging:
  log_every: 20
  progress: none
)";

std::vector<nlohmann::json> lines_of(const fs::path& run, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_text(run / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) v.push_back(j);
  }
  return v;
}

RunResult train(const fs::path& dir, const std::string& name, const std::string& sets) {
  write_text(dir / (name + ".yaml"), kConfig);
  return run_lrnn("train --config " + (dir / (name + ".yaml")).string() + " --out " + (dir / name).string() + sets);
}

}  // namespace

// Measured (cpu2c, 2026-11-28; seeds 0-4, OpenBLAS's own kernels and Haswell's, 1 and 2 threads):
// see the assertion on the stopping step.
TEST(EarlyStop, OnTheTrainingLengths) {
  TempDir dir("lrnn_early_stop");
  for (int seed : {0, 1}) {
    const std::string name = "seed" + std::to_string(seed);
    const RunResult r = train(dir.path, name, " --set training.seed=" + std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("stopping early: scaled accuracy on the training lengths reached training.stop_at = 0.99"),
              std::string::npos)
        << r.out;
    const fs::path run = dir.path / name;
    const auto evals = lines_of(run, "eval");
    ASSERT_FALSE(evals.empty());
    // The last periodic evaluation is the one that stopped the run: the first at >= 0.99 on the
    // training lengths, while the eval lengths stay below it.
    const auto& last = evals.back();
    const int64_t step = last["step"].get<int64_t>();
    std::printf("seed %d: stopped at step %lld (training lengths %.3f, eval lengths %.3f)\n", seed, (long long)step,
                last["train_scaled_accuracy"].get<double>(), last["scaled_accuracy"].get<double>());
    EXPECT_GE(last["train_scaled_accuracy"].get<double>(), 0.99);
    EXPECT_LT(last["scaled_accuracy"].get<double>(), 0.99);
    for (size_t i = 0; i + 1 < evals.size(); ++i) EXPECT_LT(evals[i]["train_scaled_accuracy"].get<double>(), 0.99);
    EXPECT_LT(step, 1500) << "(the measured stopping steps are in the comment above)";
    // A completed run: the final evaluation and the checkpoint are there.
    EXPECT_TRUE(fs::exists(run / "eval.json"));
    EXPECT_TRUE(fs::exists(run / "model.safetensors"));
    EXPECT_NE(read_text(run / "provenance.json").find("stopped early"), std::string::npos);
  }
}

TEST(EarlyStop, RefusesAnUnknownStopOn) {
  TempDir dir("lrnn_early_stop_bad");
  const RunResult r = train(dir.path, "bad", " --set training.stop_on=valid");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("stop_on"), std::string::npos) << r.out;
}
