// CUDA linear layer through cuBLAS (TF32 tensor cores or fp32, cuda::set_gemm_precision): the
// contract of linear.h — out[N,OC] = inp[N,IC] W[OC,IC]^T + bias; backward accumulates into
// dinp, dW, dbias (each may be null); accumulate = false overwrites dinp (cuBLAS beta 0, the old
// content is not read) while dW and dbias still accumulate.
#pragma once
namespace lrnn::ops::cuda {
// The contract of ops::gemm (linear.h): row-major C[M,N] = alpha op(A) op(B) + beta C with
// leading dimensions lda, ldb, ldc (elements between rows); beta = 0 does not read C.
void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void linear_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC);
void linear_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate = true);
}  // namespace lrnn::ops::cuda
