// CUDA per-head L2 normalisation (contract: l2norm_cuda.h / l2norm.h): one warp per (token,
// head) row of D (D = 32 in the models: one element per lane).
#include "ops/l2norm/l2norm_cuda.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads) l2norm_forward_kernel(float* __restrict__ y, float* __restrict__ rstd,
                                                                  const float* __restrict__ x, int R, int D,
                                                                  int heads, int ldx, int ldy, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= R) return;  // whole warps leave together
  const int n = row / heads, h = row % heads;
  const float* xr = x + size_t(n) * ldx + size_t(h) * D;
  float* yr = y + size_t(n) * ldy + size_t(h) * D;
  float ss = 0.f;
  for (int d = lane; d < D; d += 32) ss += xr[d] * xr[d];
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss + eps);
  if (lane == 0) rstd[row] = r;
  for (int d = lane; d < D; d += 32) yr[d] = xr[d] * r;
}

__global__ void __launch_bounds__(kThreads) l2norm_backward_kernel(float* __restrict__ dx,
                                                                   const float* __restrict__ dy,
                                                                   const float* __restrict__ y,
                                                                   const float* __restrict__ rstd, int R, int D,
                                                                   int heads, int ldx, int ldy) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= R) return;
  const int n = row / heads, h = row % heads;
  const float* yr = y + size_t(n) * ldy + size_t(h) * D;
  const float* g = dy + size_t(n) * ldy + size_t(h) * D;
  float* dxr = dx + size_t(n) * ldx + size_t(h) * D;
  const float r = rstd[row];
  float dot = 0.f;
  for (int d = lane; d < D; d += 32) dot += yr[d] * g[d];
  dot = warp_sum(dot);
  for (int d = lane; d < D; d += 32) dxr[d] += r * (g[d] - yr[d] * dot);
}

}  // namespace

void l2norm_forward(float* y, float* rstd, const float* x, int N, int D, double eps, int heads, int ldx, int ldy) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  l2norm_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(R), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
      y, rstd, x, int(R), D, heads, ldx, ldy, float(eps));
  LRNN_CUDA_LAUNCH_CHECK();
}

void l2norm_backward(float* dx, const float* dy, const float* y, const float* rstd, int N, int D, int heads, int ldx,
                     int ldy) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  l2norm_backward_kernel<<<::lrnn::cuda::blocks_for(size_t(R), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
      dx, dy, y, rstd, int(R), D, heads, ldx, ldy);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
