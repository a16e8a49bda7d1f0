// Models on the GPU against the CPU reference: the delta-rule family's forward (logits, loss) and
// every parameter gradient; a short training run on the GPU (CUDA graphs, device AdamW) tracking
// the CPU run's loss step for step; and parity learned on the GPU (the P1 headline).
#include <cstdlib>
#include <fstream>
#include "../e2e/cli_util.h"
#include "cuda_test_util.h"
#include "models/device_model.h"
#include "train/trainer.h"

using namespace lrnn;
using namespace lrnn::testing;
namespace fs = std::filesystem;

namespace {

// max |a - b| / max |b| over a tensor (what fp32 with different summation orders preserves).
double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    s = std::max(s, double(std::fabs(b[i])));
  }
  return d / (s + 1e-30);
}

void compare_model(const std::string& yaml, double tol) {
  cuda::set_gemm_precision(cuda::GemmPrecision::FP32);
  YAML::Node block = YAML::Load(yaml);
  auto cpu = create_model<float>(block, "test", 7);
  const int B = 6, T = 37, V = cpu->vocab_size();
  std::vector<int32_t> tok(B * T), lab(B * T);
  Rng r{11, 0};
  for (int i = 0; i < B * T; ++i) {
    tok[i] = int32_t(r.u32(2 * i) % uint32_t(V));
    lab[i] = (i % 5 == 3) ? -1 : int32_t(r.u32(2 * i + 1) % uint32_t(V));
  }
  auto dev = to_device(*cpu, block["model_type"].as<std::string>());
  double loss = cpu->forward(tok.data(), lab.data(), B, T);
  std::fill(cpu->grads.begin(), cpu->grads.end(), 0.f);
  cpu->backward();
  auto gtok = to_device(tok), glab = to_device(lab);
  dev->grads.zero();
  dev->forward(gtok.data(), glab.data(), B, T);
  dev->backward();
  cuda::synchronize();
  std::vector<float> logits(size_t(B) * T * V), gloss(1);
  LRNN_CUDA_CHECK(cudaMemcpy(logits.data(), dev->logits(), logits.size() * 4, cudaMemcpyDeviceToHost));
  LRNN_CUDA_CHECK(cudaMemcpy(gloss.data(), dev->loss(), 4, cudaMemcpyDeviceToHost));
  EXPECT_LT(rel_err(logits.data(), cpu->logits(), logits.size()), tol) << yaml;
  EXPECT_NEAR(gloss[0], loss, tol * loss) << yaml;
  auto grads = dev->grads.download();
  for (auto& e : cpu->layout().entries())
    EXPECT_LT(rel_err(grads.data() + e.offset, cpu->grads.data() + e.offset, e.numel), 20 * tol)
        << e.name << " in " << yaml;
  // Inference on its own buffers gives the same logits.
  dev->infer(gtok.data(), B, T);
  cuda::synchronize();
  std::vector<float> inf(logits.size());
  LRNN_CUDA_CHECK(cudaMemcpy(inf.data(), dev->infer_logits(), inf.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_LT(rel_err(inf.data(), cpu->logits(), inf.size()), tol) << yaml;
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

}  // namespace

TEST(ModelCuda, DeltaNetMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: delta_net, vocab_size: 5, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true}", 1e-4);
  compare_model("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, "
                "allow_neg_eigval: false, use_short_conv: false}", 1e-4);
}

TEST(ModelCuda, GatedDeltaProductMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "num_householder: 3, allow_neg_eigval: true, use_forget_gate: true}", 1e-4);
  compare_model("{model_type: gated_deltanet, vocab_size: 7, hidden_size: 64, num_hidden_layers: 1, num_heads: 4, "
                "allow_neg_eigval: true}", 1e-4);
}

// A model type without a CUDA path says so (UserError), it does not crash.
TEST(ModelCuda, ModelWithoutCudaPathIsAUserError) {
  LRNN_REQUIRE_GPU();
  YAML::Node block = YAML::Load("{model_type: lstm, vocab_size: 3, hidden_size: 16, num_layers: 1}");
  auto cpu = create_model<float>(block, "test", 0);
  EXPECT_THROW(to_device(*cpu, "lstm"), UserError);
}

namespace {

std::vector<double> losses_of(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<double> v;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") v.push_back(j["loss"]);
  }
  return v;
}

ExperimentConfig small_run(const std::string& device, int steps) {
  YAML::Node root = YAML::Load(R"(
training: {num_steps: 30, batch_size: 32, lr: 3.0e-3, warmup_steps: 5, weight_decay: 0.1, grad_clip: 1.0,
           checkpoint_every: 0, num_threads: 1}
model: {model_type: delta_net, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, allow_neg_eigval: true}
task: {name: parity, train_len: [3, 40], eval_len: [40, 64], eval_samples: 256}
logging: {log_every: 1, progress: none}
)");
  root["training"]["device"] = device;
  root["training"]["num_steps"] = steps;
  return ExperimentConfig::from_yaml(root, "test_model_cuda");
}

}  // namespace

// 30 steps on the GPU (graphs, device AdamW with clipping, fp32 GEMMs) follow the CPU run's
// losses; the trajectories separate slowly through fp32 rounding, so the tolerance grows with
// the step.
TEST(ModelCuda, TrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  setenv("LRNN_CUDA_TF32", "0", 1);
  TrainOptions o;
  o.quiet = true;
  o.out_dir = test::temp_dir("cuda_traj_cpu");
  train(small_run("cpu", 30), o);
  auto cpu = losses_of(o.out_dir);
  o.out_dir = test::temp_dir("cuda_traj_gpu");
  TrainSummary s = train(small_run("cuda", 30), o);
  auto gpu = losses_of(o.out_dir);
  unsetenv("LRNN_CUDA_TF32");
  ASSERT_EQ(cpu.size(), 30u);
  ASSERT_EQ(gpu.size(), 30u);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 + 1e-4 * double(i)) << "step " << i + 1;
  EXPECT_TRUE(fs::exists(o.out_dir / "model.safetensors"));
  EXPECT_TRUE(s.eval.contains("scaled_accuracy"));
}

// A GPU run killed (SIGKILL, fault injection) and resumed with `lrnn train --resume` continues
// the uninterrupted run: the same losses up to the non-deterministic order of the atomic
// reductions in parameter gradients.
TEST(ModelCuda, ResumeAfterKillContinuesTheRun) {
  LRNN_REQUIRE_GPU();
  auto dir = test::temp_dir("cuda_resume");
  ExperimentConfig cfg = small_run("cuda", 20);
  cfg.training.checkpoint_every = 10;
  test::write_text(dir / "run.yaml", YAML::Dump(cfg.to_yaml()));
  auto full = test::run_lrnn("train --config " + (dir / "run.yaml").string() + " --out " + (dir / "full").string());
  ASSERT_EQ(full.code, 0) << full.out;
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "15", 1);
  auto cut = test::run_lrnn("train --config " + (dir / "run.yaml").string() + " --out " + (dir / "cut").string());
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_NE(cut.code, 0) << "the fault injection did not kill the run";
  auto resumed = test::run_lrnn("train --resume " + (dir / "cut").string());
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  auto a = losses_of(dir / "full"), b = losses_of(dir / "cut");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * (1 + a[i])) << "step " << i + 1;
}

// The P1 parity model (DeltaNet d=128, 2 layers, 4 heads, [-1,1], public protocol lr 1e-3,
// batch 256, lengths 3-40) learns parity on the GPU and extrapolates to 40-256: best of up to
// three seeds, stopping as soon as an evaluation reaches 0.99.
TEST(ModelCuda, LearnsParityOnTheGpu) {
  LRNN_REQUIRE_GPU();
  double best = -1;
  for (int seed = 0; seed < 3 && best < 0.99; ++seed) {
    YAML::Node root = YAML::Load(R"(
training: {num_steps: 20000, batch_size: 256, lr: 1.0e-3, min_lr: 1.0e-6, warmup_steps: 2000, weight_decay: 0.1,
           val_every: 500, stop_at: 0.99, checkpoint_every: 0, device: cuda}
model: {model_type: delta_net, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, allow_neg_eigval: true}
task: {name: parity, train_len: [3, 40], eval_len: [40, 256], eval_samples: 2048}
logging: {log_every: 100, progress: none}
)");
    root["training"]["seed"] = seed;
    TrainOptions o;
    o.quiet = true;
    o.out_dir = test::temp_dir("cuda_parity" + std::to_string(seed));
    TrainSummary s = train(ExperimentConfig::from_yaml(root, "test_model_cuda"), o);
    double sa = s.eval["scaled_accuracy"];
    std::printf("seed %d: scaled accuracy %.4f on 40-256 after %lld steps, %.1f s\n", seed, sa, (long long)s.steps,
                s.seconds);
    best = std::max(best, sa);
  }
  EXPECT_GE(best, 0.99);
}
