// The baselines on parity, end to end on the CPU (our own runs of P1's qualitative finding):
// the LSTM — a nonlinear RNN — learns parity on lengths 3-40 and extrapolates to 40-256; the
// Transformer fits the lengths it is trained on but does not extrapolate. Verdicts are counts
// over seeds (learning_util.h).
#include <gtest/gtest.h>
#include "learning_util.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

// LSTM, hidden 32, one layer.
const char* kLstm = R"(
training: {num_steps: 2000, batch_size: 64, lr: 1.0e-2, warmup_steps: 100, weight_decay: 0.0}
model: {model_type: lstm, hidden_size: 32, num_layers: 1, embedding_dim: 8}
task: {name: parity, train_len: [3, 40], eval_len: [40, 256], eval_samples: 2048}
logging: {log_every: 100}
)";

// Transformer, d=64, 2 layers, 4 heads, trained on lengths 3-12: fitting 3-40 takes ~2M
// sequences at d=128 (~8000 steps of 256, about half an hour on two quiet cores;
// docs/RESULTS.md), so the test trains on a range a short budget can fit, and checks that what
// it fits does not carry over to 40-256. The fit cannot reach 1.0: without a BOS token or
// absolute positions, a run of identical tokens gives the same output at every position (each
// attention average is over equal values), so the model answers "2 2 2" as it answers "2 2".
const char* kTransformer = R"(
training: {num_steps: 2500, batch_size: 64, lr: 1.0e-3, warmup_steps: 200, weight_decay: 0.1}
model: {model_type: llama, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 128}
task: {name: parity, train_len: [3, 12], eval_len: [40, 256], eval_samples: 2048}
logging: {log_every: 100}
)";

}  // namespace

// Measured: 20 of 20 runs reach 1.000 on 40-256 (seeds 0-9 with this CPU's kernels and two
// workers, 0-9 on an Intel Xeon with an x86-64-v3 build and one worker). Needing 1 of 3: P(false failure) = 2.7e-3 at the one-sided 95%
// lower bound of the rate, 0.86.
TEST(LearningBaselines, LstmSolvesParityAndExtrapolates) {
  int ok = successes_among_seeds(kLstm, "LSTM", 1, 3, 1.0, [](const SeedRun& r) { return r.test >= 0.99; });
  EXPECT_GE(ok, 1);
}

// Measured over 26 runs (seeds 0-9 with this CPU's kernels, 0-15 on an Intel Xeon with an
// x86-64-v3 build and one worker): 21 fit 3-12 to scaled accuracy >= 0.75 (the rest stall below);
// every run stays below 0.05 on 40-256. Needing 1 fit among up to 5 seeds: P(false failure) =
// 2.5e-4 at rate 0.81, 6.0e-3 at its one-sided 95% lower bound 0.64; every seed that ran must
// stay below 0.2 on 40-256.
TEST(LearningBaselines, TransformerFitsTrainingLengthsButDoesNotExtrapolate) {
  std::vector<SeedRun> runs;
  int fits = successes_among_seeds(kTransformer, "Transformer", 1, 5, 0.81, [&](const SeedRun& r) {
    runs.push_back(r);
    return r.train >= 0.75;
  });
  EXPECT_GE(fits, 1);
  for (const SeedRun& r : runs) EXPECT_LT(r.test, 0.2) << "seed " << r.seed << " extrapolates";
}
