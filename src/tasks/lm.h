// Language modelling on a tokenized corpus (`lrnn tokenize`, docs/DATA.md): task.data names the
// directory, task.context the number of tokens a training window feeds the model. Training
// batches are packed windows of context + 1 tokens from the train split, drawn by
// data::PackedSampler as a pure function of (training.seed, step), so a resumed run sees the
// batches of an uninterrupted one. Every position is supervised with the next token.
//
// Evaluation (EvalKind::Lm) reads the val split in order, window after window, and reports the
// mean cross-entropy in nats per token (val_loss), its exponential (perplexity) and the mean
// loss at each position of the window (loss_by_position), the length-extrapolation curve when
// task.eval_context is longer than the training context.
#pragma once
#include <memory>
#include "data/shards.h"
#include "tasks/task.h"

namespace lrnn {

class LmTask final : public Task {
 public:
  explicit LmTask(const TaskConfig& cfg);
  std::string name() const override { return "lm"; }
  int vocab_size() const override { return int(train_->vocab_size()); }
  int pad_token() const override { return 0; }  // windows are never padded
  double chance() const override { return 1.0 / vocab_size(); }
  EvalKind eval_kind() const override { return EvalKind::Lm; }
  // Training sample `id` (window id of the training order) or evaluation window `id` (in order);
  // `len` is ignored: every window holds the context's tokens.
  Sample sample(uint64_t seed, Split split, uint64_t id, int len) const override;
  std::string render(const Sample& s) const override;
  std::string token_name(int32_t tok) const override;
  std::vector<int> lengths(std::array<int, 2> range) const override;
  Batch train_batch(uint64_t seed, int64_t step, int B, std::array<int, 2> range) const override;
  // Only this rank's windows are read (every window has as many labels: weight 1).
  Batch train_batch_of_rank(uint64_t seed, int64_t step, int B, std::array<int, 2> range, int rank, int world,
                            double* weight) const override;

  int context() const { return context_; }
  int eval_context() const { return eval_context_; }
  bool has_val() const { return val_ != nullptr; }
  // Evaluation windows (of eval_context + 1 tokens) in the val split, and batch `index` of them.
  uint64_t eval_windows() const;
  Batch eval_batch(uint64_t index, int batch) const;

 private:
  int context_, eval_context_;
  std::string dir_;
  std::unique_ptr<data::TokenStream> train_, val_;
  std::unique_ptr<data::PackedSampler> val_sampler_;
};

}  // namespace lrnn
