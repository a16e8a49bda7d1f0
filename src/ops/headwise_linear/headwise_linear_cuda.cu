// CUDA block-diagonal linear map (contract: headwise_linear_cuda.h / headwise_linear.h).
// Blocks of 16 and wider (the sLSTM's head-dim gates): forward and dx each as one strided
// batched cuBLAS GEMM over the heads, dW as a GEMM per head (the CPU op: a GEMM per head). A thread per output element reads its weight row with a stride of
// I floats across the warp: for the sLSTM's 32x32 blocks at 40,960 tokens that took 0.66 ms per
// call. Narrower blocks (the mLSTM's 4x4 q/k/v): forward and dx one thread per output element;
// dW and dbias summed over row chunks in two passes (deterministic), or, when there are too
// many weights for that, one block per weight reducing over the N rows. 4x4 blocks on aligned
// rows (the mLSTM's q/k/v) have their own kernels: a thread per (row, head) forward and per (row
// chunk, head) backward, W_h in registers, rows as float4 (dx, dW and dbias in one pass over
// dy and x; dW and dbias per chunk, then add_partials: deterministic).
#include "ops/headwise_linear/headwise_linear_cuda.h"
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include "cuda/runtime.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGemmMin = 16;

__global__ void hw_forward_kernel(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ W,
                                  const float* __restrict__ bias, int N, int H, int I, int O, int ldx, int ldy) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t HO = size_t(H) * O;
  if (e >= size_t(N) * HO) return;
  const int n = int(e / HO), ho = int(e % HO), h = ho / O;
  const float* xh = x + size_t(n) * ldx + size_t(h) * I;
  const float* w = W + size_t(ho) * I;
  float acc = bias ? bias[ho] : 0.f;
  for (int i = 0; i < I; ++i) acc += xh[i] * w[i];
  y[size_t(n) * ldy + ho] = acc;
}

// y[n, c] = bias[c] for the H*O columns of each row (the GEMMs then add x W^T).
__global__ void hw_fill_bias(float* __restrict__ y, const float* __restrict__ bias, int N, int HO, int ldy) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * HO) return;
  const int n = int(e / HO), c = int(e % HO);
  y[size_t(n) * ldy + c] = bias[c];
}

__global__ void hw_dx_kernel(float* __restrict__ dx, const float* __restrict__ dy, const float* __restrict__ W, int N,
                             int H, int I, int O, int ldx, int ldy) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t HI = size_t(H) * I;
  if (e >= size_t(N) * HI) return;
  const int n = int(e / HI), hi = int(e % HI), h = hi / I, i = hi % I;
  const float* d = dy + size_t(n) * ldy + size_t(h) * O;
  const float* w = W + size_t(h) * O * I + i;
  float acc = 0.f;
  for (int o = 0; o < O; ++o) acc += d[o] * w[size_t(o) * I];
  dx[size_t(n) * ldx + hi] += acc;
}

// One block per weight (h, o, i) (x == null: per bias (h, o)): out += sum_n dy[n, h*O+o] x[n, h*I+i].
__global__ void __launch_bounds__(kThreads) hw_reduce_kernel(float* __restrict__ out, const float* __restrict__ dy,
                                                             const float* __restrict__ x, int N, int I, int O,
                                                             int ldx, int ldy) {
  __shared__ float red[kThreads / 32];
  const int k = blockIdx.x;
  int col_y, col_x = 0;
  if (x) {
    const int h = k / (O * I), o = (k / I) % O, i = k % I;
    col_y = h * O + o;
    col_x = h * I + i;
  } else {
    col_y = k;
  }
  float acc = 0.f;
  for (int n = threadIdx.x; n < N; n += kThreads)
    acc += dy[size_t(n) * ldy + col_y] * (x ? x[size_t(n) * ldx + col_x] : 1.f);
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) s += red[w];
    out[k] += s;  // one block per element: no race
  }
}

// Narrow blocks' dW (x != null) or dbias (x == null), in two passes without atomics: block c
// sums rows [c*R, (c+1)*R) for every weight (thread t owns weights t, t + kThreads, ...: a
// row's reads are contiguous across the warp) into partial row c of the scratch; then one
// thread per weight adds the partial rows in order (deterministic). kMaxPer weights per thread.
constexpr int kMaxPer = 8;
constexpr int kMaxChunks = 256;
__global__ void __launch_bounds__(kThreads) hw_partial_kernel(float* __restrict__ part, const float* __restrict__ dy,
                                                              const float* __restrict__ x, int N, int R, int nw,
                                                              int I, int O, int ldx, int ldy) {
  int cy[kMaxPer], cx[kMaxPer];
  float acc[kMaxPer];
#pragma unroll
  for (int k = 0; k < kMaxPer; ++k) {
    const int w = threadIdx.x + k * kThreads;
    acc[k] = 0.f;
    if (x) {
      const int h = w / (O * I), o = (w / I) % O, i = w % I;
      cy[k] = h * O + o, cx[k] = h * I + i;
    } else {
      cy[k] = w, cx[k] = 0;
    }
  }
  const int n0 = blockIdx.x * R, n1 = min(N, n0 + R);
#pragma unroll 4
  for (int n = n0; n < n1; ++n) {  // unrolled: several rows' loads in flight
    const float* d = dy + size_t(n) * ldy;
    const float* xr = x ? x + size_t(n) * ldx : nullptr;
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k)
      if (threadIdx.x + k * kThreads < nw) acc[k] = fmaf(d[cy[k]], xr ? xr[cx[k]] : 1.f, acc[k]);
  }
#pragma unroll
  for (int k = 0; k < kMaxPer; ++k) {
    const int w = threadIdx.x + k * kThreads;
    if (w < nw) part[size_t(blockIdx.x) * nw + w] = acc[k];
  }
}

// out (nw weights) += the narrow-block reduction over N rows; false if it does not apply.
bool hw_reduce_two_pass(float* out, const float* dy, const float* x, int N, int nw, int I, int O, int ldx, int ldy) {
  if (nw > kMaxPer * kThreads) return false;
  const int chunks = std::min(kMaxChunks, std::max(1, N / 64));
  const int R = (N + chunks - 1) / chunks;
  const int used = (N + R - 1) / R;
  if (size_t(used) * nw * sizeof(float) > ::lrnn::cuda::kScratchBytes) return false;
  float* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(used) * nw * sizeof(float)));
  hw_partial_kernel<<<unsigned(used), kThreads, 0, ::lrnn::cuda::stream()>>>(part, dy, x, N, R, nw, I, O, ldx, ldy);
  LRNN_CUDA_LAUNCH_CHECK();
  add_partials(out, part, used, size_t(nw));
  return true;
}

// ---- 4x4 blocks ----
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__global__ void hw4_forward(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ W,
                            const float* __restrict__ bias, int N, int H, int ldx, int ldy) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * H) return;
  const int n = int(e / H), h = int(e % H);
  const float4 xv = ld4(x + size_t(n) * ldx + 4 * h);
  const float xi[4] = {xv.x, xv.y, xv.z, xv.w};
  const float* w = W + 16 * h;
  float out[4];
#pragma unroll
  for (int o = 0; o < 4; ++o) {
    float acc = bias ? bias[4 * h + o] : 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc = fmaf(w[4 * o + i], xi[i], acc);
    out[o] = acc;
  }
  *reinterpret_cast<float4*>(y + size_t(n) * ldy + 4 * h) = make_float4(out[0], out[1], out[2], out[3]);
}

// Thread (chunk c, head h) walks rows [c R, (c + 1) R): dx += dy_h W_h; its dW_h and dbias_h sums
// go to partial row c (dW_part [chunks][H*16], db_part [chunks][H*4]).
__global__ void hw4_backward(float* __restrict__ dx, float* __restrict__ dW_part, float* __restrict__ db_part,
                             const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ W,
                             int N, int H, int R, int chunks, int ldx, int ldy) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(chunks) * H) return;
  const int c = int(e / H), h = int(e % H), n0 = c * R, n1 = min(N, n0 + R);
  float w[16], aw[16], ab[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < 16; ++k) w[k] = W[16 * h + k], aw[k] = 0.f;
#pragma unroll 2
  for (int n = n0; n < n1; ++n) {
    const float4 dv = ld4(dy + size_t(n) * ldy + 4 * h), xv = ld4(x + size_t(n) * ldx + 4 * h);
    const float d[4] = {dv.x, dv.y, dv.z, dv.w}, xi[4] = {xv.x, xv.y, xv.z, xv.w};
    if (dx) {
      float* p = dx + size_t(n) * ldx + 4 * h;
      float4 g = ld4(p);
      float gi[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int o = 0; o < 4; ++o) gi[i] = fmaf(d[o], w[4 * o + i], gi[i]);
      *reinterpret_cast<float4*>(p) = make_float4(gi[0], gi[1], gi[2], gi[3]);
    }
#pragma unroll
    for (int o = 0; o < 4; ++o) {
      ab[o] += d[o];
#pragma unroll
      for (int i = 0; i < 4; ++i) aw[4 * o + i] = fmaf(d[o], xi[i], aw[4 * o + i]);
    }
  }
  float* pw = dW_part + (size_t(c) * H + h) * 16;
#pragma unroll
  for (int k = 0; k < 16; k += 4) *reinterpret_cast<float4*>(pw + k) = make_float4(aw[k], aw[k + 1], aw[k + 2], aw[k + 3]);
  *reinterpret_cast<float4*>(db_part + (size_t(c) * H + h) * 4) = make_float4(ab[0], ab[1], ab[2], ab[3]);
}

bool quad_ok(int I, int O, int ldx, int ldy, std::initializer_list<const void*> ptrs) {
  if (I != 4 || O != 4 || ldx % 4 || ldy % 4) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}

}  // namespace

void headwise_linear_forward(float* y, const float* x, const float* W, const float* bias, int N, int H, int I, int O,
                             int ldx, int ldy) {
  if (!ldx) ldx = H * I;
  if (!ldy) ldy = H * O;
  const size_t n = size_t(N) * H * O;
  if (!n) return;
  if (I >= kGemmMin && O >= kGemmMin) {
    if (bias) {
      hw_fill_bias<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(y, bias, N, H * O,
                                                                                                  ldy);
      LRNN_CUDA_LAUNCH_CHECK();
    }
    // y_h [N, O] = x_h [N, I] W_h^T (+ y_h: the bias), all heads in one batched call
    gemm_batched(false, true, N, O, I, 1.f, x, ldx, I, W, I, (long long)O * I, bias ? 1.f : 0.f, y, ldy, O, H);
    return;
  }
  if (quad_ok(I, O, ldx, ldy, {y, x})) {
    hw4_forward<<<::lrnn::cuda::blocks_for(size_t(N) * H, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
        y, x, W, bias, N, H, ldx, ldy);
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
  hw_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(y, x, W, bias, N,
                                                                                                    H, I, O, ldx, ldy);
  LRNN_CUDA_LAUNCH_CHECK();
}

void headwise_linear_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x, const float* W,
                              int N, int H, int I, int O, int ldx, int ldy) {
  if (!ldx) ldx = H * I;
  if (!ldy) ldy = H * O;
  if (N <= 0 || H <= 0 || I <= 0 || O <= 0) return;
  if (quad_ok(I, O, ldx, ldy, {dx, dy, x})) {
    // Chunks of R rows: about 32k threads, within the scratch.
    const size_t per = size_t(H) * 20 * sizeof(float);
    const int want = std::max(1, int((size_t(32768) + H - 1) / H));
    const int chunks0 = std::min<int>({want, N, int(::lrnn::cuda::kScratchBytes / per)});
    const int R = (N + chunks0 - 1) / chunks0, chunks = (N + R - 1) / R;
    auto* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(chunks) * per));
    float *dW_part = part, *db_part = part + size_t(chunks) * H * 16;
    hw4_backward<<<::lrnn::cuda::blocks_for(size_t(chunks) * H, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
        dx, dW_part, db_part, dy, x, W, N, H, R, chunks, ldx, ldy);
    LRNN_CUDA_LAUNCH_CHECK();
    if (dW) add_partials(dW, dW_part, chunks, size_t(H) * 16);
    if (dbias) add_partials(dbias, db_part, chunks, size_t(H) * 4);
    return;
  }
  if (dx && I >= kGemmMin && O >= kGemmMin) {
    // dx_h [N, I] += dy_h [N, O] W_h [O, I]
    gemm_batched(false, false, N, I, O, 1.f, dy, ldy, O, W, I, (long long)O * I, 1.f, dx, ldx, I, H);
  } else if (dx) {
    const size_t n = size_t(N) * H * I;
    hw_dx_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(dx, dy, W, N, H, I,
                                                                                                 O, ldx, ldy);
    LRNN_CUDA_LAUNCH_CHECK();
  }
  if (dW) {
    if (I >= kGemmMin && O >= kGemmMin) {
      // dW_h [O, I] += dy_h^T x_h: a GEMM per head (cuBLAS splits the long reduction over N; its
      // batched call does not: 0.85 -> 3.14 ms per sLSTM step at B = 1024, measured on the H200)
      for (int h = 0; h < H; ++h)
        gemm(true, false, O, I, N, 1.f, dy + size_t(h) * O, ldy, x + size_t(h) * I, ldx, 1.f, dW + size_t(h) * O * I,
             I);
    } else if (!hw_reduce_two_pass(dW, dy, x, N, H * O * I, I, O, ldx, ldy)) {
      hw_reduce_kernel<<<unsigned(H * O * I), kThreads, 0, ::lrnn::cuda::stream()>>>(dW, dy, x, N, I, O, ldx, ldy);
      LRNN_CUDA_LAUNCH_CHECK();
    }
  }
  if (dbias && !hw_reduce_two_pass(dbias, dy, nullptr, N, H * O, I, O, ldx, ldy)) {
    hw_reduce_kernel<<<unsigned(H * O), kThreads, 0, ::lrnn::cuda::stream()>>>(dbias, dy, nullptr, N, I, O, ldx, ldy);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace lrnn::ops::cuda
