// The element-wise and row-wise CUDA ops against their CPU references (fp32 on both sides):
// embedding, rmsnorm, short_conv, l2norm, forget_gate, gated_rmsnorm, swiglu, cross_entropy.
//
// Every backward starts from random gradient buffers on both sides (the ops accumulate, except
// cross_entropy_backward, which overwrites), outputs and gradients are compared over their whole
// buffers, padding of strided layouts included (it is filled with the same random values on both
// sides, so a stray write shows), and null optional gradients must leave their buffers alone.
// rmsnorm, l2norm and short_conv backward also run with accumulate = false: the GPU's dx then
// starts as NaN (padding excepted) and must equal the CPU's accumulate = true from zeros.
// Their parameter sums (dw, dbias) must be bitwise reproducible where the kernels promise it.
// Sizes are deliberately not multiples of the block sizes (N = 37, C = 129, ...), and some are
// large enough that the capped grids loop. Skipped without a GPU.
//
// Tolerances (fp32 on both sides, different summation orders, CUDA expf/logf vs the CPU's
// polynomial exp): |got - want| <= atol + rtol |want| with
//   forward values           atol 1e-5, rtol 1e-5
//   per-element gradients    atol 2e-5, rtol 1e-4
//   parameter sums over N    atol 1e-5 + 4e-6 S, rtol 1e-4   (dw, dbias, dA_log, ddt_bias, dW), where
//                            S = the largest sum of |terms| of one output (computed in the test;
//                            fp32 summation error grows with it, ~2.5e-8 S for random signs)
//   cross-entropy mean       atol 1e-6, rtol 1e-5; dlogits atol 1e-6 * max|dlogits|, rtol 1e-4
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#include "cuda_test_util.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/cross_entropy/cross_entropy_cuda.h"
#include "ops/embedding/embedding.h"
#include "ops/embedding/embedding_cuda.h"
#include "ops/forget_gate/forget_gate.h"
#include "ops/forget_gate/forget_gate_cuda.h"
#include "ops/gated_rmsnorm/gated_rmsnorm.h"
#include "ops/gated_rmsnorm/gated_rmsnorm_cuda.h"
#include "ops/l2norm/l2norm.h"
#include "ops/l2norm/l2norm_cuda.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/short_conv/short_conv.h"
#include "ops/short_conv/short_conv_cuda.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace cpu = lrnn::ops;
namespace gpu = lrnn::ops::cuda;
using lrnn::bf16;
using lrnn::cuda::Buffer;
using lrnn::testing::expect_close;
using lrnn::testing::randn;
using lrnn::testing::randu;
using lrnn::testing::to_device;

namespace {

constexpr double kFwdAtol = 1e-5, kFwdRtol = 1e-5;
constexpr double kGradAtol = 2e-5, kGradRtol = 1e-4;
constexpr double kSumRtol = 1e-4;
double sum_atol(double abs_terms) { return 1e-5 + 4e-6 * abs_terms; }
// Largest entry of a per-output sum of |terms|.
double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}
double silu_d(double x) { return x / (1 + std::exp(-x)); }
double silu_grad_d(double x) {
  const double s = 1 / (1 + std::exp(-x));
  return s * (1 + x * (1 - s));
}
double softplus_d(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

std::vector<int32_t> rand_ints(size_t n, uint64_t seed, int lo, int hi) {  // uniform in [lo, hi)
  auto u = randu(n, seed, 0.0, 1.0);
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + std::min(int(u[i] * (hi - lo)), hi - lo - 1);
  return v;
}

// Every `every`-th value (from `first`) set to +big, the next one to -big.
void add_extremes(std::vector<float>& v, float big, size_t every = 7, size_t first = 0) {
  for (size_t i = first; i < v.size(); i += every) {
    v[i] = big;
    if (i + 1 < v.size()) v[i + 1] = -big;
  }
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The starting dx of a backward run with accumulate = false: the CPU reference (accumulating)
// starts from zeros, the GPU from NaN; only the first `cols` of every `ld`-long row are the op's
// (the padding keeps its random values on both sides).
void overwrite_start(std::vector<float>& cpu, std::vector<float>& gpu, size_t rows, int cols, int ld) {
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      cpu[r * ld + c] = 0.f;
      gpu[r * ld + c] = kNaN;
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding

// The embedding's forward and backward against the CPU on the tokens `tok` (tokens outside
// [0, V) allowed: the forward writes NaN rows for them and the backward skips them; the CPU
// reference, which refuses them, runs on the others). Where embedding_backward_deterministic
// says so, a second backward must give the same bits.
void check_embedding_tokens(const std::vector<int32_t>& tok, int C, int V, uint64_t seed, const std::string& what) {
  const int N = int(tok.size());
  SCOPED_TRACE("embedding " + what + " N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V));
  auto W = randn(size_t(V) * C, seed + 1);
  auto dout = randn(size_t(N) * C, seed + 2);
  auto dW0 = randn(size_t(V) * C, seed + 3);

  std::vector<float> out(size_t(N) * C, 0.f), dW = dW0;
  std::vector<double> abs_terms(size_t(V) * C, 0.0);
  for (int n = 0; n < N; ++n) {
    if (tok[n] < 0 || tok[n] >= V) continue;
    cpu::embedding_forward<float>(out.data() + size_t(n) * C, &tok[n], W.data(), 1, C, V);
    cpu::embedding_backward<float>(dW.data(), dout.data() + size_t(n) * C, &tok[n], 1, C, V);
    for (int c = 0; c < C; ++c) abs_terms[size_t(tok[n]) * C + c] += std::fabs(dout[size_t(n) * C + c]);
  }

  auto dTok = to_device(tok);
  auto dWt = to_device(W), dOut = to_device(randn(size_t(N) * C, seed + 4)), dDout = to_device(dout);
  auto dDW = to_device(dW0);
  gpu::embedding_forward(dOut.data(), dTok.data(), dWt.data(), N, C, V);
  gpu::embedding_backward(dDW.data(), dDout.data(), dTok.data(), N, C, V);
  auto got_out = dOut.download();
  for (int n = 0; n < N; ++n)  // the rows of tokens outside [0, V) are NaN (then set to the reference's 0)
    if (tok[n] < 0 || tok[n] >= V)
      for (int c = 0; c < C; ++c) {
        ASSERT_TRUE(std::isnan(got_out[size_t(n) * C + c])) << "token " << tok[n] << " at " << n;
        got_out[size_t(n) * C + c] = 0.f;
      }
  expect_close(got_out, out, 0, 0, "embedding out");
  const auto first = dDW.download();
  expect_close(first, dW, sum_atol(max_of(abs_terms)), kSumRtol, "embedding dW");
  if (gpu::embedding_backward_deterministic(N, C, V)) {
    auto again = to_device(dW0);
    gpu::embedding_backward(again.data(), dDout.data(), dTok.data(), N, C, V);
    EXPECT_EQ(again.download(), first) << "deterministic path: a second run differs";
  }
}

void check_embedding(int N, int C, int V, uint64_t seed) {
  auto tok = rand_ints(N, seed, 0, V);
  tok[0] = 0;
  tok[N - 1] = V - 1;
  check_embedding_tokens(tok, C, V, seed, "random");
}

TEST(CudaElementwise, Embedding) {
  LRNN_REQUIRE_GPU();
  check_embedding(37, 129, 5, 1);      // scalar forward, 5 channel tiles (the last of 1), one partial chunk
  check_embedding(1, 7, 3, 2);         // a single token
  check_embedding(600, 128, 64, 3);    // float4 forward, 3 chunks (last partial)
  check_embedding(1000, 32, 3, 4);     // long runs of equal tokens
  check_embedding(10240, 128, 64, 5);  // a training batch
  check_embedding(300, 16, 1000, 6);   // larger vocabulary than a chunk: mostly distinct tokens (sorted)
  check_embedding(40960, 128, 3, 7);   // the P1 parity step at B = 1024 (8 warps a block)
  check_embedding(5000, 260, 16, 8);   // 9 channel tiles
  check_embedding(777, 64, 17, 9);     // 8 warps; 777 tokens over 4 blocks, remainders of the unrolled walk
  check_embedding(33024, 128, 122, 10);  // S5 with BOS, 256 words of 129 (3 warps a block)
  check_embedding(3000, 100, 193, 11);   // 1 warp a block
  check_embedding(2000, 64, gpu::kEmbDetMaxV, 12);      // the largest vocabulary of the partial tables
  check_embedding(2000, 64, gpu::kEmbDetMaxV + 1, 13);  // just above it: sorted
  check_embedding(600, 8200, 300, 14);  // V x C floats more than the scratch holds: sorted
  check_embedding(16384, 72, 32000, 15);  // a language model's vocabulary and batch (8 x 2048 tokens)
}

// The sorted backward's segments (a token's rows in sorted order) against the blocks of 256
// sorted positions it works in: segments that cross one or many blocks, end exactly at a block's
// end, fill whole blocks; tokens outside the vocabulary; and beyond the scratch, the atomic path.
TEST(CudaElementwise, EmbeddingSortedSegments) {
  LRNN_REQUIRE_GPU();
  const int V = 1000;
  {  // one token everywhere: one segment over 12 blocks (the last partial)
    check_embedding_tokens(std::vector<int32_t>(3000, 7), 40, V, 21, "one token");
  }
  {  // segments of exactly 256 and 512 rows: every block boundary is a segment boundary
    std::vector<int32_t> tok;
    for (int t : {3, 4, 5, 5, 9}) tok.insert(tok.end(), 256, t);
    std::vector<int32_t> mixed(tok.size());  // the positions permuted (7919 is prime to 1280)
    for (size_t i = 0; i < tok.size(); ++i) mixed[(i * 7919) % tok.size()] = tok[i];
    check_embedding_tokens(mixed, 33, V, 23, "aligned segments");
  }
  {  // a frequent token (a third of the rows) among rare ones, and tokens outside [0, V)
    auto tok = rand_ints(5000, 24, 0, V);
    for (size_t i = 0; i < tok.size(); i += 3) tok[i] = 11;
    tok[5] = -1, tok[17] = V, tok[4000] = -7, tok[4001] = 1 << 30;
    check_embedding_tokens(tok, 64, V, 25, "frequent and invalid tokens");
  }
  {  // more tokens than the sort's scratch holds: the atomic path, still correct
    const int N = 600000;
    EXPECT_FALSE(gpu::embedding_backward_deterministic(N, 4, V));
    check_embedding_tokens(rand_ints(N, 26, 0, V), 4, V, 27, "atomic");
  }
  EXPECT_TRUE(gpu::embedding_backward_deterministic(16384, 1024, 32000));  // the LM step's shape
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

// off: the device arrays start `off` floats into their buffers (off % 4 != 0: no float4 path).
void check_rmsnorm(int N, int C, double eps, bool with_dw, double xscale, bool zero_row, uint64_t seed,
                   bool accumulate = true, int off = 0, bool check_repeat = false) {
  SCOPED_TRACE("rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C) + " dw=" + std::to_string(with_dw) +
               " xscale=" + std::to_string(xscale) + " accumulate=" + std::to_string(accumulate) +
               " off=" + std::to_string(off));
  const size_t NC = size_t(N) * C;
  auto x = randn(NC, seed, xscale);
  if (zero_row) std::fill_n(x.begin() + size_t(N / 2) * C, C, 0.f);
  auto w = randu(C, seed + 1, 0.5, 1.5);
  auto dout = randn(NC, seed + 2);
  auto dx0 = randn(NC, seed + 3), dw0 = randn(C, seed + 4);
  auto dx0_gpu = dx0;
  if (!accumulate) overwrite_start(dx0, dx0_gpu, N, C, C);

  std::vector<float> out(NC), rstd(N), dx = dx0, dw = dw0;
  cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  cpu::rmsnorm_backward<float>(dx.data(), with_dw ? dw.data() : nullptr, dout.data(), x.data(), w.data(),
                               rstd.data(), N, C);

  // Device copies `off` floats into buffers one `off` longer.
  auto shifted = [off](const std::vector<float>& v) {
    std::vector<float> s(v.size() + off, 0.f);
    std::copy(v.begin(), v.end(), s.begin() + off);
    return to_device(s);
  };
  auto tail = [off](const Buffer<float>& b) {
    auto v = b.download();
    return std::vector<float>(v.begin() + off, v.end());
  };
  auto X = shifted(x), Wt = shifted(w), Dout = shifted(dout);
  auto Out = shifted(randn(NC, seed + 5)), Rstd = to_device(randn(N, seed + 6));
  auto Dx = shifted(dx0_gpu), Dw = to_device(dw0);
  gpu::rmsnorm_forward(Out.data() + off, Rstd.data(), X.data() + off, Wt.data() + off, N, C, eps);
  gpu::rmsnorm_backward(Dx.data() + off, with_dw ? Dw.data() : nullptr, Dout.data() + off, X.data() + off,
                        Wt.data() + off, Rstd.data(), N, C, accumulate);
  expect_close(tail(Out), out, kFwdAtol, kFwdRtol, "rmsnorm out");
  expect_close(Rstd.download(), rstd, kFwdAtol, kFwdRtol, "rmsnorm rstd");
  expect_close(tail(Dx), dx, kGradAtol, kGradRtol, "rmsnorm dx");
  std::vector<double> abs_terms(C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      abs_terms[c] += std::fabs(double(dout[size_t(n) * C + c]) * x[size_t(n) * C + c] * rstd[n]);
  const auto dw_gpu = Dw.download();
  expect_close(dw_gpu, dw, sum_atol(max_of(abs_terms)), kSumRtol, "rmsnorm dw");
  if (check_repeat && with_dw) {  // the dw sums come out bitwise the same on a second run
    auto Dw2 = to_device(dw0), Dx2 = shifted(dx0_gpu);
    gpu::rmsnorm_backward(Dx2.data() + off, Dw2.data(), Dout.data() + off, X.data() + off, Wt.data() + off,
                          Rstd.data(), N, C, accumulate);
    EXPECT_EQ(Dw2.download(), dw_gpu) << "rmsnorm dw not reproducible";
  }
}

TEST(CudaElementwise, RmsNorm) {
  LRNN_REQUIRE_GPU();
  check_rmsnorm(37, 129, 1e-5, true, 1.0, false, 10);
  check_rmsnorm(37, 129, 1e-5, false, 1.0, false, 11);   // dw null
  check_rmsnorm(300, 128, 1e-6, true, 1.0, false, 12);
  check_rmsnorm(64, 32, 1e-6, true, 1.0, false, 13);     // DeltaNet's o_norm rows (N*H rows of Dv)
  check_rmsnorm(40, 20, 1e-5, true, 1.0, false, 14);     // rows shorter than a warp
  check_rmsnorm(33, 128, 1e-6, true, 1e-4, true, 15);    // tiny rows (eps matters) and a zero row
  check_rmsnorm(8300, 64, 1e-5, true, 1.0, false, 16);   // more rows than the capped grid has warps
  check_rmsnorm(5, 1600, 1e-5, true, 1.0, false, 17);    // dw partials larger than shared memory
}

// The benchmark's shapes (DeltaNet d=128, 4 heads of 32, T=40; B=64 instead of 1024), rows of
// every kernel variant (float4 with 4..32 lanes per row and 1..8 float4s per lane, scalar, the
// general kernels), and dx overwritten (accumulate = false) over a NaN-filled buffer.
TEST(CudaElementwise, RmsNormShapesAndOverwrite) {
  LRNN_REQUIRE_GPU();
  for (bool acc : {true, false}) {
    check_rmsnorm(64 * 40, 128, 1e-6, true, 1.0, false, 200, acc, 0, true);      // the hidden rows
    check_rmsnorm(64 * 40 * 4, 32, 1e-6, true, 1.0, false, 201, acc, 0, true);   // the per-head o_norm rows
    check_rmsnorm(37, 129, 1e-5, true, 1.0, false, 202, acc);                    // scalar, 5 values per lane
    check_rmsnorm(50, 4, 1e-5, true, 1.0, false, 203, acc);                      // 4-lane groups
    check_rmsnorm(45, 64, 1e-5, true, 1.0, false, 204, acc);                     // 16-lane groups
    check_rmsnorm(33, 256, 1e-5, true, 1.0, false, 205, acc);                    // 2 float4 per lane
    check_rmsnorm(19, 1024, 1e-5, true, 1.0, false, 206, acc);                   // 8 float4 per lane
    check_rmsnorm(21, 1030, 1e-5, true, 1.0, false, 207, acc);                   // general kernel
    check_rmsnorm(5, 1600, 1e-5, true, 1.0, false, 208, acc);                    // general kernel, dw atomics
    check_rmsnorm(40, 128, 1e-5, true, 1.0, false, 209, acc, 1);                 // misaligned: scalar path
    check_rmsnorm(40, 32, 1e-5, false, 1.0, false, 210, acc);                    // dw null
    check_rmsnorm(1, 32, 1e-5, true, 1.0, false, 211, acc);                      // one row
  }
}

// ---------------------------------------------------------------------------------------------
// L2 norm

void check_l2norm(int N, int D, int heads, int ldx, int ldy, double xscale, bool zero_row, uint64_t seed,
                  bool accumulate = true) {
  SCOPED_TRACE("l2norm N=" + std::to_string(N) + " D=" + std::to_string(D) + " heads=" + std::to_string(heads) +
               " ldx=" + std::to_string(ldx) + " ldy=" + std::to_string(ldy) +
               " accumulate=" + std::to_string(accumulate));
  const double eps = 1e-6;
  const int lx = ldx ? ldx : heads * D, ly = ldy ? ldy : heads * D;
  auto x = randn(size_t(N) * lx, seed, xscale);
  if (zero_row) std::fill_n(x.begin() + size_t(N / 2) * lx + D, D, 0.f);  // token N/2, head 1
  auto y0 = randn(size_t(N) * ly, seed + 1), dy = randn(size_t(N) * ly, seed + 2);
  auto dx0 = randn(size_t(N) * lx, seed + 3);
  auto dx0_gpu = dx0;
  if (!accumulate) overwrite_start(dx0, dx0_gpu, N, heads * D, lx);

  std::vector<float> y = y0, rstd(size_t(N) * heads), dx = dx0;
  cpu::l2norm_forward<float>(y.data(), rstd.data(), x.data(), N, D, eps, heads, ldx, ldy);
  cpu::l2norm_backward<float>(dx.data(), dy.data(), y.data(), rstd.data(), N, D, heads, ldx, ldy);

  auto X = to_device(x), Y = to_device(y0), Dy = to_device(dy), Dx = to_device(dx0_gpu);
  auto Rstd = to_device(randn(size_t(N) * heads, seed + 4));
  gpu::l2norm_forward(Y.data(), Rstd.data(), X.data(), N, D, eps, heads, ldx, ldy);
  gpu::l2norm_backward(Dx.data(), Dy.data(), Y.data(), Rstd.data(), N, D, heads, ldx, ldy, accumulate);
  expect_close(Y.download(), y, kFwdAtol, kFwdRtol, "l2norm y");
  expect_close(Rstd.download(), rstd, kFwdAtol, kFwdRtol, "l2norm rstd");
  expect_close(Dx.download(), dx, kGradAtol, kGradRtol, "l2norm dx");
}

TEST(CudaElementwise, L2Norm) {
  LRNN_REQUIRE_GPU();
  check_l2norm(37, 32, 4, 0, 0, 1.0, false, 20);
  check_l2norm(37, 32, 8, 4 * 32 * 3 + 5, 8 * 32 + 3, 1.0, false, 21);  // q,k inside a fused row, padded out
  check_l2norm(29, 33, 3, 0, 0, 1.0, false, 22);                      // D > 32, not a multiple
  check_l2norm(50, 16, 4, 70, 0, 1.0, false, 23);                     // D < 32
  check_l2norm(41, 32, 4, 0, 0, 1e-4, true, 24);                      // tiny rows (eps matters), a zero row
  check_l2norm(3000, 32, 4, 0, 0, 1.0, false, 25);
}

// The benchmark's layout (q|k heads of a fused q|k|v row of 384 in, a q|k row of 256 out; B=64
// instead of 1024), every kernel variant, and dx overwritten over a NaN-filled buffer.
TEST(CudaElementwise, L2NormShapesAndOverwrite) {
  LRNN_REQUIRE_GPU();
  for (bool acc : {true, false}) {
    check_l2norm(64 * 40, 32, 8, 384, 256, 1.0, false, 220, acc);   // the benchmark layout
    check_l2norm(37, 32, 8, 8 * 32 + 3, 0, 1.0, false, 221, acc);   // odd ldx: scalar path
    check_l2norm(37, 32, 8, 0, 8 * 32 + 2, 1.0, false, 222, acc);   // ldy % 4 != 0: scalar path
    check_l2norm(29, 33, 3, 0, 0, 1.0, false, 223, acc);            // D not a multiple of 4
    check_l2norm(30, 4, 5, 0, 0, 1.0, false, 224, acc);             // 4-lane groups, one float4 used
    check_l2norm(25, 64, 3, 200, 0, 1.0, false, 225, acc);          // 16-lane groups
    check_l2norm(11, 512, 2, 0, 0, 1.0, false, 226, acc);           // 4 float4 per lane
    check_l2norm(7, 1100, 2, 0, 0, 1.0, false, 227, acc);           // general kernel (one warp per row)
    check_l2norm(41, 32, 4, 0, 0, 1e-4, true, 228, acc);            // tiny rows and a zero row
    check_l2norm(1, 32, 1, 0, 0, 1.0, false, 229, acc);             // one row: 3 idle groups in the warp
  }
}

// ---------------------------------------------------------------------------------------------
// Forget gate

void check_forget_gate(int N, int H, int lda, bool with_sums, uint64_t seed) {
  SCOPED_TRACE("forget_gate N=" + std::to_string(N) + " H=" + std::to_string(H) + " lda=" + std::to_string(lda) +
               " sums=" + std::to_string(with_sums));
  const int la = lda ? lda : H;
  auto a = randn(size_t(N) * la, seed, 2.0);
  add_extremes(a, 30.f, 5);
  auto A_log = randu(H, seed + 1, -1.0, 2.5), dt_bias = randn(H, seed + 2);
  auto dg = randn(size_t(N) * H, seed + 3);
  auto da0 = randn(size_t(N) * la, seed + 4), dA0 = randn(H, seed + 5), dB0 = randn(H, seed + 6);

  std::vector<float> g(size_t(N) * H), da = da0, dA = dA0, dB = dB0;
  cpu::forget_gate_forward<float>(g.data(), a.data(), A_log.data(), dt_bias.data(), N, H, lda);
  cpu::forget_gate_backward<float>(da.data(), with_sums ? dA.data() : nullptr, with_sums ? dB.data() : nullptr,
                                   dg.data(), a.data(), A_log.data(), dt_bias.data(), N, H, lda);

  auto Aa = to_device(a), AL = to_device(A_log), DB = to_device(dt_bias), Dg = to_device(dg);
  auto G = to_device(randn(size_t(N) * H, seed + 7)), Da = to_device(da0), DA = to_device(dA0),
       DDB = to_device(dB0);
  gpu::forget_gate_forward(G.data(), Aa.data(), AL.data(), DB.data(), N, H, lda);
  gpu::forget_gate_backward(Da.data(), with_sums ? DA.data() : nullptr, with_sums ? DDB.data() : nullptr, Dg.data(),
                            Aa.data(), AL.data(), DB.data(), N, H, lda);
  expect_close(G.download(), g, kFwdAtol, kFwdRtol, "forget_gate g");
  expect_close(Da.download(), da, kGradAtol, kGradRtol, "forget_gate da");
  std::vector<double> absA(H, 0.0), absB(H, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const double xv = double(a[size_t(n) * la + h]) + dt_bias[h], A = std::exp(double(A_log[h]));
      const double d = std::fabs(dg[size_t(n) * H + h]);
      absA[h] += A * softplus_d(xv) * d;
      absB[h] += A / (1 + std::exp(-xv)) * d;
    }
  expect_close(DA.download(), dA, sum_atol(max_of(absA)), kSumRtol, "forget_gate dA_log");
  expect_close(DDB.download(), dB, sum_atol(max_of(absB)), kSumRtol, "forget_gate ddt_bias");
  if (with_sums) {  // the sums have a fixed order: a second run gives the same bits
    auto DA2 = to_device(dA0), DDB2 = to_device(dB0);
    gpu::forget_gate_backward(Da.data(), DA2.data(), DDB2.data(), Dg.data(), Aa.data(), AL.data(), DB.data(), N, H,
                              lda);
    EXPECT_EQ(DA2.download(), DA.download()) << "forget_gate dA_log differs between runs";
    EXPECT_EQ(DDB2.download(), DDB.download()) << "forget_gate ddt_bias differs between runs";
  }
}

TEST(CudaElementwise, ForgetGate) {
  LRNN_REQUIRE_GPU();
  check_forget_gate(37, 4, 0, true, 30);
  check_forget_gate(37, 4, 0, false, 31);      // dA_log, ddt_bias null
  check_forget_gate(37, 4, 13, true, 32);      // logits inside a fused projection row
  check_forget_gate(101, 3, 0, true, 33);      // H not a power of two
  check_forget_gate(61, 40, 45, true, 34);     // H >= 32
  check_forget_gate(50, 300, 0, true, 36);     // H > a block's threads
  check_forget_gate(70000, 4, 9, true, 35);    // more elements than the capped grid has threads
}

// ---------------------------------------------------------------------------------------------
// Gated RMSNorm

void check_gated_rmsnorm(int N, int heads, int D, int ldg, bool with_dw, double xscale, bool zero_row,
                         uint64_t seed) {
  SCOPED_TRACE("gated_rmsnorm N=" + std::to_string(N) + " heads=" + std::to_string(heads) + " D=" +
               std::to_string(D) + " ldg=" + std::to_string(ldg) + " dw=" + std::to_string(with_dw));
  const double eps = 1e-5;
  const size_t R = size_t(N) * heads;
  const int lg = ldg ? ldg : heads * D;
  auto x = randn(R * D, seed, xscale);
  if (zero_row) std::fill_n(x.begin() + (R / 2) * D, D, 0.f);
  auto g = randn(size_t(N) * lg, seed + 1, 2.0);
  add_extremes(g, 30.f, 6);
  auto w = randu(D, seed + 2, 0.5, 1.5);
  auto dy = randn(R * D, seed + 3);
  auto dx0 = randn(R * D, seed + 4), dg0 = randn(size_t(N) * lg, seed + 5), dw0 = randn(D, seed + 6);

  std::vector<float> y(R * D), rstd(R), dx = dx0, dg = dg0, dw = dw0;
  cpu::gated_rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), g.data(), w.data(), N, heads, D, eps, ldg);
  cpu::gated_rmsnorm_backward<float>(dx.data(), dg.data(), with_dw ? dw.data() : nullptr, dy.data(), x.data(),
                                     g.data(), w.data(), rstd.data(), N, heads, D, ldg);

  auto X = to_device(x), Gt = to_device(g), Wt = to_device(w), Dy = to_device(dy);
  auto Y = to_device(randn(R * D, seed + 7)), Rstd = to_device(randn(R, seed + 8));
  auto Dx = to_device(dx0), Dg = to_device(dg0), Dw = to_device(dw0);
  gpu::gated_rmsnorm_forward(Y.data(), Rstd.data(), X.data(), Gt.data(), Wt.data(), N, heads, D, eps, ldg);
  gpu::gated_rmsnorm_backward(Dx.data(), Dg.data(), with_dw ? Dw.data() : nullptr, Dy.data(), X.data(), Gt.data(),
                              Wt.data(), Rstd.data(), N, heads, D, ldg);
  expect_close(Y.download(), y, kFwdAtol, kFwdRtol, "gated_rmsnorm y");
  expect_close(Rstd.download(), rstd, kFwdAtol, kFwdRtol, "gated_rmsnorm rstd");
  expect_close(Dx.download(), dx, kGradAtol, kGradRtol, "gated_rmsnorm dx");
  expect_close(Dg.download(), dg, kGradAtol, kGradRtol, "gated_rmsnorm dg");
  std::vector<double> abs_terms(D, 0.0);
  for (size_t r = 0; r < R; ++r) {
    const size_t n = r / heads, h = r % heads;
    for (int c = 0; c < D; ++c)
      abs_terms[c] += std::fabs(double(dy[r * D + c]) * silu_d(g[n * lg + h * D + c]) * x[r * D + c] * rstd[r]);
  }
  expect_close(Dw.download(), dw, sum_atol(max_of(abs_terms)), kSumRtol, "gated_rmsnorm dw");
  if (with_dw) {  // dw has a fixed summation order: a second run gives the same bits
    auto Dw2 = to_device(dw0);
    gpu::gated_rmsnorm_backward(Dx.data(), Dg.data(), Dw2.data(), Dy.data(), X.data(), Gt.data(), Wt.data(),
                                Rstd.data(), N, heads, D, ldg);
    EXPECT_EQ(Dw2.download(), Dw.download()) << "gated_rmsnorm dw differs between runs";
  }
}

TEST(CudaElementwise, GatedRmsNorm) {
  LRNN_REQUIRE_GPU();
  check_gated_rmsnorm(37, 4, 32, 0, true, 1.0, false, 40);
  check_gated_rmsnorm(37, 4, 32, 0, false, 1.0, false, 41);         // dw null
  check_gated_rmsnorm(37, 4, 32, 4 * 32 * 5 + 3, true, 1.0, false, 42);  // gate inside a fused projection row
  check_gated_rmsnorm(23, 3, 33, 0, true, 1.0, false, 43);          // D > 32, not a multiple
  check_gated_rmsnorm(40, 1, 129, 200, true, 1.0, false, 44);
  check_gated_rmsnorm(31, 4, 32, 0, true, 1e-4, true, 45);          // tiny rows and a zero row
  check_gated_rmsnorm(2100, 4, 32, 0, true, 1.0, false, 46);        // more rows than the capped grid has warps
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// gate and up are the two halves of one [N, ld] buffer starting at offset `off` (up at off + I
// when fused, i.e. ld >= 2I; a separate buffer otherwise).
void check_swiglu(int N, int I, int ld, int off, uint64_t seed) {
  SCOPED_TRACE("swiglu N=" + std::to_string(N) + " I=" + std::to_string(I) + " ld=" + std::to_string(ld) +
               " off=" + std::to_string(off));
  const int l = ld ? ld : I;
  const bool fused = l >= 2 * I;
  const size_t n = size_t(N) * l + off;
  auto gbuf = randn(n, seed, 2.0);
  add_extremes(gbuf, 30.f, 9, off);
  auto ubuf = fused ? std::vector<float>() : randn(n, seed + 1);
  auto dout = randn(size_t(N) * I, seed + 2);
  auto dg0 = randn(n, seed + 3), du0 = fused ? std::vector<float>() : randn(n, seed + 4);

  const size_t goff = off, uoff = fused ? off + I : off;
  std::vector<float> out(size_t(N) * I), dg = dg0, du = du0;
  const float* up_h = fused ? gbuf.data() + uoff : ubuf.data() + uoff;
  float* dup_h = fused ? dg.data() + uoff : du.data() + uoff;
  cpu::swiglu_forward<float>(out.data(), gbuf.data() + goff, up_h, N, I, ld);
  cpu::swiglu_backward<float>(dg.data() + goff, dup_h, dout.data(), gbuf.data() + goff, up_h, N, I, ld);

  auto Gb = to_device(gbuf), Ub = fused ? Buffer<float>() : to_device(ubuf), Dout = to_device(dout);
  auto Dg = to_device(dg0), Du = fused ? Buffer<float>() : to_device(du0);
  auto Out = to_device(randn(size_t(N) * I, seed + 5));
  const float* up_d = fused ? Gb.data() + uoff : Ub.data() + uoff;
  float* dup_d = fused ? Dg.data() + uoff : Du.data() + uoff;
  gpu::swiglu_forward(Out.data(), Gb.data() + goff, up_d, N, I, ld);
  gpu::swiglu_backward(Dg.data() + goff, dup_d, Dout.data(), Gb.data() + goff, up_d, N, I, ld);
  expect_close(Out.download(), out, kFwdAtol, kFwdRtol, "swiglu out");
  expect_close(Dg.download(), dg, kGradAtol, kGradRtol, fused ? "swiglu dgate|dup" : "swiglu dgate");
  if (!fused) expect_close(Du.download(), du, kGradAtol, kGradRtol, "swiglu dup");
}

TEST(CudaElementwise, SwiGlu) {
  LRNN_REQUIRE_GPU();
  check_swiglu(37, 129, 0, 0, 50);          // scalar path, separate buffers
  check_swiglu(37, 129, 258, 0, 51);        // fused [N, 2I], misaligned up
  check_swiglu(64, 512, 1024, 0, 52);       // fused, float4 path (the MLP's layout)
  check_swiglu(33, 128, 0, 0, 53);          // float4 path, separate buffers
  check_swiglu(20, 128, 0, 1, 54);          // I % 4 == 0 but misaligned pointers: scalar path
  check_swiglu(25, 64, 130, 0, 55);         // ld % 4 != 0: scalar path
  check_swiglu(2048, 512, 1024, 0, 56);
}

// ---------------------------------------------------------------------------------------------
// Short convolution

void check_short_conv(int B, int T, int C, int K, int ldx, int ldo, bool with_bias, bool with_grads,
                      uint64_t seed, bool accumulate = true, bool check_repeat = false) {
  SCOPED_TRACE("short_conv B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " K=" + std::to_string(K) + " ldx=" + std::to_string(ldx) + " ldo=" + std::to_string(ldo) +
               " bias=" + std::to_string(with_bias) + " grads=" + std::to_string(with_grads) +
               " accumulate=" + std::to_string(accumulate));
  const int lx = ldx ? ldx : C, lo = ldo ? ldo : C;
  const size_t N = size_t(B) * T;
  auto x = randn(N * lx, seed, 1.5);
  add_extremes(x, 12.f, 11);  // pre-activations far in both tails of the SiLU
  auto w = randn(size_t(C) * K, seed + 1, 0.7), bias = randn(C, seed + 2, 0.5);
  auto dout = randn(N * lo, seed + 3);
  auto out0 = randn(N * lo, seed + 4), dx0 = randn(N * lx, seed + 5);
  auto dw0 = randn(size_t(C) * K, seed + 6), db0 = randn(C, seed + 7);
  auto dx0_gpu = dx0;
  if (!accumulate) overwrite_start(dx0, dx0_gpu, N, C, lx);

  const float* wp = K ? w.data() : nullptr;
  std::vector<float> out = out0, dx = dx0, dw = dw0, db = db0;
  cpu::short_conv_forward<float>(out.data(), x.data(), wp, B, T, C, K, ldx, ldo, with_bias ? bias.data() : nullptr);
  cpu::short_conv_backward<float>(dx.data(), with_grads && K ? dw.data() : nullptr, dout.data(), x.data(), wp, B, T,
                                  C, K, ldx, ldo, with_bias ? bias.data() : nullptr,
                                  with_grads && with_bias ? db.data() : nullptr);

  auto X = to_device(x), Wt = K ? to_device(w) : Buffer<float>(), Bias = to_device(bias), Dout = to_device(dout);
  auto Out = to_device(out0), Dx = to_device(dx0_gpu), Dw = K ? to_device(dw0) : Buffer<float>(),
       Db = to_device(db0);
  const float* wd = K ? Wt.data() : nullptr;
  gpu::short_conv_forward(Out.data(), X.data(), wd, B, T, C, K, ldx, ldo, with_bias ? Bias.data() : nullptr);
  gpu::short_conv_backward(Dx.data(), with_grads && K ? Dw.data() : nullptr, Dout.data(), X.data(), wd, B, T, C, K,
                           ldx, ldo, with_bias ? Bias.data() : nullptr, with_grads && with_bias ? Db.data() : nullptr,
                           accumulate);
  if (check_repeat && with_grads) {  // K <= 4: the dw / dbias sums are bitwise reproducible
    auto Dx2 = to_device(dx0_gpu), Dw2 = K ? to_device(dw0) : Buffer<float>(), Db2 = to_device(db0);
    gpu::short_conv_backward(Dx2.data(), K ? Dw2.data() : nullptr, Dout.data(), X.data(), wd, B, T, C, K, ldx, ldo,
                             with_bias ? Bias.data() : nullptr, with_bias ? Db2.data() : nullptr, accumulate);
    if (K) {
      EXPECT_EQ(Dw2.download(), Dw.download()) << "short_conv dw not reproducible";
    }
    EXPECT_EQ(Db2.download(), Db.download()) << "short_conv dbias not reproducible";
    EXPECT_EQ(Dx2.download(), Dx.download()) << "short_conv dx not reproducible";
  }
  expect_close(Out.download(), out, kFwdAtol, kFwdRtol, "short_conv out");
  expect_close(Dx.download(), dx, kGradAtol, kGradRtol, "short_conv dx");
  // |terms| of the sums: |dpre| (dbias) and |dpre x| (dw), dpre = dout silu'(pre), in double.
  std::vector<double> abs_w(size_t(C) * K, 0.0), abs_b(C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        auto xat = [&](int p) { return p < 0 ? 0.0 : double(x[(size_t(b) * T + p) * lx + c]); };
        double pre = with_bias ? bias[c] : 0.0;
        if (K == 0) pre += xat(t);
        for (int j = 0; j < K; ++j) pre += double(w[size_t(c) * K + j]) * xat(t - (K - 1) + j);
        const double dp = std::fabs(dout[(size_t(b) * T + t) * lo + c] * silu_grad_d(pre));
        abs_b[c] += dp;
        for (int j = 0; j < K; ++j) abs_w[size_t(c) * K + j] += dp * std::fabs(xat(t - (K - 1) + j));
      }
  if (K) expect_close(Dw.download(), dw, sum_atol(max_of(abs_w)), kSumRtol, "short_conv dw");
  expect_close(Db.download(), db, sum_atol(max_of(abs_b)), kSumRtol, "short_conv dbias");
}

TEST(CudaElementwise, ShortConv) {
  LRNN_REQUIRE_GPU();
  for (int K : {0, 1, 3, 4}) {
    check_short_conv(3, 37, 129, K, 0, 0, true, true, 60 + K);
    check_short_conv(3, 37, 129, K, 0, 0, false, true, 70 + K);            // no bias
    check_short_conv(2, 150, 40, K, 2 * 40 + 3, 40 + 5, true, true, 80 + K);  // strided x/dx and out/dout, 3 time tiles
    check_short_conv(2, 70, 33, K, 3 * 33, 0, true, false, 90 + K);        // dw, dbias null
  }
  check_short_conv(2, 65, 20, 4, 0, 0, true, true, 100);  // T = one tile + 1: the halo reaches past T
  check_short_conv(1, 3, 8, 4, 0, 0, true, true, 101);    // T < K
  check_short_conv(2, 100, 24, 10, 0, 0, true, true, 102);  // K > 8 taps: two passes for dw
  check_short_conv(4, 1024, 128, 4, 3 * 128, 128, false, true, 103);  // a DeltaNet-like layer
}

// The benchmark's layout (q|k|v columns of a fused projection row of 388 in, rows of 384 out,
// K = 4, no bias), odd shapes, and dx overwritten (accumulate = false) over a NaN-filled buffer.
TEST(CudaElementwise, ShortConvShapesAndOverwrite) {
  LRNN_REQUIRE_GPU();
  for (bool acc : {true, false}) {
    check_short_conv(64, 40, 384, 4, 388, 384, false, true, 300, acc, true);  // the benchmark layout, B = 64
    check_short_conv(3, 40, 384, 4, 388, 384, true, true, 301, acc, true);    // with bias; few rows: short chunks
    for (int K : {0, 1, 2, 3, 4, 9}) {
      check_short_conv(2, 1, 24, K, 0, 0, true, true, 310 + K, acc);         // T = 1
      check_short_conv(2, 70, 24, K, 27, 0, true, true, 320 + K, acc);       // T = 70 (chunks, T > 64), odd ldx
      check_short_conv(3, 37, 30, K, 0, 0, true, true, 330 + K, acc);        // C % 4 == 2: float2 path
      check_short_conv(2, 45, 33, K, 35, 37, true, true, 340 + K, acc);      // C odd: scalar path
      check_short_conv(2, 19, 40, K, 44, 41, false, false, 350 + K, acc);    // dw, dbias null; odd ldo
    }
    check_short_conv(2, 3, 8, 4, 0, 0, true, true, 360, acc);     // T < K
    check_short_conv(1, 130, 264, 4, 0, 0, true, true, 361, acc, true);  // 3 channel tiles, last partial
  }
}

// The benchmark's full batch (B = 1024, T = 40): the launch plan of the real step.
TEST(CudaElementwise, ShortConvBenchmarkBatch) {
  LRNN_REQUIRE_GPU();
  check_short_conv(1024, 40, 384, 4, 388, 384, false, true, 370, false, true);
}

// The conv + L2 norm's `out` [N, C] on the channels it writes (c >= Cn) against the CPU's.
void expect_unnormed_close(const std::vector<float>& got, const std::vector<float>& want, int N, int C, int Cn) {
  std::vector<float> g2, w2;
  for (int n = 0; n < N; ++n)
    for (int c = Cn; c < C; ++c) g2.push_back(got[size_t(n) * C + c]), w2.push_back(want[size_t(n) * C + c]);
  expect_close(g2, w2, kFwdAtol, kFwdRtol, "out (channels >= Cn)");
}

// The fused conv + L2 norm (the delta rule's q|k): x [B T, ldx] (the projection row), out
// [B T, C]; the first Cn channels normalised per head of D into y [B T, Cn] with rstd. Compared
// with the CPU's two ops: y and rstd whole, out on its channels >= Cn (the GPU leaves out's first
// Cn channels alone: they hold a sentinel that must survive). off shifts x (float4 -> fallback).
void check_conv_l2norm(int B, int T, int C, int K, int ldx, int Cn, int D, int off, uint64_t seed) {
  SCOPED_TRACE("conv+l2norm B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " K=" + std::to_string(K) + " Cn=" + std::to_string(Cn) + " D=" + std::to_string(D) +
               " off=" + std::to_string(off));
  const int N = B * T;
  auto x = randn(size_t(N) * ldx + off, seed, 1.5), w = randn(size_t(C) * std::max(K, 1), seed + 1, 0.5);
  std::vector<float> out(size_t(N) * C), y(size_t(N) * Cn), r(size_t(N) * (Cn / D));
  cpu::short_conv_l2norm_forward<float>(out.data(), y.data(), r.data(), x.data() + off, K ? w.data() : nullptr, B, T,
                                        C, K, ldx, C, Cn, D, 1e-6, Cn);
  auto X = to_device(x), W = to_device(w);
  std::vector<float> sentinel(out.size(), 7.f);
  auto Out = to_device(sentinel);
  Buffer<float> Y(y.size()), R(r.size());
  gpu::short_conv_l2norm_forward(Out.data(), Y.data(), R.data(), X.data() + off, K ? W.data() : nullptr, B, T, C, K,
                                 ldx, C, Cn, D, 1e-6, Cn);
  expect_close(Y.download(), y, kFwdAtol, kFwdRtol, "y");
  expect_close(R.download(), r, kFwdAtol, kFwdRtol, "rstd");
  expect_unnormed_close(Out.download(), out, N, C, Cn);
}

// The conv reading a piece after others (inference): prev [B, K-1, C] holds the inputs before the
// piece. CUDA against the CPU with the same prev, plain (D = 0) or with the fused L2 norm of the
// first Cn channels (heads of D); then the tail advanced past the piece on both (copies: exact).
void check_conv_carried(int B, int T, int C, int K, int ldx, int Cn, int D, uint64_t seed) {
  SCOPED_TRACE("carried conv B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " K=" + std::to_string(K) + " ldx=" + std::to_string(ldx) + " D=" + std::to_string(D));
  const int N = B * T, keep = std::max(K - 1, 0);
  auto x = randn(size_t(N) * ldx, seed, 1.5), w = randn(size_t(C) * std::max(K, 1), seed + 1, 0.5);
  auto b = randn(size_t(C), seed + 2, 0.5), prev = randn(size_t(B) * keep * C + 1, seed + 3, 1.5);
  std::vector<float> out(size_t(N) * C), y(size_t(N) * std::max(Cn, 1)), r(size_t(N) * (D ? Cn / D : 1));
  auto X = to_device(x), W = to_device(w), Bi = to_device(b), P = to_device(prev);
  Buffer<float> Out(out.size()), Y(y.size()), R(r.size());
  if (D == 0) {
    cpu::short_conv_forward<float>(out.data(), x.data(), w.data(), B, T, C, K, ldx, C, b.data(), prev.data());
    gpu::short_conv_forward(Out.data(), X.data(), W.data(), B, T, C, K, ldx, C, Bi.data(), P.data());
    expect_close(Out.download(), out, kFwdAtol, kFwdRtol, "out");
  } else {
    cpu::short_conv_l2norm_forward<float>(out.data(), y.data(), r.data(), x.data(), w.data(), B, T, C, K, ldx, C, Cn,
                                          D, 1e-6, Cn, prev.data());
    gpu::short_conv_l2norm_forward(Out.data(), Y.data(), R.data(), X.data(), W.data(), B, T, C, K, ldx, C, Cn, D, 1e-6,
                                   Cn, P.data());
    expect_close(Y.download(), y, kFwdAtol, kFwdRtol, "y (normalised channels)");
    expect_unnormed_close(Out.download(), out, N, C, Cn);
  }
  cpu::short_conv_advance_tail<float>(prev.data(), x.data(), B, T, C, K, ldx);
  gpu::short_conv_advance_tail(P.data(), X.data(), B, T, C, K, ldx);
  EXPECT_EQ(P.download(), prev) << "the tail after the piece";
}

TEST(CudaElementwise, ShortConvCarriesItsInputs) {
  LRNN_REQUIRE_GPU();
  for (int T : {1, 2, 3, 7}) {
    check_conv_carried(2, T, 40, 4, 44, 0, 0, 400 + T);   // float4 rows
    check_conv_carried(2, T, 33, 4, 33, 0, 0, 410 + T);   // scalar rows
    check_conv_carried(2, T, 24, 9, 24, 0, 0, 420 + T);   // K > 4: the general kernel
    check_conv_carried(1, T, 30, 3, 32, 0, 0, 430 + T);   // float2 rows, K = 3
    check_conv_carried(2, T, 384, 4, 392, 256, 64, 440 + T);  // fused L2 norm (heads of 64)
    check_conv_carried(2, T, 768, 4, 776, 512, 128, 450 + T);  // heads of 128: conv, then norm
  }
  check_conv_carried(2, 5, 16, 1, 16, 0, 0, 460);  // K = 1: nothing carried
}

TEST(CudaElementwise, ShortConvL2Norm) {
  LRNN_REQUIRE_GPU();
  check_conv_l2norm(64, 40, 384, 4, 388, 256, 32, 0, 80);   // the P1 DeltaNet layer (fused, D = 32)
  check_conv_l2norm(8, 37, 512, 4, 520, 384, 16, 0, 81);    // D = 16, n_h = 2 style widths
  check_conv_l2norm(5, 50, 320, 3, 320, 128, 64, 0, 82);    // D = 64, K = 3
  check_conv_l2norm(6, 21, 200, 0, 204, 96, 32, 0, 83);     // no conv (K = 0: SiLU only); C % 128 != 0
  check_conv_l2norm(4, 19, 384, 4, 388, 256, 32, 1, 84);    // misaligned: the two-op fallback
  check_conv_l2norm(3, 17, 96, 4, 96, 48, 24, 0, 85);       // D = 24: the fallback
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

// offset: the logits and dlogits start that many floats into their buffers (1: rows not 16-byte
// aligned, which the long-row kernels read without float4).
void check_cross_entropy(int N, int V, double ignore_frac, double scale, bool with_losses, bool all_ignored,
                         uint64_t seed, int offset = 0) {
  SCOPED_TRACE("cross_entropy N=" + std::to_string(N) + " V=" + std::to_string(V) +
               " all_ignored=" + std::to_string(all_ignored) + " offset=" + std::to_string(offset));
  auto logits = randn(size_t(N) * V, seed, scale);
  auto labels = rand_ints(N, seed + 1, 0, V);
  auto u = randu(N, seed + 2, 0.0, 1.0);
  for (int n = 0; n < N; ++n)
    if (all_ignored || u[n] < ignore_frac) labels[n] = -1;
  if (!all_ignored && N >= 3) labels[0] = 0, labels[1] = V - 1, labels[2] = -1;
  const double dloss = 1.7;

  std::vector<float> losses(N), dlogits(size_t(N) * V);
  const double loss = cpu::cross_entropy_forward<float>(losses.data(), logits.data(), labels.data(), N, V);
  cpu::cross_entropy_backward<float>(dlogits.data(), logits.data(), labels.data(), N, V, dloss);

  std::vector<float> padded(offset, 0.f);
  padded.insert(padded.end(), logits.begin(), logits.end());
  auto L = to_device(padded);
  auto Lab = to_device(labels);
  auto Loss = to_device(std::vector<float>{123.f});
  auto Losses = to_device(randn(N, seed + 3));
  auto Dl = to_device(randn(size_t(N) * V + offset, seed + 4));  // overwritten, not accumulated
  gpu::cross_entropy_loss(Loss.data(), with_losses ? Losses.data() : nullptr, L.data() + offset, Lab.data(), N, V);
  gpu::cross_entropy_backward(Dl.data() + offset, L.data() + offset, Lab.data(), N, V, dloss);
  expect_close(Loss.download(), {float(loss)}, 1e-6, 1e-5, "cross_entropy loss");
  if (with_losses) expect_close(Losses.download(), losses, kFwdAtol, kFwdRtol, "cross_entropy losses");
  auto dl = Dl.download();
  dl.erase(dl.begin(), dl.begin() + offset);
  expect_close(dl, dlogits, 1e-6 * std::max(1e-30f, max_abs(dlogits)), 1e-4, "cross_entropy dlogits");
  if (all_ignored) {
    EXPECT_EQ(Loss.download()[0], 0.f);
    EXPECT_EQ(max_abs(dl), 0.f);
  }
  // dlogits in bf16 (the bf16 LM head's input): the fp32 kernel's values rounded to nearest even,
  // bit for bit (the same arithmetic, then one rounding), in both layouts and at either alignment.
  std::vector<bf16> garbage(size_t(N) * V + offset);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = bf16::from_float(float(i % 7) - 3.f);
  Buffer<bf16> Dh;
  Dh.upload(garbage);
  gpu::cross_entropy_backward(Dh.data() + offset, L.data() + offset, Lab.data(), N, V, dloss);
  auto dh = Dh.download();
  size_t mismatches = 0;
  for (size_t i = 0; i < dl.size(); ++i) mismatches += dh[i + offset].bits != bf16::from_float(dl[i]).bits;
  EXPECT_EQ(mismatches, 0u) << "bf16 dlogits differ from the rounded fp32 ones";

  // The loss and the backward in one call (the training step's head): the same loss and dlogits
  // against the CPU (for long rows its logsumexp sums in another order than the two calls'), and
  // its bf16 dlogits its fp32 ones rounded, bit for bit.
  auto Loss2 = to_device(std::vector<float>{123.f});
  auto Df = to_device(randn(size_t(N) * V + offset, seed + 5));
  gpu::cross_entropy_loss_backward(Loss2.data(), Df.data() + offset, L.data() + offset, Lab.data(), N, V, dloss);
  expect_close(Loss2.download(), {float(loss)}, 1e-6, 1e-5, "fused cross_entropy loss");
  auto df = Df.download();
  df.erase(df.begin(), df.begin() + offset);
  expect_close(df, dlogits, 1e-6 * std::max(1e-30f, max_abs(dlogits)), 1e-4, "fused cross_entropy dlogits");
  Dh.upload(garbage);
  gpu::cross_entropy_loss_backward(Loss2.data(), Dh.data() + offset, L.data() + offset, Lab.data(), N, V, dloss);
  dh = Dh.download();
  mismatches = 0;
  for (size_t i = 0; i < df.size(); ++i) mismatches += dh[i + offset].bits != bf16::from_float(df[i]).bits;
  EXPECT_EQ(mismatches, 0u) << "fused bf16 dlogits differ from the rounded fp32 ones";
  if (all_ignored) EXPECT_EQ(Loss2.download()[0], 0.f);
}

TEST(CudaElementwise, CrossEntropy) {
  LRNN_REQUIRE_GPU();
  for (int V : {2, 3, 5, 8, 16, 17, 32, 64, 100}) check_cross_entropy(37, V, 0.2, 2.0, true, false, 110 + V);
  check_cross_entropy(37, 3, 0.2, 2.0, false, false, 120);   // no per-row losses
  check_cross_entropy(37, 64, 0.0, 20.0, true, false, 121);  // large logits
  check_cross_entropy(37, 5, 0.0, 2.0, true, true, 122);     // every label ignored: loss 0, dlogits 0
  check_cross_entropy(70000, 3, 0.3, 2.0, true, false, 123); // more rows than the capped grid covers at once
  check_cross_entropy(20480, 64, 0.1, 2.0, true, false, 124);
  check_cross_entropy(1, 4, 0.0, 1.0, true, false, 125);
}

// Language-model vocabularies: a block per row from V = 2048 on (float4 rows where aligned).
TEST(CudaElementwise, CrossEntropyLongRows) {
  LRNN_REQUIRE_GPU();
  check_cross_entropy(300, 32000, 0.2, 2.0, true, false, 130);  // the P2 LMs' vocabulary
  check_cross_entropy(37, 32000, 0.0, 20.0, true, false, 131);  // large logits
  check_cross_entropy(37, 2048, 0.2, 2.0, true, false, 132);    // the first V of the layout
  check_cross_entropy(41, 5003, 0.2, 2.0, true, false, 133);    // V % 4 != 0: scalar loads
  check_cross_entropy(41, 4096, 0.2, 2.0, false, false, 134, 1);  // rows not 16-byte aligned
  check_cross_entropy(19, 4096, 0.0, 2.0, true, true, 135);     // every label ignored
  check_cross_entropy(8300, 2048, 0.1, 2.0, true, false, 136);  // more rows than either grid covers
  check_cross_entropy(3, 2047, 0.0, 2.0, true, false, 137);     // the last V of a warp per row
  check_cross_entropy(5, 65536, 0.1, 2.0, true, false, 138);    // rows longer than shared memory
}

// A NaN logit makes the loss NaN in both layouts (a diverged run must show it).
TEST(CudaElementwise, CrossEntropyNaNLogit) {
  LRNN_REQUIRE_GPU();
  for (int V : {64, 4096}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const int N = 5;
    auto logits = randn(size_t(N) * V, 140, 1.0);
    logits[size_t(2) * V + 17] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> labels = {1, 2, 3, 4, 5};
    auto L = to_device(logits);
    auto Lab = to_device(labels);
    auto Loss = to_device(std::vector<float>{0.f});
    auto Losses = to_device(std::vector<float>(N, 0.f));
    gpu::cross_entropy_loss(Loss.data(), Losses.data(), L.data(), Lab.data(), N, V);
    EXPECT_TRUE(std::isnan(Loss.download()[0]));
    const auto l = Losses.download();
    EXPECT_TRUE(std::isnan(l[2]));
    EXPECT_TRUE(std::isfinite(l[1]) && std::isfinite(l[3]));
  }
}

TEST(CudaElementwise, CrossEntropyNoRows) {
  LRNN_REQUIRE_GPU();
  auto Loss = to_device(std::vector<float>{123.f});
  gpu::cross_entropy_loss(Loss.data(), nullptr, nullptr, nullptr, 0, 5);
  gpu::cross_entropy_backward(static_cast<float*>(nullptr), nullptr, nullptr, 0, 5, 1.0);
  EXPECT_EQ(Loss.download()[0], 0.f);
  Loss.upload(std::vector<float>{123.f});
  gpu::cross_entropy_loss_backward(Loss.data(), static_cast<float*>(nullptr), nullptr, nullptr, 0, 4096, 1.0);
  EXPECT_EQ(Loss.download()[0], 0.f);
}

// ---------------------------------------------------------------------------------------------
// All ops captured in one CUDA graph: nothing may allocate or synchronise inside a capture.

TEST(CudaElementwise, CapturedInCudaGraph) {
  LRNN_REQUIRE_GPU();
  const int B = 2, T = 41, N = B * T, C = 48, V = 7, H = 4, D = 12, K = 4, I = 36;
  auto tok = rand_ints(N, 200, 0, V);
  auto labels = rand_ints(N, 201, -1, V);
  auto Wemb = randn(size_t(V) * C, 202), wn = randu(C, 203, 0.5, 1.5), wc = randn(size_t(C) * K, 204, 0.5);
  auto bc = randn(C, 205, 0.3), A_log = randu(H, 206, -1.0, 1.0), dtb = randn(H, 207), wg = randu(D, 208, 0.5, 1.5);
  auto gate = randn(size_t(N) * H * D, 209, 2.0), gu = randn(size_t(N) * 2 * I, 210), logits = randn(size_t(N) * V, 211);
  auto dh = randn(size_t(N) * C, 212), dgu_out = randn(size_t(N) * I, 213), dgn = randn(size_t(N) * H * D, 214);
  auto dg_gate = randn(size_t(N) * H, 215);

  // CPU reference of the same sequence.
  std::vector<float> h(size_t(N) * C), xn(size_t(N) * C), rstd(N), conv(size_t(N) * C), qn(size_t(N) * C),
      rq(size_t(N) * C / D), fg(size_t(N) * H), on(size_t(N) * H * D), ro(size_t(N) * H), act(size_t(N) * I),
      losses(N), dlog(size_t(N) * V);
  std::vector<float> dWemb(size_t(V) * C, 0.f), dwn(C, 0.f), dwc(size_t(C) * K, 0.f), dbc(C, 0.f),
      dx(size_t(N) * C, 0.f), dconv(size_t(N) * C, 0.f), dA(H, 0.f), ddt(H, 0.f), da(size_t(N) * H, 0.f),
      dwg(D, 0.f), dxg(size_t(N) * H * D, 0.f), dgate(size_t(N) * H * D, 0.f), dgu(size_t(N) * 2 * I, 0.f);
  std::vector<float> a_log(size_t(N) * H);
  for (size_t i = 0; i < a_log.size(); ++i) a_log[i] = gate[i];
  cpu::embedding_forward<float>(h.data(), tok.data(), Wemb.data(), N, C, V);
  cpu::rmsnorm_forward<float>(xn.data(), rstd.data(), h.data(), wn.data(), N, C, 1e-5);
  cpu::short_conv_forward<float>(conv.data(), xn.data(), wc.data(), B, T, C, K, 0, 0, bc.data());
  cpu::l2norm_forward<float>(qn.data(), rq.data(), conv.data(), N, D, 1e-6, C / D);
  cpu::forget_gate_forward<float>(fg.data(), a_log.data(), A_log.data(), dtb.data(), N, H);
  cpu::gated_rmsnorm_forward<float>(on.data(), ro.data(), qn.data(), gate.data(), wg.data(), N, H, D, 1e-5);
  cpu::swiglu_forward<float>(act.data(), gu.data(), gu.data() + I, N, I, 2 * I);
  const double loss = cpu::cross_entropy_forward<float>(losses.data(), logits.data(), labels.data(), N, V);
  cpu::cross_entropy_backward<float>(dlog.data(), logits.data(), labels.data(), N, V, 1.0);
  cpu::swiglu_backward<float>(dgu.data(), dgu.data() + I, dgu_out.data(), gu.data(), gu.data() + I, N, I, 2 * I);
  cpu::gated_rmsnorm_backward<float>(dxg.data(), dgate.data(), dwg.data(), dgn.data(), qn.data(), gate.data(),
                                     wg.data(), ro.data(), N, H, D);
  cpu::forget_gate_backward<float>(da.data(), dA.data(), ddt.data(), dg_gate.data(), a_log.data(), A_log.data(),
                                   dtb.data(), N, H);
  cpu::l2norm_backward<float>(dconv.data(), dh.data(), qn.data(), rq.data(), N, D, C / D);
  cpu::short_conv_backward<float>(dx.data(), dwc.data(), dconv.data(), xn.data(), wc.data(), B, T, C, K, 0, 0,
                                  bc.data(), dbc.data());
  std::vector<float> dh2(size_t(N) * C, 0.f);
  cpu::rmsnorm_backward<float>(dh2.data(), dwn.data(), dx.data(), h.data(), wn.data(), rstd.data(), N, C);
  cpu::embedding_backward<float>(dWemb.data(), dh2.data(), tok.data(), N, C, V);

  // The same on the GPU, captured once and replayed.
  auto zeros = [](size_t n) { return to_device(std::vector<float>(n, 0.f)); };
  auto Tok = to_device(tok), Lab = to_device(labels);
  auto dWe = to_device(Wemb), dWn = to_device(wn), dWc = to_device(wc), dBc = to_device(bc), dAl = to_device(A_log),
       dDtb = to_device(dtb), dWg = to_device(wg), dGate = to_device(gate), dGu = to_device(gu),
       dLogits = to_device(logits), dDh = to_device(dh), dDguOut = to_device(dgu_out), dDgn = to_device(dgn),
       dDgGate = to_device(dg_gate), dAlog = to_device(a_log);
  auto H_ = zeros(h.size()), Xn = zeros(xn.size()), Rstd = zeros(N), Conv = zeros(conv.size()), Qn = zeros(qn.size()),
       Rq = zeros(rq.size()), Fg = zeros(fg.size()), On = zeros(on.size()), Ro = zeros(ro.size()),
       Act = zeros(act.size()), Loss = zeros(1), Losses = zeros(N), Dlog = zeros(dlog.size());
  auto GWe = zeros(dWemb.size()), GWn = zeros(C), GWc = zeros(dwc.size()), GBc = zeros(C), GA = zeros(H),
       GDt = zeros(H), Da = zeros(da.size()), GWg = zeros(D), Dxg = zeros(dxg.size()), Dgate = zeros(dgate.size()),
       Dgu = zeros(dgu.size()), Dconv = zeros(dconv.size()), Dx = zeros(dx.size()), Dh2 = zeros(dh2.size());

  cudaStream_t s = lrnn::cuda::stream();
  lrnn::cuda::scratch(1);  // the context (and its scratch) exists before the capture
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  gpu::embedding_forward(H_.data(), Tok.data(), dWe.data(), N, C, V);
  gpu::rmsnorm_forward(Xn.data(), Rstd.data(), H_.data(), dWn.data(), N, C, 1e-5);
  gpu::short_conv_forward(Conv.data(), Xn.data(), dWc.data(), B, T, C, K, 0, 0, dBc.data());
  gpu::l2norm_forward(Qn.data(), Rq.data(), Conv.data(), N, D, 1e-6, C / D);
  gpu::forget_gate_forward(Fg.data(), dAlog.data(), dAl.data(), dDtb.data(), N, H);
  gpu::gated_rmsnorm_forward(On.data(), Ro.data(), Qn.data(), dGate.data(), dWg.data(), N, H, D, 1e-5);
  gpu::swiglu_forward(Act.data(), dGu.data(), dGu.data() + I, N, I, 2 * I);
  gpu::cross_entropy_loss(Loss.data(), Losses.data(), dLogits.data(), Lab.data(), N, V);
  gpu::cross_entropy_backward(Dlog.data(), dLogits.data(), Lab.data(), N, V, 1.0);
  gpu::swiglu_backward(Dgu.data(), Dgu.data() + I, dDguOut.data(), dGu.data(), dGu.data() + I, N, I, 2 * I);
  gpu::gated_rmsnorm_backward(Dxg.data(), Dgate.data(), GWg.data(), dDgn.data(), Qn.data(), dGate.data(), dWg.data(),
                              Ro.data(), N, H, D);
  gpu::forget_gate_backward(Da.data(), GA.data(), GDt.data(), dDgGate.data(), dAlog.data(), dAl.data(), dDtb.data(),
                            N, H);
  gpu::l2norm_backward(Dconv.data(), dDh.data(), Qn.data(), Rq.data(), N, D, C / D);
  gpu::short_conv_backward(Dx.data(), GWc.data(), Dconv.data(), Xn.data(), dWc.data(), B, T, C, K, 0, 0, dBc.data(),
                           GBc.data());
  gpu::rmsnorm_backward(Dh2.data(), GWn.data(), Dx.data(), H_.data(), dWn.data(), Rstd.data(), N, C);
  gpu::embedding_backward(GWe.data(), Dh2.data(), Tok.data(), N, C, V);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  lrnn::cuda::synchronize();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // Chained ops pass small differences on: slightly wider tolerances than the single-op tests.
  expect_close(H_.download(), h, 0, 0, "graph: embedding");
  expect_close(Xn.download(), xn, kFwdAtol, kFwdRtol, "graph: rmsnorm");
  expect_close(Conv.download(), conv, 1e-4, 1e-4, "graph: short_conv");
  expect_close(Qn.download(), qn, 1e-4, 1e-4, "graph: l2norm");
  expect_close(Fg.download(), fg, kFwdAtol, kFwdRtol, "graph: forget_gate");
  expect_close(On.download(), on, 1e-4, 1e-4, "graph: gated_rmsnorm");
  expect_close(Act.download(), act, kFwdAtol, kFwdRtol, "graph: swiglu");
  expect_close(Loss.download(), {float(loss)}, 1e-6, 1e-5, "graph: loss");
  expect_close(Losses.download(), losses, kFwdAtol, kFwdRtol, "graph: losses");
  expect_close(Dlog.download(), dlog, 1e-7, 1e-4, "graph: dlogits");
  expect_close(Dgu.download(), dgu, kGradAtol, kGradRtol, "graph: dgate|dup");
  expect_close(Dxg.download(), dxg, 1e-4, 1e-3, "graph: gated_rmsnorm dx");
  expect_close(Dgate.download(), dgate, 1e-4, 1e-3, "graph: gated_rmsnorm dg");
  expect_close(GWg.download(), dwg, 1e-3, 1e-3, "graph: gated_rmsnorm dw");
  expect_close(Da.download(), da, kGradAtol, kGradRtol, "graph: forget_gate da");
  expect_close(GA.download(), dA, 1e-3, 1e-3, "graph: dA_log");
  expect_close(GDt.download(), ddt, 1e-3, 1e-3, "graph: ddt_bias");
  expect_close(Dconv.download(), dconv, 1e-4, 1e-3, "graph: l2norm dx");
  expect_close(Dx.download(), dx, 1e-4, 1e-3, "graph: short_conv dx");
  expect_close(GWc.download(), dwc, 1e-3, 1e-3, "graph: short_conv dw");
  expect_close(GBc.download(), dbc, 1e-3, 1e-3, "graph: short_conv dbias");
  expect_close(Dh2.download(), dh2, 1e-3, 1e-3, "graph: rmsnorm dx");
  expect_close(GWn.download(), dwn, 1e-3, 1e-3, "graph: rmsnorm dw");
  expect_close(GWe.download(), dWemb, 1e-3, 1e-3, "graph: embedding dW");
}

}  // namespace
