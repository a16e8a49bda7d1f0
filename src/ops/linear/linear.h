// Dense layer on OpenBLAS (row-major, PyTorch weight layout [out, in]).
//   out[N,OC] = inp[N,IC] @ W[OC,IC]^T (+ bias[OC])
// Backward accumulates: dinp += dout @ W ; dW += dout^T @ inp ; dbias += sum_n dout.
// Any of dinp / dW / dbias may be null (not needed). With accumulate = false the input gradient
// is overwritten instead: dinp = dout @ W (GEMM beta 0, its previous content is never read, NaN
// included); dW and dbias, the parameter gradients, always accumulate.
#pragma once

namespace lrnn::ops {

// Threads OpenBLAS may use for one call; returns the previous setting. Data-parallel workers set
// it to 1: OpenBLAS's OpenMP build otherwise serialises concurrent calls from several threads.
int set_blas_threads(int n);

// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op = transpose when the flag is set.
template <class T>
void gemm(bool transA, bool transB, int M, int N, int K, T alpha, const T* A, int lda,
          const T* B, int ldb, T beta, T* C, int ldc);

// Row-major B[M,N] <- op(L)^-1 B for a unit lower-triangular L[M,M] (only its strict lower part is
// read), op = transpose when `trans`: a triangular solve, never an inverse.
template <class T>
void trsm_unit_lower(bool trans, int M, int N, const T* L, int ldl, T* B, int ldb);

template <class T>
void linear_forward(T* out, const T* inp, const T* W, const T* bias, int N, int IC, int OC);
template <class T>
void linear_backward(T* dinp, T* dW, T* dbias, const T* dout, const T* inp, const T* W,
                     int N, int IC, int OC, bool accumulate = true);
// out = inp @ W^T + res (no bias; out must not alias res): a block's residual add, which the CUDA
// version does in the GEMM's epilogue. Here: linear_forward, then out[i] += res[i].
template <class T>
void linear_forward_residual(T* out, const T* inp, const T* W, const T* res, int N, int IC, int OC);
}  // namespace lrnn::ops
