// One training step (forward, backward, AdamW) of the P1 parity model on the CPU:
// DeltaNet d=128, 2 layers, 4 heads, vocab 3, batch 256, T=40. Also the forward alone and the
// delta-rule kernel alone, to see where the time goes.
#include <benchmark/benchmark.h>
#include <algorithm>
#include <vector>
#include "core/rng.h"
#include "models/model.h"
#include "ops/adamw/adamw.h"
#include "ops/delta_rule/delta_rule.h"
#include "tasks/task.h"
#include "train/data_parallel.h"

using namespace lrnn;

namespace {

// This machine is a shared VM: other tenants only ever add time, so the minimum over
// repetitions is the most faithful figure (reported next to mean and median).
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

struct Setup {
  std::unique_ptr<Model<float>> model;
  std::vector<int32_t> tok, lab;
  std::vector<float> m, v;
  std::vector<uint8_t> decay;
  int B, T;
  Setup(int B_, int T_, bool neg) : B(B_), T(T_) {
    YAML::Node b = YAML::Load("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2, num_heads: 4}");
    b["allow_neg_eigval"] = neg;
    model = create_model<float>(b, "bench", 0);
    Rng r{1, 2};
    tok.resize(size_t(B) * T);
    lab.assign(size_t(B) * T, -1);
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = 1 + int32_t(r.below(i, 2));
    for (int i = 0; i < B; ++i) lab[size_t(i) * T + T - 1] = 1 + int32_t(r.below(1000000 + i, 2));
    m.assign(model->params.size(), 0.f);
    v.assign(model->params.size(), 0.f);
    decay.assign(model->params.size(), 1);
  }
  void step(int64_t k) {
    std::fill(model->grads.begin(), model->grads.end(), 0.f);
    model->forward(tok.data(), lab.data(), B, T);
    model->backward();
    double n = ops::global_norm(model->grads.data(), model->grads.size());
    ops::clip_by_global_norm(model->grads.data(), model->grads.size(), n, 1.0);
    ops::AdamWParams p{1e-3, 0.9, 0.999, 1e-8, 0.1, k};
    ops::adamw_update(model->params.data(), model->grads.data(), m.data(), v.data(), decay.data(), m.size(), p);
  }
};

// The trainer's path: data parallel over `workers` cores, then clipping and AdamW.
void BM_TrainStep(benchmark::State& state) {
  const int B = int(state.range(0)), T = int(state.range(1)), W = int(state.range(2));
  YAML::Node blk = YAML::Load("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2,"
                              " num_heads: 4, allow_neg_eigval: true}");
  DataParallel dp(blk, "bench", 0, W);
  Setup s(B, T, true);
  Batch b;
  b.B = B; b.T = T; b.tokens = s.tok; b.labels = s.lab;
  auto& m = dp.main();
  int64_t k = 1;
  // One untimed step first: the activation arenas' pages are touched (faulted in) on the first
  // step only, as in a training run; timing it would charge each of the few timed steps a share.
  dp.forward_backward(b);
  for (auto _ : state) {
    dp.forward_backward(b);
    double n = ops::global_norm(m.grads.data(), m.grads.size());
    ops::clip_by_global_norm(m.grads.data(), m.grads.size(), n, 1.0);
    ops::AdamWParams p{1e-3, 0.9, 0.999, 1e-8, 0.1, k++};
    ops::adamw_update(m.params.data(), m.grads.data(), s.m.data(), s.v.data(), s.decay.data(), s.m.size(), p);
    dp.sync_params();
  }
  state.counters["tokens/s"] = benchmark::Counter(double(B) * T, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)->ArgNames({"B", "T", "workers"})->Args({256, 40, 2})->Args({256, 40, 1})
    ->Args({1024, 40, 2})->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);

// The same step, one model, every op split over all cores (OpenMP + threaded OpenBLAS).
void BM_TrainStepSharedOps(benchmark::State& state) {
  Setup s(int(state.range(0)), int(state.range(1)), true);
  int64_t k = 1;
  for (auto _ : state) s.step(k++);
  state.counters["tokens/s"] = benchmark::Counter(double(s.B) * s.T, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStepSharedOps)->Args({256, 40})->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);

void BM_Forward(benchmark::State& state) {
  Setup s(int(state.range(0)), int(state.range(1)), true);
  for (auto _ : state) s.model->forward(s.tok.data(), s.lab.data(), s.B, s.T);
  state.counters["tokens/s"] = benchmark::Counter(double(s.B) * s.T, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Forward)->Args({256, 40})->Args({64, 256})->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);

void BM_DeltaRule(benchmark::State& state) {
  const int B = 256, T = 40, H = 4, D = 32;
  const bool bwd = state.range(0);
  std::vector<float> q(size_t(B) * T * H * D, 0.1f), k(q.size(), 0.1f), v(q.size(), 0.3f), bl(size_t(B) * T * H, 0.5f);
  std::vector<float> o(q.size()), dq(q.size()), dk(q.size()), dv(q.size()), db(bl.size());
  ops::DeltaRuleDims d{B, T, H, D, D, 1, ops::EigenRange::Signed, 0};
  for (auto _ : state) {
    if (bwd)
      ops::delta_rule_backward<float>(dq.data(), dk.data(), dv.data(), db.data(), nullptr, o.data(), q.data(),
                                      k.data(), v.data(), bl.data(), nullptr, d);
    else
      ops::delta_rule_forward<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), nullptr, d);
  }
}
BENCHMARK(BM_DeltaRule)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);

}  // namespace

BENCHMARK_MAIN();
