// CUDA gated RMSNorm (contract: gated_rmsnorm_cuda.h / gated_rmsnorm.h): one warp per row of D.
//
// Backward: dw [D] is summed per warp into its own slice of shared memory (each lane owns
// channels lane, lane + 32, ...), the slices of a block are added in warp order and written to
// the device scratch as [block][D], which add_partials sums in a fixed order: deterministic. The
// grid is capped so a warp walks several rows. (Where the partials do not fit the scratch, or
// the slices do not fit shared memory: atomics in a varying order; D > 256 only.)
#include "ops/gated_rmsnorm/gated_rmsnorm_cuda.h"
#include "cuda/runtime.h"
#include "ops/elementwise/elementwise_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;
constexpr size_t kMaxSmem = 48 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void __launch_bounds__(kThreads) gated_rmsnorm_forward_kernel(
    float* __restrict__ y, float* __restrict__ rstd, const float* __restrict__ x, const float* __restrict__ g,
    const float* __restrict__ w, int R, int heads, int D, int ldg, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= R) return;  // whole warps leave together
  const int n = row / heads, h = row % heads;
  const float* xr = x + size_t(row) * D;
  const float* gr = g + size_t(n) * ldg + size_t(h) * D;
  float* yr = y + size_t(row) * D;
  float ss = 0.f;
  for (int c = lane; c < D; c += 32) ss += xr[c] * xr[c];
  ss = warp_sum(ss);
  const float rs = 1.f / sqrtf(ss / float(D) + eps);
  if (lane == 0) rstd[row] = rs;
  for (int c = lane; c < D; c += 32) {
    const float gv = gr[c];
    yr[c] = xr[c] * rs * w[c] * (gv * sigmoid(gv));
  }
}

// dynamic smem: kWarps * D floats when use_smem (else dw atomics per row; huge D only).
// Acc false: dx and dg are overwritten (accumulated onto 0, never read); dw always accumulates.
template <bool Acc>
__global__ void __launch_bounds__(kThreads) gated_rmsnorm_backward_kernel(
    float* __restrict__ dx, float* __restrict__ dg, float* __restrict__ dw, const float* __restrict__ dy,
    const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ w,
    const float* __restrict__ rstd, int R, int heads, int D, int ldg, bool use_smem, float* __restrict__ dw_part) {
  extern __shared__ float part[];  // [kWarps][D]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* mine = part + size_t(warp) * D;
  if (dw && use_smem)
    for (int c = lane; c < D; c += 32) mine[c] = 0.f;
  for (int row = blockIdx.x * kWarps + warp; row < R; row += gridDim.x * kWarps) {
    const int n = row / heads, h = row % heads;
    const float* xr = x + size_t(row) * D;
    const float* d = dy + size_t(row) * D;
    const float* gr = g + size_t(n) * ldg + size_t(h) * D;
    float* dgr = dg + size_t(n) * ldg + size_t(h) * D;
    float* dxr = dx + size_t(row) * D;
    const float rs = rstd[row];
    float dot = 0.f;  // sum e * x, e = dy * silu(g) * w
    for (int c = lane; c < D; c += 32) {
      const float gv = gr[c], s = sigmoid(gv), si = gv * s;
      const float dc = d[c], xc = xr[c], wc = w[c];
      dgr[c] = (Acc ? dgr[c] : 0.f) + dc * xc * rs * wc * (s * (1.f + gv * (1.f - s)));
      dot += dc * si * wc * xc;
      if (dw) {
        const float v = dc * si * xc * rs;
        if (use_smem) mine[c] += v;
        else atomicAdd(dw + c, v);
      }
    }
    dot = warp_sum(dot);
    const float k = dot * rs * rs * rs / float(D);
    for (int c = lane; c < D; c += 32) {
      const float gv = gr[c];
      dxr[c] = (Acc ? dxr[c] : 0.f) + (rs * w[c] * (gv * sigmoid(gv)) * d[c] - xr[c] * k);
    }
  }
  if (!dw || !use_smem) return;  // uniform over the block
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) s += part[size_t(k) * D + c];
    if (dw_part) dw_part[size_t(blockIdx.x) * D + c] = s;
    else atomicAdd(dw + c, s);
  }
}

}  // namespace

void gated_rmsnorm_forward(float* y, float* rstd, const float* x, const float* g, const float* w, int N, int heads,
                           int D, double eps, int ldg) {
  if (!ldg) ldg = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  gated_rmsnorm_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(R), kWarps), kThreads, 0,
                                 ::lrnn::cuda::stream()>>>(y, rstd, x, g, w, int(R), heads, D, ldg, float(eps));
  LRNN_CUDA_LAUNCH_CHECK();
}

void gated_rmsnorm_backward(float* dx, float* dg, float* dw, const float* dy, const float* x, const float* g,
                            const float* w, const float* rstd, int N, int heads, int D, int ldg, bool accumulate) {
  if (!ldg) ldg = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  const size_t smem_need = size_t(kWarps) * D * sizeof(float);
  const bool use_smem = dw && smem_need <= kMaxSmem;
  unsigned blocks = ::lrnn::cuda::blocks_for(size_t(R), kWarps);
  if (blocks > unsigned(kMaxBlocks)) blocks = kMaxBlocks;
  auto kernel = accumulate ? gated_rmsnorm_backward_kernel<true> : gated_rmsnorm_backward_kernel<false>;
  float* dw_part = nullptr;
  if (use_smem && size_t(blocks) * D * sizeof(float) <= (size_t(1) << 20))
    dw_part = static_cast<float*>(::lrnn::cuda::scratch(size_t(blocks) * D * sizeof(float)));
  kernel<<<blocks, kThreads, use_smem ? smem_need : 0, ::lrnn::cuda::stream()>>>(dx, dg, dw, dy, x, g, w, rstd, int(R),
                                                                                heads, D, ldg, use_smem, dw_part);
  LRNN_CUDA_LAUNCH_CHECK();
  if (dw_part) add_partials(dw, dw_part, int(blocks), size_t(D));
}

}  // namespace lrnn::ops::cuda
