// Running the real `lrnn` binary from tests, as a user would.
#pragma once
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>
#include "io/schema.h"

extern "C" char** environ;

namespace lrnn::test {

// The tests' tiny experiment: a 1-layer DeltaNet [-1,1] of width 16 on parity, 24 steps of batch
// 8, a checkpoint every 4 steps, a metrics line per step.
inline const char* kTinyConfig = R"(training:
  num_steps: 24
  batch_size: 8
  lr: 3.0e-3
  warmup_steps: 4
  checkpoint_every: 4
  seed: 3
model:
  model_type: delta_net
  hidden_size: 16
  num_hidden_layers: 1
  num_heads: 2
  intermediate_size: 32
  allow_neg_eigval: true
task:
  name: parity
  train_len: [3, 12]
  eval_len: [12, 16]
  eval_samples: 20
logging:
  log_every: 1
  progress: none
)";

// kTinyConfig with `block.key=value` changes (as --set writes them), as YAML text; values keep
// their spelling ("1.0e-5").
inline std::string tiny_config(std::initializer_list<std::string> sets) {
  YAML::Node root = YAML::Load(kTinyConfig);
  for (const auto& s : sets) io::apply_override(root, s);
  return YAML::Dump(root) + "\n";
}

struct RunResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

inline RunResult run_lrnn(const std::string& args) {
  std::string cmd = std::string(LRNN_BINARY) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("lrnn_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The metrics.jsonl lines of a run with this "type" (train, eval, curriculum, ...), in order; a
// line still being written by a running process (not yet valid JSON) is skipped.
inline std::vector<nlohmann::json> lines_of(const std::filesystem::path& run, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_text(run / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j["type"] == type) v.push_back(j);
  }
  return v;
}

// `lrnn args...` as a child process with stdout and stderr in `log`, for tests that signal it. The
// child starts with SIGINT and SIGTERM at their default action even when the test runs in the
// background (where a shell would have it ignore SIGINT).
struct Child {
  pid_t pid = -1;
  Child(const std::vector<std::string>& args, const std::filesystem::path& log) {
    std::vector<std::string> all{LRNN_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
    if (posix_spawn(&pid, argv[0], &fa, &at, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
  }
  int wait_status() {
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
  }
};

}  // namespace lrnn::test
