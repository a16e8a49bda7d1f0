// CUDA RoPE (contract: rope_cuda.h / rope.h). A block per (token t, group of kRows batch rows):
// it evaluates the D/2 (cos, sin) pairs of t once, in double as the CPU tables are, into shared
// memory, then rotates the pairs (i, i + D/2) of every head of its rows. (A thread per element
// with its own double pow, cos and sin took 100 us per call at the P1 Transformer's B = 1024.)
#include "core/check.h"
#include "cuda/runtime.h"
#include "ops/rope/rope_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 16;       // batch rows per block
constexpr int kMaxHalf = 2048;  // D <= 4096

template <bool kBackward>
__global__ void __launch_bounds__(kThreads) rope_kernel(float* __restrict__ dst, const float* __restrict__ src, int B,
                                                        int T_, int H, int D, double theta, int ld_dst, int ld_src,
                                                        int offset) {
  __shared__ float2 cs[kMaxHalf];
  const int t = blockIdx.x, half = D / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // HF: inv_freq = 1 / theta^(2i/D); angle t * inv_freq.
    const double ang = double(t + offset) / pow(theta, double(2 * i) / double(D));
    cs[i] = make_float2(float(cos(ang)), float(sin(ang)));
  }
  __syncthreads();
  const int b1 = min(B, int(blockIdx.y + 1) * kRows), per = H * half;
  for (int b = blockIdx.y * kRows; b < b1; ++b) {
    const size_t n = size_t(b) * T_ + t;
    const float* g = src + n * ld_src;
    float* o = dst + n * ld_dst;
    for (int x = threadIdx.x; x < per; x += blockDim.x) {
      const int h = x / half, i = x - h * half, e = h * D + i;
      const float c = cs[i].x, s = cs[i].y, a = g[e], bb = g[e + half];
      if (kBackward) {
        o[e] += a * c + bb * s;
        o[e + half] += bb * c - a * s;
      } else {
        o[e] = a * c - bb * s;
        o[e + half] = bb * c + a * s;
      }
    }
  }
}

void check(const RopeDims& d) {
  LRNN_CHECK(d.B > 0 && d.T > 0 && d.H > 0 && d.D > 0 && d.D % 2 == 0,
             "rope: bad dims B={} T={} H={} D={} (D must be even)", d.B, d.T, d.H, d.D);
  LRNN_CHECK(d.D / 2 <= kMaxHalf, "rope (CUDA): head dim {} above {}", d.D, 2 * kMaxHalf);
  LRNN_CHECK((d.B + kRows - 1) / kRows <= 65535, "rope (CUDA): batch {} above {}", d.B, 65535 * kRows);
}

}  // namespace

void rope_forward(float* out, const float* x, const RopeDims& d) {
  check(d);
  const dim3 grid(unsigned(d.T), unsigned((d.B + kRows - 1) / kRows));
  rope_kernel<false><<<grid, kThreads, 0, lrnn::cuda::stream()>>>(out, x, d.B, d.T, d.H, d.D, d.theta, d.lo(), d.lx(), d.offset);
  LRNN_CUDA_LAUNCH_CHECK();
}

void rope_backward(float* dx, const float* dout, const RopeDims& d) {
  check(d);
  const dim3 grid(unsigned(d.T), unsigned((d.B + kRows - 1) / kRows));
  rope_kernel<true><<<grid, kThreads, 0, lrnn::cuda::stream()>>>(dx, dout, d.B, d.T, d.H, d.D, d.theta, d.lx(), d.lo(), d.offset);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
