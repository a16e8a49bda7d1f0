// The mixed-precision CUDA ops (bf16 storage, fp32 arithmetic) against the CPU reference run in
// fp32 on the same bf16-rounded inputs: the bf16 conversion, RMSNorm with bf16 output, SwiGLU
// over bf16, and the bf16 linear layer (cuBLAS, fp32 accumulation). Skipped without a GPU.
//
// Tolerances follow from the storage: an input rounded to bf16 is exact on both sides (the CPU
// gets the same rounded values), so the only differences are
//   - a result stored in bf16: rounding to 8 mantissa bits, and the fp32 values before rounding
//     may differ in their last bits, so the two sides can round to neighbouring bf16 values: one
//     ulp, which is up to 2^-7 relative (just above a power of two);
//   - a result kept in fp32 (bf16 GEMMs with fp32 output, dW): bf16 x bf16 products are exact in
//     fp32, so only the summation order differs: rtol 1e-4 relative to the row's scale.
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace cpu = lrnn::ops;
namespace gpu = lrnn::ops::cuda;
using lrnn::bf16;
using lrnn::cuda::Buffer;
using lrnn::testing::expect_close;
using lrnn::testing::randn;
using lrnn::testing::to_device;

namespace {

constexpr double kUlp = 1.0 / 128;  // one bf16 ulp, relative, at worst

std::vector<bf16> to_bf(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16::from_float(v[i]);
  return r;
}
std::vector<float> to_f(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = v[i].to_float();
  return r;
}
// The values a bf16 tensor holds, as floats (what the CPU reference computes on).
std::vector<float> rounded(const std::vector<float>& v) { return to_f(to_bf(v)); }

}  // namespace

TEST(Bf16Cuda, ConversionRoundsToNearestEven) {
  LRNN_REQUIRE_GPU();
  auto x = randn(100003, 1, 3.0);
  // Ties (exactly half an ulp: both directions), the extremes, signed zero, inf, NaN.
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f, 1e-40f, -0.0f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 65504.f, 1.17549435e-38f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 7] = specials[i];
  for (int off : {0, 1, 3}) {  // aligned float4 path, and the misaligned scalar path
    SCOPED_TRACE("offset " + std::to_string(off));
    const size_t n = x.size() - off;
    auto X = to_device(x);
    Buffer<bf16> Y(n);
    gpu::to_bf16(Y.data(), X.data() + off, n);
    auto y = Y.download();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const bf16 want = bf16::from_float(x[off + i]);
      const bool nan = std::isnan(x[off + i]);
      if (nan ? !std::isnan(y[i].to_float()) : y[i].bits != want.bits) ++bad;
    }
    EXPECT_EQ(bad, 0u);
  }
}

TEST(Bf16Cuda, RmsNormWithBf16Output) {
  LRNN_REQUIRE_GPU();
  for (auto [N, C] : {std::pair{2048, 128}, std::pair{37, 129}, std::pair{64, 32}, std::pair{5, 2000}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    auto x = randn(size_t(N) * C, 2, 2.0), w = randn(C, 3, 0.5);
    std::vector<float> out(x.size()), rstd(N);
    cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
    auto X = to_device(x), W = to_device(w);
    Buffer<bf16> Out(x.size());
    Buffer<float> R(N);
    gpu::rmsnorm_forward(Out.data(), R.data(), X.data(), W.data(), N, C, 1e-6);
    expect_close(to_f(Out.download()), rounded(out), 1e-30, kUlp, "bf16 rmsnorm out");
    expect_close(R.download(), rstd, 1e-6, 1e-5, "rstd");
  }
}

// gate | up as the two halves of one [N, 2I] buffer (the MLP's layout) or, with ld = I, two
// buffers; backward overwriting and accumulating.
void check_swiglu_bf16(int N, int I, bool fused, int off, uint64_t seed) {
  SCOPED_TRACE("swiglu bf16 N=" + std::to_string(N) + " I=" + std::to_string(I) + (fused ? " fused" : " split") +
               " off=" + std::to_string(off));
  const int ld = fused ? 2 * I : I;
  const size_t n = size_t(N) * ld + off;
  auto g = rounded(randn(n, seed, 2.0)), u = rounded(randn(n, seed + 1));
  auto d = rounded(randn(size_t(N) * I, seed + 2));
  auto d0 = rounded(randn(n, seed + 3)), e0 = rounded(randn(n, seed + 4));
  const size_t go = off, uo = fused ? off + I : off;
  float* up_h = fused ? g.data() + uo : u.data() + uo;
  std::vector<float> out(size_t(N) * I), dg(n, 0.f), du(n, 0.f), dga = d0, dua = e0;
  cpu::swiglu_forward<float>(out.data(), g.data() + go, up_h, N, I, ld);
  cpu::swiglu_backward<float>(dg.data() + go, (fused ? dg.data() : du.data()) + uo, d.data(), g.data() + go, up_h,
                              N, I, ld);
  cpu::swiglu_backward<float>(dga.data() + go, (fused ? dga.data() : dua.data()) + uo, d.data(), g.data() + go, up_h,
                              N, I, ld);

  Buffer<bf16> G, U, D, Out(size_t(N) * I), Dg, Du, Dga, Dua;
  G.upload(to_bf(g)), U.upload(to_bf(u)), D.upload(to_bf(d));
  Dg.upload(to_bf(d0)), Du.upload(to_bf(e0)), Dga.upload(to_bf(d0)), Dua.upload(to_bf(e0));
  const bf16* up_d = fused ? G.data() + uo : U.data() + uo;
  gpu::swiglu_forward(Out.data(), G.data() + go, up_d, N, I, ld);
  gpu::swiglu_backward(Dg.data() + go, (fused ? Dg.data() : Du.data()) + uo, D.data(), G.data() + go, up_d, N, I, ld,
                       false);
  gpu::swiglu_backward(Dga.data() + go, (fused ? Dga.data() : Dua.data()) + uo, D.data(), G.data() + go, up_d, N, I,
                       ld, true);
  // atol: the fp32 arithmetic before rounding differs by fp32 ulps of the O(1) terms, which
  // shows where a result cancels to near 0.
  constexpr double kAtol = 1e-6;
  expect_close(to_f(Out.download()), rounded(out), kAtol, kUlp, "out");
  // Overwrite: the op's elements as computed from 0; the rest (padding) keeps d0 / e0.
  std::vector<float> want_g = d0, want_u = e0;
  for (int r = 0; r < N; ++r)
    for (int i = 0; i < I; ++i) {
      const size_t k = size_t(r) * ld + i;
      want_g[go + k] = dg[go + k];
      (fused ? want_g : want_u)[uo + k] = (fused ? dg : du)[uo + k];
    }
  expect_close(to_f(Dg.download()), rounded(want_g), kAtol, kUlp, "dgate (overwrite)");
  if (!fused) expect_close(to_f(Du.download()), rounded(want_u), kAtol, kUlp, "dup (overwrite)");
  // Accumulate: the old bf16 value plus the gradient, rounded once.
  expect_close(to_f(Dga.download()), rounded(dga), kAtol, kUlp, "dgate (accumulate)");
  if (!fused) expect_close(to_f(Dua.download()), rounded(dua), kAtol, kUlp, "dup (accumulate)");
}

TEST(Bf16Cuda, SwiGlu) {
  LRNN_REQUIRE_GPU();
  check_swiglu_bf16(2048, 512, true, 0, 10);  // the MLP's layout: 16-byte path
  check_swiglu_bf16(37, 64, false, 0, 11);    // two buffers, 16-byte path
  check_swiglu_bf16(37, 129, true, 0, 12);    // I % 8 != 0: scalar path
  check_swiglu_bf16(20, 64, true, 1, 13);     // misaligned: scalar path
}

// out = inp W^T in bf16 and in fp32; dinp in bf16 (overwrite) and fp32 (accumulate); dW fp32
// (accumulate).
void check_linear_bf16(int N, int IC, int OC, uint64_t seed) {
  SCOPED_TRACE("linear bf16 N=" + std::to_string(N) + " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC));
  auto x = rounded(randn(size_t(N) * IC, seed)), W = rounded(randn(size_t(OC) * IC, seed + 1, 0.1));
  auto dy = rounded(randn(size_t(N) * OC, seed + 2));
  auto dx0 = randn(x.size(), seed + 3), dW0 = randn(W.size(), seed + 4);
  std::vector<float> y(size_t(N) * OC), dx(x.size(), 0.f), dxa = dx0, dW = dW0;
  cpu::linear_forward<float>(y.data(), x.data(), W.data(), nullptr, N, IC, OC);
  cpu::linear_backward<float>(dx.data(), dW.data(), nullptr, dy.data(), x.data(), W.data(), N, IC, OC);
  cpu::linear_backward<float>(dxa.data(), nullptr, nullptr, dy.data(), x.data(), W.data(), N, IC, OC);

  Buffer<bf16> X, Wb, Dy, Yh(y.size()), Dxh(x.size());
  X.upload(to_bf(x)), Wb.upload(to_bf(W)), Dy.upload(to_bf(dy));
  Buffer<float> Y(y.size());
  auto Dx = to_device(dx0), DW = to_device(dW0);
  gpu::linear_forward(Yh.data(), X.data(), Wb.data(), N, IC, OC);
  gpu::linear_forward(Y.data(), X.data(), Wb.data(), N, IC, OC);
  gpu::linear_backward(Dxh.data(), DW.data(), Dy.data(), X.data(), Wb.data(), N, IC, OC, false);
  gpu::linear_backward(Dx.data(), nullptr, Dy.data(), X.data(), Wb.data(), N, IC, OC, true);
  // Scales: |y| ~ 0.1 sqrt(IC), |dx| ~ 0.1 sqrt(OC), |dW| ~ sqrt(N).
  const double sy = 0.1 * std::sqrt(double(IC)), sx = 0.1 * std::sqrt(double(OC)), sw = std::sqrt(double(N));
  expect_close(Y.download(), y, 1e-4 * sy, 1e-4, "y (fp32)");
  expect_close(to_f(Yh.download()), rounded(y), 1e-4 * sy, kUlp, "y (bf16)");
  expect_close(to_f(Dxh.download()), rounded(dx), 1e-4 * sx, kUlp, "dx (bf16, overwrite)");
  expect_close(Dx.download(), dxa, 1e-4 * (sx + 1), 1e-4, "dx (fp32, accumulate)");
  expect_close(DW.download(), dW, 1e-4 * sw, 1e-4, "dW (fp32, accumulate)");
  // With the residual epilogue (cuBLASLt): y + res in fp32.
  auto res = randn(y.size(), seed + 5);
  auto Res = to_device(res);
  std::vector<float> yr = y;
  for (size_t i = 0; i < yr.size(); ++i) yr[i] += res[i];
  gpu::linear_forward_residual(Y.data(), X.data(), Wb.data(), Res.data(), N, IC, OC);
  expect_close(Y.download(), yr, 1e-4 * (sy + 1), 1e-4, "y + res (fp32)");
}

TEST(Bf16Cuda, Linear) {
  LRNN_REQUIRE_GPU();
  check_linear_bf16(2048, 128, 1024, 20);  // the MLP's gate|up
  check_linear_bf16(2048, 512, 128, 21);   // its down projection
  check_linear_bf16(37, 129, 3, 22);       // odd sizes
}
