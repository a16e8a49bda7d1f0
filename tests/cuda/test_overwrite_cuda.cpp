// The overwrite mode of the CUDA backward ops (accumulate = false): linear, swiglu, geglu, gated
// RMSNorm and the forget gate. On the GPU the input gradients start out NaN and must come out
// as the CPU reference's zero-filled + accumulate (within the tolerances of
// test_elementwise_cuda.cpp / test_linear_adamw_cuda.cpp), and as the GPU's own zero-filled +
// accumulate: exactly for the element- and row-wise ops (the same arithmetic onto 0), within the
// fp32 GEMM tolerance for linear (cuBLAS may pick another kernel for beta 0). Parameter
// gradients start from the same random values everywhere and must keep accumulating. Elements
// of a strided layout that the op does not own hold a sentinel and must keep it. Skipped without
// a GPU.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>
#include "cuda_test_util.h"
#include "ops/forget_gate/forget_gate.h"
#include "ops/forget_gate/forget_gate_cuda.h"
#include "ops/gated_rmsnorm/gated_rmsnorm.h"
#include "ops/gated_rmsnorm/gated_rmsnorm_cuda.h"
#include "ops/geglu/geglu.h"
#include "ops/geglu/geglu_cuda.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace cpu = lrnn::ops;
namespace gpu = lrnn::ops::cuda;
using lrnn::cuda::Buffer;
using lrnn::testing::expect_close;
using lrnn::testing::randn;
using lrnn::testing::randu;

namespace {

using HostBufs = std::vector<std::vector<float>>;
using DevPtrs = std::vector<float*>;

// A device copy that std::function can hold.
std::shared_ptr<Buffer<float>> dev(const std::vector<float>& v) {
  auto b = std::make_shared<Buffer<float>>();
  b->upload(v);
  return b;
}

struct Case {
  std::string name;
  std::vector<std::vector<char>> written;  // per input gradient: 1 where the op writes
  std::vector<size_t> param_sizes;
  double grad_atol, grad_rtol;    // input gradients against the CPU reference
  double param_atol, param_rtol;  // parameter gradients (sums over tokens), against CPU and GPU
  bool exact;                     // GPU overwrite == GPU zero-filled + accumulate, exactly
  std::function<void(HostBufs&, HostBufs&, bool)> cpu;
  std::function<void(DevPtrs&, DevPtrs&, bool)> gpu;
};

// A row-major [rows, ld] mask with columns [c0, c1) set.
std::vector<char> cols(int rows, int ld, int c0, int c1) {
  std::vector<char> m(size_t(rows) * ld, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = c0; c < c1; ++c) m[size_t(r) * ld + c] = 1;
  return m;
}
std::vector<char> all(size_t n) { return std::vector<char>(n, 1); }

// test_elementwise_cuda.cpp's absolute tolerance for a sum over tokens: 1e-5 + 4e-6 S, S = the
// largest sum of |terms| of one output.
double sum_atol(const std::vector<double>& abs_terms) {
  double S = 0;
  for (double v : abs_terms) S = std::max(S, v);
  return 1e-5 + 4e-6 * S;
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const float nan = std::numeric_limits<float>::quiet_NaN(), sentinel = 7.25f;
  auto inputs = [&](float fill) {
    HostBufs v;
    for (const auto& m : c.written) {
      std::vector<float> b(m.size());
      for (size_t i = 0; i < m.size(); ++i) b[i] = m[i] ? fill : sentinel;
      v.push_back(std::move(b));
    }
    return v;
  };
  HostBufs p0;
  for (size_t k = 0; k < c.param_sizes.size(); ++k) p0.push_back(randn(c.param_sizes[k], seed + 100 + k));
  // CPU reference: zero-filled + accumulate.
  HostBufs ref_in = inputs(0.f), ref_p = p0;
  c.cpu(ref_in, ref_p, true);
  // GPU: overwrite over NaN (o) and zero-filled + accumulate (a), the same parameter prefill.
  auto upload = [](const HostBufs& h) {
    std::vector<std::shared_ptr<Buffer<float>>> d;
    for (const auto& v : h) d.push_back(dev(v));
    return d;
  };
  auto ptrs = [](std::vector<std::shared_ptr<Buffer<float>>>& d) {
    DevPtrs p;
    for (auto& b : d) p.push_back(b->data());
    return p;
  };
  auto o_in = upload(inputs(nan)), o_p = upload(p0), a_in = upload(inputs(0.f)), a_p = upload(p0);
  DevPtrs oi = ptrs(o_in), op = ptrs(o_p), ai = ptrs(a_in), ap = ptrs(a_p);
  c.gpu(oi, op, false);
  c.gpu(ai, ap, true);
  lrnn::cuda::synchronize();
  for (size_t k = 0; k < ref_in.size(); ++k) {
    const std::string what = "input gradient " + std::to_string(k);
    auto got = o_in[k]->download(), acc = a_in[k]->download();
    expect_close(got, ref_in[k], c.grad_atol, c.grad_rtol, what + " vs CPU");  // NaN fails here
    if (c.exact) expect_close(got, acc, 0, 0, what + " vs GPU zero-filled + accumulate");
    else expect_close(got, acc, c.grad_atol, c.grad_rtol, what + " vs GPU zero-filled + accumulate");
    size_t moved = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!c.written[k][i]) {
        EXPECT_EQ(got[i], sentinel) << what << ": element " << i << " is not the op's but was written";
      }
      moved += c.written[k][i] && ref_in[k][i] != 0.f;
    }
    EXPECT_GT(moved, 0u) << what << " is all zero: the case checks nothing";
  }
  for (size_t k = 0; k < ref_p.size(); ++k) {
    const std::string what = "parameter gradient " + std::to_string(k);
    auto got = o_p[k]->download();
    expect_close(got, ref_p[k], c.param_atol, c.param_rtol, what + " vs CPU");
    // Both sides carry fp32 summation error (atomics in another order): twice the tolerance.
    expect_close(got, a_p[k]->download(), 2 * c.param_atol, 2 * c.param_rtol, what + " vs GPU accumulate");
  }
}

// ---- linear ----

Case linear_case(int N, int IC, int OC, bool bias, lrnn::cuda::GemmPrecision prec, uint64_t seed) {
  auto x = randn(size_t(N) * IC, seed), W = randn(size_t(OC) * IC, seed + 1, 0.1), dy = randn(size_t(N) * OC, seed + 2);
  auto gx = dev(x), gW = dev(W), gdy = dev(dy);
  const bool fp32 = prec == lrnn::cuda::GemmPrecision::FP32;
  const double rtol = fp32 ? 2e-5 : 5e-3;  // test_linear_adamw_cuda.cpp's
  Case c;
  c.name = "linear N=" + std::to_string(N) + " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC) +
           (bias ? " bias" : "") + (fp32 ? " fp32" : " tf32");
  c.written = {all(size_t(N) * IC)};
  c.param_sizes = {W.size()};
  if (bias) c.param_sizes.push_back(size_t(OC));
  // Scales: |dx| ~ sqrt(OC) * 0.1, |dW| and |dbias| ~ sqrt(N) (+ the prefill ~ 1).
  c.grad_atol = rtol * (std::sqrt(double(OC)) * 0.1 + 1);
  c.grad_rtol = rtol;
  c.param_atol = rtol * (std::sqrt(double(N)) + 1);
  c.param_rtol = rtol;
  c.exact = false;
  c.cpu = [=](HostBufs& din, HostBufs& dp, bool acc) {
    cpu::linear_backward<float>(din[0].data(), dp[0].data(), bias ? dp[1].data() : nullptr, dy.data(), x.data(),
                                W.data(), N, IC, OC, acc);
  };
  c.gpu = [=](DevPtrs& din, DevPtrs& dp, bool acc) {
    lrnn::cuda::set_gemm_precision(prec);
    gpu::linear_backward(din[0], dp[0], bias ? dp[1] : nullptr, gdy->data(), gx->data(), gW->data(), N, IC, OC, acc);
    lrnn::cuda::set_gemm_precision(lrnn::cuda::GemmPrecision::TF32);
  };
  return c;
}

// ---- swiglu / geglu: gate | up, two halves of one [N, ld] buffer (ld >= 2I) or two buffers ----

template <class CpuOp, class GpuOp>
Case glu_case(const char* name, CpuOp cpu_op, GpuOp gpu_op, int N, int I, int ld, uint64_t seed) {
  const bool fused = ld >= 2 * I;
  const int l = ld ? ld : I;
  auto gate = randn(size_t(N) * l, seed, 2.0), up = fused ? std::vector<float>() : randn(size_t(N) * l, seed + 1);
  auto dout = randn(size_t(N) * I, seed + 2);
  auto ggate = dev(gate), gup = dev(up), gdout = dev(dout);
  Case c;
  c.name = std::string(name) + " N=" + std::to_string(N) + " I=" + std::to_string(I) + " ld=" + std::to_string(ld);
  if (fused) c.written = {cols(N, l, 0, 2 * I)};
  else c.written = {cols(N, l, 0, I), cols(N, l, 0, I)};
  c.grad_atol = 2e-5;  // test_elementwise_cuda.cpp's per-element gradient tolerance
  c.grad_rtol = 1e-4;
  c.param_atol = c.param_rtol = 0;
  c.exact = true;
  c.cpu = [=](HostBufs& din, HostBufs&, bool acc) {
    float* dup = fused ? din[0].data() + I : din[1].data();
    const float* upp = fused ? gate.data() + I : up.data();
    cpu_op(din[0].data(), dup, dout.data(), gate.data(), upp, N, I, ld, acc);
  };
  c.gpu = [=](DevPtrs& din, DevPtrs&, bool acc) {
    float* dup = fused ? din[0] + I : din[1];
    const float* upp = fused ? ggate->data() + I : gup->data();
    gpu_op(din[0], dup, gdout->data(), ggate->data(), upp, N, I, ld, acc);
  };
  return c;
}

Case swiglu_case(int N, int I, int ld, uint64_t seed) {
  return glu_case(
      "swiglu", [](auto... a) { cpu::swiglu_backward<float>(a...); }, [](auto... a) { gpu::swiglu_backward(a...); },
      N, I, ld, seed);
}
Case geglu_case(int N, int I, int ld, uint64_t seed) {
  return glu_case(
      "geglu", [](auto... a) { cpu::geglu_backward<float>(a...); }, [](auto... a) { gpu::geglu_backward(a...); }, N,
      I, ld, seed);
}

// ---- gated RMSNorm: the gate at column goff of [N, ldg] rows (ldg 0: packed) ----

Case gated_rmsnorm_case(int N, int heads, int D, int ldg, int goff, bool with_dw, uint64_t seed) {
  const size_t R = size_t(N) * heads;
  const int lg = ldg ? ldg : heads * D;
  auto x = randn(R * D, seed), g = randn(size_t(N) * lg, seed + 1, 2.0), w = randu(D, seed + 2, 0.5, 1.5);
  auto dy = randn(R * D, seed + 3);
  std::vector<float> y(R * D), rstd(R);
  cpu::gated_rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), g.data() + goff, w.data(), N, heads, D, 1e-5,
                                    ldg);
  auto gx = dev(x), gg = dev(g), gw = dev(w), gdy = dev(dy), grstd = dev(rstd);
  Case c;
  c.name = "gated_rmsnorm N=" + std::to_string(N) + " heads=" + std::to_string(heads) + " D=" + std::to_string(D) +
           " ldg=" + std::to_string(ldg) + (with_dw ? "" : " no dw");
  c.written = {all(R * D), cols(N, lg, goff, goff + heads * D)};
  if (with_dw) c.param_sizes = {size_t(D)};
  c.grad_atol = 2e-5;
  c.grad_rtol = 1e-4;
  // dw: test_elementwise_cuda.cpp's tolerance for sums, from S = the largest sum of |terms|.
  std::vector<double> abs_terms(D, 0.0);
  for (size_t r = 0; r < R; ++r) {
    const size_t n = r / heads, h = r % heads;
    for (int k = 0; k < D; ++k) {
      const double gv = g[goff + n * lg + h * D + k];
      abs_terms[k] += std::fabs(double(dy[r * D + k]) * gv / (1 + std::exp(-gv)) * x[r * D + k] * rstd[r]);
    }
  }
  c.param_atol = sum_atol(abs_terms);
  c.param_rtol = 1e-4;
  c.exact = true;
  c.cpu = [=](HostBufs& din, HostBufs& dp, bool acc) {
    cpu::gated_rmsnorm_backward<float>(din[0].data(), din[1].data() + goff, with_dw ? dp[0].data() : nullptr,
                                       dy.data(), x.data(), g.data() + goff, w.data(), rstd.data(), N, heads, D, ldg,
                                       acc);
  };
  c.gpu = [=](DevPtrs& din, DevPtrs& dp, bool acc) {
    gpu::gated_rmsnorm_backward(din[0], din[1] + goff, with_dw ? dp[0] : nullptr, gdy->data(), gx->data(),
                                gg->data() + goff, gw->data(), grstd->data(), N, heads, D, ldg, acc);
  };
  return c;
}

// ---- forget gate: the logits at column aoff of [N, lda] rows (lda 0: packed) ----

Case forget_gate_case(int N, int H, int lda, int aoff, bool with_sums, uint64_t seed) {
  const int la = lda ? lda : H;
  auto a = randn(size_t(N) * la, seed, 2.0), A_log = randu(H, seed + 1, -1.0, 1.5), dt_bias = randn(H, seed + 2);
  auto dg = randn(size_t(N) * H, seed + 3);
  auto ga = dev(a), gA = dev(A_log), gb = dev(dt_bias), gdg = dev(dg);
  Case c;
  c.name = "forget_gate N=" + std::to_string(N) + " H=" + std::to_string(H) + " lda=" + std::to_string(lda) +
           (with_sums ? "" : " no sums");
  c.written = {cols(N, la, aoff, aoff + H)};
  if (with_sums) c.param_sizes = {size_t(H), size_t(H)};
  c.grad_atol = 2e-5;
  c.grad_rtol = 1e-4;
  // dA_log, ddt_bias: test_elementwise_cuda.cpp's tolerance for sums, from S = the largest sum
  // of |terms| (A softplus(x) |dg| and A sigmoid(x) |dg|).
  std::vector<double> abs_terms(H, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const double xv = double(a[aoff + size_t(n) * la + h]) + dt_bias[h], A = std::exp(double(A_log[h]));
      const double d = std::fabs(dg[size_t(n) * H + h]);
      const double sp = std::max(xv, 0.0) + std::log1p(std::exp(-std::fabs(xv)));
      abs_terms[h] += A * std::max(sp, 1 / (1 + std::exp(-xv))) * d;
    }
  c.param_atol = sum_atol(abs_terms);
  c.param_rtol = 1e-4;
  c.exact = true;
  c.cpu = [=](HostBufs& din, HostBufs& dp, bool acc) {
    cpu::forget_gate_backward<float>(din[0].data() + aoff, with_sums ? dp[0].data() : nullptr,
                                     with_sums ? dp[1].data() : nullptr, dg.data(), a.data() + aoff, A_log.data(),
                                     dt_bias.data(), N, H, lda, acc);
  };
  c.gpu = [=](DevPtrs& din, DevPtrs& dp, bool acc) {
    gpu::forget_gate_backward(din[0] + aoff, with_sums ? dp[0] : nullptr, with_sums ? dp[1] : nullptr, gdg->data(),
                              ga->data() + aoff, gA->data(), gb->data(), N, H, lda, acc);
  };
  return c;
}

}  // namespace

TEST(OverwriteCuda, Linear) {
  LRNN_REQUIRE_GPU();
  using lrnn::cuda::GemmPrecision;
  check(linear_case(37, 129, 3, true, GemmPrecision::FP32, 1), 1);
  check(linear_case(2048, 512, 128, false, GemmPrecision::FP32, 2), 2);   // the MLP's down projection
  check(linear_case(2048, 128, 1024, false, GemmPrecision::FP32, 3), 3);  // gate|up projection
  check(linear_case(10240, 128, 1024, false, GemmPrecision::TF32, 4), 4);
  check(linear_case(10240, 512, 128, true, GemmPrecision::TF32, 5), 5);
}

TEST(OverwriteCuda, SwiGlu) {
  LRNN_REQUIRE_GPU();
  check(swiglu_case(37, 129, 0, 10), 10);     // scalar path, separate buffers
  check(swiglu_case(37, 129, 261, 11), 11);   // scalar path, fused and padded
  check(swiglu_case(33, 128, 0, 12), 12);     // float4 path, separate buffers
  check(swiglu_case(64, 512, 1024, 13), 13);  // float4 path, the MLP's layout
  check(swiglu_case(25, 64, 130, 14), 14);    // ld % 4 != 0: scalar path
}

TEST(OverwriteCuda, GeGlu) {
  LRNN_REQUIRE_GPU();
  check(geglu_case(33, 19, 41, 20), 20);
  check(geglu_case(33, 19, 0, 21), 21);
  check(geglu_case(64, 512, 1024, 22), 22);
}

TEST(OverwriteCuda, GatedRmsNorm) {
  LRNN_REQUIRE_GPU();
  check(gated_rmsnorm_case(37, 4, 32, 0, 0, true, 30), 30);
  check(gated_rmsnorm_case(37, 4, 32, 0, 0, false, 31), 31);                  // dw null
  check(gated_rmsnorm_case(37, 4, 32, 4 * 32 * 5 + 3, 70, true, 32), 32);     // gate inside a fused row
  check(gated_rmsnorm_case(23, 3, 33, 0, 0, true, 33), 33);                   // D > 32, not a multiple
  check(gated_rmsnorm_case(2100, 4, 32, 0, 0, true, 34), 34);                 // the capped grid loops
}

TEST(OverwriteCuda, ForgetGate) {
  LRNN_REQUIRE_GPU();
  check(forget_gate_case(37, 4, 0, 0, true, 40), 40);
  check(forget_gate_case(37, 4, 0, 0, false, 41), 41);      // dA_log, ddt_bias null
  check(forget_gate_case(37, 4, 13, 5, true, 42), 42);      // logits inside a fused row
  check(forget_gate_case(61, 40, 45, 2, true, 43), 43);     // H >= 32 (per-thread atomics)
  check(forget_gate_case(70000, 4, 9, 1, true, 44), 44);    // the capped grid loops
}
