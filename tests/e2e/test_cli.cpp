// The command line as a user meets it: good runs, bad input (exit 2, one clear message, nothing
// half-written), corrupt checkpoints, and resume after a kill that matches an uninterrupted run.
#include <gtest/gtest.h>
#include <sstream>
#include <nlohmann/json.hpp>
#include "cli_util.h"

using namespace lrnn::test;
namespace fs = std::filesystem;

static const char* kTiny = kTinyConfig;

static std::vector<nlohmann::json> train_lines(const fs::path& run) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_text(run / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") v.push_back(j);
  }
  return v;
}

TEST(Cli, TrainWritesTheRunDirectory) {
  auto dir = temp_dir("train");
  write_text(dir / "c.yaml", kTiny);
  auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (auto f : {"config.yaml", "config.json", "model.safetensors", "metrics.jsonl", "eval.json", "train_state.safetensors"})
    EXPECT_TRUE(fs::exists(dir / "run" / f)) << f;
  auto eval = nlohmann::json::parse(read_text(dir / "run" / "eval.json"));
  for (auto k : {"accuracy", "scaled_accuracy", "per_length", "train_range"}) EXPECT_TRUE(eval.contains(k)) << k;
  EXPECT_EQ(eval["per_length"].size(), 5u);  // lengths 12..16
  auto cfg = nlohmann::json::parse(read_text(dir / "run" / "config.json"));
  EXPECT_EQ(cfg["model_type"], "delta_net");
  EXPECT_EQ(cfg["allow_neg_eigval"], true);
  EXPECT_EQ(train_lines(dir / "run").size(), 24u);
  // A second train into the same directory refuses instead of overwriting.
  auto again = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.out.find("--resume"), std::string::npos) << again.out;

  // eval at other lengths, predict, data.
  auto e = run_lrnn("eval --run " + (dir / "run").string() + " --set task.eval_len=[20,22] --json");
  ASSERT_EQ(e.code, 0) << e.out;
  auto ej = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  EXPECT_EQ(ej["lengths"], nlohmann::json({20, 22}));
  auto p = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 2 2 1\"");
  ASSERT_EQ(p.code, 0) << p.out;
  auto pj = nlohmann::json::parse(p.out);
  ASSERT_EQ(pj["positions"].size(), 4u);
  EXPECT_EQ(pj["positions"][2]["logits"].size(), 3u);
  auto d = run_lrnn("data --task parity --n 3 --seed 5");
  ASSERT_EQ(d.code, 0);
  std::istringstream lines(d.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["input"].size(), j["target"].size());
    ++n;
  }
  EXPECT_EQ(n, 3);
}

TEST(Cli, BadConfigsFailWithExitTwoAndWriteNothing) {
  auto dir = temp_dir("bad");
  struct Case { std::string name, yaml, expect; };
  std::string base = kTiny;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  std::vector<Case> cases = {
      {"unknown_key", with("  lr: 3.0e-3", "  lr: 3.0e-3\n  learning_rate: 1"), "training.learning_rate: unknown key"},
      {"wrong_type", with("batch_size: 8", "batch_size: eight"), "training.batch_size: expected an integer"},
      {"out_of_range", with("lr: 3.0e-3", "lr: -1"), "training.lr: expected a number in [0, 10], got -1"},
      {"bad_choice", with("name: parity", "name: parityy"), "task.name: expected one of"},
      {"bad_range", with("train_len: [3, 12]", "train_len: [12, 3]"), "task.train_len: expected [lo, hi]"},
      {"heads", with("num_heads: 2", "num_heads: 3"), "model.num_heads: must divide hidden_size"},
      {"model_type", with("model_type: delta_net", "model_type: gpt5"), "model.model_type"},
      {"block", base + "optimizer:\n  lr: 1\n", "optimizer: unknown block"},
      {"yaml", "training: [1, 2\n", "not valid YAML"},
  };
  for (auto& c : cases) {
    auto file = dir / (c.name + ".yaml");
    write_text(file, c.yaml);
    auto out = dir / ("run_" + c.name);
    auto r = run_lrnn("train --config " + file.string() + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(file.string()), std::string::npos) << c.name << " must name the file: " << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.name << ": nothing may be written";
  }
  auto missing = run_lrnn("train --config " + (dir / "nope.yaml").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("no such config file"), std::string::npos);
  auto set = run_lrnn("train --config " + (dir / "unknown_key.yaml").string() + " --set training.lr");
  EXPECT_EQ(set.code, 2);
  auto flag = run_lrnn("train --bogus");
  EXPECT_EQ(flag.code, 2);
  auto tokens = run_lrnn("data --n 0");
  EXPECT_EQ(tokens.code, 2);
}

TEST(Cli, CorruptCheckpointIsRejected) {
  auto dir = temp_dir("corrupt");
  write_text(dir / "c.yaml", kTiny);
  ASSERT_EQ(run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() +
                     " --set training.num_steps=2").code, 0);
  std::string good = read_text(dir / "run" / "model.safetensors");
  write_text(dir / "run" / "model.safetensors", good.substr(0, good.size() - 10));
  auto r = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 2\"");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  write_text(dir / "run" / "model.safetensors", "");
  EXPECT_EQ(run_lrnn("eval --run " + (dir / "run").string()).code, 2);
  write_text(dir / "run" / "model.safetensors", good);
  auto bad_tok = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 7\"");
  EXPECT_EQ(bad_tok.code, 2);
  EXPECT_NE(bad_tok.out.find("'7' is not a token id"), std::string::npos) << bad_tok.out;
  EXPECT_EQ(run_lrnn("eval --run " + (dir / "nowhere").string()).code, 2);
}

TEST(Cli, ResumeAfterKillMatchesUninterruptedRun) {
  auto dir = temp_dir("resume");
  write_text(dir / "c.yaml", kTiny);
  std::string cfg = (dir / "c.yaml").string();
  ASSERT_EQ(run_lrnn("train --config " + cfg + " --out " + (dir / "a").string()).code, 0);
  auto full = train_lines(dir / "a");
  ASSERT_EQ(full.size(), 24u);

  // The same run, killed (SIGKILL) after step 10: its last checkpoint is from step 8, and
  // metrics.jsonl already holds steps 9 and 10, which the resume must replace.
  fs::path b = dir / "b";
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "10", 1);
  auto k = run_lrnn("train --config " + cfg + " --out " + b.string());
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  EXPECT_NE(k.code, 0) << "the fault injection did not kill the run";
  EXPECT_FALSE(fs::exists(b / "eval.json"));
  EXPECT_EQ(train_lines(b).size(), 10u);
  auto r = run_lrnn("train --resume " + b.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto resumed = train_lines(b);
  ASSERT_EQ(resumed.size(), 24u);
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(resumed[i]["step"], full[i]["step"]);
    EXPECT_EQ(double(resumed[i]["loss"]), double(full[i]["loss"])) << "step " << i + 1;
  }
  EXPECT_EQ(read_text(b / "model.safetensors"), read_text(dir / "a" / "model.safetensors"));
}

// Several GPUs: what a machine without them can check of `--gpus` and of the rank environment.
TEST(Cli, MultiProcessTrainingIsForGpusAndSaysWhy) {
  auto dir = temp_dir("gpus");
  write_text(dir / "tiny.yaml", kTinyConfig);
  const std::string base = "train --config " + (dir / "tiny.yaml").string() + " --out " + (dir / "run").string();
  auto r = run_lrnn(base + " --gpus 2 --device cpu");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--gpus 2 trains on GPUs"), std::string::npos) << r.out;
  // A rank started by a scheduler (here by hand) on the CPU: refused before anything is written.
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29999", 1);
  r = run_lrnn(base + " --device cpu");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("training over several processes is on GPUs only"), std::string::npos) << r.out;
  r = run_lrnn(base + " --gpus 2");  // --gpus inside a launched rank
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("already rank 1 of 2"), std::string::npos) << r.out;
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
  EXPECT_FALSE(fs::exists(dir / "run" / "metrics.jsonl"));
  if (!std::getenv("LRNN_TEST_HAS_GPU")) {
    // The launcher itself on a machine without GPUs (or a build without CUDA): every rank stops
    // with the device error, named by its rank, and the launcher returns its status.
    r = run_lrnn(base + " --gpus 2");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(r.out.find("no CUDA device is available") != std::string::npos ||
                r.out.find("this lrnn was built without CUDA") != std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(" of 2): error"), std::string::npos) << r.out;  // (whichever rank stops first)
    EXPECT_NE(r.out.find("lrnn --gpus: rank"), std::string::npos) << r.out;
  }
  fs::remove_all(dir);
}
