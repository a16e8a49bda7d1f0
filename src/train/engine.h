// What the training loop runs its steps on: the CPU (data parallelism over cores, train/
// data_parallel.h) or one CUDA device (train/engine_cuda.cpp). The loop itself (data, schedule,
// logging, evaluation, checkpoints, resume) is the same for both (train/trainer.cpp).
#pragma once
#include <memory>
#include "models/model.h"
#include "tasks/task.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluate.h"

namespace lrnn {

// What happened since the last `stats()` call.
struct EngineStats {
  double loss = 0;      // the last step's loss
  double loss_avg = 0;  // mean loss of the applied steps since the last call (the last loss if none)
  double grad_norm = 0; // the last step's gradient norm (before clipping)
  double lr = 0;        // the last step's learning rate
  int64_t skipped = 0;  // non-finite steps skipped since the start of the run
  int64_t averaged = 0; // how many applied steps loss_avg is the mean of (0: none since the last call)
};

class Engine {
 public:
  virtual ~Engine() = default;
  // The host copy of the model: layout, names, config; its params are current after to_host().
  virtual Model<float>& host_model() = 0;
  // Takes the starting optimizer state (fresh, or resumed into host_model() by the caller).
  virtual void start(const TrainState& st) = 0;
  // One optimizer step on batch `b` at learning rate `lr` (step index st.step of the loop):
  // forward, backward, global norm, skip if not finite, clip, AdamW. With several ranks
  // (dist/world.h), `b` is this rank's rows of the global batch and `weight` its share of the
  // global batch's labels times the number of ranks (1 when every rank has as many labels).
  virtual void step(const Batch& b, int64_t step, double lr, double weight = 1.0) = 0;
  // True when `mine` is true on any rank (a collective: every rank must call it at the same step).
  virtual bool any_rank(bool mine) { return mine; }
  // May synchronise with a device: the loop calls it only when it logs, ends a curriculum epoch or
  // checkpoints.
  virtual EngineStats stats() = 0;
  // Brings parameters into host_model() and the optimizer state into `st` (before checkpoints;
  // a collective with several ranks).
  virtual void to_host(TrainState& st) = 0;
  // Logits [B,T,V] of a batch under the current parameters, in host memory.
  virtual LogitsFn logits_fn() = 0;
  virtual std::string describe() const = 0;  // "cpu x2 workers", "cuda: NVIDIA H200 ..."
};

// The engine for cfg.training.device ("cpu" or "cuda"), with freshly initialised parameters.
// UserError when this build has no CUDA backend, no device is present or the model type has no
// CUDA path.
std::unique_ptr<Engine> make_engine(const ExperimentConfig& cfg);
#ifdef LRNN_WITH_CUDA
std::unique_ptr<Engine> make_cuda_engine(const ExperimentConfig& cfg);
#endif

}  // namespace lrnn
