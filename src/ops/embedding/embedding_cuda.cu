// CUDA token embedding (contract: embedding_cuda.h / embedding.h).
//
// Forward: one thread per output element (float4 when rows allow it).
// Backward: dW[tok[n], :] += dout[n, :]. The vocabulary is small in practice (3..64 rows) and
// the signature carries no V, so instead of a [V, C] table in shared memory each block ranks
// (sorts) its chunk of 256 tokens in shared memory and walks them in token order: every thread
// owns one channel, sums dout over each run of equal tokens and issues one atomicAdd per run.
// That is at most min(V, 128) atomics per channel per half chunk instead of one per token.
//
// Tokens outside [0, V) cannot be reported from the device: the forward writes NaN rows for
// them (so the loss shows it), the backward skips negative tokens (it does not know V).
#include "ops/embedding/embedding_cuda.h"
#include <climits>
#include <cmath>
#include <cstdint>
#include "cuda/runtime.h"

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
                                                                      int C) {
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
      v[u] = (in && kk[u] >= 0) ? d[size_t(sidx[i + u]) * C] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u >= end) break;
      if (kk[u] != cur) {
        if (cur >= 0) atomicAdd(dW + size_t(cur) * C + c, acc);
        cur = kk[u];
        acc = 0.f;
      }
      acc += v[u];
    }
  }
  if (cur >= 0) atomicAdd(dW + size_t(cur) * C + c, acc);
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

void embedding_backward(float* dW, const float* dout, const int32_t* tok, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const dim3 grid((N + kChunk - 1) / kChunk, (C + kTile - 1) / kTile);
  embedding_backward_kernel<<<grid, kThreads, 0, ::lrnn::cuda::stream()>>>(dW, dout, tok, N, C);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
