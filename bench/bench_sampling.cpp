// The host's share of a generated token at a language model's vocabulary (V = 32,000): drawing
// the token (temperature 1; top-p 0.9; top-k 50) and the log-sum-exp behind its reported
// log-probability. The logits are a fixed N(0, 3) row; each iteration draws at a new position.
#include <benchmark/benchmark.h>
#include <random>
#include <vector>
#include "infer/decoder.h"

using namespace lrnn;

namespace {

const std::vector<float>& logits() {
  static const std::vector<float> v = [] {
    std::vector<float> x(32000);
    std::mt19937 g(1);
    std::normal_distribution<float> n(0.f, 3.f);
    for (float& e : x) e = n(g);
    return x;
  }();
  return v;
}

void BM_SampleToken(benchmark::State& state) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = state.range(0) == 1 ? 0.9 : 1.0;
  o.top_k = state.range(0) == 2 ? 50 : 0;
  const auto& x = logits();
  uint64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(sample_token(x.data(), int(x.size()), o, i++));
}
// 0: the whole distribution; 1: top-p 0.9; 2: top-k 50.
BENCHMARK(BM_SampleToken)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_LogSumExp(benchmark::State& state) {
  const auto& x = logits();
  for (auto _ : state) benchmark::DoNotOptimize(log_sum_exp(x.data(), int(x.size())));
}
BENCHMARK(BM_LogSumExp)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
