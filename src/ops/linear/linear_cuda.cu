// cuBLAS linear layer. Row-major [N,IC] x [OC,IC]^T is, seen column-major, out^T = W^T' x inp^T,
// i.e. one column-major GEMM with W transposed: (OC x N) = op_T(W: IC x OC) * (inp: IC x N).
#include "ops/linear/linear_cuda.h"
#include <cublas_v2.h>
#include <algorithm>
#include "core/check.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {

namespace {

cublasHandle_t handle() { return static_cast<cublasHandle_t>(lrnn::cuda::cublas()); }

void check(cublasStatus_t s, const char* what) {
  LRNN_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS {} failed: status {}", what, int(s));
}

// Column-major C[m,n] = alpha op(A) op(B) + beta C with fp32 storage and the context's precision.
void sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc, float alpha = 1.0f) {
  check(cublasGemmEx(handle(), ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C, CUDA_R_32F,
                     ldc,
                     lrnn::cuda::gemm_precision() == lrnn::cuda::GemmPrecision::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                     : CUBLAS_COMPUTE_32F_PEDANTIC,
                     CUBLAS_GEMM_DEFAULT),
        "GemmEx");
}

__global__ void fill_bias(float* out, const float* bias, int N, int OC) {
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(N) * OC) out[i] = bias[i % OC];
}

// dbias[o] += sum_n dout[n, o]: a block per 32 columns, threads stride over rows.
__global__ void bias_grad(float* dbias, const float* dout, int N, int OC) {
  __shared__ float part[8][33];
  int o = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (o < OC)
    for (int n = threadIdx.y; n < N; n += 8) acc += dout[size_t(n) * OC + o];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    float s = 0.f;
    for (int j = 0; j < 8; ++j) s += part[j][threadIdx.x];
    dbias[o] += s;
  }
}

constexpr int kRedThreads = 256;
// Narrow blocks' dW (x != null) or dbias (x == null), in two passes without atomics: block c
// sums rows [c*R, (c+1)*R) for every weight (thread t owns weights t, t + kRedThreads, ...: a
// row's reads are contiguous across the warp) into partial row c of the scratch; then one
// thread per weight adds the partial rows in order (deterministic). kMaxPer weights per thread.
constexpr int kMaxPer = 8;
constexpr int kMaxChunks = 256;
__global__ void __launch_bounds__(kRedThreads) hw_partial_kernel(float* __restrict__ part, const float* __restrict__ dy,
                                                              const float* __restrict__ x, int N, int R, int nw,
                                                              int I, int O, int ldx, int ldy) {
  int cy[kMaxPer], cx[kMaxPer];
  float acc[kMaxPer];
#pragma unroll
  for (int k = 0; k < kMaxPer; ++k) {
    const int w = threadIdx.x + k * kRedThreads;
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
      if (threadIdx.x + k * kRedThreads < nw) acc[k] = fmaf(d[cy[k]], xr ? xr[cx[k]] : 1.f, acc[k]);
  }
#pragma unroll
  for (int k = 0; k < kMaxPer; ++k) {
    const int w = threadIdx.x + k * kRedThreads;
    if (w < nw) part[size_t(blockIdx.x) * nw + w] = acc[k];
  }
}
__global__ void hw_sum_partials(float* __restrict__ out, const float* __restrict__ part, int chunks, int nw) {
  const int w = blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= nw) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += part[size_t(c) * nw + w];
  out[w] += s;
}


// Linear layers with few outputs (a language-model head over a small vocabulary: OC = 3 for
// parity): cuBLAS runs such a GEMM far below bandwidth (~0.1 ms for 40,960 x 128 -> 3), so
// these go to a warp per row. Forward: lanes split the input columns, one butterfly per output.
constexpr int kSmallOC = 16;
constexpr int kRowWarps = 8;
__global__ void __launch_bounds__(kRowWarps * 32) small_oc_forward(float* __restrict__ out, const float* __restrict__ x,
                                                                  const float* __restrict__ W,
                                                                  const float* __restrict__ bias, int N, int IC, int OC) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRowWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps
  const float* xr = x + size_t(row) * IC;
  float acc[kSmallOC];
#pragma unroll
  for (int v = 0; v < kSmallOC; ++v) acc[v] = 0.f;
  for (int c = lane; c < IC; c += 32) {
    const float xv = xr[c];
#pragma unroll
    for (int v = 0; v < kSmallOC; ++v)
      if (v < OC) acc[v] = fmaf(xv, W[size_t(v) * IC + c], acc[v]);
  }
#pragma unroll
  for (int v = 0; v < kSmallOC; ++v) {
    if (v >= OC) break;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[v] += __shfl_xor_sync(0xffffffffu, acc[v], o);
    if (lane == v) out[size_t(row) * OC + v] = acc[v] + (bias ? bias[v] : 0.f);
  }
}
// dinp[n, c] (+)= sum_v dout[n, v] W[v, c]: a warp per row, lanes over c.
__global__ void __launch_bounds__(kRowWarps * 32) small_oc_dinp(float* __restrict__ dinp, const float* __restrict__ dout,
                                                               const float* __restrict__ W, int N, int IC, int OC,
                                                               bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRowWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  float d[kSmallOC];
#pragma unroll
  for (int v = 0; v < kSmallOC; ++v) d[v] = v < OC ? dout[size_t(row) * OC + v] : 0.f;
  float* o = dinp + size_t(row) * IC;
  for (int c = lane; c < IC; c += 32) {
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kSmallOC; ++v)
      if (v < OC) s = fmaf(d[v], W[size_t(v) * IC + c], s);
    o[c] = accumulate ? o[c] + s : s;
  }
}

}  // namespace

bool narrow_weight_grad(float* out, const float* dy, const float* x, int N, int nw, int I, int O, int ldx, int ldy) {
  if (nw > kMaxPer * kRedThreads) return false;
  const int chunks = std::min(kMaxChunks, std::max(1, N / 64));
  const int R = (N + chunks - 1) / chunks;
  const int used = (N + R - 1) / R;
  if (size_t(used) * nw * sizeof(float) > (size_t(1) << 20)) return false;  // the scratch's capacity
  float* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(used) * nw * sizeof(float)));
  hw_partial_kernel<<<unsigned(used), kRedThreads, 0, ::lrnn::cuda::stream()>>>(part, dy, x, N, R, nw, I, O, ldx, ldy);
  LRNN_CUDA_LAUNCH_CHECK();
  hw_sum_partials<<<unsigned((nw + kRedThreads - 1) / kRedThreads), kRedThreads, 0, ::lrnn::cuda::stream()>>>(out, part, used,
                                                                                                    nw);
  LRNN_CUDA_LAUNCH_CHECK();
  return true;
}


void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  // Row-major C[M,N] is column-major C^T (N x M, leading dimension ldc), and
  // C^T = alpha op(B)^T op(A)^T + beta C^T, where the column-major view of row-major B is B^T:
  // op(B)^T is that view as is when B is not transposed, and its transpose otherwise.
  sgemm(transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, B, ldb, A, lda, beta, C, ldc,
        alpha);
}

void linear_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (OC <= kSmallOC) {
    small_oc_forward<<<unsigned((N + kRowWarps - 1) / kRowWarps), kRowWarps * 32, 0, lrnn::cuda::stream()>>>(
        out, inp, W, bias, N, IC, OC);
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
  if (bias) {
    fill_bias<<<lrnn::cuda::blocks_for(size_t(N) * OC, 256), 256, 0, lrnn::cuda::stream()>>>(out, bias, N, OC);
    LRNN_CUDA_LAUNCH_CHECK();
  }
  sgemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, W, IC, inp, IC, bias ? 1.f : 0.f, out, OC);
}

void linear_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate) {
  // dinp[N,IC] (+)= dout[N,OC] W[OC,IC]: column-major (IC x N) (+)= W(IC x OC) * dout(OC x N);
  // beta 0 (accumulate = false): cuBLAS does not read dinp.
  if (N <= 0 || OC <= 0 || IC <= 0) return;
  const bool small = OC <= kSmallOC;
  if (dinp && small) {
    small_oc_dinp<<<unsigned((N + kRowWarps - 1) / kRowWarps), kRowWarps * 32, 0, lrnn::cuda::stream()>>>(
        dinp, dout, W, N, IC, OC, accumulate);
    LRNN_CUDA_LAUNCH_CHECK();
  } else if (dinp) {
    sgemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, W, IC, dout, OC, accumulate ? 1.f : 0.f, dinp, IC);
  }
  // dW[OC,IC] += dout^T inp: column-major (IC x OC) += inp(IC x N) * dout^T(N x OC); few
  // outputs: summed over row chunks in two passes (one block of OC x IC weights, H = 1).
  if (dW && !(small && narrow_weight_grad(dW, dout, inp, N, OC * IC, IC, OC, IC, OC)))
    sgemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, 1.f, dW, IC);
  if (dbias) {
    bias_grad<<<dim3((OC + 31) / 32), dim3(32, 8), 0, lrnn::cuda::stream()>>>(dbias, dout, N, OC);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace lrnn::ops::cuda
