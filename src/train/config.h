// The experiment config: YAML blocks `training`, `model`, `task`, `logging` (keys follow the
// xLSTM harness and fla). Loading validates everything up front: unknown keys, wrong types and
// out-of-range values are UserErrors naming the file and the key.
#pragma once
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>
#include "io/schema.h"
#include "tasks/task.h"

namespace lrnn {

// The most steps a run may have (training.num_steps; also the bound on a saved step counter).
inline constexpr int64_t kMaxSteps = 1'000'000'000'000;

struct TrainingConfig {
  int64_t num_steps = 1000;
  int batch_size = 256;            // sequences per optimizer step (all micro-batches together)
  int gradient_accumulation_steps = 1;  // micro-batches of batch_size / this many sequences per step
  double lr = 1e-3;
  double min_lr = 1e-6;            // floor of the cosine schedule
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;       // decoupled; never on norm weights
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double grad_clip = 0.0;          // global-norm clipping; 0 = off
  int64_t val_every = 0;           // evaluate every N steps (0: only at the end)
  double stop_at = 0.0;            // stop once a periodic evaluation reaches this scaled accuracy (0: never)
  std::string stop_on = "eval";    // the lengths stop_at reads: eval (task.eval_len) or train (task.train_len)
  int64_t checkpoint_every = 1000; // write a resumable checkpoint every N steps (and at the end)
  // A curriculum over positions (the DeltaProduct authors' state-tracking script, `--curriculum`):
  // the loss starts on the first `curriculum` target positions only (a BOS counts as one) and takes
  // one more after each epoch whose mean training loss is below curriculum_loss, until it covers
  // the whole sequence. 0: off. An epoch is curriculum_every steps (0: one pass over task.train_pool).
  int curriculum = 0;
  double curriculum_loss = 0.3;
  int64_t curriculum_every = 0;
  // Once the curriculum covers the whole sequence, the learning rate is multiplied by this (1:
  // unchanged): a constant learning rate keeps Adam's steps large when the loss is ~1e-5, and one
  // S5 run fell back to chance that way.
  double curriculum_lr_factor = 1.0;
  int64_t seed = 0;
  std::string device = "cpu";
  std::string precision = "bf16";  // CUDA only: bf16 | tf32 | fp32 (cuda::GemmPrecision); the CPU computes in fp32
  int num_threads = 0;             // 0: all cores
  void describe(io::Schema& s);
};

struct LoggingConfig {
  int64_t log_every = 10;
  std::string progress = "auto";   // auto: a progress bar on a terminal, log lines otherwise
  void describe(io::Schema& s);
};

struct ExperimentConfig {
  TrainingConfig training;
  YAML::Node model;                // validated by create_model; vocab_size filled from the task
  TaskConfig task;
  LoggingConfig logging;
  std::string source;              // where it came from, for messages
  YAML::Node spelled;              // the YAML as given (file + --set), for numbers as the user wrote them

  // Loads a YAML file, applies `--set` overrides, validates. Throws UserError. A relative
  // task.data is made absolute (from the working directory), so a run's config.yaml names its
  // data wherever it is read from. open_task = false skips opening the task when the model block
  // names its vocab_size (a saved run read for generation or serving, whose data may be gone).
  static ExperimentConfig load(const std::string& path, const std::vector<std::string>& overrides,
                               bool open_task = true);
  static ExperimentConfig from_yaml(YAML::Node root, const std::string& source, bool open_task = true);
  YAML::Node to_yaml() const;      // the resolved config, every default written out
};

}  // namespace lrnn
