// CUDA causal softmax attention (contract: attention_cuda.h / attention.h). Two kernel families.
//
// Tile kernels (short sequences: the papers' T = 40-256 at head dims up to 64, whenever the
// (b,h) pair's operands fit one block's shared memory): one block per (b,h) loads Q, K, V (and
// dO) once, rows padded to D+1 floats so that reading a column across a warp hits 32 banks,
// and works on the T x T score matrix in shared memory (stride T+1):
//   forward:  S = scale Q K^T (j <= i), P = softmax rows (a warp per row), O = P V;
//   backward: P = exp(S - lse), dS = P (dO V^T - D) with D_i = dO_i . o_i, then
//             dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO, each element by one thread.
// No atomics; every output has one owner thread (deterministic).
//
// Row kernels (any T up to kAttnCudaMaxT), correct and simple rather than fast:
//   forward:  one block per (query row i, b*h): q_i in shared memory, one warp per key computes
//             s_j = scale q_i.k_j (j <= i) into shared memory, block max / sum, then
//             o_i = sum_j exp(s_j - m) v_j / l, lse_i = m + log l.
//   backward: two kernels, no atomics.
//     rows (one block per query i):  p_j = exp(scale q_i.k_j - lse_i), dp_j = dO_i.v_j,
//       D_i = dO_i.o_i, ds_j = p_j (dp_j - D_i);  dq_i += scale sum_j ds_j k_j.
//     keys (one block per key j):    for every i >= j the same p_ij, ds_ij (D_i recomputed);
//       dv_j += sum_i p_ij dO_i,  dk_j += scale sum_i ds_ij q_i.
// The sums over keys (or queries) of a column c are split over G = max(1, blockDim / D) thread
// groups, added in a fixed order: deterministic.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include "core/check.h"
#include "cuda/runtime.h"
#include "cuda/tile.cuh"
#include "ops/attention/attention_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr size_t kMaxSmem = 48 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions (every thread gets the result); red: kWarps floats of shared memory.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t = fmaxf(t, red[w]);
  return t;
}
// Dot product of two D-vectors by one warp (all lanes get it).
__device__ __forceinline__ float warp_dot(const float* a, const float* b, int D) {
  float acc = 0.f;
  for (int c = threadIdx.x & 31; c < D; c += 32) acc += a[c] * b[c];
  return warp_sum(acc);
}

struct Geo {
  int T, H, D, lq, lk, lv, lo;
  float scale;
};

__global__ void __launch_bounds__(kThreads) attn_forward(float* __restrict__ o, float* __restrict__ lse,
                                                         const float* __restrict__ q, const float* __restrict__ k,
                                                         const float* __restrict__ v, Geo g) {
  extern __shared__ float sm[];
  __shared__ float red[kWarps];
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / g.H, h = bh % g.H, D = g.D, tid = threadIdx.x;
  const int gdim = D >= kThreads ? 1 : kThreads / D;
  float* qs = sm;                      // [D]
  float* s = qs + D;                   // [T]
  float* part = s + g.T;               // [max(kThreads, D)]
  const float* Q = q + (size_t(b) * g.T + i) * g.lq + size_t(h) * D;
  const float* K = k + size_t(b) * g.T * g.lk + size_t(h) * D;
  const float* V = v + size_t(b) * g.T * g.lv + size_t(h) * D;
  for (int c = tid; c < D; c += kThreads) qs[c] = Q[c];
  __syncthreads();
  for (int j = tid >> 5; j <= i; j += kWarps) {
    const float acc = warp_dot(qs, K + size_t(j) * g.lk, D);
    if ((tid & 31) == 0) s[j] = g.scale * acc;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = tid; j <= i; j += kThreads) m = fmaxf(m, s[j]);
  m = block_max(m, red);
  float l = 0.f;
  for (int j = tid; j <= i; j += kThreads) {
    const float e = expf(s[j] - m);
    s[j] = e;
    l += e;
  }
  l = block_sum(l, red);  // also orders the writes to s before the reads below
  for (int idx = tid; idx < gdim * D; idx += kThreads) {
    const int c = idx % D, grp = idx / D;
    float acc = 0.f;
    for (int j = grp; j <= i; j += gdim) acc += s[j] * V[size_t(j) * g.lv + c];
    part[idx] = acc;
  }
  __syncthreads();
  float* O = o + (size_t(b) * g.T + i) * g.lo + size_t(h) * D;
  const float inv = 1.f / l;
  for (int c = tid; c < D; c += kThreads) {
    float acc = 0.f;
    for (int grp = 0; grp < gdim; ++grp) acc += part[grp * D + c];
    O[c] = acc * inv;
  }
  if (lse && tid == 0) lse[size_t(bh) * g.T + i] = m + logf(l);
}

// dq_i += scale sum_j ds_ij k_j, one block per query row.
__global__ void __launch_bounds__(kThreads) attn_backward_rows(float* __restrict__ dq, const float* __restrict__ dout,
                                                               const float* __restrict__ q, const float* __restrict__ k,
                                                               const float* __restrict__ v, const float* __restrict__ o,
                                                               const float* __restrict__ lse, Geo g) {
  extern __shared__ float sm[];
  __shared__ float red[kWarps];
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / g.H, h = bh % g.H, D = g.D, tid = threadIdx.x;
  const int gdim = D >= kThreads ? 1 : kThreads / D;
  float* qs = sm;          // [D]
  float* gs = qs + D;      // [D] dO_i
  float* ds = gs + D;      // [T]
  float* part = ds + g.T;  // [max(kThreads, D)]
  const size_t ro = (size_t(b) * g.T + i) * g.lo + size_t(h) * D;
  const float* Q = q + (size_t(b) * g.T + i) * g.lq + size_t(h) * D;
  const float* K = k + size_t(b) * g.T * g.lk + size_t(h) * D;
  const float* V = v + size_t(b) * g.T * g.lv + size_t(h) * D;
  float di = 0.f;
  for (int c = tid; c < D; c += kThreads) {
    qs[c] = Q[c];
    gs[c] = dout[ro + c];
    di += gs[c] * o[ro + c];
  }
  di = block_sum(di, red);  // also publishes qs, gs
  const float L = lse[size_t(bh) * g.T + i];
  for (int j = tid >> 5; j <= i; j += kWarps) {
    const float sc = g.scale * warp_dot(qs, K + size_t(j) * g.lk, D);
    const float dp = warp_dot(gs, V + size_t(j) * g.lv, D);
    if ((tid & 31) == 0) {
      const float p = expf(sc - L);
      ds[j] = p * (dp - di);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < gdim * D; idx += kThreads) {
    const int c = idx % D, grp = idx / D;
    float acc = 0.f;
    for (int j = grp; j <= i; j += gdim) acc += ds[j] * K[size_t(j) * g.lk + c];
    part[idx] = acc;
  }
  __syncthreads();
  float* dQ = dq + (size_t(b) * g.T + i) * g.lq + size_t(h) * D;
  for (int c = tid; c < D; c += kThreads) {
    float acc = 0.f;
    for (int grp = 0; grp < gdim; ++grp) acc += part[grp * D + c];
    dQ[c] += g.scale * acc;
  }
}

// dv_j += sum_{i>=j} p_ij dO_i, dk_j += scale sum_{i>=j} ds_ij q_i, one block per key row.
__global__ void __launch_bounds__(kThreads) attn_backward_keys(float* __restrict__ dk, float* __restrict__ dv,
                                                               const float* __restrict__ dout,
                                                               const float* __restrict__ q, const float* __restrict__ k,
                                                               const float* __restrict__ v, const float* __restrict__ o,
                                                               const float* __restrict__ lse, Geo g) {
  extern __shared__ float sm[];
  const int j = blockIdx.x, bh = blockIdx.y, b = bh / g.H, h = bh % g.H, D = g.D, tid = threadIdx.x;
  const int gdim = D >= kThreads ? 1 : kThreads / D;
  const int P = D > kThreads ? D : kThreads;
  const int n = g.T - j;  // queries i = j .. T-1
  float* ks = sm;          // [D]
  float* vs = ks + D;      // [D]
  float* ps = vs + D;      // [T]  p_ij at i - j
  float* ds = ps + g.T;    // [T]  ds_ij at i - j
  float* pv = ds + g.T;    // [P]
  float* pk = pv + P;      // [P]
  const float* K = k + (size_t(b) * g.T + j) * g.lk + size_t(h) * D;
  const float* V = v + (size_t(b) * g.T + j) * g.lv + size_t(h) * D;
  const float* Q = q + size_t(b) * g.T * g.lq + size_t(h) * D;
  const float* dO = dout + size_t(b) * g.T * g.lo + size_t(h) * D;
  const float* O = o + size_t(b) * g.T * g.lo + size_t(h) * D;
  const float* L = lse + size_t(bh) * g.T;
  for (int c = tid; c < D; c += kThreads) {
    ks[c] = K[c];
    vs[c] = V[c];
  }
  __syncthreads();
  for (int r = tid >> 5; r < n; r += kWarps) {
    const int i = j + r;
    const float sc = g.scale * warp_dot(Q + size_t(i) * g.lq, ks, D);
    const float dp = warp_dot(dO + size_t(i) * g.lo, vs, D);
    const float di = warp_dot(dO + size_t(i) * g.lo, O + size_t(i) * g.lo, D);
    if ((tid & 31) == 0) {
      const float p = expf(sc - L[i]);
      ps[r] = p;
      ds[r] = p * (dp - di);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < gdim * D; idx += kThreads) {
    const int c = idx % D, grp = idx / D;
    float av = 0.f, ak = 0.f;
    for (int r = grp; r < n; r += gdim) {
      const size_t i = size_t(j + r);
      av += ps[r] * dO[i * g.lo + c];
      ak += ds[r] * Q[i * g.lq + c];
    }
    pv[idx] = av;
    pk[idx] = ak;
  }
  __syncthreads();
  float* dV = dv + (size_t(b) * g.T + j) * g.lv + size_t(h) * D;
  float* dK = dk + (size_t(b) * g.T + j) * g.lk + size_t(h) * D;
  for (int c = tid; c < D; c += kThreads) {
    float av = 0.f, ak = 0.f;
    for (int grp = 0; grp < gdim; ++grp) {
      av += pv[grp * D + c];
      ak += pk[grp * D + c];
    }
    dV[c] += av;
    dK[c] += g.scale * ak;
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernels.
constexpr int kTileThreads = 128;
constexpr size_t kTileMaxSmem = 100 * 1024;  // above this the row kernels run (2+ blocks per SM)

struct TileSmem {
  int q, k, v, dout, p, ds, dd, lse, total;  // offsets in floats
};
__host__ __device__ inline TileSmem tile_smem(int T, int D, bool bwd) {
  const int rows = T * (D + 1), mat = T * (T + 1);
  TileSmem s{};
  int o = 0;
  s.q = o; o += rows;
  s.k = o; o += rows;
  s.v = o; o += rows;
  s.dout = o; o += bwd ? rows : 0;
  s.p = o; o += mat;
  s.ds = o; o += bwd ? mat : 0;
  s.dd = o; o += bwd ? T : 0;
  s.lse = o; o += bwd ? T : 0;
  s.total = o;
  return s;
}

// T rows of D floats (token stride ld) into shared rows of D + 1.
__device__ __forceinline__ void load_rows(float* dst, const float* src, int T, int D, int ld) {
  for (int x = threadIdx.x; x < T * D; x += blockDim.x) {
    const int t = x / D, c = x - t * D;
    dst[t * (D + 1) + c] = src[size_t(t) * ld + c];
  }
}
// DT: the head dim at compile time (16, 32, 64: loops unroll, indices become shifts), or 0.
template <int DT>
__device__ __forceinline__ float row_dot(const float* a, const float* b, int D) {
  const int n = DT ? DT : D;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 16
  for (int c = 0; c < n; ++c) acc[c & 3] = fmaf(a[c], b[c], acc[c & 3]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <int DT>
__global__ void __launch_bounds__(kTileThreads) attn_tile_forward(float* __restrict__ o, float* __restrict__ lse,
                                                                  const float* __restrict__ q,
                                                                  const float* __restrict__ k,
                                                                  const float* __restrict__ v, Geo g) {
  extern __shared__ float sm[];
  const int bh = blockIdx.x, b = bh / g.H, h = bh % g.H, T = g.T, D = DT ? DT : g.D, DP = D + 1, TP = T + 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const TileSmem L = tile_smem(T, D, false);
  float *Qs = sm + L.q, *Ks = sm + L.k, *Vs = sm + L.v, *P = sm + L.p;
  const size_t tok = size_t(b) * T;
  load_rows(Qs, q + tok * g.lq + size_t(h) * D, T, D, g.lq);
  load_rows(Ks, k + tok * g.lk + size_t(h) * D, T, D, g.lk);
  load_rows(Vs, v + tok * g.lv + size_t(h) * D, T, D, g.lv);
  __syncthreads();
  for (int x = tid; x < T * T; x += blockDim.x) {
    const int i = x / T, j = x - i * T;
    if (j <= i) P[i * TP + j] = g.scale * row_dot<DT>(Qs + i * DP, Ks + j * DP, D);
  }
  __syncthreads();
  for (int i = warp; i < T; i += nw) {  // softmax of row i over j <= i
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, P[i * TP + j]);
    m = warp_max(m);
    float l = 0.f;
    for (int j = lane; j <= i; j += 32) {
      const float e = expf(P[i * TP + j] - m);
      P[i * TP + j] = e;
      l += e;
    }
    l = warp_sum(l);
    const float inv = 1.f / l;
    for (int j = lane; j <= i; j += 32) P[i * TP + j] *= inv;
    if (lse && lane == 0) lse[size_t(bh) * T + i] = m + logf(l);
  }
  __syncthreads();
  float* O = o + tok * g.lo + size_t(h) * D;
  for (int x = tid; x < T * D; x += blockDim.x) {
    const int i = x / D, c = x - i * D;
    float acc = 0.f;
    for (int j = 0; j <= i; ++j) acc = fmaf(P[i * TP + j], Vs[j * DP + c], acc);
    O[size_t(i) * g.lo + c] = acc;
  }
}

template <int DT>
__global__ void __launch_bounds__(kTileThreads) attn_tile_backward(float* __restrict__ dq, float* __restrict__ dk,
                                                                   float* __restrict__ dv,
                                                                   const float* __restrict__ dout,
                                                                   const float* __restrict__ q,
                                                                   const float* __restrict__ k,
                                                                   const float* __restrict__ v,
                                                                   const float* __restrict__ o,
                                                                   const float* __restrict__ lse, Geo g) {
  extern __shared__ float sm[];
  const int bh = blockIdx.x, b = bh / g.H, h = bh % g.H, T = g.T, D = DT ? DT : g.D, DP = D + 1, TP = T + 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const TileSmem L = tile_smem(T, D, true);
  float *Qs = sm + L.q, *Ks = sm + L.k, *Vs = sm + L.v, *Gs = sm + L.dout, *P = sm + L.p, *dS = sm + L.ds;
  float *Dd = sm + L.dd, *Ls = sm + L.lse;
  const size_t tok = size_t(b) * T;
  load_rows(Qs, q + tok * g.lq + size_t(h) * D, T, D, g.lq);
  load_rows(Ks, k + tok * g.lk + size_t(h) * D, T, D, g.lk);
  load_rows(Vs, v + tok * g.lv + size_t(h) * D, T, D, g.lv);
  load_rows(Gs, dout + tok * g.lo + size_t(h) * D, T, D, g.lo);
  const float* O = o + tok * g.lo + size_t(h) * D;
  for (int i = warp; i < T; i += nw) {  // D_i = dO_i . o_i
    float acc = 0.f;
    for (int c = lane; c < D; c += 32) acc = fmaf(dout[(tok + i) * g.lo + size_t(h) * D + c], O[size_t(i) * g.lo + c], acc);
    acc = warp_sum(acc);
    if (lane == 0) Dd[i] = acc, Ls[i] = lse[size_t(bh) * T + i];
  }
  __syncthreads();
  for (int x = tid; x < T * T; x += blockDim.x) {
    const int i = x / T, j = x - i * T;
    if (j <= i) {
      const float p = expf(g.scale * row_dot<DT>(Qs + i * DP, Ks + j * DP, D) - Ls[i]);
      P[i * TP + j] = p;
      dS[i * TP + j] = p * (row_dot<DT>(Gs + i * DP, Vs + j * DP, D) - Dd[i]);
    }
  }
  __syncthreads();
  float* dQ = dq + tok * g.lq + size_t(h) * D;
  float* dK = dk + tok * g.lk + size_t(h) * D;
  float* dV = dv + tok * g.lv + size_t(h) * D;
  for (int x = tid; x < T * D; x += blockDim.x) {
    const int r = x / D, c = x - r * D;
    float aq = 0.f, ak = 0.f, av = 0.f;
    for (int j = 0; j <= r; ++j) aq = fmaf(dS[r * TP + j], Ks[j * DP + c], aq);  // query r
    for (int i = r; i < T; ++i) {                                                 // key r
      ak = fmaf(dS[i * TP + r], Qs[i * DP + c], ak);
      av = fmaf(P[i * TP + r], Gs[i * DP + c], av);
    }
    dQ[size_t(r) * g.lq + c] += g.scale * aq;
    dK[size_t(r) * g.lk + c] += g.scale * ak;
    dV[size_t(r) * g.lv + c] += av;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
std::atomic<int> g_attn_kernel{int(AttnKernel::Auto)};

using ::lrnn::cuda::max_smem_optin;

// Shared memory of the tile kernel for these dims, or 0 where the row kernels run.
size_t tile_bytes(const AttentionDims& d, bool bwd) {
  if (AttnKernel(g_attn_kernel.load()) != AttnKernel::Auto) return 0;
  const size_t bytes = sizeof(float) * size_t(tile_smem(d.T, d.D, bwd).total);
  return bytes > std::min<size_t>(kTileMaxSmem, size_t(max_smem_optin())) ? 0 : bytes;
}

template <int DT>
struct TileForward {
  static constexpr auto fn = attn_tile_forward<DT>;
};
template <int DT>
struct TileBackward {
  static constexpr auto fn = attn_tile_backward<DT>;
};

// Launches K<DT>::fn, a block per (b,h), if its shared memory fits; false where the row kernels
// must run instead.
template <template <int> class K, class... Args>
bool launch_tile(const AttentionDims& d, bool bwd, Args... args) {
  const size_t bytes = tile_bytes(d, bwd);
  if (!bytes) return false;
  lrnn::cuda::launch_by_head_dim<K>(d.D, unsigned(d.B * d.H), kTileThreads, bytes, kTileMaxSmem, args...);
  return true;
}

Geo geo(const AttentionDims& d) {
  LRNN_CHECK(d.B > 0 && d.T > 0 && d.H > 0 && d.D > 0, "attention: bad dims B={} T={} H={} D={}", d.B, d.T, d.H, d.D);
  LRNN_CHECK(d.T <= kAttnCudaMaxT, "attention (CUDA): T = {} exceeds {}", d.T, kAttnCudaMaxT);
  LRNN_CHECK(d.B * d.H <= 65535, "attention (CUDA): B*H = {} exceeds 65535", d.B * d.H);
  return Geo{d.T, d.H, d.D, d.lq(), d.lk(), d.lv(), d.lo(), float(d.softmax_scale())};
}

size_t smem_bytes(size_t floats) {
  const size_t bytes = floats * sizeof(float);
  LRNN_CHECK(bytes <= kMaxSmem, "attention (CUDA): {} bytes of shared memory per block exceed {}", bytes, kMaxSmem);
  return bytes;
}

}  // namespace

void set_attention_kernel(AttnKernel k) { g_attn_kernel.store(int(k)); }

void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, const AttentionDims& d) {
  const Geo g = geo(d);
  if (launch_tile<TileForward>(d, false, o, lse, q, k, v, g)) return;
  const size_t P = std::max(kThreads, d.D);
  const size_t smem = smem_bytes(size_t(d.D) + d.T + P);
  attn_forward<<<dim3(d.T, d.B * d.H), kThreads, smem, lrnn::cuda::stream()>>>(o, lse, q, k, v, g);
  LRNN_CUDA_LAUNCH_CHECK();
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* o, const float* lse, const AttentionDims& d) {
  LRNN_CHECK(lse != nullptr, "attention_backward needs the forward's log-sum-exp");
  const Geo g = geo(d);
  if (launch_tile<TileBackward>(d, true, dq, dk, dv, dout, q, k, v, o, lse, g)) return;
  const size_t P = std::max(kThreads, d.D);
  const dim3 grid(d.T, d.B * d.H);
  attn_backward_rows<<<grid, kThreads, smem_bytes(2 * size_t(d.D) + d.T + P), lrnn::cuda::stream()>>>(
      dq, dout, q, k, v, o, lse, g);
  LRNN_CUDA_LAUNCH_CHECK();
  attn_backward_keys<<<grid, kThreads, smem_bytes(2 * size_t(d.D) + 2 * size_t(d.T) + 2 * P), lrnn::cuda::stream()>>>(
      dk, dv, dout, q, k, v, o, lse, g);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
