// training.stop_at with training.stop_on: a run stops at the first periodic evaluation whose scaled
// accuracy on the named lengths reaches the threshold — on the training lengths (stop_on: train,
// the DeltaProduct authors' early stop on held-out sequences of the training length) even while
// the longer eval lengths are far from it — and then finishes as a completed run (final
// checkpoint, eval.json). A wrong value is refused.
#include <gtest/gtest.h>
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

RunResult train(const fs::path& dir, const std::string& name, const std::string& sets) {
  write_text(dir / (name + ".yaml"), kConfig);
  return run_lrnn("train --config " + (dir / (name + ".yaml")).string() + " --out " + (dir / name).string() + sets);
}

}  // namespace

// Measured (cpu2c, AMD EPYC Zen 3, 2026-11-28; seeds 0-4, OpenBLAS's own kernels and Haswell's, 1
// and 2 threads: 20 runs): stopped at steps 60-200, at training-length accuracy 1.000 each time,
// length-64 accuracy 0. The bound on the stopping step, 1500, is 7.5x the slowest.
TEST(EarlyStop, OnTheTrainingLengths) {
  const fs::path dir = temp_dir("early_stop");
  for (int seed : {0, 1}) {
    const std::string name = "seed" + std::to_string(seed);
    const RunResult r = train(dir, name, " --set training.seed=" + std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.out;
    const fs::path run = dir / name;
    const auto evals = lines_of(run, "eval");
    // The periodic evaluations up to the first at >= 0.99 on the training lengths (the eval
    // lengths stay far below), then the final evaluation of the completed run at the same step.
    size_t first = 0;
    while (first < evals.size() && evals[first]["train_scaled_accuracy"].get<double>() < 0.99) ++first;
    ASSERT_LT(first + 1, evals.size()) << "no periodic evaluation reached 0.99, or no final one";
    const int64_t step = evals[first]["step"].get<int64_t>();
    std::printf("seed %d: stopped at step %lld (training lengths %.3f, eval lengths %.3f)\n", seed, (long long)step,
                evals[first]["train_scaled_accuracy"].get<double>(), evals[first]["scaled_accuracy"].get<double>());
    EXPECT_EQ(first + 2, evals.size()) << "the run went on after the stopping evaluation";
    EXPECT_EQ(evals.back()["step"].get<int64_t>(), step);
    EXPECT_LT(evals[first]["scaled_accuracy"].get<double>(), 0.99);
    EXPECT_LT(step, 1500) << "(the measured stopping steps are in the comment above)";
    // A completed run: the final evaluation and the checkpoint are there.
    EXPECT_TRUE(fs::exists(run / "eval.json"));
    EXPECT_TRUE(fs::exists(run / "model.safetensors"));
    EXPECT_NE(read_text(run / "provenance.json").find("stopped early"), std::string::npos);
  }
}

// The same run reading the eval lengths (the default) goes the whole schedule: on length 64 it
// stays far from 0.99.
TEST(EarlyStop, OnTheEvalLengthsByDefault) {
  const fs::path dir = temp_dir("early_stop_eval");
  const RunResult r = train(dir, "run", " --set training.stop_on=eval --set training.num_steps=300");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto evals = lines_of(dir / "run", "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_EQ(evals.back()["step"].get<int64_t>(), 300);
  double best_train = 0;  // (the training lengths did reach 0.99: stop_on is what kept it going)
  for (const auto& e : evals) best_train = std::max(best_train, e["train_scaled_accuracy"].get<double>());
  EXPECT_GE(best_train, 0.99);
  EXPECT_EQ(read_text(dir / "run" / "provenance.json").find("stopped early"), std::string::npos);
}

TEST(EarlyStop, RefusesAnUnknownStopOn) {
  const fs::path dir = temp_dir("early_stop_bad");
  const RunResult r = train(dir, "bad", " --set training.stop_on=valid");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("stop_on"), std::string::npos) << r.out;
}
