// GPU training-step benchmark (CUDA builds): one optimizer step (forward, backward, norm, clip,
// AdamW) of the papers' models at their P1 sizes, T = 40, batch 256 and 1024, timed over many
// steps of the real CUDA engine (the code `lrnn train --device cuda` runs):
//   graph     steps replayed as CUDA graphs, the batch fixed (device time per step)
//   eager     the same with kernels launched one by one (LRNN_CUDA_GRAPHS=0): launch overhead
//   +data     graphs, and the host generating a fresh batch every step (what training does)
// Prints a Markdown table. Usage:
//   bench_cuda [steps=300]                       every model, batch 256 and 1024
//   bench_cuda [steps] --only I                  model I only
//   bench_cuda [steps] --profile [I=0]           per-op device time of model I
//   bench_cuda [steps] --profile-config FILE     the same for an experiment config (its model,
//                                                task, batch and precision; e.g. the S5 recipe)
//   bench_cuda [steps] --gemm                    the P1 DeltaNet's GEMMs alone at 40,960 tokens
// LRNN_BENCH_PRECISION=bf16|tf32|fp32 sets training.precision (default: the config default, bf16).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "cuda/runtime.h"
#include "ops/linear/linear_cuda.h"
#include "train/engine.h"
#include "train/schedule.h"

using namespace lrnn;
using Clock = std::chrono::steady_clock;

namespace {

ExperimentConfig config(const std::string& model_yaml, int B, int steps) {
  YAML::Node root = YAML::Load(R"(
training: {lr: 1.0e-3, warmup_steps: 100, weight_decay: 0.1, grad_clip: 1.0, device: cuda}
task: {name: parity, train_len: [40, 40], eval_len: [40, 40]}
)");
  root["model"] = YAML::Load(model_yaml);
  root["training"]["batch_size"] = B;
  root["training"]["num_steps"] = steps + 100;
  if (const char* p = std::getenv("LRNN_BENCH_PRECISION")) root["training"]["precision"] = p;
  return ExperimentConfig::from_yaml(root, "bench_cuda");
}

// Seconds per step over `steps` steps after a warm-up (first step captures the graph).
double time_steps(const ExperimentConfig& cfg, int steps, bool graphs, bool fresh_data) {
  setenv("LRNN_CUDA_GRAPHS", graphs ? "1" : "0", 1);
  auto engine = make_engine(cfg);
  TrainState st;
  st.m.assign(engine->host_model().params.size(), 0.f);
  st.v = st.m;
  engine->start(st);
  auto task = create_task(cfg.task);
  const auto& tc = cfg.training;
  Batch fixed = task->train_batch(0, 0, tc.batch_size, cfg.task.train_len);
  auto lr = [&](int s) { return lr_at(s, tc.num_steps, tc.warmup_steps, tc.lr, tc.min_lr); };  // the schedule's
  for (int s = 0; s < 20; ++s) engine->step(fixed, s, lr(s));
  engine->stats();  // synchronises
  auto t0 = Clock::now();
  for (int s = 20; s < 20 + steps; ++s) {
    if (fresh_data) {
      Batch b = task->train_batch(0, s, tc.batch_size, cfg.task.train_len);
      engine->step(b, s, lr(s));
    } else {
      engine->step(fixed, s, lr(s));
    }
  }
  EngineStats e = engine->stats();
  double dt = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  if (!std::isfinite(e.loss)) std::fprintf(stderr, "warning: non-finite loss %g\n", e.loss);
  unsetenv("LRNN_CUDA_GRAPHS");
  return dt;
}

// Device milliseconds of f() per call, over n calls after a warm-up.
template <class F>
double device_ms(F&& f, int n) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t e0, e1;
  LRNN_CUDA_CHECK(cudaEventCreate(&e0));
  LRNN_CUDA_CHECK(cudaEventCreate(&e1));
  LRNN_CUDA_CHECK(cudaEventRecord(e0, cuda::stream()));
  for (int i = 0; i < n; ++i) f();
  LRNN_CUDA_CHECK(cudaEventRecord(e1, cuda::stream()));
  cuda::synchronize();
  float ms = 0;
  LRNN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / n;
}

// The P1 DeltaNet layer's four linear layers at N = 40,960 tokens (batch 1024, T 40): forward,
// input gradient (overwrite and accumulate) and weight gradient, each alone, with the bytes it
// must move at least (fp32) and the bandwidth that implies.
void bench_gemms(int n) {
  const int N = 1024 * 40;
  struct S {
    const char* name;
    int IC, OC;
  } shapes[] = {{"q|k|v|b proj", 128, 388}, {"o_proj", 128, 128}, {"gate|up", 128, 1024}, {"down", 512, 128}};
  std::printf("\nGEMMs of the P1 DeltaNet at N = %d tokens, TF32 (us per call; GB/s = minimum bytes / time)\n\n", N);
  std::printf("| layer | IC x OC | forward | dX (beta 0) | dX (beta 1) | dW |\n|---|---|---|---|---|---|\n");
  for (const S& s : shapes) {
    cuda::Buffer<float> x(size_t(N) * s.IC), y(size_t(N) * s.OC), W(size_t(s.OC) * s.IC), dW(W.size()),
        dx(x.size());
    x.zero(), y.zero(), W.zero(), dW.zero(), dx.zero();
    const double fx = 4.0 * N * s.IC, fy = 4.0 * N * s.OC;
    const double tf = device_ms([&] { ops::cuda::linear_forward(y.data(), x.data(), W.data(), nullptr, N, s.IC, s.OC); }, n);
    const double t0 = device_ms([&] {
      ops::cuda::gemm(false, false, N, s.IC, s.OC, 1.f, y.data(), s.OC, W.data(), s.IC, 0.f, dx.data(), s.IC);
    }, n);
    const double t1 = device_ms([&] {
      ops::cuda::linear_backward(dx.data(), nullptr, nullptr, y.data(), x.data(), W.data(), N, s.IC, s.OC);
    }, n);
    const double tw = device_ms([&] {
      ops::cuda::linear_backward(nullptr, dW.data(), nullptr, y.data(), x.data(), W.data(), N, s.IC, s.OC);
    }, n);
    auto cell = [](double ms, double bytes) {
      char b[64];
      std::snprintf(b, sizeof b, "%.1f (%.0f GB/s)", ms * 1e3, bytes / (ms * 1e-3) / 1e9);
      return std::string(b);
    };
    std::printf("| %s | %d x %d | %s | %s | %s | %s |\n", s.name, s.IC, s.OC, cell(tf, fx + fy).c_str(),
                cell(t0, fx + fy).c_str(), cell(t1, 2 * fx + fy).c_str(), cell(tw, fx + fy).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const std::string mode = argc > 2 ? argv[2] : "";
  const bool profile = mode == "--profile";
  const int picked = argc > 3 ? std::atoi(argv[3]) : 0;  // --profile / --only: index into models[]
  if (!cuda::available()) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  struct M {
    const char* name;
    const char* yaml;
  } models[] = {
      {"DeltaNet [-1,1] (P1 parity: d128 L2 H4)",
       "{model_type: delta_net, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, allow_neg_eigval: true}"},
      {"DeltaNet [-1,1] (P1 mod arith: d128 L3 H4)",
       "{model_type: delta_net, hidden_size: 128, num_hidden_layers: 3, num_heads: 4, allow_neg_eigval: true}"},
      {"Gated DeltaProduct n_h=2 [-1,1] (d128 L2 H4)",
       "{model_type: gated_deltaproduct, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, num_householder: 2, "
       "allow_neg_eigval: true, use_forget_gate: true}"},
      {"Gated DeltaNet [-1,1] (d128 L2 H4)",
       "{model_type: gated_deltanet, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, allow_neg_eigval: true}"},
      {"Mamba [-1,1] (P1: d128 L2 N16)",
       "{model_type: mamba, hidden_size: 128, num_hidden_layers: 2, state_size: 16, allow_neg_eigval: true}"},
      {"sLSTM (P1: d128, 2 blocks, 4 heads)",
       "{model_type: slstm, embedding_dim: 128, num_blocks: 2, num_heads: 4, conv1d_kernel_size: 4, context_length: 256}"},
      {"mLSTM (P1: d128, 2 blocks, 4 heads)",
       "{model_type: mlstm, embedding_dim: 128, num_blocks: 2, num_heads: 4, conv1d_kernel_size: 4, context_length: 256}"},
      {"LSTM (P1: hidden 128, 2 layers)", "{model_type: lstm, hidden_size: 128, num_layers: 2, embedding_dim: 128}"},
      {"Transformer (P1: d128 L2 H4, MLP 512)",
       "{model_type: llama, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 512}"},
  };
  if ((profile || mode == "--only") && (picked < 0 || picked >= int(std::size(models)))) {
    std::fprintf(stderr, "bench_cuda: model index %d out of range 0..%d\n", picked, int(std::size(models)) - 1);
    return 2;
  }
  if (mode == "--gemm") {
    bench_gemms(steps);
    return 0;
  }
  // Where one step's device time goes, per op (eager, synchronised per op); then the step itself
  // as training runs it (graphs, fresh data).
  auto profile_one = [&](const ExperimentConfig& cfg, const std::string& what) {
    cuda::set_profiling(true);
    time_steps(cfg, 5, false, false);  // warm-up and graph-free setup
    cuda::reset_profile();
    time_steps(cfg, steps, false, false);
    cuda::set_profiling(false);
    std::printf("\nper-op device time, %s (ms per step, synchronised per op)\n\n", what.c_str());
    std::printf("| op | ms/step | calls/step |\n|---|---|---|\n");
    double total = 0;
    auto prof = cuda::profile();
    for (auto& t : prof) total += t.ms;
    const int n = steps + 20;
    for (auto& t : prof) std::printf("| %s | %.3f | %.0f |\n", t.name.c_str(), t.ms / n, double(t.calls) / n);
    std::printf("| total | %.3f | |\n", total / n);
    std::printf("\nthe step with graphs and fresh data: %.3f ms\n", time_steps(cfg, steps, true, true) * 1e3);
    std::fflush(stdout);
  };
  if (mode == "--profile-config") {
    if (argc < 4) {
      std::fprintf(stderr, "usage: bench_cuda [steps] --profile-config FILE\n");
      return 2;
    }
    try {
      ExperimentConfig cfg = ExperimentConfig::load(argv[3], {});
      cfg.training.num_steps = steps + 100;
      cfg.training.device = "cuda";
      profile_one(cfg, std::string(argv[3]) + ", batch " + std::to_string(cfg.training.batch_size));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_cuda: %s\n", e.what());
      return 2;
    }
    return 0;
  }
  if (profile) {
    for (int B : {256, 1024})
      profile_one(config(models[picked].yaml, B, steps), std::string(models[picked].name) + ", batch " +
                                                              std::to_string(B) + ", T 40");
    return 0;
  }
  const char* prec = std::getenv("LRNN_BENCH_PRECISION");
  std::printf("device: %s, T = 40, %d timed steps each, precision %s\n\n", cuda::device_name().c_str(), steps,
              prec ? prec : "bf16 (default)");
  std::printf("| model | batch | graph ms/step | eager ms/step | graph+data ms/step | tokens/s (graph+data) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int i = 0; i < int(std::size(models)); ++i) {
    const M& m = models[i];
    if (mode == "--only" && i != picked) continue;
    for (int B : {256, 1024}) {
      ExperimentConfig cfg = config(m.yaml, B, steps);
      double g = time_steps(cfg, steps, true, false);
      double e = time_steps(cfg, steps, false, false);
      double d = time_steps(cfg, steps, true, true);
      std::printf("| %s | %d | %.3f | %.3f | %.3f | %.2fM |\n", m.name, B, g * 1e3, e * 1e3, d * 1e3,
                  B * 40.0 / d / 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}
