// xLSTM on the GPU against the CPU reference: the ops (LayerNorm over groups, the block-diagonal
// linear map, the GELU gate, the mLSTM output gate, the sLSTM and mLSTM cells: forward outputs
// and saved states, every gradient accumulated into random initial values; odd sizes, token
// strides, saturated gates, long sequences), then both models (logits, loss, every parameter
// gradient) and a short training run following the CPU run's losses.
//
// Tolerances as in test_mamba_cuda.cpp: |got - want| <= tol * max(1, max|want|) + tol * |want|;
// fp32 on both sides, differing in summation order and exp/erf/tanh implementations (the CPU
// float path uses vectorisable approximations with errors ~1e-7).
#include "../e2e/cli_util.h"
#include "cuda_test_util.h"
#include "model_checks.h"
#include "ops/geglu/geglu.h"
#include "ops/geglu/geglu_cuda.h"
#include "ops/headwise_linear/headwise_linear.h"
#include "ops/headwise_linear/headwise_linear_cuda.h"
#include "ops/layernorm/layernorm.h"
#include "ops/layernorm/layernorm_cuda.h"
#include "ops/mlstm_cell/mlstm_cell.h"
#include "ops/mlstm_cell/mlstm_cell_cuda.h"
#include "ops/skip_gate/skip_gate.h"
#include "ops/skip_gate/skip_gate_cuda.h"
#include "ops/slstm_cell/slstm_cell.h"
#include "ops/slstm_cell/slstm_cell_cuda.h"

using namespace lrnn;
using namespace lrnn::testing;

namespace {

// ---- LayerNorm ----

void check_layernorm(int N, int C, int G, bool weight, uint64_t seed) {
  const std::string what = "layernorm N=" + std::to_string(N) + " C=" + std::to_string(C) + " G=" +
                           std::to_string(G) + (weight ? " w" : " no-w");
  auto x = randn(size_t(N) * C, seed, 2.0), w = randn(C, seed + 1, 0.3), dy = randn(size_t(N) * C, seed + 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] += 0.5f;  // a nonzero mean
  auto dx0 = randn(size_t(N) * C, seed + 3), dw0 = randn(C, seed + 4);
  std::vector<float> y(x.size()), mu(size_t(N) * G), rs(size_t(N) * G), dx = dx0, dw = dw0;
  const float* wp = weight ? w.data() : nullptr;
  ops::layernorm_forward<float>(y.data(), mu.data(), rs.data(), x.data(), wp, N, C, G, 1e-5, 1.0);
  ops::layernorm_backward<float>(dx.data(), weight ? dw.data() : nullptr, dy.data(), x.data(), wp, mu.data(),
                                 rs.data(), N, C, G, 1.0);
  auto gx = to_device(x), gw = to_device(w), gdy = to_device(dy), gdx = to_device(dx0), gdw = to_device(dw0);
  auto gy = to_device(std::vector<float>(y.size())), gmu = to_device(std::vector<float>(mu.size())),
       grs = to_device(std::vector<float>(rs.size()));
  const float* gwp = weight ? gw.data() : nullptr;
  ops::cuda::layernorm_forward(gy.data(), gmu.data(), grs.data(), gx.data(), gwp, N, C, G, 1e-5, 1.0);
  ops::cuda::layernorm_backward(gdx.data(), weight ? gdw.data() : nullptr, gdy.data(), gx.data(), gwp, gmu.data(),
                                grs.data(), N, C, G, 1.0);
  cuda::synchronize();
  near(gy.download(), y, 1e-5, what + " y");
  near(gmu.download(), mu, 1e-5, what + " mean");
  near(grs.download(), rs, 1e-5, what + " rstd");
  near(gdx.download(), dx, 1e-4, what + " dx");
  near(gdw.download(), dw, 1e-4, what + " dw");
}

TEST(XlstmCuda, LayerNormMatchesCpu) {
  LRNN_REQUIRE_GPU();
  check_layernorm(37, 48, 1, true, 1);
  check_layernorm(37, 48, 3, true, 2);
  check_layernorm(37, 48, 4, false, 3);
  check_layernorm(300, 130, 2, true, 4);  // channels beyond one warp, many rows
  check_layernorm(5, 7, 7, true, 5);      // groups of one channel
}

// ---- block-diagonal linear ----

void check_headwise(int N, int H, int I, int O, int padx, int pady, bool bias, uint64_t seed) {
  const std::string what = "headwise N=" + std::to_string(N) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                           " O=" + std::to_string(O) + (bias ? " bias" : "");
  const int ldx = H * I + padx, ldy = H * O + pady;
  auto x = randn(size_t(N) * ldx, seed), W = randn(size_t(H) * O * I, seed + 1, 0.5), b = randn(size_t(H) * O, seed + 2);
  auto y0 = randn(size_t(N) * ldy, seed + 3), dy = randn(size_t(N) * ldy, seed + 4);
  auto dx0 = randn(size_t(N) * ldx, seed + 5), dW0 = randn(W.size(), seed + 6), db0 = randn(b.size(), seed + 7);
  std::vector<float> y = y0, dx = dx0, dW = dW0, db = db0;
  ops::headwise_linear_forward<float>(y.data(), x.data(), W.data(), bias ? b.data() : nullptr, N, H, I, O, ldx, ldy);
  ops::headwise_linear_backward<float>(dx.data(), dW.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                                       W.data(), N, H, I, O, ldx, ldy);
  auto gx = to_device(x), gW = to_device(W), gb = to_device(b), gy = to_device(y0), gdy = to_device(dy);
  auto gdx = to_device(dx0), gdW = to_device(dW0), gdb = to_device(db0);
  ops::cuda::headwise_linear_forward(gy.data(), gx.data(), gW.data(), bias ? gb.data() : nullptr, N, H, I, O, ldx,
                                     ldy);
  ops::cuda::headwise_linear_backward(gdx.data(), gdW.data(), bias ? gdb.data() : nullptr, gdy.data(), gx.data(),
                                      gW.data(), N, H, I, O, ldx, ldy);
  cuda::synchronize();
  near(gy.download(), y, 1e-5, what + " y (padding untouched)");
  near(gdx.download(), dx, 1e-5, what + " dx");
  near(gdW.download(), dW, 1e-4, what + " dW");
  near(gdb.download(), db, 1e-4, what + " dbias");
}

TEST(XlstmCuda, HeadwiseLinearMatchesCpu) {
  LRNN_REQUIRE_GPU();
  cuda::set_gemm_precision(cuda::GemmPrecision::FP32);
  check_headwise(29, 3, 5, 7, 3, 2, true, 1);     // odd blocks, strided rows
  check_headwise(64, 16, 4, 4, 0, 0, true, 2);    // the mLSTM's q/k/v blocks
  check_headwise(61, 2, 16, 16, 5, 64, false, 3); // GEMM path, a slice of a wider buffer
  check_headwise(40, 4, 32, 32, 0, 96, true, 4);
  check_headwise(37, 3, 16, 24, 2, 1, true, 5);   // GEMM path, I != O, odd strides
  check_headwise(5000, 64, 4, 4, 0, 0, true, 6);  // narrow blocks over many rows (two-pass sums)
  check_headwise(3, 64, 4, 4, 1, 2, true, 7);     // fewer rows than chunks
  check_headwise(700, 200, 4, 4, 0, 0, false, 8); // more weights than the two-pass kernel takes
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

// ---- GELU gate, mLSTM output gate ----

TEST(XlstmCuda, GegluMatchesCpu) {
  LRNN_REQUIRE_GPU();
  const int N = 33, I = 19, ld = 2 * I + 3;
  auto gu = randn(size_t(N) * ld, 1, 3.0), dout = randn(size_t(N) * I, 2), dgu0 = randn(gu.size(), 3);
  std::vector<float> out(size_t(N) * I), dgu = dgu0;
  ops::geglu_forward<float>(out.data(), gu.data(), gu.data() + I, N, I, ld);
  ops::geglu_backward<float>(dgu.data(), dgu.data() + I, dout.data(), gu.data(), gu.data() + I, N, I, ld);
  auto ggu = to_device(gu), gdout = to_device(dout), gdgu = to_device(dgu0), gout = to_device(std::vector<float>(out.size()));
  ops::cuda::geglu_forward(gout.data(), ggu.data(), ggu.data() + I, N, I, ld);
  ops::cuda::geglu_backward(gdgu.data(), gdgu.data() + I, gdout.data(), ggu.data(), ggu.data() + I, N, I, ld);
  cuda::synchronize();
  near(gout.download(), out, 1e-5, "geglu out");
  near(gdgu.download(), dgu, 1e-5, "geglu dgate|dup");
}

TEST(XlstmCuda, SkipGateMatchesCpu) {
  LRNN_REQUIRE_GPU();
  const int N = 131, I = 21, ldx = 2 * I, ldz = 2 * I + 1;
  auto h = randn(size_t(N) * I, 1), x = randn(size_t(N) * ldx, 2), skip = randn(I, 3), z = randn(size_t(N) * ldz, 4, 3.0);
  auto dout = randn(size_t(N) * I, 5), dh0 = randn(h.size(), 6), dx0 = randn(x.size(), 7), ds0 = randn(I, 8),
       dz0 = randn(z.size(), 9);
  std::vector<float> out(size_t(N) * I), dh = dh0, dx = dx0, ds = ds0, dz = dz0;
  ops::skip_gate_forward<float>(out.data(), h.data(), x.data(), skip.data(), z.data(), N, I, ldx, ldz);
  ops::skip_gate_backward<float>(dh.data(), dx.data(), ds.data(), dz.data(), dout.data(), h.data(), x.data(),
                                 skip.data(), z.data(), N, I, ldx, ldz);
  auto gh = to_device(h), gx = to_device(x), gs = to_device(skip), gz = to_device(z), gdout = to_device(dout);
  auto gdh = to_device(dh0), gdx = to_device(dx0), gds = to_device(ds0), gdz = to_device(dz0);
  auto gout = to_device(std::vector<float>(out.size()));
  ops::cuda::skip_gate_forward(gout.data(), gh.data(), gx.data(), gs.data(), gz.data(), N, I, ldx, ldz);
  ops::cuda::skip_gate_backward(gdh.data(), gdx.data(), gds.data(), gdz.data(), gdout.data(), gh.data(), gx.data(),
                                gs.data(), gz.data(), N, I, ldx, ldz);
  cuda::synchronize();
  near(gout.download(), out, 1e-5, "skip_gate out");
  near(gdh.download(), dh, 1e-5, "skip_gate dh");
  near(gdx.download(), dx, 1e-5, "skip_gate dx");
  near(gds.download(), ds, 1e-4, "skip_gate dskip");
  near(gdz.download(), dz, 1e-5, "skip_gate dz");
}

// ---- sLSTM cell ----

struct SlstmCase {
  int B, T, H, D, pad = 0;
  double wx_scale = 1.0, r_scale = 0.3;  // large wx_scale: saturated gates
  double tol = 1e-4;
  uint64_t seed = 1;
};

void check_slstm_with(const SlstmCase& c, bool block) {
  const std::string what = "slstm B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" +
                           std::to_string(c.H) + " D=" + std::to_string(c.D) + " wx=" + std::to_string(c.wx_scale) +
                           (block ? " block" : " auto");
  const int C = c.H * c.D, lx = 4 * C + c.pad;
  const size_t N = size_t(c.B) * c.T;
  ops::SLSTMDims d{c.B, c.T, c.H, c.D, lx};
  auto wx = randn(N * lx, c.seed, c.wx_scale), R = randn(size_t(c.H) * c.D * 4 * c.D, c.seed + 1, c.r_scale);
  auto bias = randn(size_t(4) * C, c.seed + 2), dy = randn(N * C, c.seed + 3);
  auto dwx0 = randn(wx.size(), c.seed + 4), dR0 = randn(R.size(), c.seed + 5), db0 = randn(bias.size(), c.seed + 6);
  std::vector<float> y(N * C), saved(ops::slstm_saved_size(d)), dwx = dwx0, dR = dR0, db = db0;
  ops::slstm_forward<float>(y.data(), wx.data(), R.data(), bias.data(), d, saved.data());
  ops::slstm_backward<float>(dwx.data(), dR.data(), db.data(), dy.data(), wx.data(), R.data(), bias.data(), y.data(),
                             d, saved.data());
  auto gwx = to_device(wx), gR = to_device(R), gb = to_device(bias), gdy = to_device(dy);
  auto gy = to_device(std::vector<float>(y.size())), gsaved = to_device(std::vector<float>(saved.size()));
  auto gdwx = to_device(dwx0), gdR = to_device(dR0), gdb = to_device(db0);
  ops::cuda::slstm_forward(gy.data(), gwx.data(), gR.data(), gb.data(), d, gsaved.data());
  ops::cuda::slstm_backward(gdwx.data(), gdR.data(), gdb.data(), gdy.data(), gwx.data(), gR.data(), gb.data(),
                            gy.data(), d, gsaved.data());
  // Inference (no saved states) gives the same outputs.
  auto gy2 = to_device(std::vector<float>(y.size()));
  ops::cuda::slstm_forward(gy2.data(), gwx.data(), gR.data(), gb.data(), d, nullptr);
  cuda::synchronize();
  near(gy.download(), y, c.tol, what + " y");
  near(gy2.download(), y, c.tol, what + " y (no saved)");
  near(gsaved.download(), saved, c.tol, what + " saved");
  near(gdwx.download(), dwx, c.tol, what + " dwx");
  near(gdR.download(), dR, 10 * c.tol, what + " dR");
  near(gdb.download(), db, 10 * c.tol, what + " dbias");
  if (!block && (c.D == 8 || c.D == 16 || c.D == 32)) {  // the lane kernels' sums: a fixed order
    auto gdwx2 = to_device(dwx0), gdR2 = to_device(dR0), gdb2 = to_device(db0);
    ops::cuda::slstm_backward(gdwx2.data(), gdR2.data(), gdb2.data(), gdy.data(), gwx.data(), gR.data(), gb.data(),
                              gy.data(), d, gsaved.data());
    cuda::synchronize();
    EXPECT_EQ(gdR2.download(), gdR.download()) << what << " dR repeat";
    EXPECT_EQ(gdb2.download(), gdb.download()) << what << " dbias repeat";
  }
}

// Both kernel families (lane, block) against the CPU.
void check_slstm(const SlstmCase& c) {
  for (auto kern : {ops::cuda::SlstmKernel::Auto, ops::cuda::SlstmKernel::Block}) {
    ops::cuda::set_slstm_kernel(kern);
    check_slstm_with(c, kern == ops::cuda::SlstmKernel::Block);
  }
  ops::cuda::set_slstm_kernel(ops::cuda::SlstmKernel::Auto);
}

TEST(XlstmCuda, SlstmCellMatchesCpu) {
  LRNN_REQUIRE_GPU();
  check_slstm({3, 37, 2, 16});
  check_slstm({2, 29, 3, 5, 7});            // odd head dim, padded token stride
  check_slstm({2, 21, 1, 64, 0, 1.0, 0.1}); // dR in shared memory at the opt-in size
  check_slstm({1, 9, 2, 1});                // head dim 1
  check_slstm({9, 40, 4, 32, 3});           // the P1 model's layer (4 heads of 32), padded stride
  check_slstm({70, 12, 2, 32});             // many blocks per head, a part-filled last block
  check_slstm({37, 10, 3, 8});              // four sequences per warp, the last warp part-filled
}

TEST(XlstmCuda, SlstmCellSaturatedGates) {
  LRNN_REQUIRE_GPU();
  // Pre-activations of +-30: exp gates far beyond fp32 range without the stabiliser.
  check_slstm({2, 40, 2, 8, 0, 30.0, 0.3, 1e-3, 7});
}

TEST(XlstmCuda, SlstmCellLongSequence) {
  LRNN_REQUIRE_GPU();
  check_slstm({2, 200, 2, 16, 0, 1.0, 0.3, 1e-3, 11});
}

// ---- mLSTM cell ----

struct MlstmCase {
  int B, T, H, D;
  bool strided = false;        // q|k|v and igate|fgate slices of fused rows (as the model)
  double gate_scale = 1.0;     // large: saturated gates, the stabiliser's max switching often
  double tol = 1e-4;
  bool ckpt = true;            // backward from the forward's checkpoints (else recomputed)
  uint64_t seed = 1;
};

void check_mlstm_with(const MlstmCase& c, bool recurrent) {
  const std::string what = "mlstm B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" +
                           std::to_string(c.H) + " D=" + std::to_string(c.D) + (c.strided ? " strided" : "") +
                           " gates=" + std::to_string(c.gate_scale) + (c.ckpt ? "" : " no-ckpt") +
                           (recurrent ? " recurrent" : " auto");
  const int C = c.H * c.D;
  const size_t N = size_t(c.B) * c.T;
  const int lqkv = c.strided ? 3 * C + 1 : C, lg = c.strided ? 2 * c.H + 3 : c.H;
  ops::MLSTMDims d{c.B, c.T, c.H, c.D, lqkv, lqkv, lqkv, lg};
  // q, k, v in separate buffers (packed) or slices of one (strided).
  const size_t qsz = N * lqkv, gsz = N * lg;
  auto q = randn(qsz, c.seed), k = randn(qsz, c.seed + 1), v = randn(qsz, c.seed + 2);
  auto ig = randn(gsz, c.seed + 3, c.gate_scale), fg = randn(gsz, c.seed + 4, c.gate_scale);
  for (auto& f : fg) f += 2.0f;
  auto dh = randn(N * C, c.seed + 5);
  auto dq0 = randn(qsz, c.seed + 6), dk0 = randn(qsz, c.seed + 7), dv0 = randn(qsz, c.seed + 8);
  auto di0 = randn(gsz, c.seed + 9), df0 = randn(gsz, c.seed + 10);
  std::vector<float> h(N * C), ckpt(ops::mlstm_ckpt_size(d)), dq = dq0, dk = dk0, dv = dv0, di = di0, df = df0;
  ops::mlstm_forward<float>(h.data(), q.data(), k.data(), v.data(), ig.data(), fg.data(), d, ckpt.data());
  ops::mlstm_backward<float>(dq.data(), dk.data(), dv.data(), di.data(), df.data(), dh.data(), q.data(), k.data(),
                             v.data(), ig.data(), fg.data(), d, ckpt.data());
  auto gq = to_device(q), gk = to_device(k), gv = to_device(v), gi = to_device(ig), gf = to_device(fg),
       gdh = to_device(dh);
  auto gh = to_device(std::vector<float>(h.size())), gck = to_device(std::vector<float>(ckpt.size()));
  auto gdq = to_device(dq0), gdk = to_device(dk0), gdv = to_device(dv0), gdi = to_device(di0), gdf = to_device(df0);
  ops::cuda::mlstm_forward(gh.data(), gq.data(), gk.data(), gv.data(), gi.data(), gf.data(), d, gck.data());
  ops::cuda::mlstm_backward(gdq.data(), gdk.data(), gdv.data(), gdi.data(), gdf.data(), gdh.data(), gq.data(),
                            gk.data(), gv.data(), gi.data(), gf.data(), d, c.ckpt ? gck.data() : nullptr);
  cuda::synchronize();
  near(gh.download(), h, c.tol, what + " h");
  if (recurrent) near(gck.download(), ckpt, c.tol, what + " ckpt");
  near(gdq.download(), dq, c.tol, what + " dq");
  near(gdk.download(), dk, c.tol, what + " dk");
  near(gdv.download(), dv, c.tol, what + " dv");
  near(gdi.download(), di, c.tol, what + " digate");
  near(gdf.download(), df, c.tol, what + " dfgate");
}

// Both kernel families (tile, recurrent) against the CPU; the checkpoints only where the
// recurrent forward runs (the tile kernels neither write nor read them).
void check_mlstm(const MlstmCase& c) {
  for (auto kern : {ops::cuda::MlstmKernel::Auto, ops::cuda::MlstmKernel::Recurrent}) {
    ops::cuda::set_mlstm_kernel(kern);
    check_mlstm_with(c, kern == ops::cuda::MlstmKernel::Recurrent);
  }
  ops::cuda::set_mlstm_kernel(ops::cuda::MlstmKernel::Auto);
}

TEST(XlstmCuda, MlstmCellMatchesCpu) {
  LRNN_REQUIRE_GPU();
  check_mlstm({2, 37, 3, 8});
  check_mlstm({2, 37, 2, 7, true});         // odd head dim, fused strided inputs
  check_mlstm({1, 40, 2, 32, true});        // the model's head dim
  check_mlstm({2, 19, 1, 64});              // two warps per block
  check_mlstm({3, 40, 4, 64, true});        // the P1 model's layer (4 heads of 64, T = 40)
  check_mlstm({2, 64, 2, 64, true});        // the largest tile at D = 64
  check_mlstm({2, 70, 1, 64});              // past it: Auto runs the recurrent kernels
  check_mlstm({1, 23, 2, 16, false, 1.0, 1e-4, false});  // backward without checkpoints
}

TEST(XlstmCuda, MlstmCellSaturatedGates) {
  LRNN_REQUIRE_GPU();
  check_mlstm({2, 50, 2, 8, true, 30.0, 1e-3, true, 5});
}

TEST(XlstmCuda, MlstmCellLongSequence) {
  LRNN_REQUIRE_GPU();
  check_mlstm({2, 200, 2, 16, true, 1.0, 1e-3, true, 9});
}

// ---- models ----

TEST(XlstmCuda, SlstmModelMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: slstm, vocab_size: 5, embedding_dim: 32, num_blocks: 2, num_heads: 2, "
                "recurrent_weight_init: standard}", 1e-4);
  // No conv, no group-norm weight, standard bias init.
  compare_model("{model_type: slstm, vocab_size: 7, embedding_dim: 32, num_blocks: 2, num_heads: 2, "
                "conv1d_kernel_size: 0, group_norm_weight: false, bias_init: standard, "
                "recurrent_weight_init: standard}", 1e-4);
}

TEST(XlstmCuda, MlstmModelMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: mlstm, vocab_size: 5, embedding_dim: 32, num_blocks: 2, num_heads: 2}", 1e-4);
  // Biases, no conv (q, k read the xm half of proj_up directly).
  compare_model("{model_type: mlstm, vocab_size: 7, embedding_dim: 32, num_blocks: 2, num_heads: 2, "
                "conv1d_kernel_size: 0, bias: true}", 1e-4);
}

TEST(XlstmCuda, SlstmTrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: slstm, embedding_dim: 32, num_blocks: 2, num_heads: 2}", "slstm");
}

TEST(XlstmCuda, MlstmTrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: mlstm, embedding_dim: 32, num_blocks: 2, num_heads: 2}", "mlstm");
}

}  // namespace
