// cuBLAS linear layer, the residual add and the device optimizer step against the CPU reference.
// Tolerances: fp32 GEMMs (pedantic) differ from OpenBLAS only by summation order, ~K * 2^-24
// relative to the magnitudes (K <= 512: 1e-5 relative, with an absolute floor for values near 0);
// TF32 rounds inputs to 10 mantissa bits (2^-11 ~ 5e-4 relative per product; sums of K random
// terms average out, so 3e-3 relative to the row scale holds).
#include "cuda_test_util.h"
#include "ops/adamw/adamw.h"
#include "ops/adamw/adamw_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"

using namespace lrnn;
using namespace lrnn::testing;

namespace {

struct LinearCase {
  int N, IC, OC;
  bool bias;
};

void check_linear(const LinearCase& c, cuda::GemmPrecision prec, double rtol) {
  cuda::set_gemm_precision(prec);
  auto x = randn(size_t(c.N) * c.IC, 1), W = randn(size_t(c.OC) * c.IC, 2, 0.1), b = randn(c.OC, 3);
  auto dy = randn(size_t(c.N) * c.OC, 4);
  auto dx0 = randn(x.size(), 5), dW0 = randn(W.size(), 6), db0 = randn(c.OC, 7);
  std::vector<float> y(size_t(c.N) * c.OC), dx = dx0, dW = dW0, db = db0;
  ops::linear_forward<float>(y.data(), x.data(), W.data(), c.bias ? b.data() : nullptr, c.N, c.IC, c.OC);
  ops::linear_backward<float>(dx.data(), dW.data(), c.bias ? db.data() : nullptr, dy.data(), x.data(), W.data(), c.N,
                              c.IC, c.OC);
  auto gx = to_device(x), gW = to_device(W), gb = to_device(b), gdy = to_device(dy);
  auto gdx = to_device(dx0), gdW = to_device(dW0), gdb = to_device(db0);
  cuda::Buffer<float> gy(y.size());
  ops::cuda::linear_forward(gy.data(), gx.data(), gW.data(), c.bias ? gb.data() : nullptr, c.N, c.IC, c.OC);
  ops::cuda::linear_backward(gdx.data(), gdW.data(), c.bias ? gdb.data() : nullptr, gdy.data(), gx.data(), gW.data(),
                             c.N, c.IC, c.OC);
  std::string what = "N=" + std::to_string(c.N) + " IC=" + std::to_string(c.IC) + " OC=" + std::to_string(c.OC);
  // Scales: |y| ~ sqrt(IC) * 0.1, |dx| ~ sqrt(OC) * 0.1 + 1, |dW| ~ sqrt(N).
  expect_close(gy.download(), y, rtol * std::sqrt(double(c.IC)) * 0.1, rtol, what + " y");
  expect_close(gdx.download(), dx, rtol * (std::sqrt(double(c.OC)) * 0.1 + 1), rtol, what + " dx");
  expect_close(gdW.download(), dW, rtol * std::sqrt(double(c.N)), rtol, what + " dW");
  if (c.bias) expect_close(gdb.download(), db, rtol * std::sqrt(double(c.N)), rtol, what + " db");
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}

}  // namespace

TEST(LinearCuda, MatchesCpuInFp32) {
  LRNN_REQUIRE_GPU();
  for (auto c : {LinearCase{10240, 128, 388, false}, LinearCase{37, 129, 3, true}, LinearCase{1, 512, 128, true},
                 LinearCase{2048, 512, 128, false}})
    check_linear(c, cuda::GemmPrecision::FP32, 2e-5);
}

TEST(LinearCuda, MatchesCpuInTf32) {
  LRNN_REQUIRE_GPU();
  for (auto c : {LinearCase{10240, 128, 1024, false}, LinearCase{37, 129, 3, true}})
    check_linear(c, cuda::GemmPrecision::TF32, 5e-3);
}

TEST(ElementwiseCuda, AddInplaceAnyAlignment) {
  LRNN_REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(7), size_t(1024), size_t(100003)}) {
    auto a = randn(n + 1, 1), b = randn(n + 1, 2);
    auto ga = to_device(a), gb = to_device(b);
    // Offset by one element: not 16-byte aligned, takes the scalar path.
    ops::cuda::add_inplace(ga.data() + 1, gb.data() + 1, n);
    ops::cuda::add_inplace(ga.data(), gb.data(), 0);
    for (size_t i = 1; i <= n; ++i) a[i] += b[i];
    expect_close(ga.download(), a, 0, 0, "add n=" + std::to_string(n));
  }
}

// Several optimizer steps on the device against the CPU's global_norm / clip / adamw_update,
// including a non-finite step that must be skipped without touching anything. The buffers start
// 16-byte aligned (groups of four floats, with a tail of P % 4) and one float further (one by one).
TEST(AdamWCuda, StepsMatchCpuAndSkipNonFinite) {
  LRNN_REQUIRE_GPU();
  const size_t P = 100003;
  for (size_t off : {size_t(0), size_t(1)}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    auto p = randn(P, 1), m = std::vector<float>(P, 0.f), v = std::vector<float>(P, 0.f);
    std::vector<uint8_t> mask(P);
    for (size_t i = 0; i < P; ++i) mask[i] = i % 3 != 0;
    auto shifted = [&](const auto& x) {  // a device copy whose element 0 sits at index off
      std::decay_t<decltype(x)> y(off);
      y.insert(y.end(), x.begin(), x.end());
      return to_device(y);
    };
    const std::vector<float> lr_table = {1e-2f, 5e-3f, 2e-3f, 1e-3f};
    const double clip = 1.0, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    auto gp = shifted(p), gm = shifted(m), gv = shifted(v), glr = to_device(lr_table);
    auto gmask = shifted(mask);
    auto tail = [&](const auto& g) { return std::vector<float>(g.begin() + off, g.end()); };
    ops::cuda::StepStats s0{};
    cuda::Buffer<ops::cuda::StepStats> gs;
    gs.upload(&s0, 1);
    int64_t adam_step = 0;
    const float losses[] = {1.5f, NAN, 1.2f, 1.1f};
    for (int step = 0; step < 4; ++step) {
      auto g = randn(P, 100 + step, step == 2 ? 0.001 : 0.05);  // step 2: below the clip threshold
      if (step == 1) g[P / 2] = INFINITY;
      auto gg = shifted(g);
      auto gloss = to_device(std::vector<float>{losses[step]});
      ops::cuda::optimizer_prepare(gs.data(), gloss.data(), gg.data() + off, P, glr.data(),
                                   int64_t(lr_table.size()), clip);
      ops::cuda::adamw_update(gp.data() + off, gg.data() + off, gm.data() + off, gv.data() + off,
                              gmask.data() + off, P, gs.data(), b1, b2, eps, wd);
      // CPU
      double norm = ops::global_norm(g.data(), P);
      auto st = gs.download()[0];
      EXPECT_EQ(st.step, step + 1);
      if (step == 1) {
        EXPECT_EQ(st.finite, 0);
        EXPECT_EQ(st.skipped, 1);
        EXPECT_TRUE(tail(gp.download()) == p);
        continue;
      }
      EXPECT_EQ(st.finite, 1);
      EXPECT_NEAR(st.norm, norm, 1e-5 * norm);
      EXPECT_FLOAT_EQ(st.lr, lr_table[step]);
      ops::clip_by_global_norm(g.data(), P, norm, clip);
      ops::AdamWParams ap{lr_table[step], b1, b2, eps, wd, ++adam_step};
      ops::adamw_update(p.data(), g.data(), m.data(), v.data(), mask.data(), P, ap);
      EXPECT_EQ(st.adam_step, adam_step);
      expect_close(tail(gp.download()), p, 1e-6, 1e-5, "params after step " + std::to_string(step));
      expect_close(tail(gm.download()), m, 1e-7, 1e-5, "m after step " + std::to_string(step));
      expect_close(tail(gv.download()), v, 1e-9, 1e-5, "v after step " + std::to_string(step));
    }
    auto st = gs.download()[0];
    EXPECT_EQ(st.loss_n, 3);
    EXPECT_NEAR(st.loss_sum, 1.5 + 1.2 + 1.1, 1e-6);
  }
}

// A step whose loss and gradient are finite but whose update would not be (a corrupt negative
// second moment; a huge finite gradient whose square overflows) is skipped on the device too:
// counted, nothing written, the counters of an applied step taken back.
TEST(AdamWCuda, UpdateThatWouldNotBeFiniteIsSkipped) {
  LRNN_REQUIRE_GPU();
  const size_t P = 70001;
  auto p = randn(P, 7), m = std::vector<float>(P, 0.f), v = std::vector<float>(P, 0.f);
  std::vector<uint8_t> mask(P, 1);
  const std::vector<float> lr_table = {1e-3f, 1e-3f, 1e-3f};
  auto gp = to_device(p), gm = to_device(m), gv = to_device(v), glr = to_device(lr_table);
  auto gmask = to_device(mask);
  ops::cuda::StepStats s0{};
  cuda::Buffer<ops::cuda::StepStats> gs;
  gs.upload(&s0, 1);
  auto gloss = to_device(std::vector<float>{1.0f});
  for (int step = 0; step < 3; ++step) {
    auto g = randn(P, 40 + step, 0.05);
    if (step == 0) v[P / 3] = -1.f;   // corrupt moment
    if (step == 1) g[P / 2] = 1e30f;  // finite, but g^2 overflows
    gv.upload(v);
    auto gg = to_device(g);
    ops::cuda::optimizer_prepare(gs.data(), gloss.data(), gg.data(), P, glr.data(), 3, 0.0);
    ops::cuda::adamw_update(gp.data(), gg.data(), gm.data(), gv.data(), gmask.data(), P, gs.data(), 0.9, 0.999, 1e-8,
                            0.1);
    auto st = gs.download()[0];
    EXPECT_EQ(st.finite, step == 2 ? 1 : 0) << "step " << step;
    EXPECT_EQ(st.skipped, step < 2 ? step + 1 : 2);
    EXPECT_EQ(st.adam_step, step == 2 ? 1 : 0);
    EXPECT_EQ(st.loss_n, step == 2 ? 1 : 0);
    if (step < 2) {  // nothing written
      EXPECT_TRUE(gp.download() == p);
      EXPECT_TRUE(gm.download() == m);
    }
    if (step == 0) v[P / 3] = 0.f;
  }
}

// out = inp W^T + res by cuBLASLt's epilogue against the CPU (linear_forward, then the add): fp32
// GEMMs, TF32, an odd shape, misaligned pointers (another plan), and out == res (the fallback).
TEST(LinearCuda, ResidualEpilogue) {
  LRNN_REQUIRE_GPU();
  struct Case {
    int N, IC, OC, off;
    cuda::GemmPrecision prec;
    double rtol;
  };
  for (const Case& c : {Case{2048, 512, 128, 0, cuda::GemmPrecision::FP32, 2e-5},
                        Case{2048, 128, 128, 0, cuda::GemmPrecision::TF32, 5e-3},
                        Case{37, 129, 65, 1, cuda::GemmPrecision::FP32, 2e-5}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " IC=" + std::to_string(c.IC) + " OC=" + std::to_string(c.OC) +
                 " off=" + std::to_string(c.off));
    cuda::set_gemm_precision(c.prec);
    auto x = randn(size_t(c.N) * c.IC + c.off, 1), W = randn(size_t(c.OC) * c.IC + c.off, 2, 0.1);
    auto r = randn(size_t(c.N) * c.OC + c.off, 3);
    std::vector<float> y(size_t(c.N) * c.OC);
    ops::linear_forward_residual<float>(y.data(), x.data() + c.off, W.data() + c.off, r.data() + c.off, c.N, c.IC,
                                        c.OC);
    auto gx = to_device(x), gW = to_device(W), gr = to_device(r);
    cuda::Buffer<float> gy(y.size() + c.off);
    ops::cuda::linear_forward_residual(gy.data() + c.off, gx.data() + c.off, gW.data() + c.off, gr.data() + c.off,
                                       c.N, c.IC, c.OC);
    auto got = gy.download();
    got.erase(got.begin(), got.begin() + c.off);
    const double atol = c.rtol * (std::sqrt(double(c.IC)) * 0.1 + 1);
    expect_close(got, y, atol, c.rtol, "out");
    // In place (out == res): the same sums.
    ops::cuda::linear_forward_residual(gr.data() + c.off, gx.data() + c.off, gW.data() + c.off, gr.data() + c.off,
                                       c.N, c.IC, c.OC);
    auto inplace = gr.download();
    inplace.erase(inplace.begin(), inplace.begin() + c.off);
    expect_close(inplace, y, atol, c.rtol, "out == res");
  }
  cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
}
