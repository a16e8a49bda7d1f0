// The baselines on the GPU against the CPU reference: the LSTM layer (forward h, c, gates;
// backward into random pre-filled gradients; long T), its layout helpers, RoPE and causal
// softmax attention (strided operands, odd sizes, T = 300, a head dim above the block size),
// then both models (logits, loss, every parameter gradient, accumulation, inference) and a
// short training run each following the CPU run's losses.
//
// Tolerances: both sides run fp32 with fp32 GEMMs (cuda::set_gemm_precision(FP32)) and differ in
// summation order and in exp/tanh implementations (1-2 ulp). Every element:
// |got - want| <= tol * max(1, max|want|) + tol * |want|, tol = 1e-4 for short sequences and
// 1e-3 where the recurrence runs 200 steps or attention sums over 300 keys. An indexing or math
// bug is an O(1) error.
#include "cuda_test_util.h"
#include "model_checks.h"
#include "ops/attention/attention.h"
#include "ops/attention/attention_cuda.h"
#include "ops/lstm_cell/lstm_cell.h"
#include "ops/lstm_cell/lstm_cell_cuda.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_cuda.h"

using namespace lrnn;
using namespace lrnn::testing;

namespace {

// ---- LSTM layer ----

void check_lstm(const ops::LstmDims& d, double tol) {
  cuda::set_gemm_precision(cuda::GemmPrecision::FP32);
  const size_t N = size_t(d.T) * d.B, G = 4 * size_t(d.H), BH = N * d.H;
  const double ws = 1.0 / std::sqrt(double(d.H));
  auto x = randn(N * d.I, 1), Wih = randn(G * d.I, 2, ws), Whh = randn(G * d.H, 3, ws);
  auto bih = randn(G, 4, 0.3), bhh = randn(G, 5, 0.3);
  std::vector<float> h(BH), c(BH), gates(N * G);
  ops::lstm_forward<float>(h.data(), c.data(), gates.data(), x.data(), Wih.data(), Whh.data(), bih.data(), bhh.data(),
                           d);
  auto gx = to_device(x), gWih = to_device(Wih), gWhh = to_device(Whh), gbih = to_device(bih), gbhh = to_device(bhh);
  cuda::Buffer<float> gh(BH), gc(BH), ggates(N * G);
  ops::cuda::lstm_forward(gh.data(), gc.data(), ggates.data(), gx.data(), gWih.data(), gWhh.data(), gbih.data(),
                          gbhh.data(), d);
  const std::string tag = fmt::format("lstm T={} B={} I={} H={}", d.T, d.B, d.I, d.H);
  near(gh.download(), h, tol, tag + " h");
  near(gc.download(), c, tol, tag + " c");
  near(ggates.download(), gates, tol, tag + " gates");

  // Backward into random initial gradients (it accumulates), from the CPU forward's activations.
  auto dh = randn(BH, 6);
  auto dx = randn(N * d.I, 7), dWih = randn(G * d.I, 8), dWhh = randn(G * d.H, 9), dbih = randn(G, 10),
       dbhh = randn(G, 11);
  auto gdh = to_device(dh), gdx = to_device(dx), gdWih = to_device(dWih), gdWhh = to_device(dWhh),
       gdbih = to_device(dbih), gdbhh = to_device(dbhh);
  auto gh2 = to_device(h), gc2 = to_device(c), gg2 = to_device(gates);
  cuda::Buffer<float> work(ops::lstm_backward_work_size(d));
  ops::lstm_backward<float>(dx.data(), dWih.data(), dWhh.data(), dbih.data(), dbhh.data(), dh.data(), x.data(),
                            Wih.data(), Whh.data(), h.data(), c.data(), gates.data(), d);
  ops::cuda::lstm_backward(gdx.data(), gdWih.data(), gdWhh.data(), gdbih.data(), gdbhh.data(), gdh.data(), gx.data(),
                           gWih.data(), gWhh.data(), gh2.data(), gc2.data(), gg2.data(), d, work.data());
  near(gdx.download(), dx, tol, tag + " dx");
  near(gdWih.download(), dWih, tol, tag + " dW_ih");
  near(gdWhh.download(), dWhh, tol, tag + " dW_hh");
  near(gdbih.download(), dbih, tol, tag + " db_ih");
  near(gdbhh.download(), dbhh, tol, tag + " db_hh");
  // dx may be null.
  ops::cuda::lstm_backward(nullptr, gdWih.data(), gdWhh.data(), gdbih.data(), gdbhh.data(), gdh.data(), gx.data(),
                           gWih.data(), gWhh.data(), gh2.data(), gc2.data(), gg2.data(), d, work.data());
  cuda::synchronize();
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

// ---- RoPE ----

void check_rope(ops::RopeDims d, double tol) {
  const size_t BT = size_t(d.B) * d.T;
  auto x = randn(BT * d.lx(), 21), dout = randn(BT * d.lo(), 22);
  auto dx = randn(BT * d.lx(), 23);
  std::vector<float> out = randn(BT * d.lo(), 24);  // the padding stays as it is on both sides
  auto gx = to_device(x), gout = to_device(out), gdout = to_device(dout), gdx = to_device(dx);
  ops::rope_forward<float>(out.data(), x.data(), d);
  ops::cuda::rope_forward(gout.data(), gx.data(), d);
  const std::string tag = fmt::format("rope B={} T={} H={} D={} ldx={} ldo={}", d.B, d.T, d.H, d.D, d.ldx, d.ldo);
  near(gout.download(), out, tol, tag + " out");
  ops::rope_backward<float>(dx.data(), dout.data(), d);
  ops::cuda::rope_backward(gdx.data(), gdout.data(), d);
  near(gdx.download(), dx, tol, tag + " dx");
}

// ---- attention ----

void check_attention(ops::AttentionDims d, double tol) {
  const size_t BT = size_t(d.B) * d.T;
  auto q = randn(BT * d.lq(), 31), k = randn(BT * d.lk(), 32), v = randn(BT * d.lv(), 33);
  std::vector<float> o = randn(BT * d.lo(), 34), lse(size_t(d.B) * d.H * d.T);
  auto gq = to_device(q), gk = to_device(k), gv = to_device(v), go = to_device(o);
  cuda::Buffer<float> glse(lse.size());
  ops::attention_forward<float>(o.data(), lse.data(), q.data(), k.data(), v.data(), d);
  ops::cuda::attention_forward(go.data(), glse.data(), gq.data(), gk.data(), gv.data(), d);
  const std::string tag = fmt::format("attention B={} T={} H={} D={}", d.B, d.T, d.H, d.D);
  near(go.download(), o, tol, tag + " o");
  near(glse.download(), lse, tol, tag + " lse");
  // Without lse (inference).
  ops::cuda::attention_forward(go.data(), nullptr, gq.data(), gk.data(), gv.data(), d);
  near(go.download(), o, tol, tag + " o (no lse)");

  auto dout = randn(BT * d.lo(), 35);
  auto dq = randn(BT * d.lq(), 36), dk = randn(BT * d.lk(), 37), dv = randn(BT * d.lv(), 38);
  auto gdout = to_device(dout), gdq = to_device(dq), gdk = to_device(dk), gdv = to_device(dv);
  auto go2 = to_device(o), glse2 = to_device(lse);
  ops::attention_backward<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                                 lse.data(), d);
  ops::cuda::attention_backward(gdq.data(), gdk.data(), gdv.data(), gdout.data(), gq.data(), gk.data(), gv.data(),
                                go2.data(), glse2.data(), d);
  near(gdq.download(), dq, tol, tag + " dq");
  near(gdk.download(), dk, tol, tag + " dk");
  near(gdv.download(), dv, tol, tag + " dv");
}

ops::AttentionDims adims(int B, int T, int H, int D, int pad) {
  ops::AttentionDims d;
  d.B = B; d.T = T; d.H = H; d.D = D;
  if (pad) {
    d.ldq = H * D + pad;
    d.ldk = H * D + 2 * pad;
    d.ldv = H * D + 3 * pad;
    d.ldo = H * D + pad + 1;
  }
  return d;
}

}  // namespace

TEST(BaselinesCuda, LstmLayerMatchesCpu) {
  LRNN_REQUIRE_GPU();
  check_lstm({5, 3, 7, 9}, 1e-4);     // odd everything
  check_lstm({1, 2, 4, 4}, 1e-4);     // one step (no recurrent GEMM)
  check_lstm({23, 6, 32, 64}, 1e-4);
}

TEST(BaselinesCuda, LstmLayerLongSequence) {
  LRNN_REQUIRE_GPU();
  check_lstm({200, 4, 24, 40}, 1e-3);
}

TEST(BaselinesCuda, LstmLayoutHelpersMatchCpu) {
  LRNN_REQUIRE_GPU();
  const int B = 3, T = 7, C = 5;
  std::vector<int32_t> ids(B * T);
  for (int i = 0; i < B * T; ++i) ids[i] = i * 7 - 3;
  std::vector<int32_t> tm(B * T);
  ops::lstm_time_major_ids<float>(tm.data(), ids.data(), B, T);
  auto gids = to_device(ids);
  cuda::Buffer<int32_t> gtm(B * T);
  ops::cuda::lstm_time_major_ids(gtm.data(), gids.data(), B, T);
  EXPECT_EQ(gtm.download(), tm);
  auto x = randn(size_t(B) * T * C, 41);
  std::vector<float> y(x.size());
  ops::lstm_batch_major<float>(y.data(), x.data(), B, T, C);
  auto gx = to_device(x);
  cuda::Buffer<float> gy(x.size());
  ops::cuda::lstm_batch_major(gy.data(), gx.data(), B, T, C);
  EXPECT_EQ(gy.download(), y);
}

TEST(BaselinesCuda, RopeMatchesCpu) {
  LRNN_REQUIRE_GPU();
  ops::RopeDims d;
  d.B = 2; d.T = 37; d.H = 6; d.D = 10; d.theta = 10000.0;
  check_rope(d, 1e-5);
  // q|k out of a fused q|k|v projection, as Llama reads them.
  d.B = 3; d.T = 50; d.H = 8; d.D = 16; d.theta = 500.0; d.ldx = 3 * 4 * 16; d.ldo = 2 * 4 * 16;
  check_rope(d, 1e-5);
  d.B = 1; d.T = 300; d.H = 2; d.D = 2; d.ldx = 7; d.ldo = 5;
  check_rope(d, 1e-5);
  // Angles up to 4000 radians, and a head dim whose D/2 = 600 frequencies outnumber a block's
  // threads.
  d.B = 1; d.T = 4000; d.H = 2; d.D = 64; d.theta = 10000.0; d.ldx = 0; d.ldo = 0;
  check_rope(d, 1e-5);
  d.B = 2; d.T = 33; d.H = 1; d.D = 1200;
  check_rope(d, 1e-5);
}

TEST(BaselinesCuda, AttentionMatchesCpu) {
  LRNN_REQUIRE_GPU();
  // Both kernel families on every shape (the tile kernels run where their shared memory fits).
  for (const auto kernel : {ops::cuda::AttnKernel::Auto, ops::cuda::AttnKernel::Rows}) {
    SCOPED_TRACE(kernel == ops::cuda::AttnKernel::Auto ? "auto kernels" : "row kernels");
    ops::cuda::set_attention_kernel(kernel);
    check_attention(adims(2, 37, 3, 10, 0), 1e-4);
    check_attention(adims(3, 29, 2, 7, 3), 1e-4);     // odd head dim, strided operands
    check_attention(adims(2, 65, 4, 32, 5), 1e-4);    // past one CPU row block
    check_attention(adims(1, 1, 1, 4, 0), 1e-4);      // one token
    check_attention(adims(64, 40, 4, 32, 0), 1e-4);   // the P1 Transformer's heads, many pairs
    check_attention(adims(2, 96, 2, 32, 1), 1e-4);    // tile forward (75 KB), row backward (125 KB)
    check_attention(adims(1, 20, 1, 160, 2), 1e-4);   // head dim above the block size
  }
  ops::cuda::set_attention_kernel(ops::cuda::AttnKernel::Auto);
}

TEST(BaselinesCuda, AttentionLongSequence) {
  LRNN_REQUIRE_GPU();
  check_attention(adims(2, 300, 2, 32, 1), 1e-3);
  check_attention(adims(1, 512, 4, 16, 0), 1e-3);
}

TEST(BaselinesCuda, LstmModelMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: lstm, vocab_size: 5, hidden_size: 24, embedding_dim: 10, num_layers: 2}", 1e-4);
  compare_model("{model_type: lstm, vocab_size: 3, hidden_size: 64, num_layers: 1}", 1e-4);
  compare_model("{model_type: lstm, vocab_size: 7, hidden_size: 17, embedding_dim: 33, num_layers: 3}", 1e-4, 5, 11);
  // A long sequence: 200 recurrent steps.
  compare_model("{model_type: lstm, vocab_size: 3, hidden_size: 32, num_layers: 2}", 1e-3, 2, 200);
}

TEST(BaselinesCuda, LlamaModelMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: llama, vocab_size: 5, hidden_size: 32, num_attention_heads: 4, num_hidden_layers: 2}",
                1e-4);
  compare_model("{model_type: llama, vocab_size: 7, hidden_size: 48, num_attention_heads: 3, num_hidden_layers: 1, "
                "intermediate_size: 40, rope_theta: 500}",
                1e-4);
  // Longer than one CPU attention block.
  compare_model("{model_type: llama, vocab_size: 3, hidden_size: 64, num_attention_heads: 4, num_hidden_layers: 2}",
                1e-4, 2, 130);
}

// 30 steps on the GPU follow the CPU run's losses.
TEST(BaselinesCuda, LstmTrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: lstm, hidden_size: 64, num_layers: 2}", "lstm");
}

TEST(BaselinesCuda, LlamaTrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: llama, hidden_size: 64, num_attention_heads: 4, num_hidden_layers: 2}", "llama");
}
