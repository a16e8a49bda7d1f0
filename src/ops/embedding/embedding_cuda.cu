// CUDA token embedding (contract: embedding_cuda.h / embedding.h).
//
// Forward: one thread per output element (float4 when rows allow it).
// Backward: dW[tok[n], :] += dout[n, :], in a fixed order of additions (the same bits on every run).
//   Vocabularies up to kEmbDetMaxV rows (the papers' tasks: 3 tokens for parity, 122 for S5
//   with BOS) whose V x C floats the scratch holds: two passes of partial tables. Pass 1: block p
//   takes a contiguous range of tokens and a tile of 32 channels (a lane each); each of its warps
//   sums every W-th token's dout row into its own [V][32] table in shared memory, in token order
//   (W = 1..8 warps, as many tables as fit kDetTableBytes: 8 for V <= 48, 3 for S5's 122, 1 from
//   193 on); the W tables are added in warp order and written as partials[p][V][C] to the device
//   scratch. Pass 2 (add_partials) adds each element's partials in an order fixed by their count.
//   (With atomics, a differing order changed the loss by an ulp, which TF32 and bf16 roundings
//   then amplified: two runs were 3e-5 apart after 20 steps, and two runs of one S5 seed 5e-5 apart
//   after 50.)
//   Larger vocabularies (language models): the positions 0..N-1 are sorted by token (cub's radix
//   sort, which is stable: equal tokens keep their order), so each token's rows form one segment
//   of the sorted order. Block b takes sorted positions [256 b, 256 b + 256) and a tile of 32
//   channels; its warps sum the pieces of segments that lie in its range, each in sorted order. A
//   segment that lies wholly in the range is added to dW by the block; one that crosses into the
//   next blocks leaves its pieces in the scratch (the piece that starts it, and the one each later
//   block holds), and a second kernel adds them in block order and then to dW. So every element of
//   dW has one writer, a token's rows are summed in token order in pieces of at most 256, and the
//   order depends on the tokens alone. The scratch holds the sort for up to ~170k tokens at C
//   1024 (16 bytes a token and two partial rows a block); beyond that the backward falls back to
//   atomicAdd (embedding_backward_atomic: each block ranks its chunk of 256 tokens in shared memory
//   and issues one add per run of equal tokens and channel; the order of those adds varies).
//
// Tokens outside [0, V) cannot be reported from the device: the forward writes NaN rows for
// them (so the loss shows it), the backward skips them.
#include "ops/embedding/embedding_cuda.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
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
__global__ void __launch_bounds__(kThreads) embedding_backward_atomic(float* __restrict__ dW,
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


// ---- the sorted backward (any vocabulary) ----
constexpr int kSegSpan = 256;  // sorted positions per block (= threads per block: 8 warps)
constexpr int kSegUnroll = 8;  // rows a warp loads before it adds them

// keys = tok, vals = 0..N-1 (the sort's inputs).
__global__ void sort_inputs(int* __restrict__ keys, int* __restrict__ vals, const int32_t* __restrict__ tok, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) keys[i] = tok[i], vals[i] = i;
}

// Per block of the sorted order: whether its first position continues a segment begun before it
// (cont), whether no segment starts in it (whole), and whether its last segment goes on past it
// (open); the partial sums of the continued piece (pin) and of the open segment's first piece
// (pout), [block][C].
struct SegScratch {
  const int *key, *pos;  // sorted tokens and their positions
  float *pin, *pout;
  int *cont, *whole, *open;
};

// grid (ceil(N / kSegSpan), ceil(C / 32)), kSegSpan threads.
__global__ void __launch_bounds__(kSegSpan) embedding_backward_segments(float* __restrict__ dW, SegScratch s,
                                                                       const float* __restrict__ dout, int N, int C,
                                                                       int V) {
  __shared__ int start[kSegSpan + 1];
  __shared__ int count[kSegSpan / 32];
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, b = blockIdx.x;
  const int p0 = b * kSegSpan, p1 = min(N, p0 + kSegSpan);
  const int i = p0 + t;
  const bool is_start = i < p1 && (i == 0 || s.key[i] != s.key[i - 1]);
  // The starts in ascending order: each warp's by ballot, after the earlier warps' counts.
  const unsigned m = __ballot_sync(0xffffffffu, is_start);
  if (lane == 0) count[warp] = __popc(m);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < kSegSpan / 32; ++w) {
    before += w < warp ? count[w] : 0;
    total += count[w];
  }
  if (is_start) start[before + __popc(m & ((1u << lane) - 1))] = i;
  if (t == 0) start[total] = p1;
  __syncthreads();
  const bool cont = p0 > 0 && s.key[p0] == s.key[p0 - 1];
  const bool open = p1 < N && s.key[p1] == s.key[p1 - 1];
  if (t == 0 && blockIdx.y == 0) s.cont[b] = cont, s.whole[b] = total == 0, s.open[b] = open && total > 0;
  // Pieces: q = -1 the continued one [p0, start[0]) (if cont), q = 0..total-1 [start[q], start[q+1]).
  const int c = blockIdx.y * 32 + lane;
  for (int q = (cont ? -1 : 0) + warp; q < total; q += kSegSpan / 32) {
    const int from = q < 0 ? p0 : start[q], to = q < 0 ? start[0] : start[q + 1];
    float acc = 0.f;
    for (int j = from; j < to; j += kSegUnroll) {
      float x[kSegUnroll];
#pragma unroll
      for (int u = 0; u < kSegUnroll; ++u)
        x[u] = (j + u < to && c < C) ? dout[size_t(s.pos[j + u]) * C + c] : 0.f;
#pragma unroll
      for (int u = 0; u < kSegUnroll; ++u)
        if (j + u < to) acc += x[u];
    }
    if (c >= C) continue;
    if (q < 0) {
      s.pin[size_t(b) * C + c] = acc;
    } else if (q == total - 1 && open) {
      s.pout[size_t(b) * C + c] = acc;
    } else {
      const int k = s.key[from];
      if (k >= 0 && k < V) dW[size_t(k) * C + c] += acc;
    }
  }
}

// The segments that cross blocks: the block where one starts adds its pieces in block order.
// grid (nblocks, ceil(C / 128)), 128 threads.
__global__ void embedding_backward_crossing(float* __restrict__ dW, SegScratch s, int nb, int C, int V) {
  const int b = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (!s.open[b] || c >= C) return;
  const int k = s.key[(b + 1) * kSegSpan - 1];
  float acc = s.pout[size_t(b) * C + c];
  for (int j = b + 1; j < nb; ++j) {  // block j continues the segment (open[b] or whole[j - 1])
    acc += s.pin[size_t(j) * C + c];
    if (!s.whole[j] || j + 1 >= nb || !s.cont[j + 1]) break;
  }
  if (k >= 0 && k < V) dW[size_t(k) * C + c] += acc;
}

size_t up256(size_t n) { return (n + 255) / 256 * 256; }

// The sort's scratch: its keys and positions twice (cub's double buffer), the partial rows and
// block flags, cub's own temporary storage.
struct SortedBytes {
  size_t ints, parts, flags, temp, total;
};
SortedBytes sorted_bytes(int N, int C, cudaStream_t st) {
  const size_t nb = (size_t(N) + kSegSpan - 1) / kSegSpan;
  cub::DoubleBuffer<int> keys(nullptr, nullptr), vals(nullptr, nullptr);
  size_t temp = 0;
  LRNN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys, vals, N, 0, 32, st));
  SortedBytes b{up256(size_t(N) * 4), up256(nb * C * 4), up256(nb * 4), up256(temp), 0};
  b.total = 4 * b.ints + 2 * b.parts + 3 * b.flags + b.temp;
  return b;
}
// The partial tables' pass holds P partials of V x C floats (P >= 1 fits).
int partial_count(int N, int C, int V) {
  return int(std::min<size_t>((N + kChunk - 1) / kChunk, ::lrnn::cuda::kScratchBytes / (size_t(V) * C * sizeof(float))));
}

// Which backward a batch takes: the partial tables, the sort (both deterministic), or atomics.
// (sb: the sort's scratch, set where the sort is asked about.)
enum class Backward { Partials, Sorted, Atomic };
Backward backward_path(int N, int C, int V, cudaStream_t st, SortedBytes* sb) {
  if (V <= kEmbDetMaxV && partial_count(N, C, V) >= 1) return Backward::Partials;
  *sb = sorted_bytes(N, C, st);
  return sb->total <= ::lrnn::cuda::kScratchBytes ? Backward::Sorted : Backward::Atomic;
}

// The sorted backward (its arrays, sb, fit the scratch: backward_path).
void embedding_backward_sorted(float* dW, const float* dout, const int32_t* tok, int N, int C, int V, SortedBytes sb,
                               cudaStream_t st) {
  const int nb = (N + kSegSpan - 1) / kSegSpan;
  auto* base = static_cast<char*>(::lrnn::cuda::scratch(sb.total));
  auto take = [&](size_t n) {
    char* p = base;
    base += n;
    return p;
  };
  int *k0 = reinterpret_cast<int*>(take(sb.ints)), *k1 = reinterpret_cast<int*>(take(sb.ints));
  int *v0 = reinterpret_cast<int*>(take(sb.ints)), *v1 = reinterpret_cast<int*>(take(sb.ints));
  SegScratch s{};
  s.pin = reinterpret_cast<float*>(take(sb.parts)), s.pout = reinterpret_cast<float*>(take(sb.parts));
  s.cont = reinterpret_cast<int*>(take(sb.flags)), s.whole = reinterpret_cast<int*>(take(sb.flags));
  s.open = reinterpret_cast<int*>(take(sb.flags));
  void* tmp = take(sb.temp);
  sort_inputs<<<(N + 255) / 256, 256, 0, st>>>(k0, v0, tok, N);
  LRNN_CUDA_LAUNCH_CHECK();
  cub::DoubleBuffer<int> keys(k0, k1), vals(v0, v1);
  LRNN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, sb.temp, keys, vals, N, 0, 32, st));
  s.key = keys.Current(), s.pos = vals.Current();
  embedding_backward_segments<<<dim3(unsigned(nb), unsigned((C + 31) / 32)), kSegSpan, 0, st>>>(dW, s, dout, N, C, V);
  LRNN_CUDA_LAUNCH_CHECK();
  if (nb > 1) {
    embedding_backward_crossing<<<dim3(unsigned(nb - 1), unsigned((C + 127) / 128)), 128, 0, st>>>(dW, s, nb, C, V);
    LRNN_CUDA_LAUNCH_CHECK();
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
  SortedBytes sb{};
  const Backward path = backward_path(N, C, V, s, &sb);
  if (path == Backward::Partials) {
    // One block per chunk of 256 tokens (at least), as many as the scratch holds.
    const size_t per_part = size_t(V) * C * sizeof(float);
    const int P = partial_count(N, C, V);
    const int per_block = (N + P - 1) / P, W = det_warps(V);
    auto* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(P) * per_part));
    const dim3 grid(unsigned(P), unsigned((C + 31) / 32));
    embedding_backward_partials<<<grid, W * 32, size_t(W) * V * 32 * sizeof(float), s>>>(part, dout, tok, N, C, V,
                                                                                      per_block);
    LRNN_CUDA_LAUNCH_CHECK();
    add_partials(dW, part, P, size_t(V) * C);
    return;
  }
  if (path == Backward::Sorted) return embedding_backward_sorted(dW, dout, tok, N, C, V, sb, s);
  const dim3 grid((N + kChunk - 1) / kChunk, (C + kTile - 1) / kTile);
  embedding_backward_atomic<<<grid, kThreads, 0, s>>>(dW, dout, tok, N, C, V);
  LRNN_CUDA_LAUNCH_CHECK();
}

bool embedding_backward_deterministic(int N, int C, int V) {
  SortedBytes sb{};
  return N <= 0 || C <= 0 || V <= 0 || backward_path(N, C, V, ::lrnn::cuda::stream(), &sb) != Backward::Atomic;
}

}  // namespace lrnn::ops::cuda
