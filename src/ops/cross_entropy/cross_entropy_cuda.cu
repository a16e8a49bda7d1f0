// CUDA softmax cross-entropy with ignore index (contract: cross_entropy_cuda.h).
//
// Two layouts, by vocabulary size:
//  - short rows (V < kBlockRowV; the state-tracking models' V = 3..128, the small LMs' 1000): a
//    group of G = 4, 8, 16 or 32 lanes (the smallest power of two >= V, at most a warp) handles
//    one row, so a warp covers 32 / G rows at once;
//  - long rows (language-model vocabularies, V = 32,000): a block per row, each thread keeping a
//    running max and the sum of exponentials scaled to it (one pass over the row for its
//    logsumexp, float4 loads where the rows are 16-byte aligned). A warp per row made each lane
//    walk 1,000 logits three times, and the chunked LM head calls these ops on 512 rows at a time:
//    64 blocks, half the GPU idle.
// A training step's head asks for the loss and the backward at once (cross_entropy_loss_backward):
// for long rows one kernel holds each row in shared memory and makes its three passes (max, sum of
// exponentials, gradient) over the copy, reading the logits from memory once.
// Nothing is allocated and nothing waits for the host; the reductions go through
// lrnn::cuda::scratch() in a fixed order (deterministic):
//   loss:     rows kernel -> per-block (sum, count) partials -> one-block finalize kernel;
//   backward: count kernel -> per-block label counts; each dlogits block adds those up itself.
// A label >= V cannot be reported from the device: its row loss is NaN (and counts), so the
// mean shows it; the backward then treats the row like the CPU version (no one-hot term).
#include "ops/cross_entropy/cross_entropy_cuda.h"
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRowBlocks = 1024;  // partials of the loss kernel (grid-stride beyond)
constexpr int kMaxCountBlocks = 256;

template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// logsumexp of row x[0..V) over a group of G lanes (li = lane in group); every lane gets it.
template <int G>
__device__ __forceinline__ float row_lse(const float* x, int V, int li, bool valid) {
  float m = -INFINITY;
  if (valid)
    for (int v = li; v < V; v += G) m = fmaxf(m, x[v]);
  m = group_max<G>(m);
  float s = 0.f;
  if (valid)
    for (int v = li; v < V; v += G) s += expf(x[v] - m);
  s = group_sum<G>(s);
  return m + logf(s);
}

// The backward's outputs: fp32, or bf16 (rounded to nearest even) for the bf16 GEMMs of the head.
__device__ __forceinline__ void put(float* d, float v) { *d = v; }
__device__ __forceinline__ void put(__nv_bfloat16* d, float v) { *d = __float2bfloat16_rn(v); }
// Four consecutive outputs at d + 4 i (d 16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ void put4(float* d, int i, float4 v) { reinterpret_cast<float4*>(d)[i] = v; }
__device__ __forceinline__ void put4(__nv_bfloat16* d, int i, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 w;
  w.x = *reinterpret_cast<const uint32_t*>(&lo);
  w.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(d)[i] = w;
}

// Sum over the block (NT threads) of a float and an int, in a fixed order; result in thread 0.
template <int NT = kThreads>
__device__ __forceinline__ void block_sum(float& f, int& n) {
  constexpr int kW = NT / 32;
  __shared__ float sf[kW];
  __shared__ int sn[kW];
  f = group_sum<32>(f);
  n = warp_sum_int(n);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sf[warp] = f, sn[warp] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    f = 0.f;
    n = 0;
    for (int k = 0; k < kW; ++k) f += sf[k], n += sn[k];
  }
}

// A counted row's loss, lse - x[label] (NaN for a label >= V), into the running sum and count and
// into losses (if given).
__device__ __forceinline__ void add_row_loss(float* __restrict__ losses, long long row, float lse, const float* x,
                                             int lab, int V, float& acc, int& cnt) {
  const float l = lab < V ? lse - x[lab] : NAN;
  acc += l;
  ++cnt;
  if (losses) losses[row] = l;
}

// The block's sum of the counted losses and their number (fixed order) into psum, pcnt [block].
template <int NT = kThreads>
__device__ __forceinline__ void write_partials(float* __restrict__ psum, int* __restrict__ pcnt, float acc, int cnt) {
  block_sum<NT>(acc, cnt);
  if (threadIdx.x == 0) {
    psum[blockIdx.x] = acc;
    pcnt[blockIdx.x] = cnt;
  }
}

// The backward's factor dloss / (number of counted labels) from the count kernel's per-block
// counts, added up by the first warp; every thread of the block gets it.
__device__ float counted_scale(double dloss, const int* __restrict__ pcnt, int nparts) {
  __shared__ float s_scale;
  if (threadIdx.x < 32) {
    int n = 0;
    for (int i = threadIdx.x; i < nparts; i += 32) n += pcnt[i];
    n = warp_sum_int(n);
    if (threadIdx.x == 0) s_scale = n ? float(dloss / double(n)) : 0.f;
  }
  __syncthreads();
  return s_scale;
}

// Row losses; per-block partial sums of the counted losses and their number.
template <int G>
__global__ void __launch_bounds__(kThreads) ce_loss_rows_kernel(float* __restrict__ losses,
                                                                float* __restrict__ psum, int* __restrict__ pcnt,
                                                                const float* __restrict__ logits,
                                                                const int32_t* __restrict__ labels, int N, int V) {
  constexpr int kRows = kThreads / G;  // rows per block per pass
  const int li = threadIdx.x % G;
  float acc = 0.f;
  int cnt = 0;
  // The loop bound is uniform over the block, so every lane reaches every shuffle.
  for (long long base = (long long)blockIdx.x * kRows; base < N; base += (long long)gridDim.x * kRows) {
    const long long row = base + threadIdx.x / G;
    const bool valid = row < N;
    const float* x = logits + (valid ? row : 0) * (long long)V;
    const float lse = row_lse<G>(x, V, li, valid);
    if (valid && li == 0) {
      const int lab = labels[row];
      if (lab >= 0) add_row_loss(losses, row, lse, x, lab, V, acc, cnt);
      else if (losses) losses[row] = 0.f;
    }
  }
  write_partials(psum, pcnt, acc, cnt);
}

__global__ void __launch_bounds__(kThreads) ce_loss_finalize_kernel(float* __restrict__ loss,
                                                                    const float* __restrict__ psum,
                                                                    const int* __restrict__ pcnt, int nparts) {
  float s = 0.f;
  int n = 0;
  for (int i = threadIdx.x; i < nparts; i += kThreads) s += psum[i], n += pcnt[i];
  block_sum(s, n);
  if (threadIdx.x == 0) loss[0] = n ? s / float(n) : 0.f;
}

__global__ void __launch_bounds__(kThreads) ce_count_kernel(int* __restrict__ pcnt,
                                                            const int32_t* __restrict__ labels, int N) {
  int n = 0;
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < N; i += (long long)gridDim.x * kThreads)
    n += labels[i] >= 0;
  float unused = 0.f;
  block_sum(unused, n);
  if (threadIdx.x == 0) pcnt[blockIdx.x] = n;
}

template <int G, class D>
__global__ void __launch_bounds__(kThreads) ce_backward_kernel(D* __restrict__ dlogits,
                                                               const float* __restrict__ logits,
                                                               const int32_t* __restrict__ labels, int N, int V,
                                                               double dloss, const int* __restrict__ pcnt,
                                                               int nparts) {
  constexpr int kRows = kThreads / G;
  const float scale = counted_scale(dloss, pcnt, nparts);
  const int li = threadIdx.x % G;
  for (long long base = (long long)blockIdx.x * kRows; base < N; base += (long long)gridDim.x * kRows) {
    const long long row = base + threadIdx.x / G;
    const bool valid = row < N;
    const int lab = valid ? labels[row] : -1;
    const float* x = logits + (valid ? row : 0) * (long long)V;
    // Ignored and out-of-range rows still take part in the (group-uniform) shuffles.
    const float lse = row_lse<G>(x, V, li, valid && lab >= 0);
    if (!valid) continue;
    D* d = dlogits + row * (long long)V;
    if (lab < 0) {
      for (int v = li; v < V; v += G) put(d + v, 0.f);
    } else {
      for (int v = li; v < V; v += G) put(d + v, scale * (expf(x[v] - lse) - (v == lab ? 1.f : 0.f)));
    }
  }
}

// ---- long rows: a block per row ----

constexpr int kBlockRowV = 2048;       // from this V on, a block per row
constexpr int kMaxBackwardBlocks = 8192;

// A running (max m, sum s of exp(x - m)) over some of a row's logits. -inf logits add nothing;
// a NaN makes s NaN.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum ms_add(MaxSum a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.f;
    a.m = x;
  } else if (x > -INFINITY) {
    a.s += expf(x - a.m);
  } else if (x != x) {
    a.s = NAN;  // a NaN logit makes the row's loss NaN, as on the CPU
  }
  return a;
}
__device__ __forceinline__ MaxSum ms_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MaxSum{m, 0.f};
  return MaxSum{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// logsumexp of row x[0..V) by the whole block (kThreads); every thread gets it. VEC: x is 16-byte
// aligned and V a multiple of 4. The partials are combined in a fixed order (deterministic).
template <bool VEC>
__device__ float block_row_lse(const float* __restrict__ x, int V) {
  __shared__ float red_m[kWarps], red_s[kWarps];
  MaxSum a{-INFINITY, 0.f};
  if (VEC) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = threadIdx.x; i < V / 4; i += kThreads) {
      const float4 v = x4[i];
      a = ms_add(ms_add(ms_add(ms_add(a, v.x), v.y), v.z), v.w);
    }
  } else {
    for (int v = threadIdx.x; v < V; v += kThreads) a = ms_add(a, x[v]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    a = ms_merge(a, MaxSum{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)});
  __syncthreads();  // the previous row's partials are read
  if ((threadIdx.x & 31) == 0) red_m[threadIdx.x >> 5] = a.m, red_s[threadIdx.x >> 5] = a.s;
  __syncthreads();
  MaxSum t{red_m[0], red_s[0]};
  for (int w = 1; w < kWarps; ++w) t = ms_merge(t, MaxSum{red_m[w], red_s[w]});
  return t.m + logf(t.s);
}

// One row's gradient by the whole block (NT threads): d = scale (softmax(x) - onehot(lab)), or 0
// for an ignored row (lab < 0; lse unused). VEC as above, and d holds 4 outputs at 4 i.
template <bool VEC, int NT, class D>
__device__ __forceinline__ void block_row_grads(D* __restrict__ d, const float* __restrict__ x, int V, float lse,
                                                int lab, float scale) {
  if (lab < 0) {
    if (VEC) {
      for (int i = threadIdx.x; i < V / 4; i += NT) put4(d, i, make_float4(0.f, 0.f, 0.f, 0.f));
    } else {
      for (int v = threadIdx.x; v < V; v += NT) put(d + v, 0.f);
    }
    return;
  }
  if (VEC) {
    for (int i = threadIdx.x; i < V / 4; i += NT) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      const int v0 = 4 * i;
      float4 o;
      o.x = scale * (expf(v.x - lse) - (v0 == lab ? 1.f : 0.f));
      o.y = scale * (expf(v.y - lse) - (v0 + 1 == lab ? 1.f : 0.f));
      o.z = scale * (expf(v.z - lse) - (v0 + 2 == lab ? 1.f : 0.f));
      o.w = scale * (expf(v.w - lse) - (v0 + 3 == lab ? 1.f : 0.f));
      put4(d, i, o);
    }
  } else {
    for (int v = threadIdx.x; v < V; v += NT) put(d + v, scale * (expf(x[v] - lse) - (v == lab ? 1.f : 0.f)));
  }
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads) ce_loss_block_rows_kernel(float* __restrict__ losses,
                                                                      float* __restrict__ psum, int* __restrict__ pcnt,
                                                                      const float* __restrict__ logits,
                                                                      const int32_t* __restrict__ labels, int N,
                                                                      int V) {
  float acc = 0.f;
  int cnt = 0;
  for (long long row = blockIdx.x; row < N; row += gridDim.x) {
    const int lab = labels[row];  // the same for the whole block
    if (lab < 0) {
      if (losses && threadIdx.x == 0) losses[row] = 0.f;
      continue;
    }
    const float* x = logits + row * (long long)V;
    const float lse = block_row_lse<VEC>(x, V);
    if (threadIdx.x == 0) add_row_loss(losses, row, lse, x, lab, V, acc, cnt);
  }
  write_partials(psum, pcnt, acc, cnt);
}

template <bool VEC, class D>
__global__ void __launch_bounds__(kThreads) ce_backward_block_rows_kernel(D* __restrict__ dlogits,
                                                                          const float* __restrict__ logits,
                                                                          const int32_t* __restrict__ labels, int N,
                                                                          int V, double dloss,
                                                                          const int* __restrict__ pcnt, int nparts) {
  const float scale = counted_scale(dloss, pcnt, nparts);
  for (long long row = blockIdx.x; row < N; row += gridDim.x) {
    const int lab = labels[row];
    const float* x = logits + row * (long long)V;
    const float lse = lab < 0 ? 0.f : block_row_lse<VEC>(x, V);
    block_row_grads<VEC, kThreads>(dlogits + row * (long long)V, x, V, lse, lab, scale);
  }
}

// The loss and the backward in one pass over each row (the training step's head), where the two
// kernels above read every row three times. A block of 1024 threads per SM holds its row in shared
// memory (V floats: up to ~56k on H100/H200): the row is read from memory once, and three passes
// over the copy give its max, its sum of exponentials and its gradient. Each pass is a few
// instructions an element (a max; an FFMA and an ex2 and an add; an FFMA, an ex2, an FMA and the
// bf16 pack), where the running max-sum of the kernels above takes an exponential, a compare and
// a branch for every logit, and is done again by the backward: the time of those, and of this
// kernel in the running form, went into instructions, not bytes (measured on an H200 at 16,384
// rows of 32,000: the two kernels 0.70 + 1.24 ms, the running form fused 1.77 ms whether its row
// sat in shared memory or was read twice through L2, against ~0.65 ms to move the bytes; this
// form, predicted ~0.8 ms, measured 1.20 ms). Each thread keeps four float4 loads in flight
// (64 KB an SM), and reads back only the float4s it stored (no barrier for the copy).
constexpr int kFusedThreads = 1024, kFusedUnroll = 4, kFusedWarps = kFusedThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;

// x over the block (kFusedThreads) by op, in a fixed order; every thread gets it. red: kFusedWarps
// floats of shared memory, free on entry (the barrier before the write sees to the last reads).
template <class Op>
__device__ __forceinline__ float fused_block_reduce(float x, float* red, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  float t = red[0];
  for (int w = 1; w < kFusedWarps; ++w) t = op(t, red[w]);
  return t;
}

template <class D>
__global__ void __launch_bounds__(kFusedThreads, 1)
    ce_fused_block_rows_kernel(float* __restrict__ psum, int* __restrict__ pcnt, D* __restrict__ dlogits,
                               const float* __restrict__ logits, const int32_t* __restrict__ labels, int N, int V,
                               double dloss, const int* __restrict__ ccnt, int nparts) {
  extern __shared__ float4 row_s[];  // V / 4
  __shared__ float red_max[kFusedWarps], red_sum[kFusedWarps];
  const float scale = counted_scale(dloss, ccnt, nparts);
  const int n4 = V / 4;
  float acc = 0.f;
  int cnt = 0;
  for (long long row = blockIdx.x; row < N; row += gridDim.x) {
    const int lab = labels[row];
    const float* x = logits + row * (long long)V;
    D* d = dlogits + row * (long long)V;
    if (lab < 0) {
      block_row_grads<true, kFusedThreads>(d, x, V, 0.f, lab, scale);
      continue;
    }
    // The copy and the max (fmaxf passes over a NaN; the sum below then carries it).
    float m = -INFINITY;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = threadIdx.x; i < n4; i += kFusedUnroll * kFusedThreads) {
      float4 v[kFusedUnroll];
#pragma unroll
      for (int u = 0; u < kFusedUnroll; ++u)
        if (i + u * kFusedThreads < n4) v[u] = x4[i + u * kFusedThreads];
#pragma unroll
      for (int u = 0; u < kFusedUnroll; ++u)
        if (i + u * kFusedThreads < n4) {
          row_s[i + u * kFusedThreads] = v[u];
          m = fmaxf(fmaxf(m, fmaxf(v[u].x, v[u].y)), fmaxf(v[u].z, v[u].w));
        }
    }
    m = fused_block_reduce(m, red_max, [](float p, float q) { return fmaxf(p, q); });
    // Shifted by the max where it is finite (a row of -inf sums to 0: lse -inf; +inf: lse +inf).
    const float shift = isfinite(m) ? m : 0.f, sl = -shift * kLog2e;
    float s = 0.f;
    for (int i = threadIdx.x; i < n4; i += kFusedThreads) {
      const float4 v = row_s[i];
      s += exp2f(fmaf(v.x, kLog2e, sl)) + exp2f(fmaf(v.y, kLog2e, sl)) + exp2f(fmaf(v.z, kLog2e, sl)) +
           exp2f(fmaf(v.w, kLog2e, sl));
    }
    s = fused_block_reduce(s, red_sum, [](float p, float q) { return p + q; });
    const float lse = shift + logf(s), ll = -lse * kLog2e;
    if (threadIdx.x == 0) add_row_loss(nullptr, row, lse, x, lab, V, acc, cnt);
    for (int i = threadIdx.x; i < n4; i += kFusedThreads) {
      const float4 v = row_s[i];
      const int v0 = 4 * i;
      float4 o;
      o.x = scale * (exp2f(fmaf(v.x, kLog2e, ll)) - (v0 == lab ? 1.f : 0.f));
      o.y = scale * (exp2f(fmaf(v.y, kLog2e, ll)) - (v0 + 1 == lab ? 1.f : 0.f));
      o.z = scale * (exp2f(fmaf(v.z, kLog2e, ll)) - (v0 + 2 == lab ? 1.f : 0.f));
      o.w = scale * (exp2f(fmaf(v.w, kLog2e, ll)) - (v0 + 3 == lab ? 1.f : 0.f));
      put4(d, i, o);
    }
  }
  write_partials<kFusedThreads>(psum, pcnt, acc, cnt);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int G>
void launch_loss(float* losses, float* psum, int* pcnt, const float* logits, const int32_t* labels, int N, int V,
                 int blocks) {
  ce_loss_rows_kernel<G><<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(losses, psum, pcnt, logits, labels, N, V);
  LRNN_CUDA_LAUNCH_CHECK();
}

template <int G, class D>
void launch_backward(D* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss,
                     const int* pcnt, int nparts) {
  constexpr int kRows = kThreads / G;
  unsigned blocks = ::lrnn::cuda::blocks_for(size_t(N), kRows);
  if (blocks > unsigned(kMaxRowBlocks)) blocks = kMaxRowBlocks;
  ce_backward_kernel<G, D><<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(dlogits, logits, labels, N, V, dloss, pcnt,
                                                                        nparts);
  LRNN_CUDA_LAUNCH_CHECK();
}

int group_for(int V) { return V <= 4 ? 4 : V <= 8 ? 8 : V <= 16 ? 16 : 32; }

}  // namespace

void cross_entropy_loss(float* loss, float* losses, const float* logits, const int32_t* labels, int N, int V) {
  auto* psum = static_cast<float*>(::lrnn::cuda::scratch(kMaxRowBlocks * (sizeof(float) + sizeof(int))));
  int* pcnt = reinterpret_cast<int*>(psum + kMaxRowBlocks);
  int blocks = 0;
  if (N > 0 && V >= kBlockRowV) {
    blocks = std::min(N, kMaxRowBlocks);
    const auto kernel =
        V % 4 == 0 && aligned16(logits) ? ce_loss_block_rows_kernel<true> : ce_loss_block_rows_kernel<false>;
    kernel<<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(losses, psum, pcnt, logits, labels, N, V);
    LRNN_CUDA_LAUNCH_CHECK();
  } else if (N > 0 && V > 0) {
    const int G = group_for(V);
    const size_t rows_per_block = kThreads / G;
    blocks = int(::lrnn::cuda::blocks_for(size_t(N), unsigned(rows_per_block)));
    if (blocks > kMaxRowBlocks) blocks = kMaxRowBlocks;
    switch (G) {
      case 4: launch_loss<4>(losses, psum, pcnt, logits, labels, N, V, blocks); break;
      case 8: launch_loss<8>(losses, psum, pcnt, logits, labels, N, V, blocks); break;
      case 16: launch_loss<16>(losses, psum, pcnt, logits, labels, N, V, blocks); break;
      default: launch_loss<32>(losses, psum, pcnt, logits, labels, N, V, blocks); break;
    }
  }
  // With no rows this writes loss[0] = 0.
  ce_loss_finalize_kernel<<<1, kThreads, 0, ::lrnn::cuda::stream()>>>(loss, psum, pcnt, blocks);
  LRNN_CUDA_LAUNCH_CHECK();
}

namespace {
// The backward into fp32 or bf16 dlogits (D).
template <class D>
void backward_impl(D* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss) {
  if (N <= 0 || V <= 0) return;
  int* pcnt = static_cast<int*>(::lrnn::cuda::scratch(kMaxCountBlocks * sizeof(int)));
  unsigned cblocks = ::lrnn::cuda::blocks_for(size_t(N), kThreads);
  if (cblocks > unsigned(kMaxCountBlocks)) cblocks = kMaxCountBlocks;
  ce_count_kernel<<<cblocks, kThreads, 0, ::lrnn::cuda::stream()>>>(pcnt, labels, N);
  LRNN_CUDA_LAUNCH_CHECK();
  if (V >= kBlockRowV) {
    const unsigned blocks = unsigned(std::min(N, kMaxBackwardBlocks));
    // Four outputs at a time need rows of the logits 16-byte aligned and of dlogits 4 outputs.
    const bool vec = V % 4 == 0 && aligned16(logits) && reinterpret_cast<uintptr_t>(dlogits) % (4 * sizeof(D)) == 0;
    const auto kernel = vec ? ce_backward_block_rows_kernel<true, D> : ce_backward_block_rows_kernel<false, D>;
    kernel<<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(dlogits, logits, labels, N, V, dloss, pcnt, int(cblocks));
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
  switch (group_for(V)) {
    case 4: launch_backward<4>(dlogits, logits, labels, N, V, dloss, pcnt, int(cblocks)); break;
    case 8: launch_backward<8>(dlogits, logits, labels, N, V, dloss, pcnt, int(cblocks)); break;
    case 16: launch_backward<16>(dlogits, logits, labels, N, V, dloss, pcnt, int(cblocks)); break;
    default: launch_backward<32>(dlogits, logits, labels, N, V, dloss, pcnt, int(cblocks)); break;
  }
}

// The loss and the backward together (cross_entropy_loss_backward).
template <class D>
void loss_backward_impl(float* loss, D* dlogits, const float* logits, const int32_t* labels, int N, int V,
                        double dloss) {
  const auto kernel = ce_fused_block_rows_kernel<D>;
  static const size_t smem_limit = [&] {
    ::lrnn::cuda::allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
    return ::lrnn::cuda::max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  }();
  const size_t smem = size_t(V) * sizeof(float);
  // Short rows, rows not in whole float4s, rows longer than shared memory: the two kernels.
  if (N <= 0 || V < kBlockRowV || V % 4 || !aligned16(logits) ||
      reinterpret_cast<uintptr_t>(dlogits) % (4 * sizeof(D)) || smem > smem_limit) {
    cross_entropy_loss(loss, nullptr, logits, labels, N, V);
    backward_impl(dlogits, logits, labels, N, V, dloss);
    return;
  }
  auto* psum = static_cast<float*>(
      ::lrnn::cuda::scratch(kMaxRowBlocks * (sizeof(float) + sizeof(int)) + kMaxCountBlocks * sizeof(int)));
  int* pcnt = reinterpret_cast<int*>(psum + kMaxRowBlocks);
  int* ccnt = pcnt + kMaxRowBlocks;
  unsigned cblocks = ::lrnn::cuda::blocks_for(size_t(N), kThreads);
  if (cblocks > unsigned(kMaxCountBlocks)) cblocks = kMaxCountBlocks;
  ce_count_kernel<<<cblocks, kThreads, 0, ::lrnn::cuda::stream()>>>(ccnt, labels, N);
  LRNN_CUDA_LAUNCH_CHECK();
  const int blocks = std::min({N, kMaxRowBlocks, ::lrnn::cuda::num_sms()});  // one wave, one block an SM
  kernel<<<blocks, kFusedThreads, smem, ::lrnn::cuda::stream()>>>(psum, pcnt, dlogits, logits, labels, N, V, dloss,
                                                                  ccnt, int(cblocks));
  LRNN_CUDA_LAUNCH_CHECK();
  ce_loss_finalize_kernel<<<1, kThreads, 0, ::lrnn::cuda::stream()>>>(loss, psum, pcnt, blocks);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss) {
  backward_impl(dlogits, logits, labels, N, V, dloss);
}
void cross_entropy_backward(bf16* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss) {
  backward_impl(reinterpret_cast<__nv_bfloat16*>(dlogits), logits, labels, N, V, dloss);
}

void cross_entropy_loss_backward(float* loss, float* dlogits, const float* logits, const int32_t* labels, int N, int V,
                                 double dloss) {
  loss_backward_impl(loss, dlogits, logits, labels, N, V, dloss);
}
void cross_entropy_loss_backward(float* loss, bf16* dlogits, const float* logits, const int32_t* labels, int N, int V,
                                 double dloss) {
  loss_backward_impl(loss, reinterpret_cast<__nv_bfloat16*>(dlogits), logits, labels, N, V, dloss);
}

}  // namespace lrnn::ops::cuda
