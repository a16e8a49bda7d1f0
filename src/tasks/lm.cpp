#include "tasks/lm.h"
#include <filesystem>
#include <fmt/format.h>
#include "core/check.h"

namespace lrnn {

namespace fs = std::filesystem;

LmTask::LmTask(const TaskConfig& cfg) : context_(cfg.context), eval_context_(cfg.eval_context ? cfg.eval_context : cfg.context), dir_(cfg.data) {
  if (dir_.empty())
    LRNN_USER_ERROR("task.data: the lm task needs the directory of a tokenized corpus (lrnn tokenize --out DIR)");
  if (!fs::is_directory(dir_)) LRNN_USER_ERROR("task.data: {}: not a directory (lrnn tokenize --out DIR makes one)", dir_);
  // Headers are checked here (cheap); each token is checked against the vocabulary as it is read.
  train_ = std::make_unique<data::TokenStream>(data::TokenStream::open(dir_, "train", data::Verify::Header));
  if (data::PackedSampler(*train_, context_, 0).windows_per_epoch() == 0)
    LRNN_USER_ERROR("task.context: {}'s training split holds {} tokens, too few for two contexts of {} + 1", dir_,
                    train_->size(), context_);
  if (data::read_index(dir_)["splits"].contains("val")) {
    val_ = std::make_unique<data::TokenStream>(data::TokenStream::open(dir_, "val", data::Verify::Header));
    val_sampler_ = std::make_unique<data::PackedSampler>(*val_, eval_context_, 0);
  }
}

std::vector<int> LmTask::lengths(std::array<int, 2>) const { return {context_}; }

Batch LmTask::train_batch(uint64_t seed, int64_t step, int B, std::array<int, 2>) const {
  // The training order is keyed by training.seed; a sampler is a few numbers, made per batch.
  return data::PackedSampler(*train_, context_, seed).batch(step, B);
}

Batch LmTask::train_batch_of_rank(uint64_t seed, int64_t step, int B, std::array<int, 2>, int rank, int world,
                                  double* weight) const {
  *weight = 1.0;
  return data::PackedSampler(*train_, context_, seed).batch(step, B, rank, world);
}

uint64_t LmTask::eval_windows() const {
  if (!val_)
    LRNN_USER_ERROR("task.data: {} has no validation split (lrnn tokenize --val-fraction > 0 makes one)", dir_);
  return val_sampler_->eval_windows();
}

Batch LmTask::eval_batch(uint64_t index, int batch) const {
  eval_windows();  // the error when there is no val split
  return val_sampler_->eval_batch(index, batch);
}

Sample LmTask::sample(uint64_t seed, Split split, uint64_t id, int) const {
  Batch b;
  if (split == Split::Eval) {
    if (id >= eval_windows()) LRNN_USER_ERROR("evaluation window {}: the val split has {}", id, eval_windows());
    b = eval_batch(id, 1);
  } else {
    const int64_t step = int64_t(id);
    b = train_batch(seed, step, 1, {});
  }
  Sample s;
  s.input.assign(b.tokens.begin(), b.tokens.end());
  s.target.assign(b.labels.begin(), b.labels.end());
  return s;
}

std::string LmTask::render(const Sample& s) const {
  std::string out;
  for (int32_t t : s.input) {
    if (!out.empty()) out += ' ';
    out += std::to_string(t);  // (not `" " + to_string(t)`: GCC 12 -O3 warns -Wrestrict, a false positive)
  }
  return out;
}

std::string LmTask::token_name(int32_t tok) const { return std::to_string(tok); }

}  // namespace lrnn
