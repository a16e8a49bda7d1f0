// CUDA causal depthwise short conv + SiLU (contract: short_conv_cuda.h / short_conv.h).
//
// K <= 4 (every model: fla's and Mamba's conv_size is 4): "sliding window" kernels. A thread
// owns VW adjacent channels (VW = 4 with float4 loads when C, ldx, ldo and the pointers allow it,
// else 2 or 1) of one chunk of L time steps of one sequence, and walks the chunk in time keeping
// the last K inputs (and, backward, the last K output gradients) in registers, so each x / dout
// row is read once per chunk (plus a halo of K-1 rows, served by L2) and each out / dx row
// written once. The 32 lanes of a warp take 32 adjacent channel vectors of the same row
// (coalesced); the next rows of the chunk (3 forward, 2 backward) are loaded while the current
// one is computed, so a thread keeps 48-64 bytes in flight (the backward, 126 registers for
// K = 4 with float4, runs one 512-thread block per SM).
// Chunks are as long as possible while the grid still fills the GPU (T = 40, B = 1024, C = 384:
// 3 chunks of <= 14 steps forward, 2 of 20 backward). All index math inside a row is 32-bit;
// row offsets are 64-bit.
//
// Backward, per step t of the chunk [t0, t1) (steps run to t1 + K - 2 for the halo):
//   dpre[t] = dout[t] silu'(pre[t])                 (0 at t >= T)
//   dx[s]   = sum_j w[c,j] dpre[s+K-1-j]  for s = t-(K-1) in [t0, t1)   (written or added)
//   dw[c,j] += dpre[t] x[t-(K-1)+j], dbias[c] += dpre[t]   for t in [t0, t1), in registers.
// A thread owns its dx elements exactly (no atomics, no races). dw / dbias: each block sums its
// 16 rows of threads in shared memory (fixed order) and writes one partial per (channel, tap) to
// the device scratch; a second small kernel adds the partials of all blocks in a fixed order to
// dw / dbias: deterministic, no atomics. (Only if C (K+1) > 256 Ki floats would the partials not
// fit the scratch: blocks then atomicAdd their sums.)
//
// K > 4: the general kernels below (one thread per element forward; tiles of 64 steps x 32
// channels with a halo in shared memory backward, dw / dbias by atomics).
#include "ops/short_conv/short_conv_cuda.h"
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include "core/check.h"
#include "cuda/rows.cuh"
#include "cuda/runtime.h"
#include "ops/l2norm/l2norm_cuda.h"

namespace lrnn::ops::cuda {
namespace {

using ::lrnn::cuda::load_ro;
using ::lrnn::cuda::load_rw;
using ::lrnn::cuda::store;

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// ---- sliding-window kernels (K <= 4) --------------------------------------------------------

constexpr int kLanes = 32;       // channel vectors per block row (blockDim.x)
constexpr int kFwdRows = 8;      // blockDim.y forward: 256 threads
constexpr int kBwdRows = 16;     // blockDim.y backward: 512 threads (fewer partial sums)
constexpr int kMaxWinK = 4;      // largest K of the sliding-window kernels
constexpr int kMinChunk = 8;     // shortest chunk of time steps (the halo is K-1 steps)
constexpr int kFwdPrefetch = 3;  // time steps loaded ahead (bytes in flight per thread)
constexpr int kBwdPrefetch = 2;
// The partials use at most 1 MiB of lrnn::cuda::scratch (the budget these kernels were measured
// with; the scratch holds kScratchBytes).
constexpr long long kScratchFloats = (1 << 20) / sizeof(float);

template <int VW>
__device__ __forceinline__ void zero(float (&r)[VW]) {
#pragma unroll
  for (int v = 0; v < VW; ++v) r[v] = 0.f;
}

// Weights w[c, j] and bias[c] of channels c .. c+VW-1 (zeros for K = 0 / no bias).
template <int K, int VW>
__device__ __forceinline__ void load_params(float (&wr)[K > 0 ? K : 1][VW], float (&br)[VW], const float* w,
                                            const float* bias, int c) {
#pragma unroll
  for (int v = 0; v < VW; ++v) {
    br[v] = bias ? __ldg(bias + c + v) : 0.f;
#pragma unroll
    for (int j = 0; j < (K > 0 ? K : 1); ++j) wr[j][v] = K > 0 ? __ldg(w + (c + v) * K + j) : 0.f;
  }
}

// pre = bias + sum_j w[j] xw[j], where xw[j] = x[t-(K-1)+j] (K = 0: bias + x[t]).
template <int K, int VW>
__device__ __forceinline__ float pre_act(const float (&wr)[K > 0 ? K : 1][VW], const float (&br)[VW],
                                         const float (&xw)[K > 0 ? K : 1][VW], int v) {
  float pre = br[v];
  if constexpr (K == 0) {
    pre += xw[0][v];
  } else {
#pragma unroll
    for (int j = 0; j < K; ++j) pre += wr[j][v] * xw[j][v];
  }
  return pre;
}

// The window before step t0: slots 1 .. K-1 hold x[t0-K+1 .. t0-1] (before t = 0: the carried
// inputs pb = &prev[b, 0, c] (rows of C), or 0 without them); slot 0 is shifted out by the first
// step. xb = &x[b, 0, c].
template <int K, int VW>
__device__ __forceinline__ void prime_window(float (&xw)[K > 0 ? K : 1][VW], const float* xb, int t0, int ldx,
                                             const float* pb, int C) {
  zero(xw[0]);
#pragma unroll
  for (int j = 1; j < K; ++j) {
    const int p = t0 - K + j;
    if (p >= 0) load_ro(xw[j], xb + size_t(p) * ldx);
    else if (pb) load_ro(xw[j], pb + size_t(K - 1 + p) * C);
    else zero(xw[j]);
  }
}

template <int K, int VW>
__device__ __forceinline__ void push(float (&win)[K > 0 ? K : 1][VW], const float (&v)[VW]) {
#pragma unroll
  for (int j = 0; j + 1 < (K > 0 ? K : 1); ++j)
#pragma unroll
    for (int u = 0; u < VW; ++u) win[j][u] = win[j + 1][u];
#pragma unroll
  for (int u = 0; u < VW; ++u) win[(K > 0 ? K : 1) - 1][u] = v[u];
}

// grid (ceil(C / VW / 32), row blocks), block (32, kFwdRows). Rows are (b, chunk) pairs:
// row = b * nchunks + chunk, chunk covering steps [chunk L, min((chunk+1) L, T)).
//
// G > 0: the fused L2 norm (short_conv_l2norm_forward). Channels c < nrm.Cn, in heads of
// D = G VW (one group of G lanes per head and row: the lanes of a warp share their row and step),
// are normalised per head, y = o / sqrt(sum o^2 + eps), and go to nrm.y with their rstd; the
// other channels to out. Lanes past C stay (with zeros) for the groups' shuffles.
struct NormOut {
  float* y = nullptr;     // [B T, ldn]
  float* rstd = nullptr;  // [B T, Cn / D]
  int Cn = 0, ldn = 0;
  float eps = 0.f;
};

template <int K, int VW, int G = 0>
__global__ void __launch_bounds__(kLanes* kFwdRows, 3) conv_fwd_kernel(float* __restrict__ out,
                                                                    const float* __restrict__ x,
                                                                    const float* __restrict__ w,
                                                                    const float* __restrict__ bias, int B, int T,
                                                                    int C, int ldx, int ldo, int L, int nchunks,
                                                                    const float* __restrict__ prev,
                                                                    NormOut nrm = {}) {
  constexpr int KW = K > 0 ? K : 1;
  const int c = (blockIdx.x * kLanes + threadIdx.x) * VW;
  const bool live = c < C;  // C % VW == 0: a vector is wholly inside or outside
  if (G == 0 && !live) return;
  const bool normed = G > 0 && c < nrm.Cn;  // the same for the G lanes of a head
  float wr[KW][VW], br[VW];
  if (live) load_params<K, VW>(wr, br, w, bias, c);
  const int rows = B * nchunks;
  for (int row = blockIdx.y * kFwdRows + threadIdx.y; row < rows; row += gridDim.y * kFwdRows) {
    const int b = row / nchunks;
    const int t0 = (row - b * nchunks) * L, t1 = min(t0 + L, T);
    const float* xb = x + size_t(b) * T * ldx + (live ? c : 0);
    float* ob = out + size_t(b) * T * ldo + c;
    float xw[KW][VW];
    if (live)
      prime_window<K, VW>(xw, xb, t0, ldx, prev && K > 1 ? prev + size_t(b) * (K > 1 ? K - 1 : 0) * C + c : nullptr, C);
    float xq[kFwdPrefetch][VW];  // x of steps t .. t + kFwdPrefetch - 1 (loaded ahead)
#pragma unroll
    for (int k = 0; k < kFwdPrefetch; ++k)
      if (live && t0 + k < t1) load_ro(xq[k], xb + size_t(t0 + k) * ldx);
      else zero(xq[k]);
    for (int t = t0; t < t1; ++t) {
      float xc[VW];
#pragma unroll
      for (int v = 0; v < VW; ++v) xc[v] = xq[0][v];
#pragma unroll
      for (int k = 0; k + 1 < kFwdPrefetch; ++k)
#pragma unroll
        for (int v = 0; v < VW; ++v) xq[k][v] = xq[k + 1][v];
      if (live && t + kFwdPrefetch < t1) load_ro(xq[kFwdPrefetch - 1], xb + size_t(t + kFwdPrefetch) * ldx);
      float o[VW];
      if (live) {
        push<K, VW>(xw, xc);
#pragma unroll
        for (int v = 0; v < VW; ++v) {
          const float pre = pre_act<K, VW>(wr, br, xw, v);
          o[v] = pre * sigmoid(pre);
        }
      } else {
        zero(o);
      }
      if constexpr (G > 0) {
        float ss = 0.f;
#pragma unroll
        for (int v = 0; v < VW; ++v) ss += normed ? o[v] * o[v] : 0.f;
        ss = ::lrnn::cuda::group_sum<G>(ss);
        if (normed) {
          const float r = 1.f / sqrtf(ss + nrm.eps);
#pragma unroll
          for (int v = 0; v < VW; ++v) o[v] *= r;
          const size_t tok = size_t(b) * T + t;
          store(nrm.y + tok * nrm.ldn + c, o);
          if (threadIdx.x % G == 0) nrm.rstd[tok * (nrm.Cn / (G * VW)) + c / (G * VW)] = r;
          continue;
        }
      }
      if (live) store(ob + size_t(t) * ldo, o);
    }
  }
}

// grid (ceil(C / VW / 32), row blocks), block (32, kBwdRows). Partials (when dw or dbias):
// part[blockIdx.y][q], q = c K + j for dw[c, j] and C K + c for dbias[c] (direct: atomics into
// dw / dbias instead).
template <int K, int VW>
__global__ void __launch_bounds__(kLanes* kBwdRows) conv_bwd_kernel(
    float* __restrict__ dx, float* __restrict__ part, float* __restrict__ dw, float* __restrict__ dbias,
    const float* __restrict__ dout, const float* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ bias, int B, int T, int C, int ldx, int ldo, int L, int nchunks, bool accumulate,
    bool direct) {
  constexpr int KW = K > 0 ? K : 1;
  constexpr int H = K > 0 ? K - 1 : 0;  // halo
  const int c = (blockIdx.x * kLanes + threadIdx.x) * VW;
  const bool cok = c < C;
  const bool want_w = dw != nullptr && K > 0, want_b = dbias != nullptr;
  float wr[KW][VW], br[VW];
  if (cok) {
    load_params<K, VW>(wr, br, w, bias, c);
  } else {
#pragma unroll
    for (int j = 0; j < KW; ++j) zero(wr[j]);
    zero(br);
  }
  float aw[KW][VW], ab[VW];  // dw, dbias sums
#pragma unroll
  for (int j = 0; j < KW; ++j) zero(aw[j]);
  zero(ab);

  const int rows = B * nchunks;
  for (int row = blockIdx.y * kBwdRows + threadIdx.y; cok && row < rows; row += gridDim.y * kBwdRows) {
    const int b = row / nchunks;
    const int t0 = (row - b * nchunks) * L, t1 = min(t0 + L, T);
    const int tend = t1 + H;  // steps t0 .. tend-1
    const float* xb = x + size_t(b) * T * ldx + c;
    const float* gb = dout + size_t(b) * T * ldo + c;
    float* dxb = dx + size_t(b) * T * ldx + c;
    float xw[KW][VW], pw[KW][VW];  // xw[j] = x[t-(K-1)+j], pw[j] = dpre[t-(K-1)+j]
    prime_window<K, VW>(xw, xb, t0, ldx, nullptr, C);  // (training: nothing carried)
#pragma unroll
    for (int j = 0; j < KW; ++j) zero(pw[j]);  // dpre before t0 feeds no dx of this chunk
    // The inputs of steps t .. t + kBwdPrefetch - 1, loaded ahead: x[t], dout[t] (0 at t >= T)
    // and, when accumulating, the old dx[t - H] (when t - H >= t0).
    float xq[kBwdPrefetch][VW], gq[kBwdPrefetch][VW], dq[kBwdPrefetch][VW];
#pragma unroll
    for (int k = 0; k < kBwdPrefetch; ++k) {
      const int tk = t0 + k;
      zero(xq[k]), zero(gq[k]), zero(dq[k]);
      if (tk < tend && tk < T) {
        load_ro(xq[k], xb + size_t(tk) * ldx);
        load_ro(gq[k], gb + size_t(tk) * ldo);
      }
      if (accumulate && tk < tend && tk - H >= t0) load_rw(dq[k], dxb + size_t(tk - H) * ldx);
    }
    for (int t = t0; t < tend; ++t) {
      float xc[VW], gc[VW], dc[VW];
#pragma unroll
      for (int v = 0; v < VW; ++v) xc[v] = xq[0][v], gc[v] = gq[0][v], dc[v] = dq[0][v];
#pragma unroll
      for (int k = 0; k + 1 < kBwdPrefetch; ++k)
#pragma unroll
        for (int v = 0; v < VW; ++v) xq[k][v] = xq[k + 1][v], gq[k][v] = gq[k + 1][v], dq[k][v] = dq[k + 1][v];
      const int tn = t + kBwdPrefetch;
      if (tn < tend) {
        constexpr int e = kBwdPrefetch - 1;
        if (tn < T) {
          load_ro(xq[e], xb + size_t(tn) * ldx);
          load_ro(gq[e], gb + size_t(tn) * ldo);
        } else {
          zero(xq[e]);
          zero(gq[e]);
        }
        if (accumulate && tn - H >= t0) load_rw(dq[e], dxb + size_t(tn - H) * ldx);
      }
      push<K, VW>(xw, xc);
      float d[VW];
#pragma unroll
      for (int v = 0; v < VW; ++v) {
        float dp = 0.f;
        if (t < T) {
          const float pre = pre_act<K, VW>(wr, br, xw, v);
          const float s = sigmoid(pre);
          dp = gc[v] * (s * (1.f + pre * (1.f - s)));
        }
        d[v] = dp;
      }
      push<K, VW>(pw, d);
      if (t < t1) {
#pragma unroll
        for (int v = 0; v < VW; ++v) {
          ab[v] += d[v];
#pragma unroll
          for (int j = 0; j < KW; ++j) aw[j][v] += d[v] * xw[j][v];
        }
      }
      const int s = t - H;
      if (s >= t0) {  // s < t1 since t < t1 + H
        float o[VW];
#pragma unroll
        for (int v = 0; v < VW; ++v) {
          float acc;
          if constexpr (K == 0) {
            acc = pw[0][v];
          } else {
            acc = 0.f;
#pragma unroll
            for (int j = K - 1; j >= 0; --j) acc += wr[j][v] * pw[K - 1 - j][v];
          }
          o[v] = accumulate ? dc[v] + acc : acc;
        }
        store(dxb + size_t(s) * ldx, o);
      }
    }
  }

  if (!want_w && !want_b) return;  // uniform over the grid
  // Sum the block's kBwdRows rows of threads per (channel, quantity); quantity q < K is dw tap q,
  // q == K is dbias.
  __shared__ float red[kBwdRows][kLanes * VW];
  const int flat = threadIdx.y * kLanes + threadIdx.x;
  const int ch = blockIdx.x * kLanes * VW + flat;  // the channel thread `flat` sums
#pragma unroll
  for (int q = 0; q <= K; ++q) {
    if (q < K ? !want_w : !want_b) continue;  // uniform
#pragma unroll
    for (int v = 0; v < VW; ++v) red[threadIdx.y][threadIdx.x * VW + v] = q < K ? aw[q < K ? q : 0][v] : ab[v];
    __syncthreads();
    if (flat < kLanes * VW && ch < C) {
      float s = 0.f;
#pragma unroll
      for (int y = 0; y < kBwdRows; ++y) s += red[y][flat];
      if (direct) atomicAdd(q < K ? dw + ch * K + q : dbias + ch, s);
      else part[size_t(blockIdx.y) * (C * (K + 1)) + (q < K ? ch * K + q : C * K + ch)] = s;
    }
    __syncthreads();
  }
}

// dw[q] += sum_r part[r][q] (q < C K), dbias[q - C K] += ... (q >= C K), r in a fixed order.
// grid ceil(C (K+1) / 32), block (32, 32).
__global__ void __launch_bounds__(1024) conv_reduce_kernel(float* __restrict__ dw, float* __restrict__ dbias,
                                                           const float* __restrict__ part, int nparts, int C, int K) {
  __shared__ float sm[32][33];
  const int Q = C * (K + 1), CK = C * K;
  const int q = blockIdx.x * 32 + threadIdx.x;
  const bool want = q < Q && (q < CK ? dw != nullptr : dbias != nullptr);
  float s = 0.f;
  if (want)
    for (int r = threadIdx.y; r < nparts; r += 32) s += part[size_t(r) * Q + q];
  sm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && want) {
    float t = 0.f;
#pragma unroll 8
    for (int y = 0; y < 32; ++y) t += sm[y][threadIdx.x];
    if (q < CK) dw[q] += t;
    else dbias[q - CK] += t;
  }
}

// Launch geometry of the sliding-window kernels.
struct WinPlan {
  int L = 1, nchunks = 1;  // chunk length and chunks per sequence
  int ctiles = 1;          // gridDim.x
  int rblocks = 1;         // gridDim.y
  bool direct = false;     // backward: atomics instead of partials
};

// Chunks as long as possible with at least `target_threads` threads (chunks of >= kMinChunk
// steps); then row blocks of `by` rows, capped (backward with sums: so the partials fit the
// scratch).
WinPlan plan_window(int B, int T, int C, int K, int VW, int by, long long target_threads, bool sums) {
  WinPlan p;
  const int cv = C / VW;
  p.ctiles = (cv + kLanes - 1) / kLanes;
  const long long lanes = (long long)p.ctiles * kLanes;
  const long long want_rows = (target_threads + lanes - 1) / lanes;
  const long long want_chunks = std::max(1LL, (want_rows + B - 1) / B);
  const int nch = int(std::min<long long>(T, want_chunks));
  p.L = (T + nch - 1) / nch;
  if (p.L < kMinChunk) p.L = std::min(T, kMinChunk);
  p.nchunks = (T + p.L - 1) / p.L;
  const long long rows = (long long)B * p.nchunks;
  long long rb = (rows + by - 1) / by;
  rb = std::min(rb, 65535LL);
  if (sums) {
    const long long Q = (long long)C * (K + 1);
    const long long cap = kScratchFloats / Q;
    if (cap >= 1) rb = std::min(rb, cap);
    else p.direct = true, rb = std::min(rb, 256LL);
  }
  p.rblocks = int(std::max(1LL, rb));
  return p;
}


// The widest vector (4, 2, 1 floats) that C, the strides and every pointer allow.
int vector_width(int C, int ldx, int ldo, std::initializer_list<const void*> ptrs) {
  for (int vw : {4, 2}) {
    bool ok = C % vw == 0 && ldx % vw == 0 && ldo % vw == 0;
    for (const void* p : ptrs) ok = ok && ::lrnn::cuda::aligned(p, vw * sizeof(float));
    if (ok) return vw;
  }
  return 1;
}

// ---- general kernels (K > 4) ----------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kBx = 32, kBy = 8;  // channels x time rows of a backward block
constexpr int kTile = 64;         // time steps per backward block
constexpr int kKmax = 8;          // weight taps summed per pass (more taps: more passes)
static_assert(kBx * kBy == kThreads);

__global__ void short_conv_forward_kernel(float* __restrict__ out, const float* __restrict__ x,
                                          const float* __restrict__ w, const float* __restrict__ bias, int B, int T,
                                          int C, int K, int ldx, int ldo, const float* __restrict__ prev) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(B) * T * C) return;
  const int c = int(e % C);
  const size_t bt = e / C;  // b * T + t
  const int t = int(bt % T);
  const float* xb = x + (bt - t) * ldx + c;  // x[b, 0, c]
  float pre = bias ? bias[c] : 0.f;
  if (K == 0) {
    pre = xb[size_t(t) * ldx] + pre;
  } else {
    for (int j = max(0, K - 1 - t); j < K; ++j) pre += w[size_t(c) * K + j] * xb[size_t(t - (K - 1) + j) * ldx];
    if (prev)  // inputs before t = 0: the carried ones, prev[b, K-1+p, c] for p = t-(K-1)+j < 0
      for (int j = 0; j < K - 1 - t; ++j)
        pre += w[size_t(c) * K + j] * prev[(size_t(bt - t) / T * (K - 1) + size_t(t + j)) * C + c];
  }
  out[bt * ldo + c] = pre * sigmoid(pre);
}

// grid (ceil(C / 32), ceil(T / kTile), B), block (32, 8); dynamic smem: see smem_floats().
// A block owns dx on its tile (written once: added to or overwritten).
__global__ void __launch_bounds__(kThreads) short_conv_backward_kernel(
    float* __restrict__ dx, float* __restrict__ dw, const float* __restrict__ dout, const float* __restrict__ x,
    const float* __restrict__ w, int T, int C, int K, int ldx, int ldo, const float* __restrict__ bias,
    float* __restrict__ dbias, bool accumulate) {
  extern __shared__ float smem[];
  const int hl = K > 0 ? K - 1 : 0;                // halo
  float* xs = smem;                                // [kTile + 2 hl][32]: position t0 - hl + r
  float* dps = xs + (kTile + 2 * hl) * kBx;        // [kTile + hl][32]:   position t0 + r
  float* red = dps + (kTile + hl) * kBx;           // [kKmax + 1][kBy][32]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kBx + tx;
  const int t0 = blockIdx.y * kTile;
  const size_t b = blockIdx.z;
  const bool cok = c < C;
  const float* xb = x + b * T * ldx;
  float* dxb = dx + b * T * ldx;
  const float* db = dout + b * T * ldo;

  for (int r = ty; r < kTile + 2 * hl; r += kBy) {
    const int p = t0 - hl + r;
    xs[r * kBx + tx] = (cok && p >= 0 && p < T) ? xb[size_t(p) * ldx + c] : 0.f;
  }
  __syncthreads();
  const float bc = (bias && cok) ? bias[c] : 0.f;
  for (int r = ty; r < kTile + hl; r += kBy) {
    const int t = t0 + r;
    float dp = 0.f;
    if (cok && t < T) {
      float pre = bc;
      if (K == 0) {
        pre = xs[r * kBx + tx] + pre;
      } else {
        for (int j = 0; j < K; ++j) pre += w[size_t(c) * K + j] * xs[(r + j) * kBx + tx];
      }
      const float s = sigmoid(pre);
      dp = db[size_t(t) * ldo + c] * (s * (1.f + pre * (1.f - s)));
    }
    dps[r * kBx + tx] = dp;
  }
  __syncthreads();

  // dx: this thread owns (s, c) for s = t0 + ty, t0 + ty + 8, ...
  if (cok) {
    for (int r = ty; r < kTile; r += kBy) {
      const int s = t0 + r;
      if (s >= T) break;
      float acc;
      if (K == 0) {
        acc = dps[r * kBx + tx];
      } else {
        acc = 0.f;
        for (int j = K - 1; j >= 0; --j) acc += w[size_t(c) * K + j] * dps[(r + K - 1 - j) * kBx + tx];
      }
      float* g = dxb + size_t(s) * ldx + c;
      *g = accumulate ? *g + acc : acc;
    }
  }

  // dbias and dw: quantity 0 is dbias, quantity 1 + jj is dw[c, j0 + jj].
  if (!dbias && !(dw && K > 0)) return;  // uniform over the block
  for (int j0 = 0; j0 == 0 || j0 < K; j0 += kKmax) {
    const bool with_bias = dbias && j0 == 0;
    const bool with_w = dw && j0 < K;
    float accb = 0.f, acc[kKmax];
#pragma unroll
    for (int jj = 0; jj < kKmax; ++jj) acc[jj] = 0.f;
    for (int r = ty; r < kTile; r += kBy) {
      if (t0 + r >= T) break;
      const float dp = dps[r * kBx + tx];
      accb += dp;
      if (with_w) {
#pragma unroll
        for (int jj = 0; jj < kKmax; ++jj)
          if (j0 + jj < K) acc[jj] += dp * xs[(r + j0 + jj) * kBx + tx];
      }
    }
    red[ty * kBx + tx] = accb;
#pragma unroll
    for (int jj = 0; jj < kKmax; ++jj) red[((1 + jj) * kBy + ty) * kBx + tx] = acc[jj];
    __syncthreads();
    const int nq = 1 + (with_w ? min(kKmax, K - j0) : 0);
    for (int q = ty; q < nq; q += kBy) {
      if (!cok || (q == 0 && !with_bias)) continue;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kBy; ++k) s += red[(q * kBy + k) * kBx + tx];
      if (q == 0) atomicAdd(dbias + c, s);
      else atomicAdd(dw + size_t(c) * K + j0 + q - 1, s);
    }
    __syncthreads();
  }
}

size_t smem_floats(int K) {
  const int hl = K > 0 ? K - 1 : 0;
  return size_t(kTile + 2 * hl) * kBx + size_t(kTile + hl) * kBx + size_t(kKmax + 1) * kBy * kBx;
}

}  // namespace

namespace {

template <int VW>
void launch_fwd(const WinPlan& p, float* out, const float* x, const float* w, const float* bias, int B, int T, int C,
                int K, int ldx, int ldo, const float* prev) {
  const dim3 grid(p.ctiles, p.rblocks), block(kLanes, kFwdRows);
  cudaStream_t s = ::lrnn::cuda::stream();
#define LRNN_CONV_FWD(KK) \
  conv_fwd_kernel<KK, VW><<<grid, block, 0, s>>>(out, x, w, bias, B, T, C, ldx, ldo, p.L, p.nchunks, prev)
  switch (K) {
    case 0: LRNN_CONV_FWD(0); break;
    case 1: LRNN_CONV_FWD(1); break;
    case 2: LRNN_CONV_FWD(2); break;
    case 3: LRNN_CONV_FWD(3); break;
    default: LRNN_CONV_FWD(4); break;
  }
#undef LRNN_CONV_FWD
}

template <int VW>
void launch_bwd(const WinPlan& p, float* dx, float* part, float* dw, float* dbias, const float* dout, const float* x,
                const float* w, const float* bias, int B, int T, int C, int K, int ldx, int ldo, bool accumulate) {
  const dim3 grid(p.ctiles, p.rblocks), block(kLanes, kBwdRows);
  cudaStream_t s = ::lrnn::cuda::stream();
#define LRNN_CONV_BWD(KK)                                                                                    \
  conv_bwd_kernel<KK, VW><<<grid, block, 0, s>>>(dx, part, dw, dbias, dout, x, w, bias, B, T, C, ldx, ldo, p.L, \
                                                 p.nchunks, accumulate, p.direct)
  switch (K) {
    case 0: LRNN_CONV_BWD(0); break;
    case 1: LRNN_CONV_BWD(1); break;
    case 2: LRNN_CONV_BWD(2); break;
    case 3: LRNN_CONV_BWD(3); break;
    default: LRNN_CONV_BWD(4); break;
  }
#undef LRNN_CONV_BWD
}

}  // namespace

void short_conv_forward(float* out, const float* x, const float* w, int B, int T_, int C, int K, int ldx, int ldo,
                        const float* bias, const float* prev) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  if (B <= 0 || T_ <= 0 || C <= 0) return;
  if (K <= 1) prev = nullptr;  // nothing carried
  if (K > kMaxWinK) {
    const size_t n = size_t(B) * T_ * C;
    short_conv_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
        out, x, w, bias, B, T_, C, K, ldx, ldo, prev);
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
  const int vw = vector_width(C, ldx, ldo, {x, out, prev});
  const WinPlan p = plan_window(B, T_, C, K, vw, kFwdRows, 2048LL * ::lrnn::cuda::num_sms(), false);
  if (vw == 4) launch_fwd<4>(p, out, x, w, bias, B, T_, C, K, ldx, ldo, prev);
  else if (vw == 2) launch_fwd<2>(p, out, x, w, bias, B, T_, C, K, ldx, ldo, prev);
  else launch_fwd<1>(p, out, x, w, bias, B, T_, C, K, ldx, ldo, prev);
  LRNN_CUDA_LAUNCH_CHECK();
}

void short_conv_l2norm_forward(float* out, float* y, float* rstd, const float* x, const float* w, int B, int T_,
                               int C, int K, int ldx, int ldo, int Cn, int D, double eps, int ldn,
                               const float* prev) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  if (!ldn) ldn = Cn;
  if (B <= 0 || T_ <= 0 || C <= 0) return;
  LRNN_CHECK(D > 0 && Cn >= 0 && Cn <= C && Cn % D == 0, "short_conv_l2norm_forward: Cn {} in heads of {} of C {}",
             Cn, D, C);
  if (K <= 1) prev = nullptr;
  const int vw = vector_width(C, ldx, ldo, {x, out, prev});
  const bool fused = K <= kMaxWinK && vw == 4 && (D == 16 || D == 32 || D == 64) && ldn % 4 == 0 &&
                     ::lrnn::cuda::aligned(y, 16);
  if (!fused) {  // the two ops one after the other
    short_conv_forward(out, x, w, B, T_, C, K, ldx, ldo, nullptr, prev);
    l2norm_forward(y, rstd, out, B * T_, D, eps, Cn / D, ldo, ldn);
    return;
  }
  const WinPlan p = plan_window(B, T_, C, K, vw, kFwdRows, 2048LL * ::lrnn::cuda::num_sms(), false);
  const dim3 grid(p.ctiles, p.rblocks), block(kLanes, kFwdRows);
  const NormOut nrm{y, rstd, Cn, ldn, float(eps)};
  cudaStream_t s = ::lrnn::cuda::stream();
#define LRNN_CONV_NRM(KK, GG) \
  conv_fwd_kernel<KK, 4, GG><<<grid, block, 0, s>>>(out, x, w, nullptr, B, T_, C, ldx, ldo, p.L, p.nchunks, prev, nrm)
#define LRNN_CONV_NRM_K(GG)            \
  switch (K) {                         \
    case 0: LRNN_CONV_NRM(0, GG); break; \
    case 1: LRNN_CONV_NRM(1, GG); break; \
    case 2: LRNN_CONV_NRM(2, GG); break; \
    case 3: LRNN_CONV_NRM(3, GG); break; \
    default: LRNN_CONV_NRM(4, GG); break; \
  }
  if (D == 16) LRNN_CONV_NRM_K(4)
  else if (D == 32) LRNN_CONV_NRM_K(8)
  else LRNN_CONV_NRM_K(16)
#undef LRNN_CONV_NRM_K
#undef LRNN_CONV_NRM
  LRNN_CUDA_LAUNCH_CHECK();
}

void short_conv_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int B, int T_,
                         int C, int K, int ldx, int ldo, const float* bias, float* dbias, bool accumulate) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  if (B <= 0 || T_ <= 0 || C <= 0) return;
  if (K == 0) dw = nullptr;  // no weights: nothing to add to
  if (K > kMaxWinK) {
    const size_t smem = smem_floats(K) * sizeof(float);
    if (smem > 48 * 1024)  // long filters only (K > ~70): opt in to more shared memory
      LRNN_CUDA_CHECK(cudaFuncSetAttribute(short_conv_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(smem)));
    const dim3 grid((C + kBx - 1) / kBx, (T_ + kTile - 1) / kTile, B);
    short_conv_backward_kernel<<<grid, dim3(kBx, kBy), smem, ::lrnn::cuda::stream()>>>(
        dx, dw, dout, x, w, T_, C, K, ldx, ldo, bias, dbias, accumulate);
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
  const bool sums = dw || dbias;
  const int vw = vector_width(C, ldx, ldo, {x, dx, dout});
  const WinPlan p = plan_window(B, T_, C, K, vw, kBwdRows, 1024LL * ::lrnn::cuda::num_sms(), sums);
  float* part = nullptr;
  if (sums && !p.direct)
    part = static_cast<float*>(::lrnn::cuda::scratch(size_t(p.rblocks) * C * (K + 1) * sizeof(float)));
  if (vw == 4) launch_bwd<4>(p, dx, part, dw, dbias, dout, x, w, bias, B, T_, C, K, ldx, ldo, accumulate);
  else if (vw == 2) launch_bwd<2>(p, dx, part, dw, dbias, dout, x, w, bias, B, T_, C, K, ldx, ldo, accumulate);
  else launch_bwd<1>(p, dx, part, dw, dbias, dout, x, w, bias, B, T_, C, K, ldx, ldo, accumulate);
  LRNN_CUDA_LAUNCH_CHECK();
  if (part) {
    const int Q = C * (K + 1);
    conv_reduce_kernel<<<(Q + 31) / 32, dim3(32, 32), 0, ::lrnn::cuda::stream()>>>(dw, dbias, part, p.rblocks, C, K);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

namespace {
// One thread per (sequence, channel): its K-1 tail rows in increasing order (row r + T_ is read
// before row r + T_ is written), as the CPU op.
__global__ void advance_tail_kernel(float* __restrict__ tail, const float* __restrict__ x, int B, int T, int C,
                                    int keep, int ldx) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(B) * C) return;
  const int c = int(e % C);
  const size_t b = e / C;
  float* tb = tail + b * keep * C + c;
  const int from_x = min(T, keep), from_tail = keep - from_x;
  for (int r = 0; r < from_tail; ++r) tb[size_t(r) * C] = tb[size_t(r + T) * C];
  for (int r = 0; r < from_x; ++r) tb[size_t(from_tail + r) * C] = x[(b * T + size_t(T - from_x + r)) * ldx + c];
}
}  // namespace

void short_conv_advance_tail(float* tail, const float* x, int B, int T_, int C, int K, int ldx) {
  if (!ldx) ldx = C;
  if (K <= 1 || B <= 0 || T_ <= 0 || C <= 0) return;
  const size_t n = size_t(B) * C;
  advance_tail_kernel<<<::lrnn::cuda::blocks_for(n, 256), 256, 0, ::lrnn::cuda::stream()>>>(tail, x, B, T_, C, K - 1,
                                                                                            ldx);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
