// Evaluation by length. Two kinds, chosen by the task (Task::eval_kind):
//
// Answer (Chomsky tasks: one supervised answer per sample): accuracy and scaled accuracy
// ((acc - chance) / (1 - chance)) over the lengths of a range, overall and per length. A sample
// is correct when the argmax at every supervised position is the target.
//
// Prefix (group word problems: a label at every position): all samples have the longest length
// of the range, L; `per_length[t]` is the sequence accuracy up to t, the fraction of samples
// whose predictions at every supervised position <= t are correct (t counts input tokens
// without BOS; a BOS label, when present, counts at every t). The top-level accuracy is the
// sequence accuracy over the whole length L; scaled accuracy uses the chance of guessing all
// n_t supervised labels up to t, chance^n_t, which is ~0, so scaled ≈ accuracy. The fraction of
// single supervised predictions that are correct is reported as token_accuracy, and the curve
// in length order as curve.length / curve.sequence_accuracy.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include "models/model.h"
#include "tasks/task.h"

namespace lrnn {

struct EvalResult {
  struct Bucket {
    int64_t correct = 0, total = 0;
    double chance = 0;  // accuracy of guessing, for this bucket's scaled accuracy
    double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
    double scaled_accuracy() const { return (accuracy() - chance) / (1.0 - chance); }
  };
  EvalKind kind = EvalKind::Answer;
  std::array<int, 2> range{};
  double chance = 0;                  // per supervised label
  std::map<int, Bucket> per_length;   // Answer: per sample length; Prefix: per prefix length t
  int eval_length = 0;                // Prefix: the length of every evaluated sample
  int64_t samples = 0;
  int64_t labels_correct = 0, labels_total = 0;  // single supervised predictions
  double accuracy() const;
  double scaled_accuracy() const;
  nlohmann::json to_json() const;
};

// Answer: `n_samples` spread evenly over the task's lengths of `range`; Prefix: `n_samples` of the
// longest. Sample ids are fixed by `seed`, so the same evaluation set is used for every model and
// every training seed. `logits_of` runs the model on a batch and returns its logits [B,T,V].
using LogitsFn = std::function<const float*(const Batch&)>;
EvalResult evaluate(const LogitsFn& logits_of, int vocab, const Task& task, std::array<int, 2> range,
                    int n_samples, int batch_size, uint64_t seed = 0);

// Lm (tasks/lm.h): next-token cross-entropy over the validation split's windows, in order, up to
// `max_tokens` predicted tokens (0: all windows). Returns {"metric": "val_loss", "val_loss" (nats
// per token), "perplexity", "tokens", "windows", "context", "cumulative_loss" (at each t, the mean
// of loss_by_position over 0..t: P2's length-extrapolation curve), "loss_by_position" (mean loss of the
// prediction at each position 0..context-1, the length-extrapolation curve)}. Sums in double.
// `losses` fills loss[r*T + t] with the next-token cross-entropy at position t of row r < rows of
// an evaluation batch [B,T] (rows <= B: the last batch may be partly used).
class LmTask;
using TokenLossFn = std::function<void(const Batch& b, int rows, std::vector<double>& loss)>;
nlohmann::json evaluate_lm(const TokenLossFn& losses, const LmTask& task, int batch_size, int64_t max_tokens);
// The losses from one forward over each whole batch.
TokenLossFn token_losses_of(const LogitsFn& logits_of, int vocab);

// The cross-entropy -log softmax(logits)[label] of one position (`logits` holds `vocab` values).
double token_loss(const float* logits, int vocab, int label);

}  // namespace lrnn
