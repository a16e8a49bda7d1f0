// CUDA linear layer through cuBLAS (TF32 tensor cores or fp32, cuda::set_gemm_precision): the
// contract of linear.h — out[N,OC] = inp[N,IC] W[OC,IC]^T + bias; backward accumulates into
// dinp, dW, dbias (each may be null); accumulate = false overwrites dinp (cuBLAS beta 0, the old
// content is not read) while dW and dbias still accumulate.
#pragma once
#include "core/dtype.h"
namespace lrnn::ops::cuda {
// The contract of ops::gemm (linear.h): row-major C[M,N] = alpha op(A) op(B) + beta C with
// leading dimensions lda, ldb, ldc (elements between rows); beta = 0 does not read C.
void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
// `batch` such products at once, the b-th reading A + b sA, B + b sB and writing C + b sC.
void gemm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda, long long sA,
                  const float* B, int ldb, long long sB, float beta, float* C, int ldc, long long sC, int batch);
void linear_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC);
void linear_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate = true);
// out = inp W^T + res (no bias; out and res both [N, OC] fp32, out may be res): the residual add
// of a pre-norm block as the GEMM's epilogue (cuBLASLt D = A B + C), so the sum costs one read of
// res instead of an extra kernel. fp32 or bf16 inputs (as the overloads above).
void linear_forward_residual(float* out, const float* inp, const float* W, const float* res, int N, int IC, int OC);
void linear_forward_residual(float* out, const bf16* inp, const bf16* W, const float* res, int N, int IC, int OC);
// Mixed precision: bf16 inputs and weights, fp32 accumulation, output in bf16 or fp32; no bias.
// Backward: dinp (bf16 or fp32) as above, dW in fp32 (accumulated); either may be null.
void linear_forward(bf16* out, const bf16* inp, const bf16* W, int N, int IC, int OC);
void linear_forward(float* out, const bf16* inp, const bf16* W, int N, int IC, int OC);
void linear_backward(bf16* dinp, float* dW, const bf16* dout, const bf16* inp, const bf16* W, int N, int IC, int OC,
                     bool accumulate = true);
void linear_backward(float* dinp, float* dW, const bf16* dout, const bf16* inp, const bf16* W, int N, int IC, int OC,
                     bool accumulate = true);
}  // namespace lrnn::ops::cuda
