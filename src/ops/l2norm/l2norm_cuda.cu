// CUDA per-head L2 normalisation (contract: l2norm_cuda.h / l2norm.h).
//
// A group of G lanes (G = 4 .. 32, a power of two dividing the warp) owns one (token, head) row
// of D; each lane holds NCH vectors of VW floats of it in registers (VW = 4: float4 loads when
// D, ldx, ldy and the pointers allow it). The row's sum is a butterfly over the group's lanes.
// D = 32 (the models): 8 lanes of one float4 each, 4 rows per warp. One pass over the data:
// forward reads x and writes y (and rstd), backward reads y, dy (and dx when accumulating) and
// writes dx. Rows longer than 32 lanes x 8 vectors (D > 1024 with float4, > 256 without) take
// the general kernels (one warp per row).
#include "ops/l2norm/l2norm_cuda.h"
#include <cstdint>
#include "cuda/rows.cuh"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

using ::lrnn::cuda::group_sum;
using ::lrnn::cuda::load_ro;
using ::lrnn::cuda::load_row;
using ::lrnn::cuda::load_rw;
using ::lrnn::cuda::plan_row;
using ::lrnn::cuda::row_sum_squares;
using ::lrnn::cuda::RowPlan;
using ::lrnn::cuda::store;
using ::lrnn::cuda::warp_sum;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;


// One row per group; grid ceil(R G / kThreads). Lanes of groups past the last row take part in
// the shuffles with zeros.
template <int VW, int G, int NCH>
__global__ void __launch_bounds__(kThreads) l2norm_fwd_vec(float* __restrict__ y, float* __restrict__ rstd,
                                                           const float* __restrict__ x, int R, int D, int heads,
                                                           int ldx, int ldy, float eps) {
  const int gl = threadIdx.x % G;
  const long long rowl = ((long long)blockIdx.x * kThreads + threadIdx.x) / G;
  const bool ok = rowl < R;
  const int row = ok ? int(rowl) : 0;
  const int n = row / heads, h = row - n * heads;
  const float* xr = x + size_t(n) * ldx + size_t(h) * D;
  float* yr = y + size_t(n) * ldy + size_t(h) * D;
  float v[NCH][VW];
  load_row<VW, G, NCH>(v, xr, D, gl, ok);
  const float ss = row_sum_squares<VW, G, NCH>(v);
  const float r = 1.f / sqrtf(ss + eps);
  if (ok && gl == 0) rstd[row] = r;
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int d = (gl + i * G) * VW;
    if (ok && d < D) {
      float o[VW];
#pragma unroll
      for (int k = 0; k < VW; ++k) o[k] = v[i][k] * r;
      store(yr + d, o);
    }
  }
}

template <int VW, int G, int NCH>
__global__ void __launch_bounds__(kThreads) l2norm_bwd_vec(float* __restrict__ dx, const float* __restrict__ dy,
                                                           const float* __restrict__ y,
                                                           const float* __restrict__ rstd, int R, int D, int heads,
                                                           int ldx, int ldy, bool accumulate) {
  const int gl = threadIdx.x % G;
  const long long rowl = ((long long)blockIdx.x * kThreads + threadIdx.x) / G;
  const bool ok = rowl < R;
  const int row = ok ? int(rowl) : 0;
  const int n = row / heads, h = row - n * heads;
  const float* yr = y + size_t(n) * ldy + size_t(h) * D;
  const float* g = dy + size_t(n) * ldy + size_t(h) * D;
  float* dxr = dx + size_t(n) * ldx + size_t(h) * D;
  float yv[NCH][VW], gv[NCH][VW];
  load_row<VW, G, NCH>(yv, yr, D, gl, ok);
  load_row<VW, G, NCH>(gv, g, D, gl, ok);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < NCH; ++i)
#pragma unroll
    for (int k = 0; k < VW; ++k) dot += yv[i][k] * gv[i][k];
  dot = group_sum<G>(dot);
  const float r = ok ? __ldg(rstd + row) : 0.f;
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int d = (gl + i * G) * VW;
    if (ok && d < D) {
      float o[VW];
#pragma unroll
      for (int k = 0; k < VW; ++k) o[k] = r * (gv[i][k] - yv[i][k] * dot);
      if (accumulate) {
        float old[VW];
        load_rw(old, dxr + d);
#pragma unroll
        for (int k = 0; k < VW; ++k) o[k] = old[k] + o[k];
      }
      store(dxr + d, o);
    }
  }
}

// Which vector kernel a row of D takes: VW floats per load, G lanes per row, NCH vectors per
// lane (G NCH VW >= D); G = 0: none (the general kernels).


// ---- general kernels (rows longer than the vector kernels take): one warp per row ----------


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
                                                                   int heads, int ldx, int ldy, bool accumulate) {
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
  for (int d = lane; d < D; d += 32) {
    const float v = r * (g[d] - yr[d] * dot);
    dxr[d] = accumulate ? dxr[d] + v : v;
  }
}

}  // namespace

namespace {

struct FwdLaunch {
  float* y;
  float* rstd;
  const float* x;
  int R, D, heads, ldx, ldy;
  float eps;
  template <int VW, int G, int NCH>
  void run() const {
    const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(R) * G, kThreads);
    l2norm_fwd_vec<VW, G, NCH><<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(y, rstd, x, R, D, heads, ldx, ldy,
                                                                              eps);
  }
};
struct BwdLaunch {
  float* dx;
  const float *dy, *y, *rstd;
  int R, D, heads, ldx, ldy;
  bool accumulate;
  template <int VW, int G, int NCH>
  void run() const {
    const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(R) * G, kThreads);
    l2norm_bwd_vec<VW, G, NCH><<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(dx, dy, y, rstd, R, D, heads, ldx,
                                                                              ldy, accumulate);
  }
};


}  // namespace

void l2norm_forward(float* y, float* rstd, const float* x, int N, int D, double eps, int heads, int ldx, int ldy) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  const bool vec = D % 4 == 0 && ldx % 4 == 0 && ldy % 4 == 0 && ::lrnn::cuda::aligned(x, 16) && ::lrnn::cuda::aligned(y, 16);
  const RowPlan p = plan_row(D, vec ? 4 : 1);
  if (!::lrnn::cuda::dispatch_rows(p, FwdLaunch{y, rstd, x, int(R), D, heads, ldx, ldy, float(eps)}))
    l2norm_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(R), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
        y, rstd, x, int(R), D, heads, ldx, ldy, float(eps));
  LRNN_CUDA_LAUNCH_CHECK();
}

void l2norm_backward(float* dx, const float* dy, const float* y, const float* rstd, int N, int D, int heads, int ldx,
                     int ldy, bool accumulate) {
  if (!ldx) ldx = heads * D;
  if (!ldy) ldy = heads * D;
  const long long R = (long long)N * heads;
  if (R <= 0 || D <= 0) return;
  const bool vec = D % 4 == 0 && ldx % 4 == 0 && ldy % 4 == 0 && ::lrnn::cuda::aligned(dx, 16) && ::lrnn::cuda::aligned(dy, 16) && ::lrnn::cuda::aligned(y, 16);
  const RowPlan p = plan_row(D, vec ? 4 : 1);
  if (!::lrnn::cuda::dispatch_rows(p, BwdLaunch{dx, dy, y, rstd, int(R), D, heads, ldx, ldy, accumulate}))
    l2norm_backward_kernel<<<::lrnn::cuda::blocks_for(size_t(R), kWarps), kThreads, 0, ::lrnn::cuda::stream()>>>(
        dx, dy, y, rstd, int(R), D, heads, ldx, ldy, accumulate);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
