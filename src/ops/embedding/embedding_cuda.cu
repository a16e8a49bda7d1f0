// CUDA token embedding (contract: embedding_cuda.h / embedding.h).
//
// Forward: one thread per output element (float4 when rows allow it).
// Backward: dW[tok[n], :] += dout[n, :].
//   Small vocabularies (V <= kEmbDetMaxV, C % 4 == 0: the papers' tasks have 3..~30 tokens),
//   deterministic, two passes. Pass 1: block p takes a contiguous range of tokens and a tile of
//   128 channels; each of its 8 warps sums every 8th token's dout row (a lane per 4 channels,
//   float4) into its own [V][128] table in shared memory, in token order; the 8 tables are added
//   in warp order and written as partials[p][V][C] to the device scratch. Pass 2 (add_partials)
//   adds each element's partials in an order fixed by their count. The order of every sum is fixed by N, C and V alone, so
//   runs repeat bit for bit. (With atomics, a differing order changed the loss by an ulp, which
//   TF32 and bf16 roundings then amplified: two runs were 3e-5 apart after 20 steps.)
//   Otherwise each block ranks (sorts) its chunk of 256 tokens in shared memory and walks them in
//   token order: every thread owns one channel, sums dout over each run of equal tokens and
//   issues one atomicAdd per run (at most min(V, 128) atomics per channel per half chunk).
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

constexpr int kDetWarps = 8;
constexpr int kDetTile4 = 32;  // float4 columns per channel tile (128 channels)

// grid (P, ceil(C4 / 32)), kDetWarps * 32 threads; dynamic smem kDetWarps * V * 32 float4.
__global__ void __launch_bounds__(kDetWarps * 32) embedding_backward_partials(float* __restrict__ part,
                                                                            const float4* __restrict__ dout,
                                                                            const int32_t* __restrict__ tok, int N,
                                                                            int C4, int V, int per_block) {
  extern __shared__ float4 tab[];  // [warp][v][lane]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c4 = blockIdx.y * kDetTile4 + lane;
  float4* mine = tab + size_t(warp) * V * kDetTile4;
  for (int v = 0; v < V; ++v) mine[v * kDetTile4 + lane] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int n0 = blockIdx.x * per_block, n1 = min(N, n0 + per_block);
  if (c4 < C4) {
    for (int n = n0 + warp; n < n1; n += kDetWarps) {
      const int t = tok[n];
      const float4 x = dout[size_t(n) * C4 + c4];
      if (t < 0 || t >= V) continue;
      float4& a = mine[t * kDetTile4 + lane];
      a.x += x.x, a.y += x.y, a.z += x.z, a.w += x.w;
    }
  }
  __syncthreads();
  float4* out = reinterpret_cast<float4*>(part) + size_t(blockIdx.x) * V * C4;
  for (int e = threadIdx.x; e < V * kDetTile4; e += blockDim.x) {
    const int v = e / kDetTile4, cc = blockIdx.y * kDetTile4 + e % kDetTile4;
    if (cc >= C4) continue;
    float4 s = tab[e];
    for (int w = 1; w < kDetWarps; ++w) {
      const float4 y = tab[size_t(w) * V * kDetTile4 + e];
      s.x += y.x, s.y += y.y, s.z += y.z, s.w += y.w;
    }
    out[size_t(v) * C4 + cc] = s;
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
  // Partials per block: as many blocks as chunks of 256 tokens, within 1 MiB of the scratch (the
  // budget this op was measured with; the scratch holds kScratchBytes).
  const size_t per_part = size_t(V) * C * sizeof(float);
  const int P = int(std::min<size_t>((N + kChunk - 1) / kChunk, (size_t(1) << 20) / per_part));
  const bool det = V <= kEmbDetMaxV && C % 4 == 0 && reinterpret_cast<uintptr_t>(dout) % 16 == 0 && P >= 1;
  if (det) {
    const int per_block = (N + P - 1) / P, C4 = C / 4;
    const size_t smem = sizeof(float4) * kDetWarps * V * kDetTile4;  // <= 64 KiB at V = 16
    static const bool opted = [] {
      LRNN_CUDA_CHECK(cudaFuncSetAttribute(embedding_backward_partials, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(sizeof(float4) * kDetWarps * kEmbDetMaxV * kDetTile4)));
      return true;
    }();
    (void)opted;
    auto* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(P) * per_part));
    const dim3 grid(unsigned(P), unsigned((C4 + kDetTile4 - 1) / kDetTile4));
    embedding_backward_partials<<<grid, kDetWarps * 32, smem, s>>>(part, reinterpret_cast<const float4*>(dout), tok,
                                                                    N, C4, V, per_block);
    LRNN_CUDA_LAUNCH_CHECK();
    add_partials(dW, part, P, size_t(V) * C);
    return;
  }
  const dim3 grid((N + kChunk - 1) / kChunk, (C + kTile - 1) / kTile);
  embedding_backward_kernel<<<grid, kThreads, 0, s>>>(dW, dout, tok, N, C, V);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
