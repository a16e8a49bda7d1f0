// cuBLAS linear layer. Row-major [N,IC] x [OC,IC]^T is, seen column-major, out^T = W^T' x inp^T,
// i.e. one column-major GEMM with W transposed: (OC x N) = op_T(W: IC x OC) * (inp: IC x N).
#include "ops/linear/linear_cuda.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include "core/check.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {

namespace {

cublasHandle_t handle() { return static_cast<cublasHandle_t>(lrnn::cuda::cublas()); }

void check(cublasStatus_t s, const char* what) {
  LRNN_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS {} failed: status {}", what, int(s));
}

// Column-major C[m,n] = alpha op(A) op(B) + beta C. fp32 storage: the context's precision (TF32
// tensor cores unless FP32); bf16 A and B (C bf16 or fp32): fp32 accumulation.
void gemm_typed(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, const void* B,
                cudaDataType_t ab, int lda, int ldb, float beta, void* C, cudaDataType_t ct, int ldc,
                float alpha = 1.0f) {
  const cublasComputeType_t compute =
      ab == CUDA_R_16BF ? CUBLAS_COMPUTE_32F
      : lrnn::cuda::gemm_precision() == lrnn::cuda::GemmPrecision::FP32 ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                                        : CUBLAS_COMPUTE_32F_FAST_TF32;
  check(cublasGemmEx(handle(), ta, tb, m, n, k, &alpha, A, ab, lda, B, ab, ldb, &beta, C, ct, ldc, compute,
                     CUBLAS_GEMM_DEFAULT),
        "GemmEx");
}
void sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc, float alpha = 1.0f) {
  gemm_typed(ta, tb, m, n, k, A, B, CUDA_R_32F, lda, ldb, beta, C, CUDA_R_32F, ldc, alpha);
}

// The bf16 linear layer: out (type ot) = inp W^T; dinp (type dt) (+)= dout W, dW (fp32) += dout^T inp.
void forward_bf16(void* out, cudaDataType_t ot, const bf16* inp, const bf16* W, int N, int IC, int OC) {
  gemm_typed(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, W, inp, CUDA_R_16BF, IC, IC, 0.f, out, ot, OC);
}
void backward_bf16(void* dinp, cudaDataType_t dt, float* dW, const bf16* dout, const bf16* inp, const bf16* W, int N,
                   int IC, int OC, bool accumulate) {
  if (dinp)
    gemm_typed(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, W, dout, CUDA_R_16BF, IC, OC, accumulate ? 1.f : 0.f, dinp, dt,
               IC);
  if (dW) gemm_typed(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, dout, CUDA_R_16BF, IC, OC, 1.f, dW, CUDA_R_32F, IC);
}

// ---- out = inp W^T + res through cuBLASLt (D = A B + C with D != C) -------------------------
// The residual add of a pre-norm block done by the GEMM's epilogue: the GEMM reads res once
// instead of a separate kernel reading out and res and writing out again.

int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : a % 4 == 0 ? 4 : 2;
}

// One cached plan per shape, types and pointer alignments: the operation and layout
// descriptors and the heuristic's first algorithm (algo_ok false: none found, use the fallback).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool algo_ok = false;
};


const LtPlan& lt_plan(int N, int IC, int OC, cudaDataType_t ab, cublasComputeType_t ct, int align) {
  using Key = std::tuple<int, int, int, int, int, int>;
  static std::mutex mu;
  static std::map<Key, LtPlan> cache;
  const Key key{N, IC, OC, int(ab), int(ct), align};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  LtPlan p;
  // Column-major: D (OC x N) = op_T(A = W: IC x OC) * (B = inp: IC x N) + C (OC x N).
  check(cublasLtMatmulDescCreate(&p.op, ct, CUDA_R_32F), "LtMatmulDescCreate");
  const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA), "LtDescSetAttribute");
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB), "LtDescSetAttribute");
  check(cublasLtMatrixLayoutCreate(&p.a, ab, IC, OC, IC), "LtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&p.b, ab, IC, N, IC), "LtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, OC, N, OC), "LtMatrixLayoutCreate");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "LtMatmulPreferenceCreate");
  const size_t ws = lrnn::cuda::kLtWorkspace;
  const uint32_t al = uint32_t(align);
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "LtPreferenceSetAttribute");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al), "LtPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lrnn::cuda::cublaslt()), p.op, p.a, p.b, p.c,
                                     p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    p.algo = res.algo;
    p.algo_ok = true;
  }
  return cache.emplace(key, p).first->second;
}

void residual_gemm(float* out, const void* inp, const void* W, cudaDataType_t ab, const float* res, int N, int IC,
                   int OC) {
  if (N <= 0 || OC <= 0) return;
  const cublasComputeType_t ct = ab == CUDA_R_16BF ? CUBLAS_COMPUTE_32F
                                 : lrnn::cuda::gemm_precision() == lrnn::cuda::GemmPrecision::FP32
                                     ? CUBLAS_COMPUTE_32F
                                     : CUBLAS_COMPUTE_32F_FAST_TF32;
  const int align = std::min({alignment(out), alignment(inp), alignment(W), alignment(res)});
  const LtPlan& p = lt_plan(N, IC, OC, ab, ct, align);
  if (p.algo_ok && out != res) {
    const float one = 1.f;
    check(cublasLtMatmul(static_cast<cublasLtHandle_t>(lrnn::cuda::cublaslt()), p.op, &one, W, p.a, inp, p.b, &one,
                         res, p.c, out, p.c, &p.algo, lrnn::cuda::lt_workspace(), lrnn::cuda::kLtWorkspace,
                         lrnn::cuda::stream()),
          "LtMatmul");
    return;
  }
  // No cuBLASLt algorithm (or out aliases res): copy the residual, then accumulate onto it.
  if (out != res)
    LRNN_CUDA_CHECK(cudaMemcpyAsync(out, res, size_t(N) * OC * sizeof(float), cudaMemcpyDeviceToDevice,
                                    lrnn::cuda::stream()));
  gemm_typed(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, W, inp, ab, IC, IC, 1.f, out, CUDA_R_32F, OC);
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

void gemm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda, long long sA,
                  const float* B, int ldb, long long sB, float beta, float* C, int ldc, long long sC, int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  const cublasComputeType_t compute = lrnn::cuda::gemm_precision() == lrnn::cuda::GemmPrecision::FP32
                                          ? CUBLAS_COMPUTE_32F_PEDANTIC
                                          : CUBLAS_COMPUTE_32F_FAST_TF32;
  // As gemm(): the column-major transposes, B's view first.
  check(cublasGemmStridedBatchedEx(handle(), transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                   M, K, &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F, lda, sA, &beta, C, CUDA_R_32F,
                                   ldc, sC, batch, compute, CUBLAS_GEMM_DEFAULT),
        "GemmStridedBatchedEx");
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

void linear_forward(bf16* out, const bf16* inp, const bf16* W, int N, int IC, int OC) {
  forward_bf16(out, CUDA_R_16BF, inp, W, N, IC, OC);
}
void linear_forward(float* out, const bf16* inp, const bf16* W, int N, int IC, int OC) {
  forward_bf16(out, CUDA_R_32F, inp, W, N, IC, OC);
}
void linear_backward(bf16* dinp, float* dW, const bf16* dout, const bf16* inp, const bf16* W, int N, int IC, int OC,
                     bool accumulate) {
  backward_bf16(dinp, CUDA_R_16BF, dW, dout, inp, W, N, IC, OC, accumulate);
}
void linear_backward(float* dinp, float* dW, const bf16* dout, const bf16* inp, const bf16* W, int N, int IC, int OC,
                     bool accumulate) {
  backward_bf16(dinp, CUDA_R_32F, dW, dout, inp, W, N, IC, OC, accumulate);
}

void linear_forward_residual(float* out, const float* inp, const float* W, const float* res, int N, int IC, int OC) {
  residual_gemm(out, inp, W, CUDA_R_32F, res, N, IC, OC);
}
void linear_forward_residual(float* out, const bf16* inp, const bf16* W, const float* res, int N, int IC, int OC) {
  residual_gemm(out, inp, W, CUDA_R_16BF, res, N, IC, OC);
}

}  // namespace lrnn::ops::cuda
