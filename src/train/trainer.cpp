#include "train/trainer.h"
#include "tasks/lm.h"
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <omp.h>
#include "core/memory.h"
#include "data/tokenize.h"
#include "dist/world.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "ops/adamw/adamw.h"
#include "ops/linear/linear.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/engine.h"
#include "train/provenance.h"
#include "train/schedule.h"

namespace lrnn {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

nlohmann::json evaluate_run(const LogitsFn& fn, int V, const ExperimentConfig& cfg, const TokenLossFn& lm_losses) {
  auto task = create_task(cfg.task);
  const auto& t = cfg.task;
  if (task->eval_kind() == EvalKind::Lm) {
    nlohmann::json j = evaluate_lm(lm_losses ? lm_losses : token_losses_of(fn, V), static_cast<const LmTask&>(*task),
                                   t.eval_batch_size, t.eval_tokens);
    j["task"] = t.name;
    return j;
  }
  EvalResult test = evaluate(fn, V, *task, t.eval_len, t.eval_samples, t.eval_batch_size);
  // Training lengths get a smaller set: they show fitting, not extrapolation.
  EvalResult train = evaluate(fn, V, *task, t.train_len, std::max(1, t.eval_samples / 4), t.eval_batch_size);
  nlohmann::json j = test.to_json();
  j["task"] = t.name;
  j["train_range"] = train.to_json();
  return j;
}

namespace {

// The metrics.jsonl line of an evaluation: accuracies for the synthetic tasks, validation loss
// and perplexity for lm.
nlohmann::json eval_line(const nlohmann::json& e, int64_t step) {
  if (e.value("metric", "") == "val_loss")
    return {{"type", "eval"}, {"step", step}, {"val_loss", e["val_loss"]}, {"perplexity", e["perplexity"]},
            {"tokens", e["tokens"]}};
  return {{"type", "eval"}, {"step", step}, {"accuracy", e["accuracy"]}, {"scaled_accuracy", e["scaled_accuracy"]},
          {"train_scaled_accuracy", e["train_range"]["scaled_accuracy"]}};
}

std::string eval_message(const nlohmann::json& e, const ExperimentConfig& cfg, int64_t step) {
  if (e.value("metric", "") == "val_loss")
    return fmt::format("eval at step {}: validation loss {:.4f}, perplexity {:.2f} ({} tokens)", step,
                       double(e["val_loss"]), double(e["perplexity"]), int64_t(e["tokens"]));
  return fmt::format("eval at step {}: scaled accuracy {:.3f} on lengths {}-{}, {:.3f} on the training lengths {}-{}",
                     step, double(e["scaled_accuracy"]), cfg.task.eval_len[0], cfg.task.eval_len[1],
                     double(e["train_range"]["scaled_accuracy"]), cfg.task.train_len[0], cfg.task.train_len[1]);
}

// Keeps metrics.jsonl consistent with a resumed state: drops lines logged after the checkpoint.
void truncate_metrics(const fs::path& file, int64_t step) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line cut by the kill
    if (j.value("step", int64_t(0)) <= step) kept += line + "\n";
  }
  io::write_file_atomic(file, kept);
}

// Columns of the terminal on stderr (COLUMNS, then 80, when it cannot be asked).
int terminal_columns() {
  struct winsize w {};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c && std::atoi(c) > 0) return std::atoi(c);
  return 80;
}

struct Progress {
  std::string mode;
  int64_t total;
  bool tty;
  Clock::time_point start = Clock::now(), last_draw{};
  Progress(std::string m, int64_t n, bool quiet) : mode(quiet ? "none" : std::move(m)), total(n) {
    tty = isatty(fileno(stderr));
    if (mode == "auto") mode = tty ? "bar" : "lines";
  }
  static std::string hms(double s) {
    int x = int(s);
    return x >= 3600 ? fmt::format("{}:{:02}:{:02}", x / 3600, x / 60 % 60, x % 60) : fmt::format("{:02}:{:02}", x / 60, x % 60);
  }
  void update(int64_t step, int64_t first, double loss, double lr, bool log_line) {
    double el = std::chrono::duration<double>(Clock::now() - start).count();
    double rate = (step - first) / std::max(el, 1e-9);
    double eta = rate > 0 ? (total - step) / rate : 0;
    if (mode == "bar") {
      if (step != total && Clock::now() - last_draw < std::chrono::milliseconds(100)) return;
      last_draw = Clock::now();
      // Fit the terminal's width (read on every draw: terminals get resized): the bar takes what
      // the text leaves; on a narrow terminal the learning rate, then the rate, are dropped.
      const int cols = terminal_columns();
      const int pct = int(100.0 * step / std::max<int64_t>(total, 1));
      std::string counts = fmt::format(" {}/{}", step, total);
      std::string times = fmt::format(" [{}<{}, {:.2f} it/s]", hms(el), hms(eta), rate);
      std::string tail = fmt::format(" loss {:.4f} lr {:.2e}", loss, lr);
      auto room = [&] { return cols - 1 - 6 - int(counts.size() + times.size() + tail.size()); };
      if (room() < 10) tail = fmt::format(" loss {:.4f}", loss);
      if (room() < 10) times = fmt::format(" [{}<{}]", hms(el), hms(eta));
      if (room() < 10) times.clear();
      const int width = std::clamp(room(), 0, 60);
      const int fill = int(width * double(step) / std::max<int64_t>(total, 1));
      std::string line = fmt::format("{:3d}%|{}{}|{}{}{}", pct, std::string(fill, '#'), std::string(width - fill, ' '),
                                     counts, times, tail);
      if (int(line.size()) > cols - 1) line.resize(size_t(std::max(cols - 1, 0)));
      std::fprintf(stderr, "\r%s\033[K", line.c_str());  // \033[K: clear what a longer line left
      if (step == total) std::fprintf(stderr, "\n");
    } else if (mode == "lines" && log_line) {
      std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3e  %.2f it/s  elapsed %s  eta %s\n",
                   (long long)step, (long long)total, loss, lr, rate, hms(el).c_str(), hms(eta).c_str());
    }
  }
  void message(const std::string& s) {
    if (mode == "none") return;
    if (mode == "bar") std::fprintf(stderr, "\n");
    std::fprintf(stderr, "%s\n", s.c_str());
  }
};

// One trainer per run directory: an exclusive lock (flock on DIR/.lock, released when the process
// ends however it ends) held for the whole run, so that two `--resume` of one run cannot
// interleave their steps and files. With it held, temporary files of earlier writers that died
// (`*.tmp.<pid>` from write_file_atomic) are removed.
class RunDirLock {
 public:
  explicit RunDirLock(const fs::path& dir) {
    const fs::path f = dir / ".lock";
    fd_ = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) LRNN_USER_ERROR("{}: cannot open: {}", f.string(), std::strerror(errno));
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {0};
      ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      LRNN_USER_ERROR("{}: another lrnn process{} is training in this directory; wait for it to end (or stop it) "
                      "before starting or resuming this run", dir.string(),
                      n > 0 ? fmt::format(" (pid {})", std::string(buf, size_t(n))) : std::string());
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {}  // the pid is a courtesy
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      auto at = name.rfind(".tmp.");
      if (at == std::string::npos || at + 5 >= name.size()) continue;
      if (name.find_first_not_of("0123456789", at + 5) != std::string::npos) continue;
      fs::remove(e.path(), ec);
    }
  }
  ~RunDirLock() { ::close(fd_); }
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Steps skipped one after another (non-finite loss, gradient or update) after which a run stops.
constexpr int64_t kMaxSkippedInARow = 100;

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// SIGINT/SIGTERM while training: the first one asks the loop to stop after the current step
// (it then saves a checkpoint); a second one aborts at once with the default action.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_train_signal(int sig) {
  if (g_stop_signal) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  const char msg[] = "\nlrnn: interrupted: finishing this step and saving a checkpoint "
                     "(interrupt again to abort at once, losing the steps since the last checkpoint)\n";
  if (::write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {}
}

struct TrainSignals {
  bool on;
  struct sigaction old_int {}, old_term {};
  explicit TrainSignals(bool enable) : on(enable) {
    g_stop_signal = 0;
    if (!on) return;
    struct sigaction sa {};
    sa.sa_handler = on_train_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // an interrupted write or read carries on
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    // A signal the parent chose to ignore (a background job's SIGINT, nohup) stays ignored.
    if (old_int.sa_handler == SIG_IGN) sigaction(SIGINT, &old_int, nullptr);
    if (old_term.sa_handler == SIG_IGN) sigaction(SIGTERM, &old_term, nullptr);
  }
  ~TrainSignals() {
    if (!on) return;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  TrainSignals(const TrainSignals&) = delete;
  TrainSignals& operator=(const TrainSignals&) = delete;
};

// The schedule keys a run's learning rate and its curriculum depend on, as saved in its training
// state (the curriculum's keys only when it has one, so older checkpoints still compare equal).
std::string schedule_json(const TrainingConfig& tc) {
  nlohmann::json j{{"num_steps", tc.num_steps}, {"warmup_steps", tc.warmup_steps}, {"lr", tc.lr}, {"min_lr", tc.min_lr}};
  if (tc.curriculum > 0) {
    j["curriculum"] = tc.curriculum;
    j["curriculum_loss"] = tc.curriculum_loss;
    j["curriculum_every"] = tc.curriculum_every;
    if (tc.curriculum_lr_factor != 1.0) j["curriculum_lr_factor"] = tc.curriculum_lr_factor;
  }
  return j.dump();
}

// A resume must continue the schedule it was started with: changing num_steps, warmup_steps, lr
// or min_lr would bend (or restart) the cosine in the middle of the run, and changing the
// curriculum would change what the rest of the run is trained on.
void check_schedule(const std::string& saved, const TrainingConfig& tc, const fs::path& dir, int64_t step) {
  if (saved.empty()) return;  // a checkpoint from before schedules were saved
  auto old = nlohmann::json::parse(saved, nullptr, false);
  if (!old.is_object()) LRNN_USER_ERROR("{}: train_state metadata 'schedule' is not valid JSON", dir.string());
  auto now = nlohmann::json::parse(schedule_json(tc));
  std::vector<std::string> changed;
  auto differs = [&](const std::string& k) {
    if (old.contains(k) && now.contains(k) && old[k] == now[k]) return;
    changed.push_back(fmt::format("training.{} ({} -> {})", k, old.contains(k) ? old[k].dump() : "unset",
                                  now.contains(k) ? now[k].dump() : "unset"));
  };
  for (auto& [k, v] : now.items()) differs(k);
  for (auto& [k, v] : old.items())
    if (!now.contains(k)) differs(k);
  if (changed.empty()) return;
  const double lr_then = lr_at(step, old.value("num_steps", tc.num_steps), old.value("warmup_steps", tc.warmup_steps),
                               old.value("lr", tc.lr), old.value("min_lr", tc.min_lr));
  const double lr_now = lr_at(step, tc.num_steps, tc.warmup_steps, tc.lr, tc.min_lr);
  const std::string jump = lr_then == lr_now ? std::string()
                            : fmt::format("; at step {} the learning rate would jump from {:.4g} to {:.4g}", step,
                                          lr_then, lr_now);
  LRNN_USER_ERROR("{}: --resume would change the schedule the run was started with: {}{}. Resume with the run's "
                  "own values, or start a new run.",
                  dir.string(), fmt::join(changed, ", "), jump);
}

// training.curriculum: how many target positions the loss covers, and the epoch under way. An
// epoch is a fixed span of `every` steps; at its end the mean loss of its applied steps decides
// whether one more position is supervised. The progress travels in the training state, so that a
// resumed run supervises what the uninterrupted one would have.
struct Curriculum {
  int positions = 0;    // supervised target positions (0: no curriculum)
  int full = 0;         // the longest training target: from here on every position is supervised
  int64_t every = 0;    // steps per epoch
  double threshold = 0;
  double loss_sum = 0;  // the epoch under way: its applied steps' summed loss, and their number
  int64_t applied = 0;

  bool on() const { return positions > 0; }
  bool complete() const { return positions >= full; }
  int prefix() const { return on() && !complete() ? positions : 0; }  // for Task::set_supervised_prefix
  bool epoch_ends(int64_t step) const { return on() && !complete() && step % every == 0; }

  static Curriculum of(const ExperimentConfig& cfg, const Task& task) {
    const auto& tc = cfg.training;
    Curriculum c;
    if (tc.curriculum == 0) return c;
    if (task.eval_kind() != EvalKind::Prefix)
      LRNN_USER_ERROR("{}: training.curriculum: task {} has one answer per sequence; a curriculum over positions "
                      "needs a label at every position (word_problem)", cfg.source, cfg.task.name);
    c.positions = tc.curriculum;
    c.full = int(task.sample(0, Split::Train, 0, cfg.task.train_len[1]).target.size());
    c.every = tc.curriculum_every > 0 ? tc.curriculum_every
                                      : (cfg.task.train_pool + tc.batch_size - 1) / tc.batch_size;
    c.threshold = tc.curriculum_loss;
    return c;
  }
  std::string to_json() const {
    if (!on()) return {};
    return nlohmann::json{{"positions", positions}, {"loss_sum", loss_sum}, {"applied", applied}}.dump();
  }
  // The progress saved at `step` (empty: the checkpoint has none, and the run starts over at the
  // config's positions; the schedule check has already refused a run that gained a curriculum).
  void restore(const std::string& saved, const fs::path& dir, int64_t step) {
    if (!on() || saved.empty()) return;
    auto j = nlohmann::json::parse(saved, nullptr, false);
    const int64_t in_epoch = step % every;
    const bool ok = j.is_object() && j.contains("positions") && j["positions"].is_number_integer() &&
                    j.contains("loss_sum") && j["loss_sum"].is_number() && j.contains("applied") &&
                    j["applied"].is_number_integer() && int64_t(j["positions"]) >= positions &&
                    int64_t(j["positions"]) <= std::max(full, positions) && double(j["loss_sum"]) >= 0 &&
                    std::isfinite(double(j["loss_sum"])) && int64_t(j["applied"]) >= 0 &&
                    (int64_t(j["applied"]) <= in_epoch || int64_t(j["positions"]) >= full);
    if (!ok)
      LRNN_USER_ERROR("{}: train_state metadata 'curriculum' is '{}'; expected positions in [{}, {}], a finite "
                      "loss_sum >= 0 and applied in [0, {}] (steps into the epoch at step {})",
                      (dir / "train_state.safetensors").string(), saved.substr(0, 120), positions,
                      std::max(full, positions), in_epoch, step);
    positions = int(j["positions"]);
    // A complete curriculum has no epoch under way (checkpoints written before that was so kept
    // counting: their counts are not used).
    loss_sum = complete() ? 0 : double(j["loss_sum"]);
    applied = complete() ? 0 : int64_t(j["applied"]);
  }
};

// The CPU engine: data parallelism over cores (train/data_parallel.h), AdamW on the host.
class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(const ExperimentConfig& cfg)
      : tc_(cfg.training), dp_(cfg.model, cfg.source, uint64_t(cfg.training.seed), cfg.training.num_threads) {
    dp_.set_dense_labels(cfg.task.name == "lm");  // every next token is a label: the head may chunk
    check_run_memory(cfg);
    const size_t P = dp_.main().params.size();
    decay_.assign(P, 0);
    for (auto& e : dp_.main().layout().entries())
      if (e.weight_decay) std::fill(decay_.begin() + e.offset, decay_.begin() + e.offset + e.numel, 1);
  }
  Model<float>& host_model() override { return dp_.main(); }
  void start(const TrainState& st) override {
    st_ = st;
    dp_.sync_params();
  }
  void step(const Batch& b, int64_t, double lr, double = 1.0) override {
    Model<float>& model = dp_.main();
    const size_t P = model.params.size();
    const int A = tc_.gradient_accumulation_steps;
    if (A == 1) {
      loss_ = dp_.forward_backward(b);
    } else {
      // Micro-batches of B / A rows: the step's loss and gradient are the means of theirs (the
      // mean over all tokens when every micro-batch has as many labels, as in language modelling).
      const int rows = b.B / A;
      acc_.assign(P, 0.f);
      loss_ = 0;
      for (int k = 0; k < A; ++k) {
        loss_ += dp_.forward_backward(b.rows(k * rows, rows)) / A;
        const float* g = model.grads.data();
        for (size_t i = 0; i < P; ++i) acc_[i] += g[i] / float(A);
      }
      model.grads.swap(acc_);
    }
    norm_ = ops::global_norm(model.grads.data(), P);
    lr_ = lr;
    if (!std::isfinite(loss_) || !std::isfinite(norm_)) {
      ++st_.skipped;  // the update is dropped; training goes on with the next batch
      return;
    }
    if (tc_.grad_clip > 0) ops::clip_by_global_norm(model.grads.data(), P, norm_, tc_.grad_clip);
    ops::AdamWParams ap{lr, tc_.beta1, tc_.beta2, tc_.adam_eps, tc_.weight_decay, st_.adam_step + 1};
    if (!ops::adamw_update_is_finite(model.params.data(), model.grads.data(), st_.m.data(), st_.v.data(),
                                     decay_.data(), P, ap)) {
      ++st_.skipped;  // the update would make a parameter or moment non-finite: nothing is written
      return;
    }
    ++st_.adam_step;
    ops::adamw_update(model.params.data(), model.grads.data(), st_.m.data(), st_.v.data(), decay_.data(), P, ap);
    dp_.sync_params();
    loss_sum_ += loss_;
    ++loss_n_;
  }
  EngineStats stats() override {
    EngineStats s{loss_, loss_n_ ? loss_sum_ / double(loss_n_) : loss_, norm_, lr_, st_.skipped, loss_n_};
    loss_sum_ = 0;
    loss_n_ = 0;
    return s;
  }
  void to_host(TrainState& st) override {
    const int64_t step = st.step;
    st = st_;
    st.step = step;
  }
  LogitsFn logits_fn() override {
    return [this](const Batch& b) { return dp_.forward_logits(b).data(); };
  }
  std::string describe() const override { return fmt::format("cpu, {} data-parallel workers", dp_.workers()); }

 private:
  // What the run will hold at its peak, checked against the machine before the first step
  // allocates it (core/memory.h): each worker's replica (weights, gradients) and its share of the
  // batch's activations, AdamW's two moments, and the evaluation's activations and logits.
  void check_run_memory(const ExperimentConfig& cfg) {
    const int W = dp_.workers();
    const auto& t = cfg.task;
    Model<float>& m = dp_.main();
    const uint64_t P = m.params.size(), V = uint64_t(m.vocab_size());
    auto rows = [&](int B) { return std::max(1, (B + W - 1) / W); };
    // Input lengths: at most the range's top, plus a BOS (lm: the windows).
    const auto [train_T, eval_T] = task_input_lengths(t);
    const uint64_t train = m.activation_bytes(rows(tc_.batch_size / tc_.gradient_accumulation_steps), train_T, true);
    const uint64_t eval = m.activation_bytes(rows(t.eval_batch_size), eval_T, false) +
                          uint64_t(t.eval_batch_size) * uint64_t(eval_T) * V * sizeof(float) / uint64_t(W);
    const uint64_t acc = tc_.gradient_accumulation_steps > 1 ? P * sizeof(float) : 0;
    const uint64_t total = uint64_t(W) * (2 * P * sizeof(float) + std::max(train, eval)) + 2 * P * sizeof(float) + acc;
    const bool lm = t.name == "lm";
    check_memory(total, fmt::format("{}: this run ({} workers; training.batch_size {} x {} {}, task.eval_batch_size {} x "
                                    "{} {}, {} parameters)", cfg.source, W, tc_.batch_size,
                                    lm ? "task.context" : "task.train_len up to", train_T - (lm ? 0 : 1),
                                    t.eval_batch_size, lm ? "task.eval_context" : "task.eval_len up to",
                                    eval_T - (lm ? 0 : 1), P));
  }

  const TrainingConfig tc_;  // a copy: the engine may outlive the caller's config object
  DataParallel dp_;
  std::vector<uint8_t> decay_;
  std::vector<float> acc_;  // the step's gradient while micro-batches accumulate
  TrainState st_;
  double loss_ = 0, norm_ = 0, lr_ = 0, loss_sum_ = 0;
  int64_t loss_n_ = 0;
};

}  // namespace

std::unique_ptr<Engine> make_engine(const ExperimentConfig& cfg) {
  const auto& tc = cfg.training;
  if (tc.device == "cuda") {
#ifdef LRNN_WITH_CUDA
    return make_cuda_engine(cfg);
#else
    LRNN_USER_ERROR("{}: training.device: 'cuda' is not available: this lrnn was built without CUDA "
                    "(configure with -DLRNN_CUDA=ON, e.g. cmake --preset cuda)", cfg.source);
#endif
  }
  if (tc.device != "cpu")
    LRNN_USER_ERROR("{}: training.device: '{}' is not a device; use cpu or cuda", cfg.source, tc.device);
  return std::make_unique<CpuEngine>(cfg);
}

TrainSummary train(const ExperimentConfig& cfg, const TrainOptions& opt) {
  const auto& tc = cfg.training;
  if (tc.num_threads > 0) {
    // OpenBLAS's OpenMP build keeps its own thread count (one per core) and re-applies it to
    // OpenMP whenever it is set; pin both, or later parallel regions would use every core.
    omp_set_num_threads(tc.num_threads);
    ops::set_blas_threads(tc.num_threads);
  }
  const fs::path dir = opt.out_dir;
  // Several processes (one per GPU, dist/world.h): rank 0 alone writes the run directory, logs,
  // evaluates and saves; every rank steps in lockstep with the others.
  const dist::World& world = dist::world();
  const bool lead = world.leader();
  if (world.distributed() && tc.device != "cuda")
    LRNN_USER_ERROR("{}: {} ranks ({}): training over several processes is on GPUs only; use --device cuda (or one "
                    "process: the CPU engine already uses every core)", cfg.source, world.size, world.source);
  auto task = create_task(cfg.task);
  Curriculum curriculum = Curriculum::of(cfg, *task);
  std::unique_ptr<Engine> engine = make_engine(cfg);
  Model<float>* model = &engine->host_model();
  const size_t P = model->params.size();

  if (fs::exists(dir) && !fs::is_directory(dir))
    LRNN_USER_ERROR("{}: exists and is not a directory; give --out a directory (new or a run's)", dir.string());
  std::optional<RunDirLock> lock;
  if (lead) {
    fs::create_directories(dir);
    lock.emplace(dir);
  }
  TrainState st;
  if (opt.resume) {
    if (!fs::exists(dir / "train_state.safetensors"))
      LRNN_USER_ERROR("{}: nothing to resume (no train_state.safetensors)", dir.string());
    st = load_train_state(dir, *model, kMaxSteps);
    check_schedule(st.schedule, tc, dir, st.step);
    if (st.step > tc.num_steps)
      LRNN_USER_ERROR("{}: the training state is at step {}, past training.num_steps = {}", dir.string(), st.step,
                      tc.num_steps);
    if (lead) truncate_metrics(dir / "metrics.jsonl", st.step);
  } else {
    st.m.assign(P, 0.f);
    st.v.assign(P, 0.f);
    // Starting over: nothing of an earlier run in this directory may survive to be resumed.
    if (lead)
      for (auto f : {"metrics.jsonl", "eval.json", "train_state.safetensors", "model.safetensors", "config.json",
                     "provenance.json", "modeling_lrnn_mamba.py", "tokenizer.model"})
        std::remove((dir / f).c_str());
  }
  st.schedule = schedule_json(tc);
  if (opt.resume) curriculum.restore(st.curriculum, dir, st.step);
  task->set_supervised_prefix(curriculum.prefix());
  engine->start(st);
  if (lead) io::write_file_atomic(dir / "config.yaml", YAML::Dump(cfg.to_yaml()) + "\n");
  // A language model's run keeps its tokenizer (as Hugging Face model directories do), so that
  // generation and serving need only the run directory.
  fs::path run_tok;
  if (lead && cfg.task.name == "lm" && !(run_tok = data::index_tokenizer(cfg.task.data)).empty())
    io::write_file_atomic(dir / "tokenizer.model", data::Tokenizer::load(run_tok).bytes());

  std::ofstream metrics;
  if (lead) metrics.open(dir / "metrics.jsonl", std::ios::app);
  auto log = [&](const nlohmann::json& j) {
    if (!lead) return;
    metrics << j.dump() << "\n";
    metrics.flush();
  };
  Progress progress(cfg.logging.progress, tc.num_steps, opt.quiet || !lead);
  progress.message(fmt::format("training on {}", engine->describe()));
  const int64_t first = st.step;
  std::optional<ProvenanceLog> provenance;
  if (lead) provenance.emplace(dir, cfg, engine->describe(), first, opt.resume);
  TrainSignals signals(opt.handle_signals);
  bool stopped_early = false;
  double loss = 0;
  int64_t tokens = 0, skipped_logged = st.skipped, skipped_in_a_row = 0, logged_step = st.step;
  auto t0 = Clock::now(), tlog = t0;
  // The engine's loss statistics, read at log steps, at curriculum epochs' ends and before
  // checkpoints: each read feeds the log line's mean and the curriculum epoch's. Periodic
  // checkpoints fall on the same steps in a resumed run as in the uninterrupted one, so the
  // epoch's sum is bit for bit the same; after a checkpoint forced by a signal it may differ in its
  // last bits (the sum is taken in other pieces).
  double log_loss_sum = 0;
  int64_t log_applied = 0;
  auto pull_stats = [&] {
    EngineStats es = engine->stats();
    const double sum = es.loss_avg * double(es.averaged);
    log_loss_sum += sum;
    log_applied += es.averaged;
    if (!curriculum.complete()) {  // (once complete there are no more epochs to decide)
      curriculum.loss_sum += sum;
      curriculum.applied += es.averaged;
    }
    return es;
  };
  auto checkpoint = [&] {
    if (curriculum.on()) pull_stats();
    engine->to_host(st);  // (every rank: the optimizer state's slices are gathered)
    st.curriculum = curriculum.to_json();
    if (!lead) return;
    // A model that is not finite never replaces the last good checkpoint (the engines skip any
    // step whose update would not be finite; this is the last line of defence).
    if (!all_finite(model->params) || !all_finite(st.m) || !all_finite(st.v))
      LRNN_USER_ERROR("{}: the parameters or optimizer state became non-finite by step {}; the last good "
                      "checkpoint is kept (lower training.lr, raise training.adam_eps, or clip with training.grad_clip)",
                      dir.string(), st.step);
    save_model(dir, *model);
    save_train_state(dir, *model, st);
  };
  auto eval_now = [&] {
    if (!world.distributed()) engine->to_host(st);  // (a collective with several ranks; the device model is current)
    return evaluate_run(engine->logits_fn(), model->vocab_size(), cfg);
  };

  // Fault injection for tests: die by SIGKILL right after this step (checkpoints are atomic, so
  // the run must resume from its last one as if nothing happened).
  const char* kill_env = std::getenv("LRNN_FAULT_KILL_AFTER_STEP");
  const int64_t kill_after = kill_env ? std::max<int64_t>(std::atoll(kill_env), 0) : 0;  // 0: off
  const char* kill_rank_env = std::getenv("LRNN_FAULT_KILL_RANK");  // only this rank (default: every rank)
  const bool kill_me = !kill_rank_env || std::atoi(kill_rank_env) == world.rank;
  bool stop_requested = false;  // a signal (with several ranks: as agreed by all of them)

  while (st.step < tc.num_steps) {
    const int64_t step = st.step;
    double weight = 1.0;
    Batch b = task->train_batch_of_rank(uint64_t(tc.seed), step, tc.batch_size, cfg.task.train_len, world.rank,
                                        world.size, &weight);
    const double lr = lr_at(step, tc.num_steps, tc.warmup_steps, tc.lr, tc.min_lr) *
                      (curriculum.on() && curriculum.complete() ? tc.curriculum_lr_factor : 1.0);
    engine->step(b, step, lr, weight);
    tokens += int64_t(b.B) * b.T * world.size;
    st.step = step + 1;
    if (curriculum.epoch_ends(st.step)) {
      pull_stats();
      const double mean = curriculum.applied ? curriculum.loss_sum / double(curriculum.applied) : HUGE_VAL;
      // With several ranks each knows its own rows' loss: a position is added when every rank's
      // epoch loss is below the threshold (a collective, so all ranks keep the same curriculum).
      bool grow = mean < curriculum.threshold;
      if (world.distributed()) grow = !engine->any_rank(!grow);
      log({{"type", "curriculum"}, {"step", st.step}, {"epoch_loss", std::isfinite(mean) ? nlohmann::json(mean) : nlohmann::json()},
           {"positions", curriculum.positions + (grow ? 1 : 0)}});
      curriculum.loss_sum = 0;
      curriculum.applied = 0;
      if (grow) {
        ++curriculum.positions;
        task->set_supervised_prefix(curriculum.prefix());
        progress.message(fmt::format("curriculum at step {}: epoch loss {:.4f} < {}; the loss now covers {} of {} "
                                     "positions{}", st.step, mean, curriculum.threshold,
                                     std::min(curriculum.positions, curriculum.full), curriculum.full,
                                     curriculum.complete() && tc.curriculum_lr_factor != 1.0
                                         ? fmt::format("; the learning rate times {} from here on", tc.curriculum_lr_factor)
                                         : std::string()));
      }
    }
    bool log_now = st.step % cfg.logging.log_every == 0 || st.step == tc.num_steps;
    if (log_now) {
      EngineStats es = pull_stats();
      es.loss_avg = log_applied ? log_loss_sum / double(log_applied) : es.loss;
      log_loss_sum = 0;
      log_applied = 0;
      loss = es.loss;
      // Steps skipped since the last line (their update was dropped), then the regular line.
      for (int64_t k = skipped_logged; k < es.skipped; ++k)
        log({{"type", "skip"}, {"step", st.step}, {"skipped", k + 1}});
      // A run that only skips steps makes no progress: after kMaxSkippedInARow it stops (the last
      // good checkpoint stays) instead of running on for nothing.
      const int64_t interval = st.step - logged_step;
      skipped_in_a_row = es.skipped - skipped_logged == interval ? skipped_in_a_row + interval : 0;
      skipped_logged = es.skipped;
      logged_step = st.step;
      if (skipped_in_a_row >= std::min<int64_t>(kMaxSkippedInARow, tc.num_steps))
        LRNN_USER_ERROR("{}: the last {} steps (up to step {}) were all skipped: their loss, gradient or update was not "
                        "finite. The last good checkpoint is kept; lower training.lr, raise training.adam_eps or set "
                        "training.grad_clip, and check the data", dir.string(), skipped_in_a_row, st.step);
      auto now = Clock::now();
      double dt = std::chrono::duration<double>(now - tlog).count();
      nlohmann::json line{{"type", "train"}, {"step", st.step}, {"loss", es.loss}, {"loss_avg", es.loss_avg},
           {"lr", es.lr}, {"grad_norm", es.grad_norm}, {"skipped", es.skipped}, {"tokens_per_s", tokens / std::max(dt, 1e-9)},
           {"elapsed_s", std::chrono::duration<double>(now - t0).count()}};
      if (curriculum.on()) line["positions"] = std::min(curriculum.positions, curriculum.full);
      log(line);
      tokens = 0; tlog = now;
    }
    // A stop signal: one rank alone must not leave the others waiting in a collective, so with
    // several ranks they agree at log steps (every rank's launcher or scheduler signals them all).
    if (world.distributed() && log_now) stop_requested = engine->any_rank(g_stop_signal != 0);
    progress.update(st.step, first, loss, lr, log_now);
    if (tc.val_every > 0 && st.step % tc.val_every == 0 && st.step < tc.num_steps) {
      bool reached = false;
      if (lead) {  // (the other ranks wait for it in their next collective)
        auto e = eval_now();
        log(eval_line(e, st.step));
        progress.message(eval_message(e, cfg, st.step));
        // stop_on: the eval lengths' scaled accuracy, or the training lengths' (train_range).
        const nlohmann::json& on = tc.stop_on == "train" && e.contains("train_range") ? e["train_range"] : e;
        reached = tc.stop_at > 0 && on.contains("scaled_accuracy") && double(on["scaled_accuracy"]) >= tc.stop_at;
      }
      if (tc.stop_at > 0 && world.distributed()) reached = engine->any_rank(reached);
      if (reached) {
        progress.message(fmt::format("stopping early: scaled accuracy on the {} lengths reached training.stop_at = {}",
                                     tc.stop_on == "train" ? "training" : "eval", tc.stop_at));
        stopped_early = true;
        break;
      }
    }
    if (tc.checkpoint_every > 0 && st.step % tc.checkpoint_every == 0 && st.step < tc.num_steps) checkpoint();
    if (kill_after > 0 && st.step == kill_after && kill_me) std::raise(SIGKILL);
    if (!world.distributed()) stop_requested = g_stop_signal != 0;  // (one process: at once)
    if (stop_requested && st.step < tc.num_steps) break;
  }
  checkpoint();
  TrainSummary sum;
  sum.leader = lead;
  if (stop_requested && st.step < tc.num_steps && !stopped_early) {
    // Interrupted: the checkpoint above holds every step so far; the run is not finished, so no
    // final evaluation and no eval.json.
    sum.steps = st.step;
    sum.skipped = st.skipped;
    sum.final_loss = loss;
    sum.interrupted = g_stop_signal ? int(g_stop_signal) : SIGTERM;  // (another rank's signal)
    sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string name = sum.interrupted == SIGINT ? "SIGINT" : sum.interrupted == SIGTERM ? "SIGTERM" : "a signal";
    if (lead) provenance->end(st.step, "interrupted by " + name);
    return sum;
  }
  sum.steps = st.step;
  sum.skipped = st.skipped;
  sum.stopped_early = stopped_early;
  sum.final_loss = loss;
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!lead) return sum;  // rank 0 evaluates and writes eval.json
  sum.eval = eval_now();
  sum.eval["step"] = st.step;
  sum.eval["stopped_early"] = stopped_early;
  log(eval_line(sum.eval, st.step));
  io::write_file_atomic(dir / "eval.json", sum.eval.dump(2) + "\n");
  provenance->end(st.step, stopped_early ? "stopped early (training.stop_at)" : "finished");
  return sum;
}

}  // namespace lrnn
