// Run directory files: the model as fla/HF would save it (model.safetensors with the public
// names + config.json), and the resumable training state (train_state.safetensors: AdamW
// moments, step counters). Every file is written atomically.
#pragma once
#include <filesystem>
#include <string>
#include "models/model.h"

namespace lrnn {

struct TrainState {
  int64_t step = 0;         // optimizer steps completed (including skipped ones)
  int64_t adam_step = 0;    // updates actually applied (AdamW bias correction)
  int64_t skipped = 0;      // non-finite steps skipped
  std::vector<float> m, v;  // AdamW moments, same layout as the parameters
  // The learning-rate schedule the run was started with (JSON: num_steps, warmup_steps, lr,
  // min_lr), so that a resume can refuse to bend it; empty in checkpoints that predate it.
  std::string schedule;
  // training.curriculum's progress (JSON: positions, and the loss sum and step count of the epoch
  // under way), so that a resumed run supervises what the uninterrupted one would; empty without one.
  std::string curriculum;
};

void save_model(const std::filesystem::path& dir, const Model<float>& model);
// Loads parameters by name; every tensor of the layout must be present with its exact shape.
template <class T>
void load_params(const std::filesystem::path& file, Model<T>& model);
void save_train_state(const std::filesystem::path& dir, const Model<float>& model, const TrainState& s);
// Also restores the parameters saved with the state. Everything is validated: counters are whole
// numbers with 0 <= step <= num_steps and adam_step + skipped == step; exactly the model's tensors,
// with finite values (and a non-negative second moment). UserError naming the file otherwise.
TrainState load_train_state(const std::filesystem::path& dir, Model<float>& model, int64_t num_steps);

}  // namespace lrnn
