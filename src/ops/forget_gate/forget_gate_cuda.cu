// CUDA log-space forget gate (contract: forget_gate_cuda.h / forget_gate.h).
//
// Forward: one thread per (token, head). Backward: threads walk the flattened [N, H] grid with a
// stride S that is a multiple of H, so every thread stays on one head and sums its dA_log /
// ddt_bias terms in registers; a block then adds the partials of each head in shared memory, in
// thread order, and writes them to the device scratch as [block][H], which add_partials sums in a
// fixed order: deterministic. (Where [blocks][H] does not fit the scratch, H > 512, the blocks
// atomicAdd their partials instead, in a varying order.)
#include "ops/forget_gate/forget_gate_cuda.h"
#include "cuda/runtime.h"
#include "ops/elementwise/elementwise_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr long long kMaxThreads = 1024LL * kThreads;  // backward: about one full wave

__device__ __forceinline__ float softplus(float x) { return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void forget_gate_forward_kernel(float* __restrict__ g, const float* __restrict__ a,
                                           const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                           int N, int H, int lda) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)N * H) return;
  const int n = int(i / H), h = int(i % H);
  g[i] = -expf(A_log[h]) * softplus(a[size_t(n) * lda + h] + dt_bias[h]);
}

// Thread gid < S handles elements gid, gid + S, ... (S % H == 0: always head gid % H).
// Acc false: da is overwritten (accumulated onto 0, never read); the sums always accumulate.
template <bool Acc>
__global__ void __launch_bounds__(kThreads) forget_gate_backward_kernel(
    float* __restrict__ da, float* __restrict__ dA_log, float* __restrict__ ddt_bias, const float* __restrict__ dg,
    const float* __restrict__ a, const float* __restrict__ A_log, const float* __restrict__ dt_bias, int N, int H,
    int lda, long long S, float* __restrict__ partA, float* __restrict__ partB) {
  __shared__ float sA[kThreads], sB[kThreads];
  const long long gid = (long long)blockIdx.x * kThreads + threadIdx.x;
  const long long total = (long long)N * H;
  const int h = int(gid % H);
  float accA = 0.f, accB = 0.f;
  if (gid < S) {
    const float A = expf(A_log[h]), bias = dt_bias[h];
    for (long long i = gid; i < total; i += S) {
      const long long n = i / H;
      const float x = a[n * lda + h] + bias, d = dg[i];
      const float dx = -A * sigmoid(x) * d;
      da[n * lda + h] = (Acc ? da[n * lda + h] : 0.f) + dx;
      accA += -A * softplus(x) * d;
      accB += dx;
    }
  }
  if (!dA_log && !ddt_bias) return;  // uniform over the block
  sA[threadIdx.x] = accA;  // 0 for idle threads
  sB[threadIdx.x] = accB;
  __syncthreads();
  // Head hh's partial of this block: its threads t with (blockIdx.x * kThreads + t) % H == hh.
  const int base = int(((long long)blockIdx.x * kThreads) % H);
  for (int hh = threadIdx.x; hh < H; hh += kThreads) {
    int t0 = hh - base;
    if (t0 < 0) t0 += H;
    float sa = 0.f, sb = 0.f;
    for (int t = t0; t < kThreads; t += H) {
      sa += sA[t];
      sb += sB[t];
    }
    if (partA) {
      partA[size_t(blockIdx.x) * H + hh] = sa;
      partB[size_t(blockIdx.x) * H + hh] = sb;
    } else {
      if (dA_log) atomicAdd(dA_log + hh, sa);
      if (ddt_bias) atomicAdd(ddt_bias + hh, sb);
    }
  }
}

}  // namespace

void forget_gate_forward(float* g, const float* a, const float* A_log, const float* dt_bias, int N, int H, int lda) {
  if (!lda) lda = H;
  const long long total = (long long)N * H;
  if (total <= 0) return;
  forget_gate_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(total), kThreads), kThreads, 0,
                               ::lrnn::cuda::stream()>>>(g, a, A_log, dt_bias, N, H, lda);
  LRNN_CUDA_LAUNCH_CHECK();
}

void forget_gate_backward(float* da, float* dA_log, float* ddt_bias, const float* dg, const float* a,
                          const float* A_log, const float* dt_bias, int N, int H, int lda, bool accumulate) {
  if (!lda) lda = H;
  const long long total = (long long)N * H;
  if (total <= 0) return;
  long long S = total < kMaxThreads ? total : kMaxThreads;
  S = (S + H - 1) / H * H;  // a multiple of H, >= H
  auto kernel = accumulate ? forget_gate_backward_kernel<true> : forget_gate_backward_kernel<false>;
  const unsigned blocks = ::lrnn::cuda::blocks_for(size_t(S), kThreads);
  const size_t part_floats = size_t(blocks) * H;
  float *partA = nullptr, *partB = nullptr;
  if ((dA_log || ddt_bias) && 2 * part_floats * sizeof(float) <= (size_t(1) << 20)) {
    partA = static_cast<float*>(::lrnn::cuda::scratch(2 * part_floats * sizeof(float)));
    partB = partA + part_floats;
  }
  kernel<<<blocks, kThreads, 0, ::lrnn::cuda::stream()>>>(da, dA_log, ddt_bias, dg, a, A_log, dt_bias, N, H, lda, S,
                                                          partA, partB);
  LRNN_CUDA_LAUNCH_CHECK();
  if (partA) {
    if (dA_log) add_partials(dA_log, partA, int(blocks), size_t(H));
    if (ddt_bias) add_partials(ddt_bias, partB, int(blocks), size_t(H));
  }
}

}  // namespace lrnn::ops::cuda
