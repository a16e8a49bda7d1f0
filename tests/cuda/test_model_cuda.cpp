// Models on the GPU against the CPU reference: the delta-rule family's forward (logits, loss) and
// every parameter gradient; a short training run on the GPU (CUDA graphs, device AdamW) tracking
// the CPU run's loss step for step; and parity learned on the GPU (the P1 headline).
#include <cstdlib>
#include <fstream>
#include "../e2e/cli_util.h"
#include "cuda_test_util.h"
#include "model_checks.h"
#include "core/rng.h"
#include "infer/decoder.h"
#include "models/core_frame.h"
#include "models/device_model.h"
#include "ops/delta_rule/delta_rule_cuda.h"
#include "ops/embedding/embedding_cuda.h"
#include "train/schedule.h"
#include "train/trainer.h"

using namespace lrnn;
using namespace lrnn::testing;
namespace fs = std::filesystem;


TEST(ModelCuda, DeltaNetMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: delta_net, vocab_size: 5, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true}", 1e-4);
  compare_model("{model_type: delta_net, vocab_size: 3, hidden_size: 128, num_hidden_layers: 2, num_heads: 4, "
                "allow_neg_eigval: false, use_short_conv: false}", 1e-4);
  // Tied embeddings: the head's weight gradient (side stream) and the embedding's add into one tensor.
  compare_model("{model_type: delta_net, vocab_size: 300, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true, tie_word_embeddings: true}", 1e-4);
}

TEST(ModelCuda, GatedDeltaProductMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "num_householder: 3, allow_neg_eigval: true, use_forget_gate: true}", 1e-4);
  compare_model("{model_type: gated_deltanet, vocab_size: 7, hidden_size: 64, num_hidden_layers: 1, num_heads: 4, "
                "allow_neg_eigval: true}", 1e-4);
}

// A long sequence at head dim 128 takes the chunked delta rule on the GPU
// (delta_rule_chunked_cuda_pays), and so does, forced, a Gated DeltaProduct (head dim 64, forget
// gate, two sub-steps): the whole model, forward and backward, against the CPU. fp32 products
// (three TF32 products each in the chunked kernels); 1e-3: 300 tokens of recurrence, while a wrong
// term is an O(1) error.
// Head dim 256 (the tiled recurrent kernels): a Gated DeltaNet, whole model against the CPU.
TEST(ModelCuda, HeadDim256MatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: gated_deltanet, vocab_size: 7, hidden_size: 256, num_hidden_layers: 1, num_heads: 2, "
                "head_dim: 256, allow_neg_eigval: true}", 1e-4, 3, 50);
}

TEST(ModelCuda, LongSequencesTakeTheChunkedDeltaRule) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: delta_net, vocab_size: 11, hidden_size: 256, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true}", 1e-3, 2, 300);
  ops::cuda::set_delta_rule_kernel(ops::cuda::DeltaKernel::Chunked);
  compare_model("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 128, num_hidden_layers: 1, num_heads: 2, "
                "num_householder: 2, allow_neg_eigval: true, use_forget_gate: true}", 1e-3, 2, 300);
  ops::cuda::set_delta_rule_kernel(ops::cuda::DeltaKernel::Auto);
}

// The language-model head in chunks of rows on the GPU (dense labels, 5 rows of logits at a time:
// 111 rows in 23 chunks, the last of one row), and whole, against the CPU's whole head: the loss, then every
// gradient. Vocabularies of 300 (the cross-entropy's warp-per-row layout) and 2500 (block per
// row). With fp32 GEMMs, the bounds of compare_model; under BF16 (bf16 head GEMMs and dlogits, the
// chunked path of a language model's training step) the bounds of the bf16 model test below
// (DeltaNetMatchesCpuWithBf16Gemms, whose worst DeltaNet gradient was 2.5e-2) and 1e-2 of the
// loss; a wiring error (a chunk's rows or scale wrong, a gradient missing) is of order 1.
TEST(ModelCuda, LmHeadChunkedAndWholeMatchesCpu) {
  LRNN_REQUIRE_GPU();
  for (const auto prec : {cuda::GemmPrecision::FP32, cuda::GemmPrecision::BF16})
  for (const int vocab : {300, 2500})
  for (const bool chunked : {true, false}) {
    // Unchunked, the bf16 head at V 2500 forms the loss and dlogits in one pass in the forward,
    // at the loss weight set before it (0.5 here: the gradients are half the CPU's).
    const bool bf16 = prec == cuda::GemmPrecision::BF16;
    const double w = chunked ? 1.0 : 0.5;
    SCOPED_TRACE("vocabulary " + std::to_string(vocab) + (bf16 ? ", bf16" : ", fp32") +
                 (chunked ? ", chunked" : ", whole, loss weight 0.5"));
    cuda::set_gemm_precision(prec);
    const std::string yaml = "{model_type: delta_net, vocab_size: " + std::to_string(vocab) +
                             ", hidden_size: 64, num_hidden_layers: 2, "
                             "num_heads: 2, allow_neg_eigval: true, tie_word_embeddings: true}";
    auto cpu = create_model<float>(YAML::Load(yaml), "test", 7);
    const int B = 3, T = 37, V = cpu->vocab_size();
    std::vector<int32_t> tok(size_t(B) * T), lab(size_t(B) * T);
    Rng r{12, 0};
    for (int i = 0; i < B * T; ++i) {
      tok[i] = int32_t(r.u32(2 * i) % uint32_t(V));
      lab[i] = int32_t(r.u32(2 * i + 1) % uint32_t(V));
    }
    const double loss = cpu->forward(tok.data(), lab.data(), B, T);
    std::fill(cpu->grads.begin(), cpu->grads.end(), 0.f);
    cpu->backward();
    std::vector<float> want(cpu->grads.begin(), cpu->grads.end());
    for (auto& g : want) g = float(g * w);
    const size_t prev = lm_head_chunk_elements(true);
    if (chunked) lm_head_chunk_elements(true) = size_t(5) * V;
    auto dev = to_device(*cpu, "delta_net");
    dev->set_dense_labels(true);
    dev->set_loss_weight(w);
    auto gtok = to_device(tok), glab = to_device(lab);
    dev->grads.zero();
    dev->forward(gtok.data(), glab.data(), B, T);
    dev->backward();
    cuda::synchronize();
    lm_head_chunk_elements(true) = prev;
    std::vector<float> gloss(1);
    LRNN_CUDA_CHECK(cudaMemcpy(gloss.data(), dev->loss(), 4, cudaMemcpyDeviceToHost));
    EXPECT_NEAR(gloss[0], loss, (bf16 ? 1e-2 : 1e-4) * loss);
    auto grads = dev->grads.download();
    double worst = 0;
    for (auto& e : cpu->layout().entries()) {
      const double err = rel_err(grads.data() + e.offset, want.data() + e.offset, e.numel);
      worst = std::max(worst, err);
      EXPECT_LT(err, bf16 ? 0.2 : 2e-3) << e.name;
    }
    std::printf("%s head, V %d, %s: loss %.3e relative, worst gradient %.2e\n", chunked ? "chunked" : "whole", vocab,
                bf16 ? "bf16" : "fp32", std::fabs(gloss[0] - loss) / loss, worst);
    cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
  }
}

// A language model's step on the GPU gives the same gradient bits twice: at a vocabulary of 5000
// the embedding backward sorts the tokens (a third of them one token, whose rows span several of
// its blocks), the delta rule takes the chunked kernels (head dim 128, T 256), the head and
// projections are bf16 GEMMs. (At V 32000 and 24 layers, two runs of `lrnn train` on an H200 parted
// at step 3 while the embedding backward used atomics, and gave the same 25 losses after.)
TEST(ModelCuda, LanguageModelGradientsRepeatBitForBit) {
  LRNN_REQUIRE_GPU();
  cuda::set_gemm_precision(cuda::GemmPrecision::BF16);
  auto cpu = create_model<float>(YAML::Load("{model_type: delta_net, vocab_size: 5000, hidden_size: 256, "
                                            "num_hidden_layers: 2, num_heads: 2, allow_neg_eigval: true}"),
                                 "test", 5);
  const int B = 4, T = 256, C = 256, V = cpu->vocab_size();
  std::vector<int32_t> tok(size_t(B) * T), lab(size_t(B) * T);
  Rng r{21, 0};
  for (int i = 0; i < B * T; ++i) {
    tok[i] = i % 3 == 0 ? 3 : int32_t(r.u32(2 * i) % uint32_t(V));
    lab[i] = int32_t(r.u32(2 * i + 1) % uint32_t(V));
  }
  auto dev = to_device(*cpu, "delta_net");
  dev->set_dense_labels(true);
  auto gtok = to_device(tok), glab = to_device(lab);
  std::vector<float> grads[2];
  for (auto& g : grads) {
    dev->grads.zero();
    dev->forward(gtok.data(), glab.data(), B, T);
    dev->backward();
    cuda::synchronize();
    g = dev->grads.download();
  }
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
  ASSERT_TRUE(ops::cuda::embedding_backward_deterministic(B * T, C, V));
  size_t differ = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) differ += grads[0][i] != grads[1][i];
  EXPECT_EQ(differ, 0u) << "of " << grads[0].size() << " gradient elements";
  for (auto& e : cpu->layout().entries()) {  // the frequent token's embedding row got its gradient
    if (e.name == "model.embeddings.weight") {
      EXPECT_GT(std::fabs(grads[0][e.offset + 3 * C]), 0.f);
    }
  }
}

// Mixed precision (training.precision: bf16, the default on the GPU): every projection (q|k|v|b|a|g,
// o_proj, the MLP, the LM head) a bf16 GEMM, its inputs rounded to bf16 (2^-9 relative). Measured
// on an H200 (2026-11-29): logits within 1.4e-2 of the CPU's fp32 (relative to the largest),
// gradients within 3e-2 (the DeltaNet's worst 2.5e-2), except the forget gate's A_log, dt_bias
// and a_proj (7.6e-2, 7.4e-2, 3.4e-2: A_log and dt_bias have one entry per head, sums over all 222 tokens whose terms cancel,
// so their error relative to the largest entry is the largest). With the MLPs alone in bf16 it was
// 2.5e-3 and 9e-3. Bounds 4e-2 and 0.2: 2.6x the worst; a wiring error (a wrong or missing term, a
// factor) is of order 1.
TEST(ModelCuda, DeltaNetMatchesCpuWithBf16Gemms) {
  LRNN_REQUIRE_GPU();
  const auto bf16 = cuda::GemmPrecision::BF16;
  compare_model("{model_type: delta_net, vocab_size: 5, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true}", 4e-2, 6, 37, bf16, 0.2);
  compare_model("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                "num_householder: 2, allow_neg_eigval: true, use_forget_gate: true, use_output_gate: true}", 4e-2, 6,
                37, bf16, 0.2);
}

// The same at a long sequence and head dim 128, where the delta rule takes the chunked form and,
// under BF16, its products take bf16 inputs too (the op's error: 0.9-2.0x that of bf16 inputs,
// DeltaRuleCudaChunked.Bf16ErrorAgainstFp64). Measured (H200, bf16 projections): logits 1.24e-2,
// gradients 2.9e-2. Bounds 4e-2 and 0.1 (3.2x and 3.4x); a wiring error is of order 1.
TEST(ModelCuda, LongSequencesWithBf16MatchCpu) {
  LRNN_REQUIRE_GPU();
  const auto bf16 = cuda::GemmPrecision::BF16;
  compare_model("{model_type: delta_net, vocab_size: 11, hidden_size: 256, num_hidden_layers: 2, num_heads: 2, "
                "allow_neg_eigval: true}", 4e-2, 2, 300, bf16, 0.1);
  compare_model("{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 256, num_hidden_layers: 1, num_heads: 2, "
                "num_householder: 2, allow_neg_eigval: true, use_forget_gate: true}", 4e-2, 2, 300, bf16, 0.1);
}

// A model class without a CUDA path (every registered model has one now: a stand-in here) is a
// UserError that names the model type, not a crash.
namespace {
class NoCudaModel final : public Model<float> {
 public:
  double forward(const int32_t*, const int32_t*, int, int) override { return 0; }
  void backward() override {}
  const float* logits() const override { return nullptr; }
  int vocab_size() const override { return 3; }
  nlohmann::json hf_config() const override { return {}; }
  YAML::Node resolved_config() const override { return {}; }
};
}  // namespace

TEST(ModelCuda, ModelWithoutCudaPathIsAUserError) {
  LRNN_REQUIRE_GPU();
  NoCudaModel m;
  try {
    to_device(m, "no_cuda_model");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no_cuda_model"), std::string::npos) << e.what();
  }
}

namespace {

ExperimentConfig small_run(const std::string& device, int steps) {
  return short_run("{model_type: delta_net, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, allow_neg_eigval: true}",
                   device, steps);
}

}  // namespace

// 30 DeltaNet [-1,1] steps on the GPU follow the CPU run's losses.
TEST(ModelCuda, TrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: delta_net, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                        "allow_neg_eigval: true}",
                        "deltanet");
}

// Gradient accumulation (4 micro-batches of 8): each micro-batch's backward adds 1/4 of its
// gradient on the device inside the captured step; the CPU adds the micro-batch gradients / 4.
TEST(ModelCuda, GradientAccumulationTracksCpu) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: delta_net, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
                        "allow_neg_eigval: true, tie_word_embeddings: true}",
                        "deltanet_accum", 4);
}

// A GPU run killed (SIGKILL, fault injection) and resumed with `lrnn train --resume` continues
// the uninterrupted run exactly. DeltaNet's GPU step is bitwise reproducible (every sum in it has
// a fixed order, the embedding backward's included: three 20-step runs on the H200 gave the same
// losses to the last bit in bf16 and in TF32), so the resumed run must log the same losses as
// the uninterrupted one, in the default precision (bf16 projections).
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
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i]) << "step " << i + 1;
}

// training.curriculum_lr_factor on the GPU: the captured step reads its learning rate from the
// schedule's table on the device, so the engine must write the trainer's scaled rate there. The
// logged rate is the one the device's optimizer used (its step statistics). S3 words of length 8
// (9 targets), a pool of 64 in batches of 16 (an epoch: 4 steps), a threshold every epoch meets:
// the curriculum is complete after step 28, and from step 29 on the rate is the schedule's x 0.1.
// (Before the engine did this, the GPU ignored the factor: an S5 run logged the schedule's rate.)
TEST(ModelCuda, CurriculumLearningRateFactorReachesTheDevice) {
  LRNN_REQUIRE_GPU();
  auto dir = test::temp_dir("cuda_curriculum_lr");
  test::write_text(dir / "run.yaml", R"(training:
  num_steps: 40
  batch_size: 16
  lr: 3.0e-3
  min_lr: 0
  warmup_steps: 0
  seed: 5
  curriculum: 2
  curriculum_loss: 1.0e+6
  curriculum_lr_factor: 0.1
  device: cuda
model: {model_type: gated_deltaproduct, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, head_dim: 8,
        num_householder: 2, allow_neg_eigval: true, use_short_conv: false}
task: {name: word_problem, group: S3, bos: true, train_len: [8, 8], eval_len: [8, 10], eval_samples: 16,
       train_pool: 64}
logging: {log_every: 1, progress: none}
)");
  auto r = test::run_lrnn("train --config " + (dir / "run.yaml").string() + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = test::lines_of(dir / "run", "train");
  ASSERT_EQ(lines.size(), 40u);
  for (const auto& l : lines) {
    const int step = int(l["step"]);  // (the step just taken is step - 1)
    const double want = lr_at(step - 1, 40, 0, 3e-3, 0) * (step > 28 ? 0.1 : 1.0);
    EXPECT_NEAR(double(l["lr"]), want, 1e-6 * want + 1e-12) << "step " << step;
  }
}

// Two GPU runs of one seed of an S5 word-problem model (the P2 recipe's shape, smaller) log the
// same losses to the last bit: its 122 tokens take the embedding backward's deterministic path,
// and every other sum of the Gated DeltaProduct step has a fixed order. (While vocabularies above
// 16 took atomics, two runs of this config parted at step 4 on an H200, and two runs of the S5
// recipe's seed 0 were 5e-5 apart at step 50.)
TEST(ModelCuda, WordProblemRunsRepeatBitForBit) {
  LRNN_REQUIRE_GPU();
  const YAML::Node root = YAML::Load(R"(
training: {num_steps: 25, batch_size: 256, lr: 1.0e-3, min_lr: 1.0e-3, warmup_steps: 0, seed: 3, checkpoint_every: 0,
           device: cuda}
model: {model_type: gated_deltaproduct, hidden_size: 64, num_hidden_layers: 1, num_heads: 4, head_dim: 16,
        num_householder: 4, allow_neg_eigval: true, use_short_conv: false, use_forget_gate: false,
        use_output_gate: false}
task: {name: word_problem, group: S5, bos: true, train_len: [32, 32], eval_len: [32, 40], eval_samples: 64}
logging: {log_every: 1, progress: none}
)");
  std::vector<double> runs[2];
  for (int i = 0; i < 2; ++i) {
    TrainOptions o;
    o.quiet = true;
    o.out_dir = test::temp_dir("cuda_s5_repeat" + std::to_string(i));
    train(ExperimentConfig::from_yaml(root, "test_model_cuda"), o);
    runs[i] = losses_of(o.out_dir);
  }
  ASSERT_EQ(runs[0].size(), 25u);
  ASSERT_EQ(runs[1].size(), 25u);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[1][i], runs[0][i]) << "step " << i + 1;
}

// The P1 parity model (DeltaNet d=128, 2 layers, 4 heads, [-1,1]; public-protocol batch 256,
// lengths 3-40, AdamW wd 0.1) learns parity on the GPU and extrapolates to 40-256: best of up to
// three seeds, stopping as soon as an evaluation reaches 0.99. lr 1e-2 with a 10k-step schedule:
// the fastest of {1e-3, 3e-3, 1e-2} on an H200 (configs/grids/gpu_parity_p1.yaml; docs/RESULTS.md,
// "Wall time to learn parity": 3/3 seeds reached 0.99 in 2500-4750 steps, 3.7-6.6 s each).
TEST(ModelCuda, LearnsParityOnTheGpu) {
  LRNN_REQUIRE_GPU();
  double best = -1;
  for (int seed = 0; seed < 3 && best < 0.99; ++seed) {
    YAML::Node root = YAML::Load(R"(
training: {num_steps: 10000, batch_size: 256, lr: 1.0e-2, min_lr: 1.0e-6, warmup_steps: 1000, weight_decay: 0.1,
           val_every: 250, stop_at: 0.99, checkpoint_every: 0, device: cuda}
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
    fs::remove_all(o.out_dir);
  }
  EXPECT_GE(best, 0.99);
}

// Piecewise reading on the GPU (generate, serve --device cuda): the device reader fed pieces of
// 7, 1, 3 and 5 tokens, then single tokens (from the third on, replays of one CUDA graph), gives
// the logits of the CPU's one forward over the whole sequence, and a graph's replay the same bits
// as running its ops one by one. The delta-rule family (short conv, lane, tiled and, at head dim
// 128 with a 300-token prompt, chunked delta-rule kernels) and Mamba; fp32 GEMMs, the bound of
// compare_model.
TEST(ModelCuda, PiecewiseReadingMatchesCpu) {
  LRNN_REQUIRE_GPU();
  struct Case {
    const char* yaml;
    int T, first;  // tokens, and the first piece's length (the rest: 1, 3, 5, then single tokens)
  };
  const Case cases[] = {
      {"{model_type: delta_net, vocab_size: 50, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
       "allow_neg_eigval: true}", 40, 7},
      {"{model_type: delta_net, vocab_size: 50, hidden_size: 64, num_hidden_layers: 2, num_heads: 4, "
       "allow_neg_eigval: false}", 30, 7},
      {"{model_type: gated_deltaproduct, vocab_size: 30, hidden_size: 64, num_hidden_layers: 2, num_heads: 2, "
       "num_householder: 2, allow_neg_eigval: true, use_forget_gate: true}", 30, 7},
      {"{model_type: delta_net, vocab_size: 40, hidden_size: 256, num_hidden_layers: 2, num_heads: 2, "
       "allow_neg_eigval: true}", 320, 300},
      {"{model_type: mamba, vocab_size: 20, hidden_size: 64, state_size: 16, num_hidden_layers: 2, "
       "allow_neg_eigval: true}", 30, 7},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    cuda::set_gemm_precision(cuda::GemmPrecision::FP32);
    const YAML::Node block = YAML::Load(c.yaml);
    auto host = create_model<float>(block, "test", 7);
    const int V = host->vocab_size(), T = c.T;
    std::vector<int32_t> tok(static_cast<size_t>(T));
    Rng r{13, 0};
    for (int i = 0; i < T; ++i) tok[size_t(i)] = int32_t(r.u32(uint64_t(i)) % uint32_t(V));
    host->forward(tok.data(), nullptr, 1, T);
    const std::vector<float> whole(host->logits(), host->logits() + size_t(T) * V);
    std::vector<int> pieces{c.first, 1, 3, 5};
    for (int at = c.first + 9; at < T; ++at) pieces.push_back(1);
    std::vector<float> graphs, eager;
    for (const bool use_graphs : {true, false}) {
      if (!use_graphs) setenv("LRNN_CUDA_GRAPHS", "0", 1);
      auto reader = device_reader(*host, block["model_type"].as<std::string>());
      unsetenv("LRNN_CUDA_GRAPHS");
      EXPECT_EQ(reader->describe().find("CUDA graphs") != std::string::npos, use_graphs) << reader->describe();
      auto st = reader->new_state(1);
      ASSERT_TRUE(st);
      std::vector<float>& got = use_graphs ? graphs : eager;
      int at = 0;
      for (int n : pieces) {
        const float* lg = reader->read(tok.data() + at, 1, n, *st);
        got.insert(got.end(), lg, lg + size_t(n) * V);
        at += n;
      }
      ASSERT_EQ(at, T);
      EXPECT_EQ(st->position, T);
      EXPECT_LT(rel_err(got.data(), whole.data(), whole.size()), 1e-4);
    }
    EXPECT_EQ(graphs, eager) << "a graph's replay differs from its ops run one by one";
  }
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

// The Transformer's KV cache lives on the CPU only: the device reader says so by name.
TEST(ModelCuda, PiecewiseReadingWithoutDeviceStateIsAUserError) {
  LRNN_REQUIRE_GPU();
  auto host = create_model<float>(
      YAML::Load("{model_type: llama, vocab_size: 5, hidden_size: 32, num_attention_heads: 4, num_hidden_layers: 2}"),
      "test", 7);
  auto reader = device_reader(*host, "llama");
  EXPECT_FALSE(reader->new_state(1));
  try {
    Decoder d(*reader);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}
