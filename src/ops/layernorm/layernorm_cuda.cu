// CUDA LayerNorm over groups (contract: layernorm_cuda.h / layernorm.h): one warp per (row,
// group) for the forward and dx; dw [C] by a column-reduction kernel (32 channels x 8 row lanes
// per block, one atomicAdd per channel and block; the order of the atomics is not deterministic).
#include "ops/layernorm/layernorm_cuda.h"
#include "core/check.h"
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

__global__ void __launch_bounds__(kThreads) ln_forward_kernel(float* __restrict__ y, float* __restrict__ mean,
                                                              float* __restrict__ rstd, const float* __restrict__ x,
                                                              const float* __restrict__ w, int rows, int G, int D,
                                                              float eps, float off) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);  // (n, g) pair
  if (row >= rows) return;
  const int g = row % G;
  const float* xr = x + size_t(row) * D;  // groups of a row are contiguous: (n*G + g) * D
  float* yr = y + size_t(row) * D;
  float s = 0.f;
  for (int c = lane; c < D; c += 32) s += xr[c];
  const float mu = warp_sum(s) / float(D);
  float v = 0.f;
  for (int c = lane; c < D; c += 32) {
    const float t = xr[c] - mu;
    v += t * t;
  }
  const float r = 1.f / sqrtf(warp_sum(v) / float(D) + eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
  const float* wr = w ? w + size_t(g) * D : nullptr;
  for (int c = lane; c < D; c += 32) yr[c] = (xr[c] - mu) * r * (wr ? off + wr[c] : 1.f);
}

__global__ void __launch_bounds__(kThreads) ln_backward_dx_kernel(float* __restrict__ dx, const float* __restrict__ dy,
                                                                  const float* __restrict__ x,
                                                                  const float* __restrict__ w,
                                                                  const float* __restrict__ mean,
                                                                  const float* __restrict__ rstd, int rows, int G,
                                                                  int D, float off) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int g = row % G;
  const size_t o = size_t(row) * D;
  const float mu = mean[row], r = rstd[row];
  const float* wr = w ? w + size_t(g) * D : nullptr;
  float s1 = 0.f, s2 = 0.f;
  for (int c = lane; c < D; c += 32) {
    const float gc = dy[o + c] * (wr ? off + wr[c] : 1.f);
    s1 += gc;
    s2 += gc * (x[o + c] - mu) * r;
  }
  s1 = warp_sum(s1) / float(D);
  s2 = warp_sum(s2) / float(D);
  for (int c = lane; c < D; c += 32) {
    const float gc = dy[o + c] * (wr ? off + wr[c] : 1.f);
    const float xh = (x[o + c] - mu) * r;
    dx[o + c] += r * (gc - s1 - xh * s2);
  }
}

// dw[c] += sum_n dy[n,c] xhat[n,c]; block (32, 8), grid (ceil(C/32), row splits).
__global__ void ln_backward_dw_kernel(float* __restrict__ dw, const float* __restrict__ dy,
                                      const float* __restrict__ x, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C, int G, int D) {
  __shared__ float red[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (c < C) {
    const int g = c / D;
    for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += gridDim.y * 8) {
      const size_t i = size_t(n) * C + c, s = size_t(n) * G + g;
      acc += dy[i] * (x[i] - mean[s]) * rstd[s];
    }
  }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += red[k][threadIdx.x];
    atomicAdd(dw + c, s);
  }
}

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, int N, int C, int G,
                       double eps, double w_offset) {
  LRNN_CHECK(G > 0 && C % G == 0, "layernorm: {} groups do not divide {} channels", G, C);
  if (N <= 0 || C <= 0) return;
  const int rows = N * G;
  ln_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(rows), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
      y, mean, rstd, x, w, rows, G, C / G, float(eps), float(w_offset));
  LRNN_CUDA_LAUNCH_CHECK();
}

void layernorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, int N, int C, int G, double w_offset) {
  if (N <= 0 || C <= 0) return;
  const int rows = N * G;
  ln_backward_dx_kernel<<<::lrnn::cuda::blocks_for(size_t(rows), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
      dx, dy, x, w, mean, rstd, rows, G, C / G, float(w_offset));
  LRNN_CUDA_LAUNCH_CHECK();
  if (!dw) return;
  const unsigned cols = unsigned((C + 31) / 32);
  unsigned splits = unsigned((N + 63) / 64);
  if (splits > 256) splits = 256;
  ln_backward_dw_kernel<<<dim3(cols, splits), dim3(32, 8), 0, ::lrnn::cuda::stream()>>>(dw, dy, x, mean, rstd, N, C,
                                                                                          G, C / G);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
