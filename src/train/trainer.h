// The training loop: fresh task samples every step, AdamW with warmup + cosine, global-norm
// clipping, skip-and-count of non-finite steps, periodic evaluation and atomic checkpoints.
// A run resumed from its last checkpoint follows the uninterrupted run's loss step for step;
// Ctrl-C (SIGINT) or SIGTERM saves a checkpoint after the current step, so nothing is lost.
#pragma once
#include <filesystem>
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/evaluate.h"

namespace lrnn {

struct TrainOptions {
  std::filesystem::path out_dir;
  bool resume = false;  // continue the run in out_dir from its train_state
  bool quiet = false;   // no progress output at all (tests)
  // SIGINT/SIGTERM end the run cleanly: the current step finishes, a checkpoint is written and
  // train() returns with `interrupted` set; a second signal aborts at once.
  bool handle_signals = true;
};

struct TrainSummary {
  int64_t steps = 0, skipped = 0;
  double final_loss = 0, seconds = 0;
  bool stopped_early = false;  // training.stop_at was reached
  int interrupted = 0;         // the signal (SIGINT, SIGTERM) that ended the run early; 0 if none
  bool leader = true;          // rank 0 (or the only process): the one that evaluated and reports
  nlohmann::json eval;  // what eval.json holds
};

TrainSummary train(const ExperimentConfig& cfg, const TrainOptions& opt);

// Evaluation on the config's eval lengths and on its training lengths; the object of eval.json.
// `logits` runs the model (vocabulary size V) on a batch. A language model's evaluation takes its
// per-token losses from `lm_losses` when given (e.g. read piecewise, infer/decoder.h), else from
// `logits`.
nlohmann::json evaluate_run(const LogitsFn& logits, int V, const ExperimentConfig& cfg,
                            const TokenLossFn& lm_losses = {});

}  // namespace lrnn
