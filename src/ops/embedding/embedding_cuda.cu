// CUDA token embedding (contract: embedding_cuda.h / embedding.h).
//
// Forward: one thread per output element (float4 when rows allow it).
// Backward: dW[tok[n], :] += dout[n, :].
//   Vocabularies up to kEmbDetMaxV rows (the papers' tasks: 3 tokens for parity, 122 for S5
//   with BOS), deterministic, two passes. Pass 1: block p takes a contiguous range of tokens and
//   a tile of 32 channels (a lane each); each of its warps sums every W-th token's dout row into
//   its own [V][32] table in shared memory, in token order (W = 1..8 warps, as many tables as fit
//   kDetTableBytes: 8 for V <= 48, 3 for S5's 122, 1 from 193 on); the W tables are added in warp
//   order and written as partials[p][V][C] to the device scratch. Pass 2 (add_partials) adds each
//   element's partials in an order fixed by their count. The order of every sum is fixed by N, C
//   and V alone, so runs repeat bit for bit. (With atomics, a differing order changed the loss by
//   an ulp, which TF32 and bf16 roundings then amplified: two runs were 3e-5 apart after 20
//   steps, and two runs of one S5 seed 5e-5 apart after 50.)
//   Otherwise (language-model vocabularies, or V C floats more than the scratch holds) each block
//   ranks (sorts) its chunk of 256 tokens in shared memory and walks them in token order: every
//   thread owns one channel, sums dout over each run of equal tokens and issues one atomicAdd per
//   run (at most min(V, 128) atomics per channel per half chunk); the order of those adds varies.
//
// Tokens outside [0, V) cannot be reported from the device: the forward writes NaN rows for
// them (so the loss shows it), the backward skips them.
#include "ops/embedding/embedding_cuda.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include "cuda/runtime.h"
#include "ops/elementwise/elementwise_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ tok,
                                         const float* __restrict__ W, int N, int C, int V) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * C) return;
  const size_t n = i / C, c = i % C;
  const int t = tok[n];
  out[i] = (t >= 0 && t < V) ? W[size_t(t) * C + c] : __int_as_float(0x7fc00000);
}

// C4 = C / 4 float4 per row; out and W 16-byte aligned.
__global__ void embedding_forward_kernel4(float4* __restrict__ out, const int32_t* __restrict__ tok,
                                          const float4* __restrict__ W, int N, int C4, int V) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * C4) return;
  const size_t n = i / C4, c = i % C4;
  const int t = tok[n];
  if (t >= 0 && t < V) {
    out[i] = W[size_t(t) * C4 + c];
  } else {
    const float q = __int_as_float(0x7fc00000);
    out[i] = make_float4(q, q, q, q);
  }
}

constexpr int kChunk = 256;               // tokens per block (= threads per block)
constexpr int kTile = 128;                // channels per block
constexpr int kGroups = kChunk / kTile;   // thread groups, each walks kChunk / kGroups sorted tokens
constexpr int kSpan = kChunk / kGroups;
constexpr int kUnroll = 8;
static_assert(kChunk == kThreads && kChunk % kTile == 0);

// grid (ceil(N / kChunk), ceil(C / kTile)), kThreads threads.
__global__ void __launch_bounds__(kThreads) embedding_backward_kernel(float* __restrict__ dW,
                                                                      const float* __restrict__ dout,
                                                                      const int32_t* __restrict__ tok, int N,
                                                                      int C, int V) {
  __shared__ int keys[kChunk];
  __shared__ int skey[kChunk];
  __shared__ int sidx[kChunk];
  const int t = threadIdx.x;
  const int n0 = blockIdx.x * kChunk;
  const int cnt = min(kChunk, N - n0);
  keys[t] = t < cnt ? tok[n0 + t] : INT_MAX;  // padding sorts last; the walk stops at cnt
  __syncthreads();
  // Stable rank: a permutation of 0..kChunk-1.
  const int k = keys[t];
  int r = 0;
#pragma unroll 8
  for (int j = 0; j < kChunk; ++j) {
    const int kj = keys[j];
    r += (kj < k) | ((kj == k) & (j < t));
  }
  skey[r] = k;
  sidx[r] = t;
  __syncthreads();

  const int g = t / kTile;
  const int c = blockIdx.y * kTile + t % kTile;
  if (c >= C) return;
  const int begin = g * kSpan, end = min(begin + kSpan, cnt);
  const float* d = dout + size_t(n0) * C + c;
  float acc = 0.f;
  int cur = -1;
  for (int i = begin; i < end; i += kUnroll) {
    int kk[kUnroll];
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool in = i + u < end;
      kk[u] = in ? skey[i + u] : -1;
      v[u] = (in && kk[u] >= 0 && kk[u] < V) ? d[size_t(sidx[i + u]) * C] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u >= end) break;
      if (kk[u] != cur) {
        if (cur >= 0 && cur < V) atomicAdd(dW + size_t(cur) * C + c, acc);
        cur = kk[u];
        acc = 0.f;
      }
      acc += v[u];
    }
  }
  if (cur >= 0 && cur < V) atomicAdd(dW + size_t(cur) * C + c, acc);
}

constexpr int kDetMaxWarps = 8;
constexpr size_t kDetTableBytes = 48 << 10;  // shared memory per block (the default limit): several blocks per SM
constexpr int kDetUnroll = 8;                // tokens a warp loads before it adds them: loads in flight
static_assert(size_t(kEmbDetMaxV) * 32 * sizeof(float) <= kDetTableBytes);

// Warps per block (tables of [V][32] floats) for a vocabulary of V rows: as many as fit, 1..8.
int det_warps(int V) {
  return int(std::clamp<size_t>(kDetTableBytes / (size_t(V) * 32 * sizeof(float)), 1, kDetMaxWarps));
}

// grid (P, ceil(C / 32)), det_warps(V) warps; dynamic shared memory warps * V * 32 floats.
__global__ void embedding_backward_partials(float* __restrict__ part, const float* __restrict__ dout,
                                            const int32_t* __restrict__ tok, int N, int C, int V, int per_block) {
  extern __shared__ float tab[];  // [warp][v][lane]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W = blockDim.x >> 5;
  const int c = blockIdx.y * 32 + lane;
  float* mine = tab + size_t(warp) * V * 32;
  for (int v = 0; v < V; ++v) mine[v * 32 + lane] = 0.f;
  const int n0 = blockIdx.x * per_block, n1 = min(N, n0 + per_block);
  if (c < C) {
    int n = n0 + warp;
    // kDetUnroll tokens at a time: their rows are loaded first, then added in token order.
    for (; n + (kDetUnroll - 1) * W < n1; n += kDetUnroll * W) {
      int t[kDetUnroll];
      float x[kDetUnroll];
#pragma unroll
      for (int u = 0; u < kDetUnroll; ++u) {
        t[u] = tok[n + u * W];
        x[u] = dout[size_t(n + u * W) * C + c];
      }
#pragma unroll
      for (int u = 0; u < kDetUnroll; ++u)
        if (t[u] >= 0 && t[u] < V) mine[t[u] * 32 + lane] += x[u];
    }
    for (; n < n1; n += W) {
      const int t = tok[n];
      if (t >= 0 && t < V) mine[t * 32 + lane] += dout[size_t(n) * C + c];
    }
  }
  __syncthreads();
  float* out = part + size_t(blockIdx.x) * V * C;
  for (int e = threadIdx.x; e < V * 32; e += blockDim.x) {
    const int v = e >> 5, cc = blockIdx.y * 32 + (e & 31);
    if (cc >= C) continue;
    float s = tab[e];
    for (int w = 1; w < W; ++w) s += tab[size_t(w) * V * 32 + e];
    out[size_t(v) * C + cc] = s;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tok, const float* W, int N, int C, int V) {
  if (N <= 0 || C <= 0) return;
  auto s = ::lrnn::cuda::stream();
  const bool vec = C % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(W) % 16 == 0;
  if (vec) {
    const size_t n = size_t(N) * (C / 4);
    embedding_forward_kernel4<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(out), tok, reinterpret_cast<const float4*>(W), N, C / 4, V);
  } else {
    const size_t n = size_t(N) * C;
    embedding_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, s>>>(out, tok, W, N, C, V);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

void embedding_backward(float* dW, const float* dout, const int32_t* tok, int N, int C, int V) {
  if (N <= 0 || C <= 0 || V <= 0) return;
  auto s = ::lrnn::cuda::stream();
  // Partials: one block per chunk of 256 tokens (at least), as many as the scratch holds.
  const size_t per_part = size_t(V) * C * sizeof(float);
  const int P = int(std::min<size_t>((N + kChunk - 1) / kChunk, ::lrnn::cuda::kScratchBytes / per_part));
  if (V <= kEmbDetMaxV && P >= 1) {
    const int per_block = (N + P - 1) / P, W = det_warps(V);
    auto* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(P) * per_part));
    const dim3 grid(unsigned(P), unsigned((C + 31) / 32));
    embedding_backward_partials<<<grid, W * 32, size_t(W) * V * 32 * sizeof(float), s>>>(part, dout, tok, N, C, V,
                                                                                      per_block);
    LRNN_CUDA_LAUNCH_CHECK();
    add_partials(dW, part, P, size_t(V) * C);
    return;
  }
  const dim3 grid((N + kChunk - 1) / kChunk, (C + kTile - 1) / kTile);
  embedding_backward_kernel<<<grid, kThreads, 0, s>>>(dW, dout, tok, N, C, V);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
