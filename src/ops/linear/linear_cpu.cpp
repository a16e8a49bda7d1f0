#include "ops/linear/linear.h"
#include <cblas.h>
#include "core/check.h"

namespace lrnn::ops {

int set_blas_threads(int n) {
  int prev = openblas_get_num_threads();
  if (n != prev) openblas_set_num_threads(n);
  return prev;
}

template <>
void gemm<float>(bool tA, bool tB, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
template <>
void gemm<double>(bool tA, bool tB, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void trsm_unit_lower<float>(bool trans, int M, int N, const float* L, int ldl, float* B, int ldb) {
  cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, trans ? CblasTrans : CblasNoTrans, CblasUnit, M, N, 1.f, L, ldl,
              B, ldb);
}
template <>
void trsm_unit_lower<double>(bool trans, int M, int N, const double* L, int ldl, double* B, int ldb) {
  cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, trans ? CblasTrans : CblasNoTrans, CblasUnit, M, N, 1.0, L, ldl,
              B, ldb);
}

template <class T>
void linear_forward(T* out, const T* inp, const T* W, const T* bias, int N, int IC, int OC) {
  if (bias) {
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) out[size_t(n) * OC + o] = bias[o];
  }
  gemm<T>(false, true, N, OC, IC, T(1), inp, IC, W, IC, bias ? T(1) : T(0), out, OC);
}

template <class T>
void linear_backward(T* dinp, T* dW, T* dbias, const T* dout, const T* inp, const T* W,
                     int N, int IC, int OC, bool accumulate) {
  // beta 0: BLAS does not read C (writes alpha op(A) op(B), even over NaN).
  if (dinp) gemm<T>(false, false, N, IC, OC, T(1), dout, OC, W, IC, accumulate ? T(1) : T(0), dinp, IC);
  if (dW) gemm<T>(true, false, OC, IC, N, T(1), dout, OC, inp, IC, T(1), dW, IC);
  if (dbias)
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) dbias[o] += dout[size_t(n) * OC + o];
}

template <class T>
void linear_forward_residual(T* out, const T* inp, const T* W, const T* res, int N, int IC, int OC) {
  LRNN_CHECK(out != res, "linear_forward_residual: out must not alias res");
  linear_forward<T>(out, inp, W, nullptr, N, IC, OC);
  const size_t n = size_t(N) * OC;
  for (size_t i = 0; i < n; ++i) out[i] += res[i];
}

#define INST(T)                                                                              \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);          \
  template void linear_forward_residual<T>(T*, const T*, const T*, const T*, int, int, int); \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
