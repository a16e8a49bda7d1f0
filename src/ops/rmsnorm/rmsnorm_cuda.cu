// CUDA RMSNorm (contract: rmsnorm_cuda.h / rmsnorm.h): one warp per row of C.
//
// Backward: dx per row as in the CPU reference; dw [C] is summed per warp into its own slice of
// shared memory (each lane owns channels lane, lane + 32, ..., so no races), the slices of a
// block are added and the block issues one atomicAdd per channel. The grid is capped so a warp
// walks several rows (fewer atomics); the order of the atomics is not deterministic.
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;  // backward grid cap (~ one full wave on an H100/H200)
constexpr size_t kMaxSmem = 48 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(float* __restrict__ out, float* __restrict__ rstd,
                                                                   const float* __restrict__ x,
                                                                   const float* __restrict__ w, int N, int C,
                                                                   float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps leave together
  const float* xr = x + size_t(row) * C;
  float* o = out + size_t(row) * C;
  float ss = 0.f;
  for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (lane == 0) rstd[row] = r;
  for (int c = lane; c < C; c += 32) o[c] = xr[c] * r * w[c];
}

// dynamic smem: kWarps * C floats when use_smem, else none (dw atomics per row, huge C only).
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(float* __restrict__ dx, float* __restrict__ dw,
                                                                    const float* __restrict__ dout,
                                                                    const float* __restrict__ x,
                                                                    const float* __restrict__ w,
                                                                    const float* __restrict__ rstd, int N, int C,
                                                                    bool use_smem) {
  extern __shared__ float part[];  // [kWarps][C]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* mine = part + size_t(warp) * C;
  if (dw && use_smem)
    for (int c = lane; c < C; c += 32) mine[c] = 0.f;
  for (int row = blockIdx.x * kWarps + warp; row < N; row += gridDim.x * kWarps) {
    const float* xr = x + size_t(row) * C;
    const float* d = dout + size_t(row) * C;
    float* g = dx + size_t(row) * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (int c = lane; c < C; c += 32) dot += d[c] * w[c] * xr[c];
    dot = warp_sum(dot);
    const float k = dot * r * r * r / float(C);
    for (int c = lane; c < C; c += 32) {
      g[c] += r * w[c] * d[c] - xr[c] * k;
      if (dw) {
        const float v = d[c] * xr[c] * r;
        if (use_smem) mine[c] += v;
        else atomicAdd(dw + c, v);
      }
    }
  }
  if (!dw || !use_smem) return;
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) s += part[size_t(k) * C + c];
    atomicAdd(dw + c, s);
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, double eps) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N), kWarps);
  rmsnorm_forward_kernel<<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(out, rstd, x, w, N, C, float(eps));
  LRNN_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int N, int C) {
  if (N <= 0 || C <= 0) return;
  const size_t smem_need = size_t(kWarps) * C * sizeof(float);
  const bool use_smem = dw && smem_need <= kMaxSmem;
  const size_t smem = use_smem ? smem_need : 0;
  unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N), kWarps);
  if (blocks > unsigned(kMaxBlocks)) blocks = kMaxBlocks;
  rmsnorm_backward_kernel<<<blocks, kThreads, smem, ::lrnn::cuda::stream()>>>(dx, dw, dout, x, w, rstd, N, C,
                                                                              use_smem);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
