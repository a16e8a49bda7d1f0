#include "train/sweep.h"
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits>
#include <map>
#include <set>
#include <sched.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include "core/check.h"
#include "io/atomic_file.h"
#ifdef LRNN_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace lrnn::sweep {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

// Names become directory names: keep them to letters, digits, '_', '-', '.' (not leading).
bool valid_name(const std::string& s) {
  if (s.empty() || s[0] == '.') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.'; });
}

std::string set_key(const std::string& assignment) { return assignment.substr(0, assignment.find('=')); }

std::vector<std::string> read_sets(const YAML::Node& n, const std::string& where, const std::string& key) {
  std::vector<std::string> v;
  if (!n || n.IsNull()) return v;
  if (!n.IsSequence())
    LRNN_USER_ERROR("{}: {}: expected a list of \"block.key=value\" overrides, e.g. [\"training.num_steps=2000\"], got {}",
                    where, key, shown(n));
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) LRNN_USER_ERROR("{}: {}[{}]: expected a \"block.key=value\" string, got {}", where, key, i, shown(n[i]));
    std::string s = n[i].Scalar();
    auto eq = s.find('=');
    if (eq == std::string::npos || s.find('.') == std::string::npos || s.find('.') > eq)
      LRNN_USER_ERROR("{}: {}[{}]: expected \"block.key=value\" (e.g. training.num_steps=2000), got '{}'", where, key, i, s);
    std::string k = set_key(s);
    if (k == "training.lr") LRNN_USER_ERROR("{}: {}[{}]: training.lr is set by the grid's lr list; list the rates there", where, key, i);
    if (k == "training.seed") LRNN_USER_ERROR("{}: {}[{}]: training.seed is set by the grid's seeds list; list them there", where, key, i);
    v.push_back(s);
  }
  return v;
}

template <class T>
std::vector<T> read_list(const YAML::Node& n, const std::string& where, const std::string& key, const char* what,
                         const char* one, const char* example) {
  if (!n) LRNN_USER_ERROR("{}: {}: missing; expected a list of {}, e.g. {}", where, key, what, example);
  if (!n.IsSequence() || n.size() == 0)
    LRNN_USER_ERROR("{}: {}: expected a non-empty list of {}, e.g. {}, got {}", where, key, what, example,
                    n.IsSequence() ? "an empty list" : shown(n));
  std::vector<T> v;
  for (size_t i = 0; i < n.size(); ++i) {
    T x{};
    bool ok = n[i].IsScalar();
    if (ok) {
      try { x = n[i].as<T>(); } catch (const YAML::Exception&) { ok = false; }
    }
    if (!ok) LRNN_USER_ERROR("{}: {}[{}]: expected {}, got {}", where, key, i, one, shown(n[i]));
    v.push_back(x);
  }
  return v;
}

fs::path find_config(const std::string& file, const fs::path& grid, const std::string& where) {
  fs::path p(file);
  if (p.is_absolute() || fs::is_regular_file(p)) {
    if (!fs::is_regular_file(p)) LRNN_USER_ERROR("{}: {}: no such config file", where, file);
    return p;
  }
  fs::path q = (grid.parent_path() / p).lexically_normal();
  if (fs::is_regular_file(q)) return q;
  LRNN_USER_ERROR("{}: {}: no such config file (looked in the current directory and in {})", where, file,
                  grid.parent_path().empty() ? "." : grid.parent_path().string());
}

ExperimentConfig load_config(const GridConfig& c, const std::vector<std::string>& overrides, const std::string& where) {
  try {
    return ExperimentConfig::load(c.path.string(), overrides);
  } catch (const UserError& e) {
    LRNN_USER_ERROR("{}: {}", where, e.what());
  }
}

std::vector<std::string> overrides_for(const Grid& g, size_t c, double lr, int64_t seed, int threads) {
  std::vector<std::string> o = g.set;
  o.insert(o.end(), g.configs[c].set.begin(), g.configs[c].set.end());
  o.push_back("training.lr=" + format_lr(lr));
  o.push_back("training.seed=" + std::to_string(seed));
  if (threads > 0 && !g.sets_num_threads(c)) o.push_back("training.num_threads=" + std::to_string(threads));
  return o;
}

// A resolved config as dotted key -> YAML text of the value.
void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      flatten(it->second, prefix.empty() ? it->first.as<std::string>() : prefix + "." + it->first.as<std::string>(), out);
  } else {
    YAML::Emitter e;
    e << YAML::Flow << n;
    out[prefix] = e.c_str();
  }
}

bool ignored_key(const std::string& k) {
  return k.rfind("logging.", 0) == 0 || k == "training.num_threads" || k == "training.val_every" ||
         k == "training.checkpoint_every";
}

// What a sweep reads of a finished run's eval.json: the test and training-range scaled accuracy,
// and for word problems the length their sequence accuracy reaches (sequence_reach).
struct EvalScores {
  double scaled = 0, train = 0, reach = 0;
};

}  // namespace

double sequence_reach(const nlohmann::json& e) {
  if (!e.is_object() || e.value("metric", "") != "sequence_accuracy_up_to_length" || !e.contains("per_length") ||
      !e["per_length"].is_object())
    return kNaN;
  std::vector<std::pair<int, double>> curve;
  for (auto& [k, v] : e["per_length"].items()) {
    if (!v.is_object() || !v.contains("accuracy") || !v["accuracy"].is_number()) return kNaN;
    curve.emplace_back(std::atoi(k.c_str()), v["accuracy"].get<double>());
  }
  std::sort(curve.begin(), curve.end());
  double reach = 0;
  for (auto& [t, acc] : curve) {
    if (acc < kReachAccuracy) break;
    reach = t;
  }
  return reach;
}

namespace {

// eval.json's scores; nullopt when missing or unreadable.
std::optional<EvalScores> read_eval(const fs::path& file) {
  if (!fs::exists(file)) return std::nullopt;
  auto j = nlohmann::json::parse(io::read_file(file), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("scaled_accuracy") || !j["scaled_accuracy"].is_number())
    return std::nullopt;
  EvalScores e;
  e.scaled = j["scaled_accuracy"].get<double>();
  e.train = kNaN;
  if (j.contains("train_range") && j["train_range"].is_object() && j["train_range"].contains("scaled_accuracy"))
    e.train = j["train_range"]["scaled_accuracy"].get<double>();
  e.reach = sequence_reach(j);
  return e;
}

std::string last_line(const fs::path& file) {
  std::string s;
  try { s = io::read_file(file); } catch (const UserError&) { return ""; }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  auto nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int sig) { g_stop = sig; }

// Catches SIGINT/SIGTERM/SIGHUP for the duration of a sweep (no SA_RESTART, so sleeps wake up).
struct StopSignals {
  struct sigaction old[3];
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  StopSignals() {
    g_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old[i]);
  }
  ~StopSignals() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old[i], nullptr);
  }
};

// An exclusive lock on the sweep directory: two sweeps must not train the same runs.
struct DirLock {
  int fd = -1;
  explicit DirLock(const fs::path& dir) {
    fs::path f = dir / ".sweep.lock";
    fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) LRNN_USER_ERROR("{}: cannot open: {}", f.string(), std::strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      LRNN_USER_ERROR("{}: another lrnn sweep is running in this directory; wait for it or use another --out", dir.string());
    }
  }
  ~DirLock() { if (fd >= 0) ::close(fd); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
};

// Starts `/proc/self/exe args...` (this very binary) with stdout and stderr appended to `log`.
// The child dies with the sweep (PR_SET_PDEATHSIG), so a killed sweep leaves no orphans.
// `env` ("NAME=value") is set in the child's environment, replacing what the sweep has under
// those names. OMP_NUM_THREADS goes there: training.num_threads alone is applied only once
// training starts, and a worker whose OpenMP pool was first sized for every core wastes CPU
// beside its siblings (measured on 16 cores: 2.3x the CPU time, 1.6x the wall time).
pid_t spawn_worker(const std::vector<std::string>& args, const fs::path& log, const std::string& header,
                   const std::vector<std::string>& env) {
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) LRNN_USER_ERROR("{}: cannot open: {}", log.string(), std::strerror(errno));
  if (::write(fd, header.data(), header.size()) < 0) {}  // the log header is a courtesy
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      const size_t n = x.find('=') + 1;
      return std::strncmp(*e, x.c_str(), n) == 0;
    });
    if (!replaced) envp.push_back(*e);
  }
  for (auto& x : env) envp.push_back(const_cast<char*>(x.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execve("/proc/self/exe", argv.data(), envp.data());
    const char msg[] = "lrnn sweep: cannot execute /proc/self/exe\n";
    if (::write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {}
    _exit(127);
  }
  int err = errno;
  ::close(fd);
  if (pid < 0) throw Error(fmt::format("lrnn sweep: fork failed: {}", std::strerror(err)));
  return pid;
}

// The training.num_threads a worker will run with (0: all cores): a resumed run keeps the one
// saved in its config.yaml (so that it continues bit for bit), others take the grid's.
int worker_threads(const RunSpec& r, RunState state) {
  if (state != RunState::Resume) return r.expected.training.num_threads;
  try {
    YAML::Node n = YAML::LoadFile((r.dir / "config.yaml").string());
    return n["training"]["num_threads"].as<int>();
  } catch (const YAML::Exception&) {
    return 0;
  }
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"\\$`*?[]{}();&|<>!#~") == std::string::npos) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string command_line(const std::vector<std::string>& args) {
  std::string cmd;
  for (auto& x : args) {
    if (!cmd.empty()) cmd += ' ';
    cmd += shell_quote(x);
  }
  return cmd;
}

std::vector<std::string> train_args(const RunSpec& r, RunState state, bool force) {
  if (state == RunState::Resume) return {"lrnn", "train", "--resume", r.dir.string()};
  std::vector<std::string> a = {"lrnn", "train", "--config", r.config_file.string()};
  for (auto& o : r.overrides) { a.push_back("--set"); a.push_back(o); }
  a.push_back("--out");
  a.push_back(r.dir.string());
  if (force) a.push_back("--force");
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Grid

bool Grid::sets_num_threads(size_t c) const {
  auto has = [](const std::vector<std::string>& v) {
    return std::any_of(v.begin(), v.end(), [](const std::string& s) { return set_key(s) == "training.num_threads"; });
  };
  return has(set) || has(configs[c].set);
}

Grid Grid::load(const fs::path& file) {
  const std::string where = file.string();
  if (!fs::is_regular_file(file)) LRNN_USER_ERROR("{}: no such grid file", where);
  YAML::Node root = io::load_yaml_file(where, "keys name, configs, lr, seeds, set (see docs/EXPERIMENTS.md)");
  if (!root.IsMap())
    LRNN_USER_ERROR("{}: expected a mapping with keys name, configs, lr, seeds, set (see docs/EXPERIMENTS.md)", where);
  const std::vector<std::string> keys = {"name", "configs", "lr", "seeds", "set"};
  for (auto it = root.begin(); it != root.end(); ++it) {
    std::string k = it->first.as<std::string>();
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      LRNN_USER_ERROR("{}: {}: unknown key; valid keys are {}", where, k, fmt::join(keys, ", "));
  }

  Grid g;
  g.source = file;
  g.name = file.stem().string();
  if (root["name"]) {
    if (!root["name"].IsScalar() || !valid_name(root["name"].Scalar()))
      LRNN_USER_ERROR("{}: name: expected a name of letters, digits, '_', '-', '.', got {}", where, shown(root["name"]));
    g.name = root["name"].Scalar();
  }

  g.lrs = read_list<double>(root["lr"], where, "lr", "learning rates", "a number", "[1.0e-3, 5.0e-4]");
  for (size_t i = 0; i < g.lrs.size(); ++i) {
    if (!std::isfinite(g.lrs[i]) || g.lrs[i] <= 0)
      LRNN_USER_ERROR("{}: lr[{}]: expected a positive number, got {}", where, i, root["lr"][i].Scalar());
    for (size_t j = 0; j < i; ++j)
      if (g.lrs[j] == g.lrs[i]) LRNN_USER_ERROR("{}: lr[{}]: {} is listed twice", where, i, root["lr"][i].Scalar());
  }
  g.seeds = read_list<int64_t>(root["seeds"], where, "seeds", "integer seeds", "an integer", "[0, 1, 2]");
  for (size_t i = 0; i < g.seeds.size(); ++i) {
    if (g.seeds[i] < 0) LRNN_USER_ERROR("{}: seeds[{}]: expected a seed >= 0, got {}", where, i, g.seeds[i]);
    for (size_t j = 0; j < i; ++j)
      if (g.seeds[j] == g.seeds[i]) LRNN_USER_ERROR("{}: seeds[{}]: {} is listed twice", where, i, g.seeds[i]);
  }
  g.set = read_sets(root["set"], where, "set");

  const YAML::Node cs = root["configs"];
  if (!cs) LRNN_USER_ERROR("{}: configs: missing; expected a list of experiment config files", where);
  if (!cs.IsSequence() || cs.size() == 0)
    LRNN_USER_ERROR("{}: configs: expected a non-empty list of config files (or {{file: F, name: N, set: [...]}}), got {}",
                    where, cs.IsSequence() ? "an empty list" : shown(cs));
  for (size_t i = 0; i < cs.size(); ++i) {
    const std::string at = fmt::format("configs[{}]", i);
    GridConfig c;
    const YAML::Node e = cs[i];
    if (e.IsScalar()) {
      c.file = e.Scalar();
    } else if (e.IsMap()) {
      for (auto it = e.begin(); it != e.end(); ++it) {
        std::string k = it->first.as<std::string>();
        if (k != "file" && k != "name" && k != "set")
          LRNN_USER_ERROR("{}: {}.{}: unknown key; valid keys are file, name, set", where, at, k);
      }
      if (!e["file"] || !e["file"].IsScalar())
        LRNN_USER_ERROR("{}: {}.file: expected the path of a config file, got {}", where, at, shown(e["file"]));
      c.file = e["file"].Scalar();
      if (e["name"]) {
        if (!e["name"].IsScalar() || !valid_name(e["name"].Scalar()))
          LRNN_USER_ERROR("{}: {}.name: expected a name of letters, digits, '_', '-', '.', got {}", where, at, shown(e["name"]));
        c.name = e["name"].Scalar();
      }
      c.set = read_sets(e["set"], where, at + ".set");
    } else {
      LRNN_USER_ERROR("{}: {}: expected a config file path or {{file: F, name: N, set: [...]}}, got {}", where, at, shown(e));
    }
    c.path = find_config(c.file, file, fmt::format("{}: {}", where, at));
    if (c.name.empty()) {
      c.name = c.path.stem().string();
      if (!valid_name(c.name))
        LRNN_USER_ERROR("{}: {}: the file name '{}' cannot name a directory; give a name: {{file: {}, name: N}}", where, at,
                        c.name, c.file);
    }
    for (auto& other : g.configs)
      if (other.name == c.name)
        LRNN_USER_ERROR("{}: {}: the name '{}' is taken by {} (runs go to <out>/<name>/); give one a name: {{file: {}, name: N}}",
                        where, at, c.name, other.file, c.file);
    g.configs.push_back(std::move(c));
  }

  // Every config with every lr and the overrides: mistakes show now, not after hours of runs.
  for (size_t c = 0; c < g.configs.size(); ++c)
    for (double lr : g.lrs)
      load_config(g.configs[c], overrides_for(g, c, lr, g.seeds[0], 0),
                  fmt::format("{}: configs[{}] ({}) with lr {}", where, c, g.configs[c].file, format_lr(lr)));
  return g;
}

std::string format_lr(double lr) {
  for (int p = 0; p < 17; ++p) {
    std::string s = fmt::format("{:.{}e}", lr, p);
    if (std::strtod(s.c_str(), nullptr) != lr) continue;
    auto e = s.find('e');
    std::string mant = s.substr(0, e);
    int exp = std::atoi(s.c_str() + e + 1);
    return fmt::format("{}e{}", mant, exp);
  }
  return fmt::format("{}", lr);
}

std::vector<RunSpec> plan(const Grid& g, const fs::path& out, int threads) {
  std::vector<RunSpec> runs;
  for (size_t c = 0; c < g.configs.size(); ++c)
    for (size_t l = 0; l < g.lrs.size(); ++l)
      for (size_t s = 0; s < g.seeds.size(); ++s) {
        RunSpec r;
        r.config = c;
        r.lr_index = l;
        r.seed_index = s;
        r.lr = g.lrs[l];
        r.seed = g.seeds[s];
        r.id = fmt::format("{}/lr{}_seed{}", g.configs[c].name, format_lr(r.lr), r.seed);
        r.dir = out / r.id;
        r.config_file = g.configs[c].path;
        r.overrides = overrides_for(g, c, r.lr, r.seed, threads);
        r.expected = load_config(g.configs[c], r.overrides, fmt::format("{}: {}", g.source.string(), r.id));
        // The report ranks runs by scaled accuracy, which a language model does not have.
        if (r.expected.task.name == "lm")
          LRNN_USER_ERROR("{}: config {} trains task lm; sweeps aggregate the synthetic tasks' scaled accuracy and do "
                          "not rank language models (train each with lrnn train)", g.source.string(), g.configs[c].path.string());
        runs.push_back(std::move(r));
      }
  return runs;
}

// ---------------------------------------------------------------------------------------------
// State of a run directory

std::vector<std::string> config_differences(const ExperimentConfig& a, const ExperimentConfig& b) {
  std::map<std::string, std::string> fa, fb;
  flatten(a.to_yaml(), "", fa);
  flatten(b.to_yaml(), "", fb);
  std::set<std::string> keys;
  for (auto& [k, v] : fa) keys.insert(k);
  for (auto& [k, v] : fb) keys.insert(k);
  std::vector<std::string> diff;
  for (auto& k : keys) {
    if (ignored_key(k)) continue;
    auto ia = fa.find(k), ib = fb.find(k);
    std::string va = ia == fa.end() ? "(absent)" : ia->second, vb = ib == fb.end() ? "(absent)" : ib->second;
    auto na = io::scalar_number(va), nb = io::scalar_number(vb);  // 5e-3 and 0.005 are the same lr
    if (va != vb && !(na && nb && *na == *nb)) diff.push_back(fmt::format("{}: {} vs {}", k, va, vb));
  }
  return diff;
}

RunStatus inspect(const RunSpec& run) {
  const fs::path& d = run.dir;
  const bool has_eval = fs::exists(d / "eval.json"), has_state = fs::exists(d / "train_state.safetensors");
  if (!has_eval && !has_state) return {RunState::New, ""};  // nothing there that a fresh start would lose
  if (!fs::exists(d / "config.yaml"))
    return {RunState::Conflict, "holds results but no config.yaml"};
  ExperimentConfig saved;
  try {
    saved = ExperimentConfig::load((d / "config.yaml").string(), {});
  } catch (const UserError& e) {
    return {RunState::Conflict, fmt::format("its config.yaml does not load: {}", e.what())};
  }
  auto diff = config_differences(saved, run.expected);
  if (!diff.empty()) {
    std::vector<std::string> first(diff.begin(), diff.begin() + std::min<size_t>(diff.size(), 3));
    return {RunState::Conflict, fmt::format("run vs grid: {}{}", fmt::join(first, "; "),
                                            diff.size() > 3 ? fmt::format("; and {} more", diff.size() - 3) : "")};
  }
  if (has_eval && read_eval(d / "eval.json")) return {RunState::Done, ""};
  if (has_state) return {RunState::Resume, has_eval ? "eval.json is unreadable" : ""};
  return {RunState::New, "eval.json is unreadable"};
}

// ---------------------------------------------------------------------------------------------
// Running

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::vector<std::string> sweep_gpus(const char* visible, int count) {
  std::vector<std::string> v;
  if (visible) {
    std::string s = visible, item;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i == s.size() || s[i] == ',') {
        if (!item.empty()) v.push_back(item);
        item.clear();
      } else if (s[i] != ' ') {
        item += s[i];
      }
    }
    return v;
  }
  for (int i = 0; i < count; ++i) v.push_back(std::to_string(i));
  return v;
}

SweepOutcome run_sweep(const Grid& grid, const SweepOptions& opt) {
  using Clock = std::chrono::steady_clock;
  if (opt.jobs < 1) LRNN_USER_ERROR("sweep: --jobs must be at least 1, got {}", opt.jobs);
  const int cores = available_cores();
  const int threads = std::max(1, cores / opt.jobs);
  std::vector<RunSpec> runs = plan(grid, opt.out, threads);
  const size_t n_grid = runs.size();
  if (!opt.only.empty()) {
    const std::string example = runs.empty() ? "" : runs.front().id;
    std::erase_if(runs, [&](const RunSpec& r) {
      return std::none_of(opt.only.begin(), opt.only.end(), [&](const std::string& pat) { return fnmatch(pat.c_str(), r.id.c_str(), 0) == 0; });
    });
    if (runs.empty())
      LRNN_USER_ERROR("sweep {}: --only {} matches none of its {} runs (their ids look like {}; --dry-run lists them)", grid.name,
                      fmt::join(opt.only, " "), n_grid, example);
  }
  std::vector<RunStatus> status;
  for (auto& r : runs) status.push_back(inspect(r));

  SweepOutcome res;
  res.total = int(runs.size());
  std::vector<std::string> conflicts;
  int n_new = 0, n_resume = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    switch (status[i].state) {
      case RunState::Done: ++res.skipped; break;
      case RunState::Resume: ++n_resume; break;
      case RunState::New: ++n_new; break;
      case RunState::Conflict: conflicts.push_back(fmt::format("  {}: {}", runs[i].id, status[i].why)); break;
    }
  }
  if (!conflicts.empty() && !opt.force) {
    size_t shown_n = std::min<size_t>(conflicts.size(), 5);
    LRNN_USER_ERROR("sweep {}: {} run(s) in {} hold results of another config:\n{}{}\n"
                    "use another --out, or --force to retrain them from scratch",
                    grid.name, conflicts.size(), opt.out.string(),
                    fmt::join(std::vector<std::string>(conflicts.begin(), conflicts.begin() + shown_n), "\n"),
                    conflicts.size() > shown_n ? fmt::format("\n  and {} more", conflicts.size() - shown_n) : "");
  }
  std::string threads_note = fmt::format("{} thread{} per run", threads, threads == 1 ? "" : "s");
  bool any_fixed = false;
  for (size_t c = 0; c < grid.configs.size(); ++c) any_fixed |= grid.sets_num_threads(c);
  if (any_fixed) threads_note += " unless the grid sets training.num_threads";
  std::fprintf(stderr, "lrnn sweep %s: %zu config%s x %zu lr x %zu seed%s = %zu runs in %s (%d job%s, %s)\n",
               grid.name.c_str(), grid.configs.size(), grid.configs.size() == 1 ? "" : "s", grid.lrs.size(),
               grid.seeds.size(), grid.seeds.size() == 1 ? "" : "s", n_grid, opt.out.string().c_str(), opt.jobs,
               opt.jobs == 1 ? "" : "s", threads_note.c_str());
  if (!opt.only.empty())
    std::fprintf(stderr, "  --only %s: %d of them\n", fmt::format("{}", fmt::join(opt.only, " ")).c_str(), res.total);
  std::fprintf(stderr, "  %d finished (skipped), %d to resume, %d to start%s\n", res.skipped, n_resume, n_new,
               conflicts.empty() ? "" : fmt::format(", {} to retrain (--force)", conflicts.size()).c_str());
  // Several GPUs: each CUDA run is pinned to one (its CUDA_VISIBLE_DEVICES), the least busy.
  const bool any_cuda = std::any_of(runs.begin(), runs.end(), [](const RunSpec& r) { return r.expected.training.device == "cuda"; });
  std::vector<std::string> gpus;
  if (any_cuda) {
    int count = 0;
#ifdef LRNN_WITH_CUDA
    count = lrnn::cuda::device_count();
#endif
    gpus = sweep_gpus(std::getenv("CUDA_VISIBLE_DEVICES"), count);
    if (gpus.size() > 1)
      std::fprintf(stderr, "  CUDA runs spread over GPUs %s (the least busy first)\n", fmt::format("{}", fmt::join(gpus, ", ")).c_str());
    if (gpus.size() <= 1) gpus.clear();
  }
  std::vector<int> gpu_load(gpus.size(), 0);

  // The work list: resumes first (they are partly paid for), then new runs, in grid order.
  std::vector<size_t> todo;
  for (RunState want : {RunState::Resume, RunState::New, RunState::Conflict})
    for (size_t i = 0; i < runs.size(); ++i)
      if (status[i].state == want) todo.push_back(i);

  auto verb = [](RunState st) {
    switch (st) {
      case RunState::New: return "start";
      case RunState::Resume: return "resume";
      case RunState::Done: return "skip";
      case RunState::Conflict: return "retrain";
    }
    return "?";
  };
  if (opt.dry_run) {
    for (size_t i = 0; i < runs.size(); ++i) {
      RunState s = status[i].state;
      std::string cmd = s == RunState::Done ? "" : command_line(train_args(runs[i], s, s == RunState::Conflict));
      std::printf("%-8s %s%s%s\n", verb(s), runs[i].id.c_str(), cmd.empty() ? "" : "  ", cmd.c_str());
    }
    return res;
  }

  fs::create_directories(opt.out);
  DirLock lock(opt.out);
  io::write_file_atomic(opt.out / "grid.yaml", io::read_file(grid.source));
  for (size_t i = 0; i < runs.size(); ++i)
    if (status[i].state == RunState::Done) {
      auto e = read_eval(runs[i].dir / "eval.json");
      std::fprintf(stderr, "skip     %s (finished: scaled accuracy %.3f)\n", runs[i].id.c_str(), e->scaled);
    }

  StopSignals signals;
  struct Active {
    size_t run;
    int number;
    pid_t pid;
    Clock::time_point t0;
    int gpu;  // index into gpus, or -1
  };
  std::vector<Active> active;
  const int n_todo = int(todo.size());
  size_t next = 0;
  const int width = int(std::to_string(n_todo).size());
  auto tag = [&](int k) { return fmt::format("[{:>{}}/{}]", k, width, n_todo); };

  while (!g_stop && (next < todo.size() || !active.empty())) {
    while (!g_stop && int(active.size()) < opt.jobs && next < todo.size()) {
      size_t i = todo[next];
      const RunSpec& r = runs[i];
      RunState s = status[i].state;
      fs::create_directories(r.dir);
      auto args = train_args(r, s, s == RunState::Conflict);
      std::vector<std::string> env;
      const int omp = worker_threads(r, s);
      if (omp > 0) env.push_back("OMP_NUM_THREADS=" + std::to_string(omp));
      int gpu = -1;
      if (!gpus.empty() && r.expected.training.device == "cuda") {
        gpu = int(std::min_element(gpu_load.begin(), gpu_load.end()) - gpu_load.begin());
        ++gpu_load[size_t(gpu)];
        env.push_back("CUDA_VISIBLE_DEVICES=" + gpus[size_t(gpu)]);
      }
      const std::string on_gpu = gpu < 0 ? "" : "CUDA_VISIBLE_DEVICES=" + gpus[size_t(gpu)] + " ";
      pid_t pid = spawn_worker(args, r.dir / "train.log",
                               fmt::format("== lrnn sweep {} {}: {}{}\n", grid.name, now_text(), on_gpu, command_line(args)),
                               env);
      active.push_back({i, int(++next), pid, Clock::now(), gpu});
      if (s == RunState::Resume) ++res.resumed;
      else ++res.started;
      std::fprintf(stderr, "%s %-7s %s%s%s\n", tag(int(next)).c_str(), verb(s), r.id.c_str(),
                   status[i].why.empty() || s == RunState::Conflict ? "" : fmt::format(" ({})", status[i].why).c_str(),
                   gpu < 0 ? "" : fmt::format(" on GPU {}", gpus[size_t(gpu)]).c_str());
    }
    bool reaped = false;
    for (size_t a = 0; a < active.size();) {
      int st = 0;
      pid_t p = waitpid(active[a].pid, &st, WNOHANG);
      const int wait_errno = errno;
      if (p == 0 || (p < 0 && wait_errno == EINTR)) {
        ++a;
        continue;
      }
      const RunSpec& r = runs[active[a].run];
      double secs = std::chrono::duration<double>(Clock::now() - active[a].t0).count();
      auto e = read_eval(r.dir / "eval.json");
      if (p > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && e) {
        ++res.finished;
        std::fprintf(stderr, "%s done    %s  scaled accuracy %.3f (training lengths %.3f)  %.1f s\n",
                     tag(active[a].number).c_str(), r.id.c_str(), e->scaled, e->train, secs);
      } else if (!(g_stop && p > 0 && WIFSIGNALED(st))) {
        ++res.failed;
        std::string why = p < 0                                            ? std::strerror(wait_errno)
                          : !e && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "no eval.json"
                                                                        : describe_exit(st);
        std::fprintf(stderr, "%s FAILED  %s  %s after %.1f s; see %s\n        %s\n", tag(active[a].number).c_str(),
                     r.id.c_str(), why.c_str(), secs, (r.dir / "train.log").string().c_str(),
                     last_line(r.dir / "train.log").c_str());
      }
      if (active[a].gpu >= 0) --gpu_load[size_t(active[a].gpu)];
      active.erase(active.begin() + std::ptrdiff_t(a));
      reaped = true;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  if (g_stop) {
    res.interrupted = true;
    // A terminal's Ctrl-C reaches the workers too; a signal to the sweep alone does not.
    for (auto& a : active) kill(a.pid, SIGTERM);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!active.empty()) {
      const bool late = Clock::now() > deadline;
      for (size_t a = 0; a < active.size();) {
        int st = 0;
        if (late) kill(active[a].pid, SIGKILL);
        pid_t p = waitpid(active[a].pid, &st, late ? 0 : WNOHANG);
        if (p > 0 || (p < 0 && errno == ECHILD)) active.erase(active.begin() + std::ptrdiff_t(a));
        else ++a;
      }
      if (!active.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "lrnn sweep: interrupted (%s); workers stopped. Run the same command again to resume.\n",
                 strsignal(int(g_stop)));
  }
  std::fprintf(stderr, "lrnn sweep %s: %d finished now, %d skipped, %d failed, %d of %d runs not done\n", grid.name.c_str(),
               res.finished, res.skipped, res.failed, res.total - res.skipped - res.finished, res.total);
  return res;
}

// ---------------------------------------------------------------------------------------------
// Aggregation

Summary summarize(const std::vector<double>& xs) {
  Summary s;
  s.n = int(xs.size());
  if (xs.empty()) {
    s.median = s.mad = s.best = kNaN;
    return s;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  s.median = median(xs);
  std::vector<double> dev;
  for (double x : xs) dev.push_back(std::fabs(x - s.median));
  s.mad = median(dev);
  s.best_index = int(std::max_element(xs.begin(), xs.end()) - xs.begin());  // first of equal maxima
  s.best = xs[size_t(s.best_index)];
  return s;
}

int select_lr(const std::vector<Summary>& per_lr) {
  int best = -1;
  for (int i = 0; i < int(per_lr.size()); ++i) {
    const Summary& s = per_lr[size_t(i)];
    if (s.n == 0) continue;
    if (best < 0) { best = i; continue; }
    const Summary& b = per_lr[size_t(best)];
    if (s.median > b.median || (s.median == b.median && s.best > b.best)) best = i;
  }
  return best;
}

std::string model_label(const YAML::Node& m) {
  std::string s = m["model_type"] ? m["model_type"].as<std::string>() : "model";
  if (m["num_householder"]) s += " n_h=" + m["num_householder"].as<std::string>();
  if (m["allow_neg_eigval"]) s += m["allow_neg_eigval"].as<bool>() ? " [-1,1]" : " [0,1]";
  return s;
}

Report collect(const Grid& g, const fs::path& out) {
  Report rep;
  rep.name = g.name;
  rep.seeds = g.seeds;
  std::vector<RunSpec> runs = plan(g, out, 0);
  rep.total = int(runs.size());
  for (size_t c = 0; c < g.configs.size(); ++c) {
    ConfigResult cr;
    cr.name = g.configs[c].name;
    const RunSpec* first = nullptr;
    for (auto& r : runs)
      if (r.config == c) { first = &r; break; }
    cr.model = model_label(first->expected.model);
    cr.train_len = first->expected.task.train_len;
    cr.eval_len = first->expected.task.eval_len;
    for (double lr : g.lrs) cr.lrs.push_back(LrResult{lr, {}, {}, {}, {}});
    rep.configs.push_back(std::move(cr));
  }
  for (auto& r : runs) {
    SeedResult sr;
    sr.seed = r.seed;
    sr.run = r.id;
    RunStatus st = inspect(r);
    if (st.state == RunState::Done) {
      auto e = read_eval(r.dir / "eval.json");
      sr.finished = true;
      sr.scaled = e->scaled;
      sr.train_scaled = e->train;
      sr.reach = e->reach;
      ++rep.finished;
    } else if (st.state == RunState::Conflict) {
      rep.notes.push_back(fmt::format("{}: left out, made with another config ({})", r.id, st.why));
    }
    rep.configs[r.config].lrs[r.lr_index].seeds.push_back(sr);
  }
  for (auto& cr : rep.configs) {
    std::vector<Summary> tests;
    for (auto& lr : cr.lrs) {
      std::vector<double> t, tr, reach;
      for (auto& s : lr.seeds)
        if (s.finished) {
          t.push_back(s.scaled);
          tr.push_back(s.train_scaled);
          if (!std::isnan(s.reach)) reach.push_back(s.reach);
        }
      lr.test = summarize(t);
      lr.train = summarize(tr);
      lr.reach = summarize(reach);
      tests.push_back(lr.test);
    }
    cr.best_lr = select_lr(tests);
  }
  return rep;
}

namespace {

std::string f3(double x) { return std::isnan(x) ? "–" : fmt::format("{:.3f}", x); }
std::string median_mad(const Summary& s) { return s.n ? fmt::format("{:.3f} ± {:.3f}", s.median, s.mad) : "–"; }
std::string num(double x) { return std::isnan(x) ? "" : fmt::format("{}", x); }
std::string lens(const std::array<int, 2>& r) { return fmt::format("{}-{}", r[0], r[1]); }

// The seed behind `l.test.best` (best_index counts finished seeds only); null if none finished.
const SeedResult* best_seed(const LrResult& l) {
  int k = -1;
  for (auto& s : l.seeds)
    if (s.finished && ++k == l.test.best_index) return &s;
  return nullptr;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string to_markdown(const Report& r) {
  std::string md = fmt::format("# Sweep {}\n\n", r.name);
  md += fmt::format(
      "Scaled accuracy (accuracy - chance) / (1 - chance) over seeds {}: median ± MAD and best of seeds; "
      "per config the learning rate with the highest median. {} of {} runs finished.\n\n",
      fmt::join(r.seeds, ", "), r.finished, r.total);
  md += "| config | model | best lr | seeds | test lengths | median ± MAD | best | train lengths | train median |\n";
  md += "|---|---|---|---|---|---|---|---|---|\n";
  for (auto& c : r.configs) {
    if (c.best_lr < 0) {
      md += fmt::format("| {} | {} | – | 0/{} | {} | – | – | {} | – |\n", c.name, c.model, r.seeds.size(), lens(c.eval_len),
                        lens(c.train_len));
      continue;
    }
    const LrResult& l = c.lrs[size_t(c.best_lr)];
    md += fmt::format("| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} |\n", c.name, c.model, format_lr(l.lr), l.test.n,
                      l.seeds.size(), lens(c.eval_len), median_mad(l.test), f3(l.test.best),
                      lens(c.train_len), f3(l.train.median));
  }
  md += "\nEvery learning rate (the chosen one in bold); scaled accuracy on the test lengths:\n\n";
  md += "| config | lr | seeds | median ± MAD | best (seed) | per seed |\n";
  md += "|---|---|---|---|---|---|\n";
  for (auto& c : r.configs)
    for (size_t i = 0; i < c.lrs.size(); ++i) {
      const LrResult& l = c.lrs[i];
      std::vector<std::string> per;
      for (auto& s : l.seeds) per.push_back(s.finished ? f3(s.scaled) : "–");
      std::string lr = format_lr(l.lr);
      if (int(i) == c.best_lr) lr = fmt::format("**{}**", lr);
      const SeedResult* b = best_seed(l);
      std::string best = b ? fmt::format("{} ({})", f3(l.test.best), b->seed) : "–";
      md += fmt::format("| {} | {} | {}/{} | {} | {} | {} |\n", c.name, lr, l.test.n, l.seeds.size(), median_mad(l.test), best,
                        fmt::join(per, ", "));
    }
  bool curves = false;
  for (auto& c : r.configs)
    for (auto& l : c.lrs) curves = curves || l.reach.n > 0;
  if (curves) {
    md += fmt::format("\nWord problems: the length at which sequence accuracy falls below {} (the longest t with "
                      "sequence accuracy >= {} at every length up to t; the longest evaluated length when it never "
                      "falls), over seeds:\n\n", kReachAccuracy, kReachAccuracy);
    md += "| config | model | lr | seeds | median ± MAD | best | per seed |\n";
    md += "|---|---|---|---|---|---|---|\n";
    for (auto& c : r.configs)
      for (auto& l : c.lrs) {
        if (l.reach.n == 0) continue;
        std::vector<std::string> per;
        for (auto& s : l.seeds) per.push_back(s.finished && !std::isnan(s.reach) ? fmt::format("{}", s.reach) : "–");
        md += fmt::format("| {} | {} | {} | {}/{} | {} ± {} | {} | {} |\n", c.name, c.model, format_lr(l.lr), l.reach.n,
                          l.seeds.size(), l.reach.median, l.reach.mad, l.reach.best, fmt::join(per, ", "));
      }
  }
  if (!r.notes.empty()) {
    md += "\nLeft out:\n\n";
    for (auto& n : r.notes) md += "- " + n + "\n";
  }
  return md;
}

std::string to_csv(const Report& r) {
  std::string s =
      "config,model,lr,selected,finished,seeds,median,mad,best,best_seed,best_run,train_median,train_mad,reach_median,"
      "reach_mad,reach_best";
  for (auto seed : r.seeds) s += fmt::format(",seed{}", seed);
  s += "\n";
  for (auto& c : r.configs)
    for (size_t i = 0; i < c.lrs.size(); ++i) {
      const LrResult& l = c.lrs[i];
      const SeedResult* b = best_seed(l);
      s += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", csv_field(c.name), csv_field(c.model),
                       format_lr(l.lr), int(i) == c.best_lr ? 1 : 0, l.test.n, l.seeds.size(), num(l.test.median),
                       num(l.test.mad), num(l.test.best), b ? std::to_string(b->seed) : "", csv_field(b ? b->run : ""),
                       num(l.train.median), num(l.train.mad), num(l.reach.median), num(l.reach.mad), num(l.reach.best));
      for (auto& sd : l.seeds) {
        s += ',';
        if (sd.finished) s += num(sd.scaled);
      }
      s += "\n";
    }
  return s;
}

std::string write_report(const Grid& grid, const fs::path& out) {
  if (!fs::is_directory(out)) LRNN_USER_ERROR("{}: no such sweep directory (run the sweep first)", out.string());
  Report r = collect(grid, out);
  std::string md = to_markdown(r);
  io::write_file_atomic(out / "results.md", md);
  io::write_file_atomic(out / "results.csv", to_csv(r));
  return md;
}

}  // namespace lrnn::sweep
