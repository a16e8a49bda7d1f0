// Bad numbers and hostile input, as found by a mutation fuzzer and a sanitizer build over real
// run directories: each finding is a test here. A broken state is never loaded, a non-finite
// model never replaces a good checkpoint, counters and sizes are checked before they are used,
// and a run directory has one trainer at a time.
#include <gtest/gtest.h>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstring>
#include <functional>
#include <sys/stat.h>
#include <sys/wait.h>
#include <limits>
#include <sstream>
#include <thread>
#include <fcntl.h>
#include <spawn.h>
#include <nlohmann/json.hpp>
#include "cli_util.h"
#include "io/safetensors.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

// kTinyConfig run longer on one worker (the tests tamper with its step-4 checkpoint).
const std::string kTiny = tiny_config({"training.num_steps=300", "training.num_threads=1"});

// A run killed after step 6: its checkpoint (step 4) is what the tests tamper with.
fs::path killed_run(const std::string& name) {
  auto dir = temp_dir(name);
  write_text(dir / "c.yaml", kTiny);
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "6", 1);
  run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  EXPECT_TRUE(fs::exists(dir / "run" / "train_state.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "run" / "eval.json"));
  return dir / "run";
}

// Rewrites a safetensors file after `edit` changed it.
void tamper(const fs::path& file, const std::function<void(io::SafeTensors&)>& edit) {
  io::SafeTensors st = io::read_safetensors(file);
  edit(st);
  io::write_safetensors(file, st);
}

void set_values(io::SafeTensors& st, const std::string& name, float value, size_t count = size_t(-1)) {
  for (auto& t : st.tensors)
    if (t.name == name) {
      auto v = t.to_f32();
      for (size_t i = 0; i < v.size() && i < count; ++i) v[i] = value;
      std::memcpy(t.data.data(), v.data(), v.size() * sizeof(float));
      return;
    }
  ADD_FAILURE() << "no tensor " << name;
}

void expect_refused(const RunResult& r, const std::string& needle, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << ":\n" << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << what << ": expected '" << needle << "' in\n" << r.out;
}

}  // namespace

TEST(HostileInput, TrainStateCountersAreValidated) {
  const fs::path run = killed_run("counters");
  const std::string good = read_text(run / "train_state.safetensors");
  const std::string model = read_text(run / "model.safetensors");
  struct Case { const char* key; const char* value; const char* expect; };
  for (Case c : std::vector<Case>{{"step", "-5", "'step' is '-5'"},
                                  {"step", "-1000000000000", "'step' is"},
                                  {"step", "5abc", "'step' is '5abc'"},
                                  {"step", "1e3", "'step' is '1e3'"},
                                  {"step", "0x10", "'step' is '0x10'"},
                                  {"step", "", "'step' is ''"},
                                  {"adam_step", "9223372036854775807", "'adam_step' is"},
                                  {"skipped", "3", "adam_step 4 + skipped 3 != step 4"},
                                  {"step", "99999", "!= step 99999"}}) {
    write_text(run / "train_state.safetensors", good);
    tamper(run / "train_state.safetensors", [&](io::SafeTensors& st) { st.metadata[c.key] = c.value; });
    auto r = run_lrnn("train --resume " + run.string());
    expect_refused(r, c.expect, std::string(c.key) + "=" + c.value);
    EXPECT_TRUE(read_text(run / "model.safetensors") == model) << "the good checkpoint must stay";
  }
  write_text(run / "train_state.safetensors", good);
  EXPECT_EQ(run_lrnn("train --resume " + run.string()).code, 0);
}

TEST(HostileInput, BrokenStatesAndModelsAreRefused) {
  const fs::path run = killed_run("broken");
  const std::string good = read_text(run / "train_state.safetensors");
  const std::string model = read_text(run / "model.safetensors");
  const std::string w = "model.layers.0.attn.q_proj.weight";
  // A negative second moment made sqrt(v) NaN and the whole model NaN (16,384 parameters), exit 0.
  tamper(run / "train_state.safetensors", [&](io::SafeTensors& st) { set_values(st, "adam_v." + w, -1.f, 3); });
  expect_refused(run_lrnn("train --resume " + run.string()), "3 non-finite or negative values", "negative adam_v");
  write_text(run / "train_state.safetensors", good);
  tamper(run / "train_state.safetensors",
         [&](io::SafeTensors& st) { set_values(st, "param." + w, std::numeric_limits<float>::quiet_NaN(), 1); });
  expect_refused(run_lrnn("train --resume " + run.string()), "1 non-finite values", "NaN parameter");
  write_text(run / "train_state.safetensors", good);
  tamper(run / "train_state.safetensors",
         [&](io::SafeTensors& st) { st.add_values<float>("adam_m.extra.weight", {2}, {1.f, 2.f}); });
  expect_refused(run_lrnn("train --resume " + run.string()), "unexpected tensor 'adam_m.extra.weight'", "extra tensor");
  write_text(run / "train_state.safetensors", good);

  // The model file read by eval and predict: the same rules.
  tamper(run / "model.safetensors", [&](io::SafeTensors& st) { set_values(st, w, INFINITY, 2); });
  expect_refused(run_lrnn("predict --run " + run.string() + " --tokens \"1 2\""), "2 non-finite values", "Inf weight");
  write_text(run / "model.safetensors", model);
  tamper(run / "model.safetensors", [&](io::SafeTensors& st) { st.add_values<float>("lm_head.bias", {3}, {0, 0, 0}); });
  expect_refused(run_lrnn("eval --run " + run.string()), "unexpected tensor 'lm_head.bias'", "extra tensor");
  write_text(run / "model.safetensors", model);
  // A link to a device or a FIFO in place of the weights: refused at once, no hang, no OOM.
  fs::remove(run / "model.safetensors");
  fs::create_symlink("/dev/zero", run / "model.safetensors");
  expect_refused(run_lrnn("predict --run " + run.string() + " --tokens \"1 2\""), "not a regular file", "/dev/zero");
  fs::remove(run / "model.safetensors");
  ASSERT_EQ(mkfifo((run / "model.safetensors").c_str(), 0644), 0);
  auto t0 = std::chrono::steady_clock::now();
  expect_refused(run_lrnn("eval --run " + run.string()), "not a regular file (a FIFO)", "FIFO");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// A step whose update would make the model non-finite is skipped; a run whose steps are all
// skipped stops with exit 2, and the good checkpoint stays.
TEST(HostileInput, NonFiniteStepsAreSkippedAndARunOfThemStops) {
  const fs::path run = killed_run("nonfinite");
  // Huge but finite head weights: the gradients reach ~1e30, their squares overflow the second
  // moment (before: written to the checkpoint as inf, exit 0).
  tamper(run / "train_state.safetensors", [&](io::SafeTensors& st) { set_values(st, "param.lm_head.weight", 1e30f); });
  auto r = run_lrnn("train --resume " + run.string());
  expect_refused(r, "were all skipped", "all steps skipped");
  EXPECT_NE(r.out.find("the last 100 steps"), std::string::npos) << r.out;
  // What the periodic checkpoints wrote meanwhile is the (finite) state the steps left alone.
  for (auto f : {"model.safetensors", "train_state.safetensors"})
    for (auto& t : io::read_safetensors(run / f).tensors)
      for (double x : t.to_f64()) ASSERT_TRUE(std::isfinite(x)) << f << ": " << t.name;
  int skips = 0;
  std::istringstream in(read_text(run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) skips += nlohmann::json::parse(line)["type"] == "skip";
  EXPECT_EQ(skips, 100);
  // adam_eps = 0 (0/0 for a parameter whose gradient is zero) is no longer a valid setting.
  write_text(run.parent_path() / "c2.yaml", kTiny);
  expect_refused(run_lrnn("train --config " + (run.parent_path() / "c2.yaml").string() + " --out " +
                          (run.parent_path() / "eps").string() + " --set training.adam_eps=0"),
                 "training.adam_eps", "adam_eps=0");
  expect_refused(run_lrnn("train --config " + (run.parent_path() / "c2.yaml").string() + " --out " +
                          (run.parent_path() / "wd").string() + " --set training.lr=5 --set training.weight_decay=1"),
                 "lr * weight_decay", "lr * wd > 1");
}

TEST(HostileInput, ConfigsSayEachKeyOnceAsAName) {
  auto dir = temp_dir("configs");
  struct Case { std::string name, yaml, expect; };
  std::vector<Case> cases = {
      {"dup", "training:\n  lr: 1.0e-3\n  lr: 5.0\nmodel: {model_type: delta_net}\n", "training.lr: duplicate key (first at line 2)"},
      {"dup_block", "training: {}\ntraining: {}\nmodel: {model_type: delta_net}\n", "training: duplicate key"},
      {"scalar_model", "model: delta_net\n", "model: expected a mapping of keys"},
      {"list_key", "[1, 2]: 3\n", "a key must be a plain name"},
      {"map_key", "model: {{a: 1}: 2}\n", "a key must be a plain name"},
      {"type_map", "model: {model_type: {a: 1}}\n", "model.model_type: expected one of"},
  };
  for (auto& c : cases) {
    write_text(dir / (c.name + ".yaml"), c.yaml);
    auto r = run_lrnn("train --config " + (dir / (c.name + ".yaml")).string() + " --out " + (dir / "run").string());
    expect_refused(r, c.expect, c.name);
    EXPECT_FALSE(fs::exists(dir / "run")) << c.name;
  }
  write_text(dir / "ok.yaml", kTiny);
  auto dup_set = run_lrnn("train --config " + (dir / "ok.yaml").string() + " --out " + (dir / "run").string() +
                          " --set 'model={model_type: delta_net, model_type: mamba}'");
  expect_refused(dup_set, "duplicate key", "--set with a duplicate key");
  write_text(dir / "afile", "");
  expect_refused(run_lrnn("train --config " + (dir / "ok.yaml").string() + " --out " + (dir / "afile").string()),
                 "is not a directory", "--out names a file");
  write_text(dir / "grid.yaml", "configs: [ok.yaml]\nlr: [1.0e-3]\nlr: [2.0e-3]\nseeds: [0]\n");
  expect_refused(run_lrnn("sweep --grid " + (dir / "grid.yaml").string() + " --dry-run"), "lr: duplicate key", "grid");
}

TEST(HostileInput, OneTrainerPerRunDirectoryAndNoStaleTemporaries) {
  auto dir = temp_dir("lock");
  write_text(dir / "c.yaml", kTiny);
  const fs::path run = dir / "run";
  ASSERT_EQ(run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + run.string() +
                     " --set training.num_steps=4").code, 0);
  // Leftovers of writers killed mid-write (kill -9 during a checkpoint).
  write_text(run / "model.safetensors.tmp.99999", "half a file");
  write_text(run / "train_state.safetensors.tmp.123", "half a file");
  write_text(run / "notes.tmp.txt", "not ours");
  // A long run holds its directory...
  const std::string log = (dir / "log.txt").string();
  Child child({"train", "--config", (dir / "c.yaml").string(), "--out", (dir / "long").string(), "--set",
               "training.num_steps=4000000", "--set", "training.checkpoint_every=0"},
              log);
  const pid_t pid = child.pid;
  ASSERT_GT(pid, 0);
  bool started = false;
  for (int i = 0; i < 3000 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    started = fs::exists(dir / "long" / "metrics.jsonl");
  }
  ASSERT_TRUE(started) << read_text(log);
  // ...so a second trainer in it is refused, naming the holder.
  auto second = run_lrnn("train --resume " + (dir / "long").string());
  expect_refused(second, "another lrnn process (pid " + std::to_string(pid) + ") is training in this directory",
                 "second trainer");
  kill(pid, SIGKILL);
  child.wait_status();

  // The stale temporaries go when the next trainer takes the directory; other files stay.
  ASSERT_EQ(run_lrnn("train --resume " + run.string()).code, 0);
  EXPECT_FALSE(fs::exists(run / "model.safetensors.tmp.99999"));
  EXPECT_FALSE(fs::exists(run / "train_state.safetensors.tmp.123"));
  EXPECT_TRUE(fs::exists(run / "notes.tmp.txt"));
}

// Sizes inside the schema's ranges but beyond the machine: refused before anything is allocated or
// written, naming the keys (before: SIGABRT from an exception escaping an OpenMP region, a signed
// overflow, or std::bad_alloc naming nothing, each leaving a half-written run directory).
TEST(HostileInput, SizesAreCheckedAgainstMemoryFirst) {
  auto dir = temp_dir("sizes");
  write_text(dir / "c.yaml", kTiny);
  setenv("LRNN_MEMORY_LIMIT_MB", "2048", 1);  // the same verdicts on any machine
  struct Case { std::string set, expect; };
  for (const Case& c : std::vector<Case>{
           {"'task.train_len=[3,2000000]'", "task.train_len: expected [lo, hi] with 2 <= lo <= hi <= 1048576"},
           {"'task.train_len=[2147483646,2147483647]'", "task.train_len: expected [lo, hi]"},
           {"'task.train_len=[3,1000000]'", "task.train_len up to 1000000"},
           {"training.batch_size=16777216", "training.batch_size 16777216"},
           {"'task.eval_len=[500000,1000000]'", "task.eval_len up to 1000000"},
           {"model.vocab_size=16777216", "parameters (model.hidden_size"},
           {"model.hidden_size=65536 --set model.num_hidden_layers=1024 --set model.num_heads=1",
            "parameters (model.hidden_size"}}) {
    auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string() + " --set " +
                      c.set);
    expect_refused(r, c.expect, c.set);
    EXPECT_NE(r.out.find((dir / "c.yaml").string()), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "run")) << c.set << ": nothing may be written";
  }
  unsetenv("LRNN_MEMORY_LIMIT_MB");
}
