// Model-level checks shared by the CUDA tests: a device model against the CPU model, and a short
// GPU training run against the CPU run's loss trajectory.
#pragma once
#include <fstream>
#include "../e2e/cli_util.h"
#include "cuda_test_util.h"
#include "models/device_model.h"
#include "train/trainer.h"

namespace lrnn::testing {

// max |a - b| / max |b| over a tensor (what fp32 with different summation orders preserves).
inline double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    s = std::max(s, double(std::fabs(b[i])));
  }
  return d / (s + 1e-30);
}

// The DeviceModel against the CPU float model on random tokens (some labels ignored), with fp32
// GEMMs (or `prec`): logits, loss, every parameter gradient (also accumulated over a second step),
// and the inference path's logits. `tol` bounds max |gpu - cpu| / max |cpu| per tensor, and
// `grad_tol` (default 20 tol) that of the gradients.
inline void compare_model(const std::string& yaml, double tol, int B = 6, int T = 37,
                          cuda::GemmPrecision prec = cuda::GemmPrecision::FP32, double grad_tol = 0) {
  if (grad_tol <= 0) grad_tol = 20 * tol;
  cuda::set_gemm_precision(prec);
  YAML::Node block = YAML::Load(yaml);
  auto cpu = create_model<float>(block, "test", 7);
  const int V = cpu->vocab_size();
  std::vector<int32_t> tok(size_t(B) * T), lab(size_t(B) * T);
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
  double worst = 0;
  for (auto& e : cpu->layout().entries()) {
    const double r = rel_err(grads.data() + e.offset, cpu->grads.data() + e.offset, e.numel);
    worst = std::max(worst, r);
    EXPECT_LT(r, grad_tol) << e.name << " in " << yaml;
  }
  std::printf("compare_model: logits %.2e, worst gradient %.2e (bounds %.1e, %.1e)\n",
              rel_err(logits.data(), cpu->logits(), logits.size()), worst, tol, grad_tol);
  // A second step on the same buffers accumulates the same gradients again.
  dev->forward(gtok.data(), glab.data(), B, T);
  dev->backward();
  cuda::synchronize();
  auto grads2 = dev->grads.download();
  std::vector<float> twice(cpu->grads.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * cpu->grads[i];
  for (auto& e : cpu->layout().entries())
    EXPECT_LT(rel_err(grads2.data() + e.offset, twice.data() + e.offset, e.numel), grad_tol)
        << e.name << " (second step) in " << yaml;
  // Inference on its own buffers gives the same logits.
  dev->infer(gtok.data(), B, T);
  cuda::synchronize();
  std::vector<float> inf(logits.size());
  LRNN_CUDA_CHECK(cudaMemcpy(inf.data(), dev->infer_logits(), inf.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_LT(rel_err(inf.data(), cpu->logits(), inf.size()), tol) << yaml;
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}


// The "train" losses of a run directory's metrics.jsonl.
inline std::vector<double> losses_of(const std::filesystem::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<double> v;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") v.push_back(j["loss"]);
  }
  return v;
}

// A 30-step parity run (batch 32, clipping, warmup) of the model block `model_yaml` on `device`.
inline ExperimentConfig short_run(const std::string& model_yaml, const std::string& device, int steps = 30,
                                  int accumulation = 1) {
  YAML::Node root = YAML::Load(R"(
training: {batch_size: 32, lr: 3.0e-3, warmup_steps: 5, weight_decay: 0.1, grad_clip: 1.0,
           checkpoint_every: 0, num_threads: 1}
task: {name: parity, train_len: [3, 40], eval_len: [40, 64], eval_samples: 256}
logging: {log_every: 1, progress: none}
)");
  root["model"] = YAML::Load(model_yaml);
  root["training"]["device"] = device;
  root["training"]["num_steps"] = steps;
  root["training"]["gradient_accumulation_steps"] = accumulation;
  return ExperimentConfig::from_yaml(root, "cuda test");
}

// 30 steps on the GPU (graphs, device AdamW with clipping, fp32 GEMMs) follow the CPU run's
// losses; fp32 rounding separates the runs slowly, so the tolerance grows with the step. With
// `accumulation` > 1 both take the step's gradient over that many micro-batches.
inline void expect_gpu_tracks_cpu(const std::string& model_yaml, const std::string& tag, int accumulation = 1) {
  namespace fs = std::filesystem;
  setenv("LRNN_CUDA_TF32", "0", 1);
  TrainOptions o;
  o.quiet = true;
  o.out_dir = test::temp_dir(tag + "_traj_cpu");
  train(short_run(model_yaml, "cpu", 30, accumulation), o);
  auto cpu = losses_of(o.out_dir);
  o.out_dir = test::temp_dir(tag + "_traj_gpu");
  TrainSummary s = train(short_run(model_yaml, "cuda", 30, accumulation), o);
  auto gpu = losses_of(o.out_dir);
  unsetenv("LRNN_CUDA_TF32");
  ASSERT_EQ(cpu.size(), 30u);
  ASSERT_EQ(gpu.size(), 30u);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 + 1e-4 * double(i)) << "step " << i + 1;
  EXPECT_TRUE(fs::exists(o.out_dir / "model.safetensors"));
  EXPECT_TRUE(s.eval.contains("scaled_accuracy"));
}

}  // namespace lrnn::testing
