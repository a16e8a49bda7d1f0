// The optimizer step on the device, with no host synchronisation: global gradient norm, the
// finite check that skips a step, clipping and AdamW (torch semantics, as adamw.h), driven by a
// learning-rate table indexed by a device-side step counter. The trainer reads `StepStats` back
// only when it logs.
#pragma once
#include <cstddef>
#include <cstdint>
#include "ops/adamw/adamw.h"

namespace lrnn::ops::cuda {

// Lives in device memory; zero-initialise it (cudaMemset) before the first step.
struct StepStats {
  int64_t step;       // steps taken (applied or skipped): the next step's index into the lr table
  int64_t adam_step;  // updates applied (1-based bias correction)
  int64_t skipped;    // steps dropped for a non-finite loss, gradient or update
  float loss, norm;   // the last step's loss and gradient norm (before clipping)
  float lr;           // the last step's learning rate
  float scale;        // the last step's clipping factor
  int finite;         // the last step was applied
  double loss_sum;    // sum of the applied steps' losses since the trainer last reset it
  int64_t loss_n;
};

// Where the optimizer's scalars meet when the gradients are sharded over data-parallel ranks
// (ZeRO-1, train/engine_cuda.cpp): each rank holds a slice of them, so the squared norm is summed
// over ranks and the "this update would not be finite" flags are or-ed, and every rank then makes
// the same decision (apply or skip, clip factor). Both work in place on device memory, queued on
// cuda::stream(). nullptr: one rank holds everything.
struct StepReduce {
  virtual ~StepReduce() = default;
  virtual void sum(double* x, int n) = 0;
  virtual void max(int* x, int n) = 0;
};

// Reads the loss (device scalar) and the gradients, then: norm, finite check, clip factor
// (max_norm <= 0: no clipping), lr = lr_table[step], counters. Scratch: cuda::scratch.
void optimizer_prepare(StepStats* s, const float* loss, const float* grads, size_t N, const float* lr_table,
                       int64_t table_size, double max_norm, StepReduce* ranks = nullptr);
// AdamW on params with grads * scale, at s->lr and s->adam_step; does nothing when !s->finite.
// First checks that the update leaves every parameter and moment finite; when it would not, the
// step is counted as skipped instead (s->finite = 0) and nothing is written.
void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t N,
                  StepStats* s, double beta1, double beta2, double eps, double weight_decay,
                  StepReduce* ranks = nullptr);

}  // namespace lrnn::ops::cuda
