// CUDA block-diagonal linear map (contract: headwise_linear_cuda.h / headwise_linear.h).
// Blocks of 16 and wider (the sLSTM's head-dim gates): forward, dx and dW as one cuBLAS GEMM
// per head (as the CPU op). A thread per output element reads its weight row with a stride of
// I floats across the warp: for the sLSTM's 32x32 blocks at 40,960 tokens that took 0.66 ms per
// call. Narrower blocks (the mLSTM's 4x4 q/k/v): forward and dx one thread per output element;
// dW and dbias summed over row chunks in two passes (deterministic), or, when there are too
// many weights for that, one block per weight reducing over the N rows.
#include "ops/headwise_linear/headwise_linear_cuda.h"
#include <algorithm>
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
  if (size_t(used) * nw * sizeof(float) > (size_t(1) << 20)) return false;  // the scratch's capacity
  float* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(used) * nw * sizeof(float)));
  hw_partial_kernel<<<unsigned(used), kThreads, 0, ::lrnn::cuda::stream()>>>(part, dy, x, N, R, nw, I, O, ldx, ldy);
  LRNN_CUDA_LAUNCH_CHECK();
  add_partials(out, part, used, size_t(nw));
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
    // y_h [N, O] = x_h [N, I] W_h^T (+ y_h: the bias)
    for (int h = 0; h < H; ++h)
      gemm(false, true, N, O, I, 1.f, x + size_t(h) * I, ldx, W + size_t(h) * O * I, I, bias ? 1.f : 0.f,
           y + size_t(h) * O, ldy);
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
  if (dx && I >= kGemmMin && O >= kGemmMin) {
    // dx_h [N, I] += dy_h [N, O] W_h [O, I]
    for (int h = 0; h < H; ++h)
      gemm(false, false, N, I, O, 1.f, dy + size_t(h) * O, ldy, W + size_t(h) * O * I, I, 1.f, dx + size_t(h) * I,
           ldx);
  } else if (dx) {
    const size_t n = size_t(N) * H * I;
    hw_dx_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(dx, dy, W, N, H, I,
                                                                                                 O, ldx, ldy);
    LRNN_CUDA_LAUNCH_CHECK();
  }
  if (dW) {
    if (I >= kGemmMin && O >= kGemmMin) {
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
