// CUDA RMSNorm (contract: rmsnorm_cuda.h / rmsnorm.h).
//
// A group of G lanes (G = 4 .. 32, a power of two dividing the warp) owns one row of C; each
// lane holds NCH vectors of VW floats of it in registers (VW = 4: float4 loads when C and the
// pointers allow it). The row sums are butterflies over the group's lanes. C = 128: one warp
// per row, one float4 per lane; C = 32 (DeltaNet's per-head o_norm): 8 lanes per row, 4 rows
// per warp. One pass over the data: forward reads x and writes out, backward reads x, dout (and
// dx when accumulating) and writes dx.
//
// Backward dw: the grid is about one wave of blocks, each group walks rows with a grid stride
// and keeps its lanes' dw sums in registers; a block then sums its groups in shared memory (a
// fixed order) into one partial row of C in the device scratch, and a second small kernel adds
// the blocks' partials to dw in a fixed order: deterministic, no atomics.
//
// Rows longer than 32 lanes x 8 vectors (C > 1024 with float4, > 256 without) take the general
// kernels (one warp per row; dw per block in shared memory, then atomics).
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include <algorithm>
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

constexpr int kThreads = 256;  // forward blocks; general kernels
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;  // general backward grid cap (~ one full wave on an H100/H200)
constexpr size_t kMaxSmem = 48 * 1024;
// The partials use at most 1 MiB of lrnn::cuda::scratch (the budget these kernels were measured
// with; the scratch holds kScratchBytes).
constexpr long long kScratchFloats = (1 << 20) / sizeof(float);

// Backward blocks: 512 threads (3 resident per SM: <= 40 registers) when a lane holds one vector
// (C <= 128 with float4), 512 / 256 threads for longer rows (more registers).
template <int NCH>
__host__ __device__ constexpr int bwd_threads() {
  return NCH <= 2 ? 512 : 256;
}
template <int NCH>
__host__ __device__ constexpr int bwd_min_blocks() {
  return NCH == 1 ? 3 : 1;
}


// One row per group; grid ceil(N G / kThreads). Lanes of groups past the last row take part in
// the shuffles with zeros.
// Out: float, or __nv_bfloat16 (the normalised rows stored in bf16 for bf16 GEMMs; rstd stays fp32).
template <int VW, int G, int NCH, class Out>
__global__ void __launch_bounds__(kThreads) rmsnorm_fwd_vec(Out* __restrict__ out, float* __restrict__ rstd,
                                                            const float* __restrict__ x, const float* __restrict__ w,
                                                            int N, int C, float eps) {
  const int gl = threadIdx.x % G;
  const long long rowl = ((long long)blockIdx.x * kThreads + threadIdx.x) / G;
  const bool ok = rowl < N;
  const size_t row = ok ? size_t(rowl) : 0;
  const float* xr = x + row * C;
  Out* o = out + row * C;
  float v[NCH][VW];
  load_row<VW, G, NCH>(v, xr, C, gl, ok);
  const float ss = row_sum_squares<VW, G, NCH>(v);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (ok && gl == 0) rstd[row] = r;
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int c = (gl + i * G) * VW;
    if (ok && c < C) {
      float wv[VW], y[VW];
      load_ro(wv, w + c);
#pragma unroll
      for (int k = 0; k < VW; ++k) y[k] = v[i][k] * r * wv[k];
      store(o + c, y);
    }
  }
}

// Grid-stride over rows (warp-uniform loop: every lane of a warp runs the same iterations, so
// the shuffles always have the whole warp). part[blockIdx.x][C]: the block's dw sums (when
// want_dw).
template <int VW, int G, int NCH>
__global__ void __launch_bounds__(bwd_threads<NCH>(), bwd_min_blocks<NCH>()) rmsnorm_bwd_vec(
    float* __restrict__ dx, float* __restrict__ part, const float* __restrict__ dout, const float* __restrict__ x,
    const float* __restrict__ w, const float* __restrict__ rstd, int N, int C, bool want_dw, bool accumulate) {
  constexpr int kT = bwd_threads<NCH>();
  constexpr int kGroups = kT / G;  // groups per block
  const int gl = threadIdx.x % G;
  const int gw = (threadIdx.x % 32) / G;  // group within its warp
  const long long gid = (long long)blockIdx.x * kGroups + threadIdx.x / G;
  const long long stride = (long long)gridDim.x * kGroups;
  float wv[NCH][VW], acc[NCH][VW];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int c = (gl + i * G) * VW;
    if (c < C) {
      load_ro(wv[i], w + c);
    } else {
#pragma unroll
      for (int k = 0; k < VW; ++k) wv[i][k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < VW; ++k) acc[i][k] = 0.f;
  }
  for (long long base = gid - gw; base < N; base += stride) {  // base: the warp's first group's row
    const long long rowl = base + gw;
    const bool ok = rowl < N;
    const size_t off = ok ? size_t(rowl) * C : 0;
    float xv[NCH][VW], gv[NCH][VW];
    load_row<VW, G, NCH>(xv, x + off, C, gl, ok);
    load_row<VW, G, NCH>(gv, dout + off, C, gl, ok);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < NCH; ++i)
#pragma unroll
      for (int k = 0; k < VW; ++k) dot += gv[i][k] * wv[i][k] * xv[i][k];
    dot = group_sum<G>(dot);
    const float r = ok ? __ldg(rstd + rowl) : 0.f;
    const float kk = dot * r * r * r / float(C);
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const int c = (gl + i * G) * VW;
      if (ok && c < C) {
        float o[VW];
#pragma unroll
        for (int k = 0; k < VW; ++k) {
          o[k] = r * wv[i][k] * gv[i][k] - xv[i][k] * kk;
          acc[i][k] += gv[i][k] * xv[i][k] * r;
        }
        if (accumulate) {
          float old[VW];
          load_rw(old, dx + off + c);
#pragma unroll
          for (int k = 0; k < VW; ++k) o[k] = old[k] + o[k];
        }
        store(dx + off + c, o);
      }
    }
  }
  if (!want_dw) return;  // uniform over the grid
  // Sum the block's groups: for chunk i, thread t = group * G + gl puts its VW sums (channels
  // i G VW + gl VW + k) at red[t VW + k]; thread j < G VW then adds red[group G VW + j] over the
  // groups for channel i G VW + j.
  __shared__ float red[kT * VW];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
#pragma unroll
    for (int k = 0; k < VW; ++k) red[threadIdx.x * VW + k] = acc[i][k];
    __syncthreads();
    const int j = threadIdx.x, c = i * G * VW + j;
    if (j < G * VW && c < C) {
      float s = 0.f;
      for (int g = 0; g < kGroups; ++g) s += red[g * G * VW + j];
      part[size_t(blockIdx.x) * C + c] = s;
    }
    __syncthreads();
  }
}

// dw[c] += sum_r part[r][c], r in a fixed order. grid ceil(C / 32), block (32, 32).
__global__ void __launch_bounds__(1024) rmsnorm_reduce_kernel(float* __restrict__ dw, const float* __restrict__ part,
                                                              int nparts, int C) {
  __shared__ float sm[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (c < C)
    for (int r = threadIdx.y; r < nparts; r += 32) s += part[size_t(r) * C + c];
  sm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.f;
#pragma unroll 8
    for (int y = 0; y < 32; ++y) t += sm[y][threadIdx.x];
    dw[c] += t;
  }
}

// Which vector kernel a row of C takes: VW floats per load, G lanes per row, NCH vectors per
// lane (G NCH VW >= C); G = 0: none (the general kernels).

// Blocks of the vector backward: enough for every row group, at most `resident` (one wave),
// and (with dw) few enough that the partials fit the scratch.
int bwd_blocks(int N, int C, int G, int threads, long long resident, bool want_dw) {
  const long long groups = threads / G;
  long long nb = (N + groups - 1) / groups;
  nb = std::min(nb, std::max(1LL, resident));
  if (want_dw) nb = std::min(nb, kScratchFloats / C);  // C <= 1024 here: >= 256 blocks
  return int(std::max(1LL, nb));
}


// ---- general kernels (rows longer than the vector kernels take) -----------------------------


template <class Out>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(Out* __restrict__ out, float* __restrict__ rstd,
                                                                   const float* __restrict__ x,
                                                                   const float* __restrict__ w, int N, int C,
                                                                   float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps leave together
  const float* xr = x + size_t(row) * C;
  Out* o = out + size_t(row) * C;
  float ss = 0.f;
  for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (lane == 0) rstd[row] = r;
  for (int c = lane; c < C; c += 32) {
    const float y[1] = {xr[c] * r * w[c]};
    store(o + c, y);
  }
}

// dynamic smem: kWarps * C floats when use_smem, else none (dw atomics per row, huge C only).
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(float* __restrict__ dx, float* __restrict__ dw,
                                                                    const float* __restrict__ dout,
                                                                    const float* __restrict__ x,
                                                                    const float* __restrict__ w,
                                                                    const float* __restrict__ rstd, int N, int C,
                                                                    bool use_smem, bool accumulate) {
  extern __shared__ float part_smem[];  // [kWarps][C]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* mine = part_smem + size_t(warp) * C;
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
      const float v = r * w[c] * d[c] - xr[c] * k;
      g[c] = accumulate ? g[c] + v : v;
      if (dw) {
        const float u = d[c] * xr[c] * r;
        if (use_smem) mine[c] += u;
        else atomicAdd(dw + c, u);
      }
    }
  }
  if (!dw || !use_smem) return;
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) s += part_smem[size_t(k) * C + c];
    atomicAdd(dw + c, s);
  }
}

}  // namespace

namespace {

// Resident blocks of a backward kernel on the whole device (queried once per kernel).
template <int VW, int G, int NCH>
long long resident_bwd_blocks() {
  static const long long v = [] {
    int per_sm = 0;
    LRNN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rmsnorm_bwd_vec<VW, G, NCH>,
                                                                  bwd_threads<NCH>(), 0));
    return (long long)std::max(per_sm, 1) * ::lrnn::cuda::num_sms();
  }();
  return v;
}

template <class Out>
struct FwdLaunch {
  Out* out;
  float* rstd;
  const float *x, *w;
  int N, C;
  float eps;
  template <int VW, int G, int NCH>
  void run() const {
    const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N) * G, kThreads);
    rmsnorm_fwd_vec<VW, G, NCH, Out><<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(out, rstd, x, w, N, C, eps);
  }
};
struct BwdLaunch {
  float *dx, *dw;
  const float *dout, *x, *w, *rstd;
  int N, C;
  bool accumulate;
  template <int VW, int G, int NCH>
  void run() const {
    constexpr int threads = bwd_threads<NCH>();
    const int nb = bwd_blocks(N, C, G, threads, resident_bwd_blocks<VW, G, NCH>(), dw != nullptr);
    float* part = dw ? static_cast<float*>(::lrnn::cuda::scratch(size_t(nb) * C * sizeof(float))) : nullptr;
    rmsnorm_bwd_vec<VW, G, NCH><<<nb, threads, 0, ::lrnn::cuda::stream()>>>(dx, part, dout, x, w, rstd, N, C,
                                                                          dw != nullptr, accumulate);
    LRNN_CUDA_LAUNCH_CHECK();
    if (dw) rmsnorm_reduce_kernel<<<(C + 31) / 32, dim3(32, 32), 0, ::lrnn::cuda::stream()>>>(dw, part, nb, C);
  }
};

template <class Out>
void forward_impl(Out* out, float* rstd, const float* x, const float* w, int N, int C, double eps) {
  if (N <= 0 || C <= 0) return;
  const bool vec = C % 4 == 0 && ::lrnn::cuda::aligned(out, 4 * sizeof(Out)) && ::lrnn::cuda::aligned(x, 16) &&
                   ::lrnn::cuda::aligned(w, 16);
  if (!::lrnn::cuda::dispatch_rows(plan_row(C, vec ? 4 : 1), FwdLaunch<Out>{out, rstd, x, w, N, C, float(eps)})) {
    const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N), kWarps);
    rmsnorm_forward_kernel<<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(out, rstd, x, w, N, C, float(eps));
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, double eps) {
  forward_impl(out, rstd, x, w, N, C, eps);
}

void rmsnorm_forward(bf16* out, float* rstd, const float* x, const float* w, int N, int C, double eps) {
  forward_impl(reinterpret_cast<__nv_bfloat16*>(out), rstd, x, w, N, C, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int N, int C, bool accumulate) {
  if (N <= 0 || C <= 0) return;
  const bool vec = C % 4 == 0 && ::lrnn::cuda::aligned(dx, 16) && ::lrnn::cuda::aligned(dout, 16) && ::lrnn::cuda::aligned(x, 16) && ::lrnn::cuda::aligned(w, 16);
  if (!::lrnn::cuda::dispatch_rows(plan_row(C, vec ? 4 : 1), BwdLaunch{dx, dw, dout, x, w, rstd, N, C, accumulate})) {
    const size_t smem_need = size_t(kWarps) * C * sizeof(float);
    const bool use_smem = dw && smem_need <= kMaxSmem;
    const size_t smem = use_smem ? smem_need : 0;
    unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N), kWarps);
    if (blocks > unsigned(kMaxBlocks)) blocks = kMaxBlocks;
    rmsnorm_backward_kernel<<<blocks, kThreads, smem, ::lrnn::cuda::stream()>>>(dx, dw, dout, x, w, rstd, N, C,
                                                                                use_smem, accumulate);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
