// Learning, end to end on the CPU, for Mamba (P1's Table 3 parity row in miniature): Mamba with
// eigenvalues in [-1,1] (abar = 2 exp(delta A) - 1) learns parity on lengths 3-40 and
// extrapolates to 40-256; with [0,1] and the same budget it does not. Verdicts are counts over
// seeds (learning_util.h).
#include <gtest/gtest.h>
#include "learning_util.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

// A 1-layer Mamba, d_model 64, d_state 4, expand 2, conv 4, HF init; AdamW lr 1e-2 and no weight
// decay (as the P1 repository's Mamba configs: decay holds back the large dt_proj weights that
// make delta*A << 0 on the "flip" token), 2000 steps of batch 64. At d_model 32 (the recipe
// before) [-1,1] reached 0.9 on only 9 of 20 runs (the rest stuck near chance); clipping, other learning rates, longer
// training, a wider dt range, 2 layers or d_state 16 were no better (docs/RESULTS.md).
std::string recipe(bool neg) {
  return std::string(R"(
training: {num_steps: 2000, batch_size: 64, lr: 1.0e-2, warmup_steps: 200, weight_decay: 0.0}
model: {model_type: mamba, hidden_size: 64, num_hidden_layers: 1, state_size: 4, expand: 2, conv_kernel: 4,
        allow_neg_eigval: )") + (neg ? "true" : "false") + R"(}
task: {name: parity, train_len: [3, 40], eval_len: [40, 256], eval_samples: 2048}
logging: {log_every: 100}
)";
}

}  // namespace

// Measured: 34 of 50 runs reach scaled accuracy >= 0.9 on 40-256 (seeds 0-9 with this CPU's
// kernels and two workers, 0-9 with Haswell kernels and one worker, 0-29 on an Intel Xeon with an
// x86-64-v3 build and one worker; the others stay near chance). Needing 2 of 10: P(false failure)
// = 2.5e-4 at rate 0.68, 3.7e-3 at its one-sided 95% lower bound 0.56.
TEST(LearningMamba, NegativeEigenvaluesSolveParity) {
  int ok = successes_among_seeds(recipe(true), "Mamba [-1,1]", 2, 10, 0.68,
                                 [](const SeedRun& r) { return r.test >= 0.9; });
  EXPECT_GE(ok, 2);
}

// Measured: 0 of 10 runs above 0.03 (the largest 0.027; and 0 of 20 at d_model 32). Two seeds
// (each run is the slowest of the suite, ~30 s on two cores).
TEST(LearningMamba, UnitRangeDoesNotSolveParityWithTheSameBudget) {
  for (const SeedRun& r : all_seeds(recipe(false), "Mamba [0,1]", 2)) EXPECT_LT(r.test, 0.2) << "seed " << r.seed;
}
