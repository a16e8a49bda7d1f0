// CUDA RoPE (contract: rope_cuda.h / rope.h): one thread per (token, head, frequency i < D/2),
// rotating the pair (i, i + D/2). cos and sin are evaluated in double as the CPU tables are.
#include "core/check.h"
#include "cuda/runtime.h"
#include "ops/rope/rope_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kBackward>
__global__ void rope_kernel(float* __restrict__ dst, const float* __restrict__ src, int BT, int T_, int H, int D,
                            double theta, int ld_dst, int ld_src) {
  const int half = D / 2;
  const size_t total = size_t(BT) * H * half;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int i = int(idx % half);
  const size_t nh = idx / half;
  const int h = int(nh % H);
  const int n = int(nh / H);
  const int t = n % T_;
  // HF: inv_freq = 1 / theta^(2i/D); angle t * inv_freq.
  const double inv_freq = 1.0 / pow(theta, double(2 * i) / double(D));
  const double ang = double(t) * inv_freq;
  const float c = float(cos(ang)), s = float(sin(ang));
  const float* g = src + size_t(n) * ld_src + size_t(h) * D;
  float* o = dst + size_t(n) * ld_dst + size_t(h) * D;
  const float a = g[i], b = g[i + half];
  if (kBackward) {
    o[i] += a * c + b * s;
    o[i + half] += b * c - a * s;
  } else {
    o[i] = a * c - b * s;
    o[i + half] = b * c + a * s;
  }
}

void check(const RopeDims& d) {
  LRNN_CHECK(d.B > 0 && d.T > 0 && d.H > 0 && d.D > 0 && d.D % 2 == 0,
             "rope: bad dims B={} T={} H={} D={} (D must be even)", d.B, d.T, d.H, d.D);
}

}  // namespace

void rope_forward(float* out, const float* x, const RopeDims& d) {
  check(d);
  const size_t total = size_t(d.B) * d.T * d.H * (d.D / 2);
  rope_kernel<false><<<lrnn::cuda::blocks_for(total, kThreads), kThreads, 0, lrnn::cuda::stream()>>>(
      out, x, d.B * d.T, d.T, d.H, d.D, d.theta, d.lo(), d.lx());
  LRNN_CUDA_LAUNCH_CHECK();
}

void rope_backward(float* dx, const float* dout, const RopeDims& d) {
  check(d);
  const size_t total = size_t(d.B) * d.T * d.H * (d.D / 2);
  rope_kernel<true><<<lrnn::cuda::blocks_for(total, kThreads), kThreads, 0, lrnn::cuda::stream()>>>(
      dx, dout, d.B * d.T, d.T, d.H, d.D, d.theta, d.lx(), d.lo());
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
