// cuBLAS linear layer. Row-major [N,IC] x [OC,IC]^T is, seen column-major, out^T = W^T' x inp^T,
// i.e. one column-major GEMM with W transposed: (OC x N) = op_T(W: IC x OC) * (inp: IC x N).
#include "ops/linear/linear_cuda.h"
#include <cublas_v2.h>
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

}  // namespace

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
  if (dinp) sgemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, W, IC, dout, OC, accumulate ? 1.f : 0.f, dinp, IC);
  // dW[OC,IC] += dout^T inp: column-major (IC x OC) += inp(IC x N) * dout^T(N x OC)
  if (dW) sgemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, 1.f, dW, IC);
  if (dbias) {
    bias_grad<<<dim3((OC + 31) / 32), dim3(32, 8), 0, lrnn::cuda::stream()>>>(dbias, dout, N, OC);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace lrnn::ops::cuda
