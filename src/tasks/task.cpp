#include "tasks/task.h"
#include <algorithm>
#include <fmt/ranges.h>
#include "core/check.h"
#include "core/rng.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "tasks/cycle_navigation.h"
#include "tasks/even_pairs.h"
#include "tasks/lm.h"
#include "tasks/modular_arithmetic.h"
#include "tasks/modular_arithmetic_brackets.h"
#include "tasks/parity.h"
#include "tasks/word_problem.h"

namespace lrnn {

Batch Batch::rows(int r0, int n) const {
  LRNN_CHECK(r0 >= 0 && n >= 0 && r0 + n <= B, "Batch::rows: rows [{}, {}) of {}", r0, r0 + n, B);
  Batch m;
  m.B = n;
  m.T = T;
  const auto at = [&](const std::vector<int32_t>& v, int r) { return v.begin() + std::ptrdiff_t(size_t(r) * size_t(T)); };
  m.tokens.assign(at(tokens, r0), at(tokens, r0 + n));
  m.labels.assign(at(labels, r0), at(labels, r0 + n));
  if (!lengths.empty()) m.lengths.assign(lengths.begin() + r0, lengths.begin() + r0 + n);
  return m;
}

namespace {

// Task-specific keys: which task uses each, and whether a config moved it off its default.
struct OptionalKey {
  const char* key;
  const char* task;
  bool (*is_set)(const TaskConfig&);
};
const TaskConfig kDefaults{};
const OptionalKey kOptionalKeys[] = {
    {"mult", "modular_arithmetic_with_brackets", [](const TaskConfig& c) { return c.mult != kDefaults.mult; }},
    {"cycle_length", "cycle_navigation", [](const TaskConfig& c) { return c.cycle_length != kDefaults.cycle_length; }},
    {"group", "word_problem", [](const TaskConfig& c) { return c.group != kDefaults.group; }},
    {"bos", "word_problem", [](const TaskConfig& c) { return c.bos != kDefaults.bos; }},
    {"only_swaps", "word_problem", [](const TaskConfig& c) { return c.only_swaps != kDefaults.only_swaps; }},
    {"max_moved", "word_problem", [](const TaskConfig& c) { return c.max_moved != kDefaults.max_moved; }},
    {"tokens_per_element", "word_problem",
     [](const TaskConfig& c) { return c.tokens_per_element != kDefaults.tokens_per_element; }},
    {"data", "lm", [](const TaskConfig& c) { return c.data != kDefaults.data; }},
    {"context", "lm", [](const TaskConfig& c) { return c.context != kDefaults.context; }},
    {"eval_context", "lm", [](const TaskConfig& c) { return c.eval_context != kDefaults.eval_context; }},
    {"eval_tokens", "lm", [](const TaskConfig& c) { return c.eval_tokens != kDefaults.eval_tokens; }},
};
// Keys of the synthetic tasks that the lm task has no use for (it has context and eval_tokens).
const OptionalKey kSyntheticKeys[] = {
    {"train_len", "lm", [](const TaskConfig& c) { return c.train_len != kDefaults.train_len; }},
    {"eval_len", "lm", [](const TaskConfig& c) { return c.eval_len != kDefaults.eval_len; }},
    {"eval_samples", "lm", [](const TaskConfig& c) { return c.eval_samples != kDefaults.eval_samples; }},
    {"train_pool", "lm", [](const TaskConfig& c) { return c.train_pool != kDefaults.train_pool; }},
};

// The task table: one row per task.
struct TaskEntry {
  const char* name;
  std::unique_ptr<Task> (*make)(const TaskConfig&);
};
const TaskEntry kTasks[] = {
    {"parity", [](const TaskConfig&) -> std::unique_ptr<Task> { return std::make_unique<ParityTask>(); }},
    {"modular_arithmetic",
     [](const TaskConfig&) -> std::unique_ptr<Task> { return std::make_unique<ModularArithmeticTask>(); }},
    {"modular_arithmetic_with_brackets",
     [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<ModularArithmeticBracketsTask>(c.mult); }},
    {"even_pairs", [](const TaskConfig&) -> std::unique_ptr<Task> { return std::make_unique<EvenPairsTask>(); }},
    {"cycle_navigation",
     [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<CycleNavigationTask>(c.cycle_length); }},
    {"word_problem", [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<WordProblemTask>(c); }},
    {"lm", [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<LmTask>(c); }},
};

}  // namespace

void TaskConfig::describe(io::Schema& s) {
  s.add("name", &name, "task", task_names())
      .add("train_len", &train_len, "[lo, hi] sequence lengths for training (inclusive)", 2, kMaxSequenceLength)
      .add("eval_len", &eval_len, "[lo, hi] sequence lengths for evaluation (inclusive)", 2, kMaxSequenceLength)
      .add("eval_samples", &eval_samples,
           "evaluation sequences, spread evenly over eval lengths (word_problem: all of the longest)", 1, 1 << 24)
      .add("eval_batch_size", &eval_batch_size, "sequences per evaluation batch", 1, 1 << 20)
      .add("train_pool", &train_pool,
           "train on a fixed set of this many sequences, reshuffled every epoch (P2: 100000); 0 = fresh every step", 0,
           int64_t(1) << 40)
      .add("mult", &mult, "modular_arithmetic_with_brackets: allow '*' as well as '+' and '-'")
      .add("cycle_length", &cycle_length, "cycle_navigation: number of positions on the cycle", 2, 1 << 16)
      .add("group", &group, "word_problem: S<n>, A<n>, Z<m> or products joined by 'x' (e.g. S3xZ2)")
      .add("bos", &bos, "word_problem: prepend BOS to input and target (P2)")
      .add("only_swaps", &only_swaps, "word_problem: input elements are transpositions only (S<n>)")
      .add("max_moved", &max_moved, "word_problem: input elements move at most this many points (0 = any)", 0, 64)
      .add("tokens_per_element", &tokens_per_element,
           "word_problem: tokens per element (the element, then filler tokens); lengths count tokens", 1, 64)
      .add("data", &data, "lm: directory of a tokenized corpus (lrnn tokenize --out DIR)")
      .add("context", &context, "lm: tokens per training window", 1, kMaxSequenceLength)
      .add("eval_context", &eval_context, "lm: tokens per evaluation window (0 = context; longer measures extrapolation)",
           0, kMaxSequenceLength)
      .add("eval_tokens", &eval_tokens, "lm: evaluate on at most this many validation tokens (0 = the whole split)",
           int64_t(0), int64_t(1) << 40);
}

std::vector<int> Task::lengths(std::array<int, 2> r) const {
  std::vector<int> out;
  for (int len = r[0]; len <= r[1]; ++len) out.push_back(len);
  return out;
}

int Task::draw_length(uint64_t seed, Split split, uint64_t id, std::array<int, 2> r) const {
  std::vector<int> lens = lengths(r);
  if (lens.empty()) LRNN_USER_ERROR("task {}: no sequence length in [{}, {}] that it can produce", name(), r[0], r[1]);
  Rng rng{seed ^ uint64_t(split), id};
  return lens[rng.below(1ull << 40, uint32_t(lens.size()))];
}

Batch Task::make_batch(const std::vector<Sample>& samples) const {
  Batch b;
  b.B = int(samples.size());
  for (auto& s : samples) b.T = std::max(b.T, int(s.input.size()));
  b.tokens.assign(size_t(b.B) * b.T, pad_token());
  b.labels.assign(size_t(b.B) * b.T, -1);
  for (int i = 0; i < b.B; ++i) {
    auto& s = samples[i];
    std::copy(s.input.begin(), s.input.end(), b.tokens.begin() + size_t(i) * b.T);
    std::copy(s.target.begin(), s.target.end(), b.labels.begin() + size_t(i) * b.T);
    b.lengths.push_back(int(s.input.size()));
  }
  return b;
}

uint64_t pool_id(uint64_t seed, uint64_t p, uint64_t n) {
  LRNN_CHECK(n > 0, "pool_id: empty pool");
  const uint64_t epoch = p / n;
  uint64_t x = p % n;
  int bits = 2;
  while (bits < 62 && (uint64_t(1) << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  const Rng round_key{seed ^ 0x706f6f6c5f696473ull, epoch};  // "pool_ids"
  auto F = [&](uint64_t r, uint64_t R) {  // round r's function of the right half
    const uint64_t i = (r << 40) | (R << 1);
    return (uint64_t(round_key.u32(i)) | uint64_t(round_key.u32(i | 1)) << 32) & mask;
  };
  do {  // cycle-walking: a bijection of [0, 4^half) applied until it lands in [0, n)
    for (uint64_t r = 0; r < 4; ++r) {
      const uint64_t L = x >> half, R = x & mask;
      x = (R << half) | (L ^ F(r, R));
    }
  } while (x >= n);
  return x;
}

Batch Task::train_batch(uint64_t seed, int64_t step, int B, std::array<int, 2> range) const {
  std::vector<Sample> samples;
  samples.reserve(B);
  for (int i = 0; i < B; ++i) {
    uint64_t id = uint64_t(step) * uint64_t(B) + uint64_t(i);
    if (train_pool_ > 0) id = pool_id(seed, id, uint64_t(train_pool_));
    samples.push_back(sample(seed, Split::Train, id, draw_length(seed, Split::Train, id, range)));
  }
  Batch b = make_batch(samples);
  if (supervised_prefix_ > 0)
    for (int i = 0; i < b.B; ++i)
      for (int t = supervised_prefix_; t < b.T; ++t) b.labels[size_t(i) * b.T + t] = -1;
  return b;
}

Batch Task::train_batch_of_rank(uint64_t seed, int64_t step, int B, std::array<int, 2> range, int rank, int world,
                                double* weight) const {
  LRNN_CHECK(world >= 1 && rank >= 0 && rank < world && B % world == 0, "rank {} of {} with batch {}", rank, world, B);
  Batch all = train_batch(seed, step, B, range);
  *weight = 1.0;
  if (world == 1) return all;
  const int rows = B / world;
  Batch mine = all.rows(rank * rows, rows);
  const int total = ops::count_labels(all.labels.data(), all.B * all.T);
  const int own = ops::count_labels(mine.labels.data(), mine.B * mine.T);
  *weight = total > 0 ? double(world) * own / total : 1.0;
  return mine;
}

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (auto& t : kTasks) names.push_back(t.name);
  return names;
}

std::unique_ptr<Task> create_task(const TaskConfig& cfg) {
  auto row = std::find_if(std::begin(kTasks), std::end(kTasks), [&](const TaskEntry& t) { return cfg.name == t.name; });
  if (row == std::end(kTasks))
    LRNN_USER_ERROR("task.name: unknown task '{}'; valid tasks are: {}", cfg.name, fmt::join(task_names(), ", "));
  for (auto& k : kOptionalKeys)
    if (k.is_set(cfg) && cfg.name != k.task)
      LRNN_USER_ERROR("task.{}: applies to task {} only, not to {}", k.key, k.task, cfg.name);
  if (cfg.name == "lm")
    for (auto& k : kSyntheticKeys)
      if (k.is_set(cfg))
        LRNN_USER_ERROR("task.{}: the lm task does not use it (its windows are task.context tokens long; evaluation "
                        "reads task.eval_tokens of the validation split)", k.key);
  std::unique_ptr<Task> task = row->make(cfg);
  task->set_train_pool(cfg.train_pool);
  for (auto [key, range] : {std::pair{"train_len", cfg.train_len}, std::pair{"eval_len", cfg.eval_len}})
    if (task->lengths(range).empty())
      LRNN_USER_ERROR("task.{}: task {} has no sequence length in [{}, {}]", key, cfg.name, range[0], range[1]);
  return task;
}

std::array<int, 2> task_input_lengths(const TaskConfig& cfg) {
  if (cfg.name == "lm") return {cfg.context, cfg.eval_context ? cfg.eval_context : cfg.context};
  return {cfg.train_len[1] + 1, cfg.eval_len[1] + 1};
}

}  // namespace lrnn
