// Learning, end to end on the CPU (P1's headline in miniature): DeltaNet with eigenvalues in
// [-1,1] learns parity on lengths 3-40 and extrapolates to 40-256; with [0,1] and the same
// budget it does not. Verdicts are counts over seeds, set from measured rates (learning_util.h).
#include <gtest/gtest.h>
#include "learning_util.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

// The demo recipe (configs/demo/): d=32, 1 layer, 2 heads, 2000 steps of batch 64, lr 5e-3, no
// weight decay. Weight decay 0.1 (the recipe before) held the beta logits back: a seed that fits
// 3-40 often keeps beta(bit 0) ~ 0.06 in one head, so its state decays by (1 - beta) per 0-bit,
// harmless up to 40 and fatal by 200; it solved 40-256 on only 8 of 19 runs.
std::string recipe(bool neg) {
  return std::string(R"(
training: {num_steps: 2000, batch_size: 64, lr: 5.0e-3, warmup_steps: 200, weight_decay: 0.0}
model: {model_type: delta_net, hidden_size: 32, num_hidden_layers: 1, num_heads: 2, intermediate_size: 64,
        use_short_conv: false, allow_neg_eigval: )") + (neg ? "true" : "false") + R"(}
task: {name: parity, train_len: [3, 40], eval_len: [40, 256], eval_samples: 2048}
logging: {log_every: 100}
)";
}

}  // namespace

// Measured: 47 of 74 runs reach scaled accuracy >= 0.99 on 40-256 (seeds 0-19 with this CPU's
// OpenBLAS kernels and two workers, 0-23 with Haswell kernels and one worker, 0-29 on an Intel
// Xeon with an x86-64-v3 build and one worker); nearly all others fit 3-40 and fall to 0.6-0.95
// beyond ~100 tokens. Needing 2 of 10: P(false failure) = 6.9e-4 at rate 0.64, 6.5e-3 at its
// one-sided 95% lower bound 0.53.
TEST(Learning, NegativeEigenvaluesSolveParity) {
  int ok = successes_among_seeds(recipe(true), "DeltaNet [-1,1]", 2, 10, 0.64,
                                 [](const SeedRun& r) { return r.test >= 0.99; });
  EXPECT_GE(ok, 2);
}

// Measured: 0 of 10 runs above 0.05 (the largest 0.041); the bound 0.2 leaves room for any CPU.
TEST(Learning, UnitRangeDoesNotSolveParityWithTheSameBudget) {
  for (const SeedRun& r : all_seeds(recipe(false), "DeltaNet [0,1]", 3)) EXPECT_LT(r.test, 0.2) << "seed " << r.seed;
}
