// The delta rule alone on the CPU, forward + backward (with the forward's checkpoints, as in
// training), recurrent loop against the chunked WY form, on one thread (what each data-parallel
// worker runs), per (T, head dim, n_h, gated): the measurements behind delta_rule_chunked_pays.
//   build/bench/bench_delta_rule --benchmark_min_time=0.5
#include <benchmark/benchmark.h>
#include <omp.h>
#include <cmath>
#include <vector>
#include "core/rng.h"
#include "ops/delta_rule/delta_rule.h"

using namespace lrnn;
using namespace lrnn::ops;

namespace {

void delta_rule(benchmark::State& state, bool chunked) {
  const int T = int(state.range(0)), D = int(state.range(1)), nh = int(state.range(2));
  const bool gated = state.range(3) != 0;
  const int B = int(state.range(4)), H = 4;
  omp_set_num_threads(1);
  DeltaRuleDims d;
  d.B = B; d.T = T; d.H = H; d.Dk = D; d.Dv = D; d.n_h = nh; d.range = EigenRange::Signed;
  const size_t N = size_t(B) * T;
  auto fill = [&](size_t n, uint64_t stream, float scale) {
    std::vector<float> v(n);
    Rng rr{1, stream};
    for (size_t i = 0; i < n; ++i) v[i] = scale * float(rr.normal(i));
    return v;
  };
  std::vector<float> q = fill(N * H * D, 1, 1.f), k = fill(N * nh * H * D, 2, 1.f), v = fill(N * nh * H * D, 3, 1.f);
  std::vector<float> bl = fill(N * nh * H, 4, 1.f), g = fill(N * H, 5, 0.1f), dout = fill(N * H * D, 6, 1.f);
  for (auto& x : g) x = -std::abs(x);
  for (size_t i = 0; i < k.size(); i += size_t(D)) {
    float s = 0;
    for (int j = 0; j < D; ++j) s += k[i + j] * k[i + j];
    for (int j = 0; j < D; ++j) k[i + j] /= std::sqrt(s);
  }
  std::vector<float> o(N * H * D), ckpt(delta_rule_ckpt_size(d)), dq(q.size()), dk(k.size()), dv(v.size()),
      db(bl.size()), dg(g.size());
  const float* gp = gated ? g.data() : nullptr;
  for (auto _ : state) {
    if (chunked) {
      delta_rule_forward_chunked<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
      delta_rule_backward_chunked<float>(dq.data(), dk.data(), dv.data(), db.data(), gated ? dg.data() : nullptr,
                                         dout.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
    } else {
      delta_rule_forward_recurrent<float>(o.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
      delta_rule_backward_recurrent<float>(dq.data(), dk.data(), dv.data(), db.data(), gated ? dg.data() : nullptr,
                                           dout.data(), q.data(), k.data(), v.data(), bl.data(), gp, d, ckpt.data());
    }
    benchmark::DoNotOptimize(dq.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(double(N) * state.iterations(), benchmark::Counter::kIsRate);
}

// (T, head dim, n_h, gated, B): the P1 parity shape (T 40, D 32), P2's state tracking (T 128,
// D 32, n_h 1-4), and language-model shapes (T 512-2048, D 64 and 128).
void shapes(benchmark::internal::Benchmark* b) {
  for (auto s : std::vector<std::vector<int64_t>>{{40, 32, 1, 0, 32},   {64, 32, 1, 0, 16},  {128, 32, 1, 0, 16},
                                                  {128, 32, 2, 0, 16},  {128, 32, 4, 0, 8},  {128, 16, 1, 0, 16},
                                                  {512, 64, 1, 0, 4},   {512, 64, 1, 1, 4},  {1024, 64, 1, 0, 2},
                                                  {2048, 128, 1, 0, 1}, {2048, 128, 2, 1, 1}})
    b->Args(s);
  b->ArgNames({"T", "D", "nh", "gated", "B"})->Unit(benchmark::kMillisecond);
}

void Recurrent(benchmark::State& s) { delta_rule(s, false); }
void Chunked(benchmark::State& s) { delta_rule(s, true); }
BENCHMARK(Recurrent)->Apply(shapes);
BENCHMARK(Chunked)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
