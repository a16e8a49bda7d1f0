// Tasks produce batches of (tokens, labels) and know how to read them; they know nothing of
// models. Every sample is generated from a counter-based stream addressed by (seed, split,
// sample id), so data is fresh every step, identical on resume, and independent of batching.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>
#include "io/schema.h"

namespace lrnn {

// The longest sequence a task.*_len may ask for (2^20 tokens; what a run can afford beyond that is
// checked against the machine's memory before anything is allocated).
inline constexpr int kMaxSequenceLength = 1 << 20;

struct TaskConfig {
  std::string name = "parity";
  std::array<int, 2> train_len{3, 40};     // inclusive range of sequence lengths for training
  std::array<int, 2> eval_len{40, 256};    // inclusive range for the evaluation
  int eval_samples = 8192;                 // spread evenly over the eval lengths (Prefix tasks: all
                                           // of the longest, train/evaluate.h)
  int eval_batch_size = 256;
  // modular_arithmetic_with_brackets
  bool mult = false;                       // allow '*' (Delétang et al.'s `mult` variant)
  // cycle_navigation
  int cycle_length = 5;
  // word_problem
  std::string group = "S3";                // see tasks/groups.h for the grammar
  bool bos = false;                        // prepend BOS to input and target (P2)
  bool only_swaps = false;                 // inputs are transpositions only (P1 S5 study)
  int max_moved = 0;                       // inputs move at most this many points (0: any)
  int tokens_per_element = 1;              // each element followed by k-1 filler tokens (P1)
  // Synthetic tasks: train on a fixed set of this many sequences, every one once per epoch in an
  // order reshuffled each epoch (P2's protocol: 100k); 0 draws fresh sequences every step.
  int64_t train_pool = 0;
  // lm (tasks/lm.h)
  std::string data;                        // a tokenized corpus (lrnn tokenize --out DIR)
  int context = 512;                       // tokens per training window
  int eval_context = 0;                    // tokens per evaluation window (0: context)
  int64_t eval_tokens = 0;                 // evaluate on at most this many val tokens (0: all)
  void describe(io::Schema& s);
};

struct Sample {
  std::vector<int32_t> input;    // model input: seq[:-1] for the Chomsky tasks
  std::vector<int32_t> target;   // seq[1:] there (word problems: y_t at x_t), -1 where not supervised
};

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> tokens, labels;  // [B,T], right-padded with the pad token / -1
  std::vector<int> lengths;             // input length of each row
  // Rows [r0, r0 + rows) as a batch of their own (a micro-batch of gradient accumulation).
  Batch rows(int r0, int rows) const;
};

// How a task's samples are scored (train/evaluate.h). Answer: one supervised answer per sample,
// accuracy per length. Prefix: a label at (nearly) every position; sequence accuracy up to each
// length t, from samples of the longest evaluation length.
// Lm: next-token cross-entropy over a validation split (tasks/lm.h).
enum class EvalKind { Answer, Prefix, Lm };

enum class Split : uint64_t { Train = 0x7261696eull, Eval = 0x6576616cull, Data = 0x64617461ull };

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual int vocab_size() const = 0;
  virtual int pad_token() const = 0;
  // The token every sample starts with (input and target), or -1 when samples have none.
  virtual int bos_token() const { return -1; }
  virtual double chance() const = 0;  // accuracy of guessing one supervised label
  virtual EvalKind eval_kind() const { return EvalKind::Answer; }
  // Sample number `id` of a split, of total length `len` (as the task counts length).
  virtual Sample sample(uint64_t seed, Split split, uint64_t id, int len) const = 0;
  // Human-readable rendering of a sample.
  virtual std::string render(const Sample& s) const = 0;
  virtual std::string token_name(int32_t tok) const = 0;

  // The lengths a range asks for, as the task counts them: a list from which draw_length picks
  // one entry uniformly (entries may repeat, e.g. the bracket task maps 3 and 4 to 5).
  // Default: every length of [lo, hi].
  virtual std::vector<int> lengths(std::array<int, 2> range) const;
  // Length of sample `id`: an entry of lengths(range), uniformly. UserError if there is none.
  int draw_length(uint64_t seed, Split split, uint64_t id, std::array<int, 2> range) const;
  // Training batch `step`: the samples at positions step*B .. step*B+B-1 of the training stream,
  // lengths from train_len. The stream's sample ids are the positions themselves, or with a pool
  // of N (set_train_pool) position p holds id pool_id(seed, p, N): epoch p / N visits ids 0..N-1
  // in its own order.
  virtual Batch train_batch(uint64_t seed, int64_t step, int B, std::array<int, 2> range) const;
  void set_train_pool(int64_t n) { train_pool_ = n; }
  // A curriculum over positions (training.curriculum): training batches supervise only the first
  // n target positions of every row (a BOS counts as one); later labels become -1. 0: all.
  void set_supervised_prefix(int n) { supervised_prefix_ = n; }
  // Data parallelism: rank `rank` of `world` gets rows [rank·B/world, (rank+1)·B/world) of
  // training batch `step` (B a multiple of world), padded as in the whole batch, and in *weight
  // its share of the whole batch's labels times world (1 when the ranks have as many labels).
  // Default: the whole batch, cut; LmTask reads only its own rows.
  virtual Batch train_batch_of_rank(uint64_t seed, int64_t step, int B, std::array<int, 2> range, int rank, int world,
                                    double* weight) const;
  Batch make_batch(const std::vector<Sample>& samples) const;

 protected:
  int64_t train_pool_ = 0;
  int supervised_prefix_ = 0;
};

// The id at position p of a training stream over a pool of n sequences: epoch p / n is a
// permutation of 0..n-1 drawn from (seed, epoch) — a Feistel network on the next power of four,
// cycle-walked into [0, n): stateless, so any step's batch (a resumed run's) is computed alone.
uint64_t pool_id(uint64_t seed, uint64_t p, uint64_t n);

// Builds the named task; validates the task.* keys it uses (UserError naming the key) and
// rejects keys set away from their defaults that the task does not use.
std::unique_ptr<Task> create_task(const TaskConfig& cfg);
// The longest input a training and an evaluation batch hold (a BOS included): what memory is
// planned for.
std::array<int, 2> task_input_lengths(const TaskConfig& cfg);
std::vector<std::string> task_names();

}  // namespace lrnn
