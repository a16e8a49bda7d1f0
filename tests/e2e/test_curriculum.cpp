// training.curriculum (the DeltaProduct authors' state-tracking option): the loss covers only the
// first N target positions, one more after each epoch whose mean loss is below a threshold. What
// a user relies on: the loss really is the prefix's, the positions grow exactly as the rule says,
// a resumed run follows the uninterrupted one, and configs that cannot work are refused.
#include <gtest/gtest.h>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include "cli_util.h"
#include "infer/run.h"
#include "io/safetensors.h"
#include "tasks/task.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

// S3 word problems with BOS, length 8 (9 targets), a pool of 64 sequences in batches of 16 (an
// epoch: 4 steps), a one-layer DeltaProduct_2 [-1,1] of width 16.
const char* kCurriculumConfig = R"(training:
  num_steps: 24
  batch_size: 16
  lr: 3.0e-3
  min_lr: 0
  warmup_steps: 0
  checkpoint_every: 6
  seed: 5
  curriculum: 2
  curriculum_loss: 1.0e+6
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
  train_len: [8, 8]
  eval_len: [8, 10]
  eval_samples: 16
  train_pool: 64
logging:
  log_every: 1
  progress: none
)";

std::string config(std::initializer_list<std::string> sets) {
  YAML::Node root = YAML::Load(kCurriculumConfig);
  for (const auto& s : sets) io::apply_override(root, s);
  return YAML::Dump(root) + "\n";
}

RunResult train(const fs::path& dir, const std::string& name, std::initializer_list<std::string> sets) {
  write_text(dir / (name + ".yaml"), config(sets));
  return run_lrnn("train --config " + (dir / (name + ".yaml")).string() + " --out " + (dir / name).string());
}

}  // namespace

// The task masks every label past the prefix and none before it (a BOS counts as a position).
TEST(Curriculum, TrainingBatchesSuperviseOnlyThePrefix) {
  TaskConfig c;
  c.name = "word_problem";
  c.group = "S3";
  c.bos = true;
  c.train_len = {8, 8};
  auto task = create_task(c);
  const Batch all = task->train_batch(1, 0, 4, c.train_len);
  task->set_supervised_prefix(3);
  const Batch some = task->train_batch(1, 0, 4, c.train_len);
  ASSERT_EQ(all.T, 9);
  EXPECT_EQ(some.tokens, all.tokens);
  for (int i = 0; i < all.B; ++i)
    for (int t = 0; t < all.T; ++t) {
      const size_t k = size_t(i) * all.T + t;
      EXPECT_GE(all.labels[k], 0) << "a word problem labels every position";
      EXPECT_EQ(some.labels[k], t < 3 ? all.labels[k] : -1) << "row " << i << " position " << t;
    }
  task->set_supervised_prefix(0);
  EXPECT_EQ(task->train_batch(1, 0, 4, c.train_len).labels, all.labels);
}

// The first step's logged loss (at lr 0 the saved model is the one that step saw) is the mean
// cross-entropy over the first 3 positions of batch 0, not over all 9.
TEST(Curriculum, TheLossIsThePrefixsMeanCrossEntropy) {
  auto dir = temp_dir("curriculum_loss");
  auto r = train(dir, "run", {"training.num_steps=1", "training.lr=0", "training.curriculum=3"});
  ASSERT_EQ(r.code, 0) << r.out;
  const auto steps = lines_of(dir / "run", "train");
  ASSERT_EQ(steps.size(), 1u);
  const double logged = steps[0]["loss"];

  LoadedRun run = load_run(dir / "run", {}, "cpu");
  auto task = create_task(run.cfg.task);
  const Batch b = task->train_batch(5, 0, 16, run.cfg.task.train_len);
  Batch prefix = b;
  for (int i = 0; i < b.B; ++i)
    for (int t = 3; t < b.T; ++t) prefix.labels[size_t(i) * b.T + t] = -1;
  Model<float>& m = run.model();
  const double want = m.forward(prefix.tokens.data(), prefix.labels.data(), b.B, b.T);
  const double full = m.forward(b.tokens.data(), b.labels.data(), b.B, b.T);
  // The run's two data-parallel workers each average half the rows: the same sum in another order.
  EXPECT_NEAR(logged, want, 1e-5 * want);
  // What the test tells apart: the loss over all positions is far from it at initialisation.
  EXPECT_GT(std::abs(full - want), 1e-3) << "full " << full << " prefix " << want;
}

// With a threshold every epoch passes, one position more per epoch (4 steps) from 2 up to all 9;
// with one no epoch passes, the positions stay. Every epoch's end is logged with its mean loss.
TEST(Curriculum, APositionMoreAfterEachEpochBelowTheThreshold) {
  auto dir = temp_dir("curriculum_grow");
  ASSERT_EQ(train(dir, "grow", {"training.num_steps=36"}).code, 0);
  const auto ends = lines_of(dir / "grow", "curriculum");
  ASSERT_EQ(ends.size(), 7u);  // steps 4, 8, ..., 28: positions 3..9, then the whole sequence
  for (size_t e = 0; e < ends.size(); ++e) {
    EXPECT_EQ(int64_t(ends[e]["step"]), int64_t(4 * (e + 1)));
    EXPECT_EQ(int(ends[e]["positions"]), int(3 + e));
    EXPECT_GT(double(ends[e]["epoch_loss"]), 0.0);
  }
  for (const auto& s : lines_of(dir / "grow", "train"))
    EXPECT_EQ(int(s["positions"]), std::min<int>(2 + int(int64_t(s["step"]) / 4), 9)) << s.dump();

  ASSERT_EQ(train(dir, "stay", {"training.num_steps=12", "training.curriculum_loss=0"}).code, 0);
  const auto stay = lines_of(dir / "stay", "curriculum");
  ASSERT_EQ(stay.size(), 3u);
  for (const auto& e : stay) EXPECT_EQ(int(e["positions"]), 2);
  // The epoch's loss is the mean of its steps' losses (one line per step here).
  const auto steps = lines_of(dir / "stay", "train");
  double sum = 0;
  for (int k = 4; k < 8; ++k) sum += double(steps[k]["loss"]);
  EXPECT_NEAR(double(stay[1]["epoch_loss"]), sum / 4, 1e-12);
}

// Killed after step 11 (last checkpoint at 6, in the middle of the epoch of steps 5-8), the run
// resumes with the positions and the part-epoch's loss it had, and logs what the uninterrupted
// run logs. The threshold (1.6) lies between the first epoch's loss (~1.94; chance is ln 6 = 1.79) and
// what two positions reach by step 24 (~1.43 on an AMD EPYC): some epochs pass and others do not.
TEST(Curriculum, AResumedRunFollowsTheUninterruptedOne) {
  auto dir = temp_dir("curriculum_resume");
  ASSERT_EQ(train(dir, "a", {"training.curriculum_loss=1.6", "training.num_steps=36"}).code, 0);
  const auto full = lines_of(dir / "a", "curriculum");
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "11", 1);
  auto k = train(dir, "b", {"training.curriculum_loss=1.6", "training.num_steps=36"});
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_NE(k.code, 0) << "the fault injection did not kill the run";
  auto r = run_lrnn("train --resume " + (dir / "b").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto resumed = lines_of(dir / "b", "curriculum");
  ASSERT_EQ(resumed.size(), full.size());
  int grew = 0;
  for (size_t e = 0; e < full.size(); ++e) {
    EXPECT_EQ(resumed[e].dump(), full[e].dump());
    grew += int(full[e]["positions"]) > (e ? int(full[e - 1]["positions"]) : 2);
  }
  // Both kinds of epoch occurred, so the saved part-epoch loss decided something.
  EXPECT_GT(grew, 0);
  EXPECT_LT(grew, int(full.size()));
  EXPECT_EQ(read_text(dir / "b" / "model.safetensors"), read_text(dir / "a" / "model.safetensors"));

  // A resume may not change the curriculum, nor drop or add it.
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "7", 1);
  train(dir, "c", {"training.curriculum_loss=1.6", "training.num_steps=36"});
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  for (auto set : {"training.curriculum=3", "training.curriculum_loss=0.3", "training.curriculum=0"}) {
    auto bad = run_lrnn("train --resume " + (dir / "c").string() + " --set " + set);
    EXPECT_EQ(bad.code, 2) << set << ": " << bad.out;
    EXPECT_NE(bad.out.find(std::string(set).substr(0, std::string(set).find('='))), std::string::npos) << bad.out;
  }
  // A broken saved progress is refused, naming the file.
  io::SafeTensors st = io::read_safetensors(dir / "c" / "train_state.safetensors");
  st.metadata["curriculum"] = R"({"positions": 1, "loss_sum": 0, "applied": 0})";
  io::write_safetensors(dir / "c" / "train_state.safetensors", st);
  auto broken = run_lrnn("train --resume " + (dir / "c").string());
  EXPECT_EQ(broken.code, 2) << broken.out;
  EXPECT_NE(broken.out.find("metadata 'curriculum'"), std::string::npos) << broken.out;
}

// A run resumes after its curriculum is complete: with the threshold at 1e6 a position is added
// after every epoch of 4 steps, all 9 targets from step 28 on; killed after step 40 (checkpoint at
// 36), the run resumes and ends with the uninterrupted run's weights. (The epoch counters used to
// keep counting after completion, and the resume refused the checkpoint: 8 applied steps, 0 steps
// into the epoch.) A checkpoint written that way is accepted: its counters are not used.
TEST(Curriculum, ARunResumesAfterItsCurriculumIsComplete) {
  auto dir = temp_dir("curriculum_complete");
  ASSERT_EQ(train(dir, "a", {"training.num_steps=48"}).code, 0);
  const auto grown = lines_of(dir / "a", "curriculum");
  ASSERT_FALSE(grown.empty());
  EXPECT_EQ(int(grown.back()["positions"]), 9);
  EXPECT_EQ(int(grown.back()["step"]), 28);
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "40", 1);
  auto k = train(dir, "b", {"training.num_steps=48"});
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_NE(k.code, 0) << "the fault injection did not kill the run";
  io::SafeTensors st = io::read_safetensors(dir / "b" / "train_state.safetensors");
  const auto saved = nlohmann::json::parse(st.metadata.at("curriculum"));
  EXPECT_EQ(int(saved["positions"]), 9);
  EXPECT_EQ(int(saved["applied"]), 0);
  auto r = run_lrnn("train --resume " + (dir / "b").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(dir / "b" / "model.safetensors"), read_text(dir / "a" / "model.safetensors"));

  setenv("LRNN_FAULT_KILL_AFTER_STEP", "40", 1);
  train(dir, "c", {"training.num_steps=48"});
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  st = io::read_safetensors(dir / "c" / "train_state.safetensors");
  st.metadata["curriculum"] = R"({"positions": 9, "loss_sum": 0.5, "applied": 8})";
  io::write_safetensors(dir / "c" / "train_state.safetensors", st);
  r = run_lrnn("train --resume " + (dir / "c").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(dir / "c" / "model.safetensors"), read_text(dir / "a" / "model.safetensors"));
}

// training.curriculum_lr_factor: from the first step after the curriculum is complete (after step
// 28 here, as above) the learning rate is the schedule's times the factor, before that the
// schedule's own; a run killed after that point and resumed ends with the uninterrupted run's
// weights; a resume may not change the factor; without a curriculum the key is refused.
TEST(Curriculum, LearningRateFactorOnceComplete) {
  auto dir = temp_dir("curriculum_lr_factor");
  ASSERT_EQ(train(dir, "plain", {"training.num_steps=40"}).code, 0);
  ASSERT_EQ(train(dir, "a", {"training.num_steps=40", "training.curriculum_lr_factor=0.1"}).code, 0);
  const auto plain = lines_of(dir / "plain", "train"), scaled = lines_of(dir / "a", "train");
  ASSERT_EQ(plain.size(), 40u);
  ASSERT_EQ(scaled.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    const int step = int(plain[i]["step"]);  // (the step just taken is step - 1)
    const double want = double(plain[i]["lr"]) * (step > 28 ? 0.1 : 1.0);
    EXPECT_NEAR(double(scaled[i]["lr"]), want, 1e-6 * want + 1e-15) << "step " << step;
  }
  EXPECT_NE(read_text(dir / "a" / "model.safetensors"), read_text(dir / "plain" / "model.safetensors"));

  setenv("LRNN_FAULT_KILL_AFTER_STEP", "33", 1);
  auto k = train(dir, "b", {"training.num_steps=40", "training.curriculum_lr_factor=0.1"});
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_NE(k.code, 0) << "the fault injection did not kill the run";
  auto changed = run_lrnn("train --resume " + (dir / "b").string() + " --set training.curriculum_lr_factor=0.5");
  EXPECT_EQ(changed.code, 2) << changed.out;
  EXPECT_NE(changed.out.find("curriculum_lr_factor"), std::string::npos) << changed.out;
  auto r = run_lrnn("train --resume " + (dir / "b").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(dir / "b" / "model.safetensors"), read_text(dir / "a" / "model.safetensors"));

  auto none = train(dir, "none", {"training.curriculum=0", "training.curriculum_lr_factor=0.5"});
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("training.curriculum_lr_factor"), std::string::npos) << none.out;
}

TEST(Curriculum, ConfigsThatCannotWorkAreRefused) {
  auto dir = temp_dir("curriculum_bad");
  auto answer = train(dir, "parity", {"task.name=parity", "task.group=S3", "task.bos=false", "task.train_len=[3,12]",
                                      "task.eval_len=[12,16]", "task.train_pool=0", "training.curriculum_every=4"});
  EXPECT_EQ(answer.code, 2) << answer.out;
  EXPECT_NE(answer.out.find("needs a label at every position"), std::string::npos) << answer.out;
  auto no_epochs = train(dir, "fresh", {"task.train_pool=0"});
  EXPECT_EQ(no_epochs.code, 2) << no_epochs.out;
  EXPECT_NE(no_epochs.out.find("training.curriculum_every"), std::string::npos) << no_epochs.out;
  // Fresh data with epochs of a given length is fine.
  EXPECT_EQ(train(dir, "every", {"task.train_pool=0", "training.curriculum_every=4", "training.num_steps=8"}).code, 0);
  EXPECT_EQ(lines_of(dir / "every", "curriculum").size(), 2u);
}
