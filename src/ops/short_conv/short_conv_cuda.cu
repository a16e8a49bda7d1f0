// CUDA causal depthwise short conv + SiLU (contract: short_conv_cuda.h / short_conv.h).
//
// Forward: one thread per (b, t, c), reading its K inputs (neighbouring threads share them
// through L1).
//
// Backward: a block owns a tile of kTile time steps x 32 channels of one sequence and so owns
// dx there exactly (no atomics, no races on dx: dx at s gathers the K output gradients
// dpre[s .. s+K-1], which the block recomputes for its tile plus a halo of K-1 steps). Steps:
//   1. x for positions [t0-(K-1), t0+kTile+K-1) -> shared (0 outside [0, T));
//   2. dpre = dout * silu'(pre) for positions [t0, t0+kTile+K-1) -> shared (0 at t >= T);
//   3. dx[s] += sum_j w[c,j] dpre[s+K-1-j] for s in the tile;
//   4. dw[c,j] / dbias[c]: each thread sums its time steps in registers, the 8 rows of the
//      block are added in shared memory and the block issues one atomicAdd per (c, j) and per c
//      (not deterministic in order).
// K = 0 (plain SiLU of x + bias) runs through the same code with no halo.
#include "ops/short_conv/short_conv_cuda.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBx = 32, kBy = 8;  // channels x time rows of a backward block
constexpr int kTile = 64;         // time steps per backward block
constexpr int kKmax = 8;          // weight taps summed per pass (more taps: more passes)
static_assert(kBx * kBy == kThreads);

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void short_conv_forward_kernel(float* __restrict__ out, const float* __restrict__ x,
                                          const float* __restrict__ w, const float* __restrict__ bias, int B, int T,
                                          int C, int K, int ldx, int ldo) {
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
  }
  out[bt * ldo + c] = pre * sigmoid(pre);
}

// grid (ceil(C / 32), ceil(T / kTile), B), block (32, 8); dynamic smem: see smem_floats().
__global__ void __launch_bounds__(kThreads) short_conv_backward_kernel(
    float* __restrict__ dx, float* __restrict__ dw, const float* __restrict__ dout, const float* __restrict__ x,
    const float* __restrict__ w, int T, int C, int K, int ldx, int ldo, const float* __restrict__ bias,
    float* __restrict__ dbias) {
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
      dxb[size_t(s) * ldx + c] += acc;
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

void short_conv_forward(float* out, const float* x, const float* w, int B, int T_, int C, int K, int ldx, int ldo,
                        const float* bias) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  const size_t n = size_t(B) * T_ * C;
  if (B <= 0 || T_ <= 0 || C <= 0) return;
  short_conv_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
      out, x, w, bias, B, T_, C, K, ldx, ldo);
  LRNN_CUDA_LAUNCH_CHECK();
}

void short_conv_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int B, int T_,
                         int C, int K, int ldx, int ldo, const float* bias, float* dbias) {
  if (!ldx) ldx = C;
  if (!ldo) ldo = C;
  if (B <= 0 || T_ <= 0 || C <= 0) return;
  const size_t smem = smem_floats(K) * sizeof(float);
  if (smem > 48 * 1024)  // long filters only (K > ~70): opt in to more shared memory
    LRNN_CUDA_CHECK(cudaFuncSetAttribute(short_conv_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem)));
  const dim3 grid((C + kBx - 1) / kBx, (T_ + kTile - 1) / kTile, B);
  short_conv_backward_kernel<<<grid, dim3(kBx, kBy), smem, ::lrnn::cuda::stream()>>>(dx, dw, dout, x, w, T_, C, K,
                                                                                     ldx, ldo, bias, dbias);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
