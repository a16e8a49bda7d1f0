// Mamba on the GPU against the CPU reference: the strided GEMM (cuBLAS) and the selective scan
// (forward outputs, chunk checkpoints, every gradient accumulated into random initial values),
// then the whole model (logits, loss, every parameter gradient; [0,1] and [-1,1]) and a short
// training run (CUDA graphs, device AdamW) following the CPU run's losses.
//
// Scan tolerances. Both sides run the same fp32 recurrence and differ in summation order (the
// sums over states and channels), in exp/softplus implementations (1-2 ulp) and in where FMAs
// contract. Each error is ~1e-7 relative to the magnitudes involved and grows with the number
// of sequential steps. Every element: |got - want| <= tol * max|want| of that tensor + tol *
// |want|, tol = 1e-4 for T <= 64 and 1e-3 for T = 1000 (the parameter gradients sum over all
// B*T tokens). An indexing or math bug is an O(1) error.
#include <cstdlib>
#include <fstream>
#include "../e2e/cli_util.h"
#include "cuda_test_util.h"
#include "model_checks.h"
#include "models/device_model.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"
#include "ops/selective_scan/selective_scan.h"
#include "ops/selective_scan/selective_scan_cuda.h"
#include "train/trainer.h"

using namespace lrnn;
using namespace lrnn::testing;
namespace fs = std::filesystem;

namespace {

std::vector<float> slice(const std::vector<float>& v, size_t from, size_t n) {
  return std::vector<float>(v.begin() + from, v.begin() + from + n);
}

// ---- strided GEMM ----

struct GemmCase {
  bool ta, tb;
  int M, N, K;
  int pad_a, pad_b, pad_c;  // extra elements per row beyond the packed width
  float alpha, beta;
};

void check_gemm(const GemmCase& c) {
  cuda::set_gemm_precision(cuda::GemmPrecision::FP32);
  // Row-major storage: op(A) is M x K, so A is M x K (K x M when transposed); likewise B.
  const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K, br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
  const int lda = ac + c.pad_a, ldb = bc + c.pad_b, ldc = c.N + c.pad_c;
  auto A = randn(size_t(ar) * lda, 21), B = randn(size_t(br) * ldb, 22), C0 = randn(size_t(c.M) * ldc, 23);
  std::vector<float> C = C0;
  ops::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  auto gA = to_device(A), gB = to_device(B), gC = to_device(C0);
  ops::cuda::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, gA.data(), lda, gB.data(), ldb, c.beta, gC.data(), ldc);
  const std::string what = std::string("gemm ta=") + (c.ta ? "1" : "0") + " tb=" + (c.tb ? "1" : "0") +
                           " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                           " beta=" + std::to_string(c.beta);
  // The padding of C must stay as it was: compared with the CPU result, which leaves it alone.
  expect_close(gC.download(), C, 2e-5 * (std::sqrt(double(c.K)) + 1), 2e-5, what);
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

// ---- selective scan ----

struct ScanOpts {
  bool bias = true, skip = true, gate = true;  // dt_bias, D, z present
  bool fused = false;      // x | dt | z | B | C in one row per token, with padding
  double dt_lo = -4, dt_hi = 1;  // dt (before bias and softplus) uniform in [dt_lo, dt_hi]
  bool some_grads_null = false;  // leave out the gradients of B, D and dt_bias
  double tol = 1e-4;
  uint64_t seed = 1;
};

// All host-side operands of one case. Fused: one row of `width` floats per token holding x, dt,
// z, B and C (and their gradients in the same layout); padding nobody may touch. Otherwise each
// operand has its own packed buffer, back to back in `rows`.
struct ScanProblem {
  ops::SelectiveScanDims d;
  ScanOpts o;
  size_t ntok = 0;
  size_t off_x = 0, off_dt = 0, off_z = 0, off_B = 0, off_C = 0;
  std::vector<float> rows, grows;          // operands / their gradients' initial values
  std::vector<float> A_log, bias, D;       // parameters
  std::vector<float> gA, gbias, gD;        // their gradients' initial values
  std::vector<float> dy;

  ScanProblem(ops::SelectiveScanDims dims, ScanOpts opts) : d(dims), o(opts) {
    ntok = size_t(d.B) * d.T;
    const size_t Di = d.Di, N = d.N;
    if (o.fused) {
      const int width = int(3 * Di + 2 * N) + 7;
      d.ldx = d.lddt = d.ldz = d.ldbc = width;
      off_x = 0, off_dt = Di, off_z = 2 * Di, off_B = 3 * Di, off_C = 3 * Di + N;
      rows = randn(ntok * width, o.seed, 1.0, 1);
    } else {
      d.ldx = d.lddt = d.ldz = d.ldbc = 0;
      off_x = 0, off_dt = ntok * Di, off_z = 2 * ntok * Di, off_B = 3 * ntok * Di, off_C = off_B + ntok * N;
      rows = randn(off_C + ntok * N, o.seed, 1.0, 1);
    }
    const auto dt = randu(ntok * Di, o.seed, o.dt_lo, o.dt_hi, 2);
    for (size_t t = 0; t < ntok; ++t)
      for (size_t c = 0; c < Di; ++c) rows[off_dt + t * d.ldt() + c] = dt[t * Di + c];
    // A_log: the S4D-real init log(n + 1) plus noise, so A spans -0.6 .. -N*1.6.
    A_log = randu(Di * N, o.seed, -0.5, 0.5, 3);
    for (size_t c = 0; c < Di; ++c)
      for (size_t n = 0; n < N; ++n) A_log[c * N + n] += float(std::log(double(n + 1)));
    bias = randu(Di, o.seed, -1, 1, 4);
    D = randn(Di, o.seed, 1.0, 5);
    grows = randn(rows.size(), o.seed, 1.0, 6);
    gA = randn(Di * N, o.seed, 1.0, 7);
    gbias = randn(Di, o.seed, 1.0, 8);
    gD = randn(Di, o.seed, 1.0, 9);
    dy = randn(ntok * Di, o.seed, 1.0, 10);
  }
  ops::SelectiveScanInputs<float> inputs(const float* r, const float* Al, const float* b, const float* Dp) const {
    return {r + off_x, r + off_dt, o.bias ? b : nullptr, Al, r + off_B, r + off_C, o.skip ? Dp : nullptr,
            o.gate ? r + off_z : nullptr};
  }
  ops::SelectiveScanGrads<float> grads(float* r, float* Al, float* b, float* Dp) const {
    ops::SelectiveScanGrads<float> g{r + off_x, r + off_dt, b, Al, r + off_B, r + off_C, Dp, r + off_z};
    if (o.some_grads_null) g.B = nullptr, g.D = nullptr, g.dt_bias = nullptr;
    return g;
  }
};

void check_scan(const ops::SelectiveScanDims& dims, const ScanOpts& opts) {
  const ScanProblem p(dims, opts);
  const ops::SelectiveScanDims& d = p.d;
  const std::string tag = "B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) + " Di=" + std::to_string(d.Di) +
                          " N=" + std::to_string(d.N) + (d.range == ops::EigenRange::Signed ? " signed" : " unit") +
                          (opts.fused ? " fused" : "") + (opts.bias ? "" : " no-bias") + (opts.skip ? "" : " no-D") +
                          (opts.gate ? "" : " no-z");
  SCOPED_TRACE(tag);
  const size_t ny = p.ntok * d.Di, nck = ops::selective_scan_ckpt_size(d);

  // CPU reference.
  std::vector<float> y_ref(ny), ck_ref(nck);
  const auto in_ref = p.inputs(p.rows.data(), p.A_log.data(), p.bias.data(), p.D.data());
  ops::selective_scan_forward<float>(y_ref.data(), in_ref, d, ck_ref.data());
  std::vector<float> gr_ref = p.grows, gA_ref = p.gA, gb_ref = p.gbias, gD_ref = p.gD;
  ops::selective_scan_backward<float>(p.grads(gr_ref.data(), gA_ref.data(), gb_ref.data(), gD_ref.data()),
                                      p.dy.data(), in_ref, d, ck_ref.data());

  // CUDA.
  auto rows = to_device(p.rows), A_log = to_device(p.A_log), bias = to_device(p.bias), D = to_device(p.D);
  auto dy = to_device(p.dy);
  const auto in = p.inputs(rows.data(), A_log.data(), bias.data(), D.data());
  cuda::Buffer<float> y(ny), ck(nck), y2(ny);
  ops::cuda::selective_scan_forward(y.data(), in, d, ck.data());
  ops::cuda::selective_scan_forward(y2.data(), in, d, nullptr);
  cuda::synchronize();
  near(y.download(), y_ref, opts.tol, "forward y");
  near(y2.download(), y_ref, opts.tol, "forward y (no checkpoints)");
  near(ck.download(), ck_ref, opts.tol, "chunk checkpoints");

  for (const bool with_ckpt : {true, false}) {
    SCOPED_TRACE(with_ckpt ? "backward with checkpoints" : "backward without checkpoints");
    auto gr = to_device(p.grows), gA = to_device(p.gA), gb = to_device(p.gbias), gD = to_device(p.gD);
    ops::cuda::selective_scan_backward(p.grads(gr.data(), gA.data(), gb.data(), gD.data()), dy.data(), in, d,
                                       with_ckpt ? ck.data() : nullptr);
    cuda::synchronize();
    const auto got = gr.download();
    if (opts.fused) {
      near(got, gr_ref, opts.tol, "dx|ddt|dz|dB|dC (fused rows, padding untouched)");
    } else {
      const size_t nd = p.ntok * d.Di, nn = p.ntok * d.N;
      near(slice(got, p.off_x, nd), slice(gr_ref, p.off_x, nd), opts.tol, "dx");
      near(slice(got, p.off_dt, nd), slice(gr_ref, p.off_dt, nd), opts.tol, "ddt");
      near(slice(got, p.off_z, nd), slice(gr_ref, p.off_z, nd), opts.tol, "dz");
      near(slice(got, p.off_B, nn), slice(gr_ref, p.off_B, nn), opts.tol, "dB");
      near(slice(got, p.off_C, nn), slice(gr_ref, p.off_C, nn), opts.tol, "dC");
    }
    near(gA.download(), gA_ref, opts.tol, "dA_log");
    near(gb.download(), gb_ref, opts.tol, "ddt_bias");
    near(gD.download(), gD_ref, opts.tol, "dD");
  }
}

ops::SelectiveScanDims sdims(int B, int T, int Di, int N, ops::EigenRange r) {
  ops::SelectiveScanDims d;
  d.B = B, d.T = T, d.Di = Di, d.N = N, d.range = r;
  return d;
}

constexpr auto kUnit = ops::EigenRange::Unit;
constexpr auto kSigned = ops::EigenRange::Signed;

}  // namespace

TEST(MambaCuda, GemmMatchesCpu) {
  LRNN_REQUIRE_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm({ta, tb, 37, 29, 13, 0, 0, 0, 1.f, 0.f});
      check_gemm({ta, tb, 64, 48, 200, 3, 5, 7, 1.f, 1.f});
      check_gemm({ta, tb, 5, 130, 1, 1, 0, 2, 0.5f, -0.75f});
    }
  // The model's three products: dt_proj forward (strided input), its input gradient (strided
  // accumulating output) and its weight gradient.
  check_gemm({false, true, 222, 64, 4, 36, 0, 0, 1.f, 0.f});
  check_gemm({false, false, 222, 4, 64, 0, 0, 36, 1.f, 1.f});
  check_gemm({true, false, 64, 4, 222, 0, 36, 0, 1.f, 1.f});
}

// A carried state (inference): the scan from a random state equals the CPU's, and so does the
// state after it (at N = 16, staged B/C rows; N = 5 and 40, the other layouts).
TEST(MambaCuda, ScanCarriesItsState) {
  LRNN_REQUIRE_GPU();
  for (const auto& dd : {sdims(2, 9, 64, 16, kSigned), sdims(3, 1, 40, 5, kUnit), sdims(1, 70, 33, 40, kSigned)}) {
    const ScanProblem p(dd, {});
    const ops::SelectiveScanDims& d = p.d;
    SCOPED_TRACE("B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) + " N=" + std::to_string(d.N));
    const size_t ny = p.ntok * d.Di, ns = size_t(d.B) * d.N * d.Di;
    const auto s0 = randn(ns, 17, 0.5);
    std::vector<float> y_ref(ny), s_ref = s0;
    ops::selective_scan_forward<float>(y_ref.data(), p.inputs(p.rows.data(), p.A_log.data(), p.bias.data(), p.D.data()),
                                       d, nullptr, s_ref.data());
    auto rows = to_device(p.rows), A_log = to_device(p.A_log), bias = to_device(p.bias), D = to_device(p.D);
    auto st = to_device(s0);
    cuda::Buffer<float> y(ny);
    ops::cuda::selective_scan_forward(y.data(), p.inputs(rows.data(), A_log.data(), bias.data(), D.data()), d, nullptr,
                                      st.data());
    cuda::synchronize();
    near(y.download(), y_ref, 1e-4, "y from a carried state");
    near(st.download(), s_ref, 1e-4, "the state after the piece");
  }
}

TEST(MambaCuda, ScanUnitState16) {
  LRNN_REQUIRE_GPU();
  check_scan(sdims(3, 40, 64, 16, kUnit), {});
}

TEST(MambaCuda, ScanSignedState16) {
  LRNN_REQUIRE_GPU();
  check_scan(sdims(3, 40, 64, 16, kSigned), {});
}

// Large delta: exp(delta A) ~ 0, so abar ~ -1 ([-1,1]) or ~ 0 ([0,1]); some dt above softplus's
// threshold (20), where delta = dt and its derivative is 1.
TEST(MambaCuda, ScanLargeDelta) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  o.dt_lo = 2, o.dt_hi = 24;
  check_scan(sdims(2, 50, 40, 16, kSigned), o);
  check_scan(sdims(2, 50, 40, 16, kUnit), o);
}

TEST(MambaCuda, ScanOddSizes) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  check_scan(sdims(2, 37, 37, 5, kUnit), o);     // 5 of 8 register states, a partial warp
  check_scan(sdims(1, 17, 3, 1, kSigned), o);    // one state, chunk + 1 token
  check_scan(sdims(2, 5, 33, 4, kSigned), o);    // a single partial chunk
  check_scan(sdims(1, 1, 7, 13, kUnit), o);      // one token
  check_scan(sdims(2, 16, 70, 8, kSigned), o);   // exactly one chunk
}

// State sizes above 16: the states of one channel spread over 2..32 lanes.
TEST(MambaCuda, ScanLargeStateSizes) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  check_scan(sdims(2, 33, 40, 20, kSigned), o);   // 2 lanes, padded to 32
  check_scan(sdims(2, 20, 24, 64, kUnit), o);     // 4 lanes
  check_scan(sdims(1, 18, 9, 100, kSigned), o);   // 8 lanes, padded
  check_scan(sdims(1, 18, 5, 256, kUnit), o);     // 16 lanes
  check_scan(sdims(1, 17, 3, 300, kSigned), o);   // 32 lanes, padded
}

TEST(MambaCuda, ScanOptionalInputsAndGradients) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  o.bias = false;
  check_scan(sdims(2, 30, 48, 16, kSigned), o);
  o.bias = true, o.skip = false;
  check_scan(sdims(2, 30, 48, 16, kUnit), o);
  o.skip = true, o.gate = false;
  check_scan(sdims(2, 30, 48, 8, kSigned), o);
  o.bias = false, o.skip = false, o.gate = false;
  check_scan(sdims(2, 30, 48, 4, kUnit), o);
  o = ScanOpts{};
  o.some_grads_null = true;
  check_scan(sdims(2, 30, 48, 16, kSigned), o);
}

// Token strides as in the model (x, dt, z, B, C inside wider rows).
TEST(MambaCuda, ScanTokenStrides) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  o.fused = true;
  check_scan(sdims(2, 35, 40, 16, kSigned), o);
  check_scan(sdims(2, 35, 19, 6, kUnit), o);
  check_scan(sdims(1, 21, 11, 40, kSigned), o);
}

TEST(MambaCuda, ScanLongSequence) {
  LRNN_REQUIRE_GPU();
  ScanOpts o;
  o.tol = 1e-3;
  check_scan(sdims(2, 1000, 32, 16, kSigned), o);
  check_scan(sdims(2, 1000, 32, 16, kUnit), o);
  o.dt_lo = 1, o.dt_hi = 8;  // abar near -1 throughout: states oscillate for 1000 steps
  check_scan(sdims(2, 1000, 32, 16, kSigned), o);
}

// ---- the whole model ----


TEST(MambaCuda, ModelUnitMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: mamba, vocab_size: 5, hidden_size: 64, state_size: 16, num_hidden_layers: 2, "
                "allow_neg_eigval: false}", 1e-4);
  // Biases in in_proj/out_proj, no conv bias, an odd dt_rank and state size.
  compare_model("{model_type: mamba, vocab_size: 7, hidden_size: 48, state_size: 6, num_hidden_layers: 2, "
                "expand: 3, conv_kernel: 3, time_step_rank: 5, use_bias: true, use_conv_bias: false, "
                "allow_neg_eigval: false}", 1e-4);
}

TEST(MambaCuda, ModelSignedMatchesCpu) {
  LRNN_REQUIRE_GPU();
  compare_model("{model_type: mamba, vocab_size: 5, hidden_size: 64, state_size: 16, num_hidden_layers: 2, "
                "allow_neg_eigval: true}", 1e-4);
  // The P1 model's shape (d = 128, d_state 16), fewer tokens.
  compare_model("{model_type: mamba, vocab_size: 3, hidden_size: 128, state_size: 16, num_hidden_layers: 2, "
                "allow_neg_eigval: true}", 1e-4, 4, 40);
  // State size 24: states over two lanes per channel.
  compare_model("{model_type: mamba, vocab_size: 5, hidden_size: 32, state_size: 24, num_hidden_layers: 1, "
                "allow_neg_eigval: true, use_bias: true}", 1e-4);
}


// 30 Mamba [-1,1] steps on the GPU follow the CPU run's losses.
TEST(MambaCuda, TrainingTracksCpuLossTrajectory) {
  LRNN_REQUIRE_GPU();
  expect_gpu_tracks_cpu("{model_type: mamba, hidden_size: 64, state_size: 16, num_hidden_layers: 2, allow_neg_eigval: true}",
                        "mamba");
}
