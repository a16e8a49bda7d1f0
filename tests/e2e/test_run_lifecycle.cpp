// A run's life as a user lives it: what the binary says it is, what a run directory records of
// where it came from, Ctrl-C (nothing lost, a resume that continues the same trajectory, a second
// Ctrl-C that aborts at once), resumes that would bend the schedule, and the smaller commands
// (eval, predict, data, --help) on their edges.
#include <gtest/gtest.h>
#include <chrono>
#include <csignal>
#include <regex>
#include <sstream>
#include <thread>
#include <fcntl.h>
#include <spawn.h>
#include <nlohmann/json.hpp>
#include "cli_util.h"

using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

// kTinyConfig, long (so a signal lands mid-run) on one worker, with numbers spelled as a user
// would (the config.yaml test reads them back).
const std::string kTiny =
    tiny_config({"training.num_steps=3000", "training.min_lr=1.0e-5", "training.adam_eps=1e-8",
                 "training.checkpoint_every=1000", "training.num_threads=1", "model.initializer_range=0.03"});

// Waits until the run has logged at least `n` training lines (or `seconds` pass).
bool wait_for_steps(const fs::path& run, size_t n, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (fs::exists(run / "metrics.jsonl") && lines_of(run, "train").size() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

nlohmann::json last_session(const fs::path& run) {
  return nlohmann::json::parse(read_text(run / "provenance.json"))["sessions"].back();
}

}  // namespace

TEST(RunLifecycle, VersionNamesTheCommit) {
  auto r = run_lrnn("--version");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^lrnn \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}|unknown)(, modified)?\))")))
      << r.out;
}

TEST(RunLifecycle, ProvenanceRecordsWhatMadeTheRun) {
  auto dir = temp_dir("provenance");
  write_text(dir / "c.yaml", kTiny);
  auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() +
                    " --set training.num_steps=5");
  ASSERT_EQ(r.code, 0) << r.out;
  auto doc = nlohmann::json::parse(read_text(dir / "run" / "provenance.json"));
  ASSERT_EQ(doc["sessions"].size(), 1u);
  auto s = doc["sessions"][0];
  EXPECT_EQ(s["lrnn"]["version"].get<std::string>().empty(), false);
  EXPECT_TRUE(std::regex_match(s["lrnn"]["commit"].get<std::string>(), std::regex("[0-9a-f]{40}|unknown")));
  EXPECT_TRUE(s["lrnn"]["modified"].is_boolean());
  ASSERT_TRUE(s["command"].is_array());
  EXPECT_EQ(s["command"][1], "train");
  EXPECT_NE(s["command"].dump().find("training.num_steps=5"), std::string::npos);
  for (auto k : {"hostname", "os", "cpu", "blas", "openmp"}) EXPECT_TRUE(s["host"].contains(k)) << k;
  EXPECT_FALSE(s["host"]["cpu"]["model"].get<std::string>().empty());
  EXPECT_TRUE(s["host"]["cpu"]["isa"].is_array());
  EXPECT_FALSE(s["host"]["blas"]["core"].get<std::string>().empty());
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_EQ(s["precision"], "fp32");
  EXPECT_EQ(s["first_step"], 0);
  EXPECT_EQ(s["last_step"], 5);
  EXPECT_EQ(s["outcome"], "finished");
  EXPECT_TRUE(std::regex_match(s["start"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  EXPECT_TRUE(s.contains("end"));
  // OpenMP threads wait passively unless the user chose otherwise.
  EXPECT_EQ(s["host"]["openmp"]["OMP_WAIT_POLICY"], "passive");
  setenv("OMP_WAIT_POLICY", "active", 1);
  auto a = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run2").string() +
                    " --set training.num_steps=2");
  unsetenv("OMP_WAIT_POLICY");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(last_session(dir / "run2")["host"]["openmp"]["OMP_WAIT_POLICY"], "active");
  // A resume appends a session.
  ASSERT_EQ(run_lrnn("train --resume " + (dir / "run2").string()).code, 0);
  EXPECT_EQ(nlohmann::json::parse(read_text(dir / "run2" / "provenance.json"))["sessions"].size(), 2u);
  EXPECT_EQ(last_session(dir / "run2")["resumed"], true);
}

// Ctrl-C: the step in flight finishes, a checkpoint is written, the process ends by SIGINT with a
// message that says how to continue, and the resumed run is step for step the uninterrupted one.
TEST(RunLifecycle, CtrlCSavesTheRunAndResumeContinuesIt) {
  auto dir = temp_dir("sigint");
  write_text(dir / "c.yaml", kTiny);
  const std::string cfg = (dir / "c.yaml").string();
  ASSERT_EQ(run_lrnn("train --config " + cfg + " --out " + (dir / "full").string()).code, 0);
  auto full = lines_of(dir / "full", "train");
  ASSERT_EQ(full.size(), 3000u);

  const fs::path run = dir / "run";
  Child c({"train", "--config", cfg, "--out", run.string()}, dir / "log.txt");
  ASSERT_GT(c.pid, 0);
  ASSERT_TRUE(wait_for_steps(run, 50, 60)) << read_text(dir / "log.txt");
  kill(c.pid, SIGINT);
  int st = c.wait_status();
  const std::string log = read_text(dir / "log.txt");
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st << "\n" << log;
  EXPECT_NE(log.find("continue with: lrnn train --resume " + run.string()), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(run / "eval.json"));
  const size_t done = lines_of(run, "train").size();
  ASSERT_LT(done, 3000u) << "the run finished before the signal; nothing was tested";
  // The checkpoint holds every logged step: the resume does not repeat any.
  auto s = last_session(run);
  EXPECT_EQ(s["outcome"], "interrupted by SIGINT");
  EXPECT_EQ(s["last_step"], done);

  auto r = run_lrnn("train --resume " + run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto resumed = lines_of(run, "train");
  ASSERT_EQ(resumed.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(resumed[i]["step"], full[i]["step"]);
    ASSERT_EQ(double(resumed[i]["loss"]), double(full[i]["loss"])) << "step " << i + 1;
  }
  EXPECT_EQ(read_text(run / "model.safetensors"), read_text(dir / "full" / "model.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(read_text(run / "provenance.json"))["sessions"].size(), 2u);
}

// A second Ctrl-C while the first is being honoured aborts at once: no interruption checkpoint.
TEST(RunLifecycle, SecondCtrlCAbortsAtOnce) {
  auto dir = temp_dir("sigint2");
  // Slow steps (~0.1-1 s each), so that the second signal lands while the first step still runs.
  write_text(dir / "c.yaml", R"(training: {num_steps: 100, batch_size: 512, checkpoint_every: 0, num_threads: 1}
model: {model_type: delta_net, hidden_size: 256, num_hidden_layers: 2, num_heads: 4}
task: {name: parity, train_len: [40, 40], eval_len: [40, 41], eval_samples: 8}
logging: {log_every: 1, progress: none}
)");
  const fs::path run = dir / "run";
  Child c({"train", "--config", (dir / "c.yaml").string(), "--out", run.string()}, dir / "log.txt");
  ASSERT_GT(c.pid, 0);
  ASSERT_TRUE(wait_for_steps(run, 1, 120)) << read_text(dir / "log.txt");
  kill(c.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  kill(c.pid, SIGINT);
  int st = c.wait_status();
  const std::string log = read_text(dir / "log.txt");
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st << "\n" << log;
  EXPECT_NE(log.find("interrupted: finishing this step"), std::string::npos) << log;
  EXPECT_EQ(log.find("checkpoint saved"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(run / "train_state.safetensors")) << "no checkpoint may be written after the abort";
  EXPECT_FALSE(last_session(run).contains("outcome"));
}

TEST(RunLifecycle, ResumeRefusesToBendTheSchedule) {
  auto dir = temp_dir("schedule");
  write_text(dir / "c.yaml", kTiny);
  const std::string run = (dir / "run").string();
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "1500", 1);
  run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + run);
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_FALSE(fs::exists(dir / "run" / "eval.json"));
  for (auto set : {"training.num_steps=6000", "training.lr=1e-2", "training.warmup_steps=100", "training.min_lr=0"}) {
    auto r = run_lrnn("train --resume " + run + " --set " + set);
    EXPECT_EQ(r.code, 2) << set << ": " << r.out;
    std::string key = std::string(set).substr(0, std::string(set).find('='));
    EXPECT_NE(r.out.find(key), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("schedule"), std::string::npos) << r.out;
  }
  // Unchanged values (however spelled) resume.
  auto ok = run_lrnn("train --resume " + run + " --set training.lr=0.003");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(RunLifecycle, ConfigYamlKeepsNumbersAsWritten) {
  auto dir = temp_dir("numbers");
  write_text(dir / "c.yaml", kTiny);
  ASSERT_EQ(run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() +
                     " --set training.num_steps=2 --set training.weight_decay=2.5e-2").code, 0);
  std::string y = read_text(dir / "run" / "config.yaml");
  for (auto want : {"lr: 3.0e-3", "min_lr: 1.0e-5", "adam_eps: 1e-8", "weight_decay: 2.5e-2", "initializer_range: 0.03",
                    "beta2: 0.999", "norm_eps: 1e-06"})
    EXPECT_NE(y.find(want), std::string::npos) << want << " in\n" << y;
  EXPECT_EQ(y.find("0000000"), std::string::npos) << y;
}

TEST(RunLifecycle, EvalWritesItsResultAndTakesOnlyTaskKeys) {
  auto dir = temp_dir("eval");
  write_text(dir / "c.yaml", kTiny);
  ASSERT_EQ(run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() +
                     " --set training.num_steps=5").code, 0);
  auto e = run_lrnn("eval --run " + (dir / "run").string() + " --set task.eval_len=[20,30]");
  ASSERT_EQ(e.code, 0) << e.out;
  ASSERT_TRUE(fs::exists(dir / "run" / "eval_20-30.json"));
  auto j = nlohmann::json::parse(read_text(dir / "run" / "eval_20-30.json"));
  EXPECT_EQ(j["lengths"], nlohmann::json({20, 30}));
  EXPECT_NE(e.out.find("20-30"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("eval_20-30.json"), std::string::npos) << e.out;
  EXPECT_LT(std::count(e.out.begin(), e.out.end(), '\n'), 16) << "a compact table, not the whole JSON:\n" << e.out;
  for (auto bad : {"training.lr=1", "model.hidden_size=8", "logging.log_every=3"}) {
    auto r = run_lrnn("eval --run " + (dir / "run").string() + " --set " + bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.out.find("only task.* keys"), std::string::npos) << r.out;
  }
}

TEST(RunLifecycle, PredictAddsBosAndRejectsPadding) {
  auto dir = temp_dir("predict");
  write_text(dir / "c.yaml", R"(training: {num_steps: 2, batch_size: 4, checkpoint_every: 0, num_threads: 1}
model: {model_type: gated_deltaproduct, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, head_dim: 8,
        intermediate_size: 32, num_householder: 2, use_short_conv: false}
task: {name: word_problem, group: S3, bos: true, train_len: [4, 8], eval_len: [8, 8], eval_samples: 4}
logging: {log_every: 1, progress: none}
)");
  ASSERT_EQ(run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string()).code, 0);
  // S3: elements 0-5, pad 6, BOS 7.
  auto p = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 2 3\"");
  ASSERT_EQ(p.code, 0) << p.out;
  auto j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["bos_added"], 7);
  ASSERT_EQ(j["positions"].size(), 4u);
  EXPECT_EQ(j["positions"][0]["token"], 7);
  EXPECT_EQ(j["positions"][1]["token"], 1);
  auto given = nlohmann::json::parse(run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"7 1 2 3\"").out);
  EXPECT_FALSE(given.contains("bos_added"));
  EXPECT_EQ(given["positions"], j["positions"]);
  auto pad = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 6 2\"");
  EXPECT_EQ(pad.code, 2);
  EXPECT_NE(pad.out.find("padding token"), std::string::npos) << pad.out;
}

TEST(RunLifecycle, DataTakesAConfigAndHelpListsTasksAndModels) {
  auto d = run_lrnn("data --config " + std::string(LRNN_SOURCE_DIR) +
                    "/configs/state_tracking/s3_deltaproduct_nh2_neg.yaml --n 2 --length 10");
  ASSERT_EQ(d.code, 0) << d.out;
  auto j = nlohmann::json::parse(d.out.substr(0, d.out.find('\n')));
  EXPECT_NE(j["text"].get<std::string>().find("<bos>"), std::string::npos) << d.out;  // the config's task: S3 with BOS
  EXPECT_EQ(run_lrnn("data --config /nonexistent.yaml").code, 2);
  EXPECT_EQ(run_lrnn("data --config " + std::string(LRNN_SOURCE_DIR) + "/configs/demo/parity_delta_net.yaml --task parity").code, 2);
  auto h = run_lrnn("--help");
  for (auto name : {"parity", "modular_arithmetic_with_brackets", "word_problem", "delta_net", "gated_deltaproduct",
                    "mamba", "llama", "lstm", "mlstm", "slstm"})
    EXPECT_NE(h.out.find(name), std::string::npos) << name;
}

TEST(RunLifecycle, ProgressBarFitsTheTerminal) {
  auto dir = temp_dir("bar");
  write_text(dir / "c.yaml", kTiny);
  for (int cols : {40, 80, 200}) {
    setenv("COLUMNS", std::to_string(cols).c_str(), 1);
    auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() +
                      " --force --set training.num_steps=300 --set logging.progress=bar");
    unsetenv("COLUMNS");
    ASSERT_EQ(r.code, 0) << r.out;
    int bars = 0;
    std::stringstream ss(r.out);
    std::string seg;
    while (std::getline(ss, seg, '\r')) {
      seg = seg.substr(0, seg.find('\n'));
      auto esc = seg.find("\033[K");
      if (esc == std::string::npos) continue;
      ++bars;
      EXPECT_LE(int(esc), cols - 1) << cols << " columns: '" << seg.substr(0, esc) << "'";
    }
    EXPECT_GT(bars, 0) << r.out;
  }
}
