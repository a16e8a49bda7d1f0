// CUDA RMSNorm: the same contract as rmsnorm.h (device pointers, fp32, cuda::stream()).
// Backward accumulates into dw (deterministically for C <= 1024 with float4 rows, C <= 256
// otherwise), and into dx unless accumulate is false (dx is then overwritten, its old content
// never read).
#pragma once
#include "core/dtype.h"
namespace lrnn::ops::cuda {
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, double eps);
// The same with the normalised rows stored in bf16 (rounded to nearest even; rstd in fp32): the
// input of a bf16 GEMM.
void rmsnorm_forward(bf16* out, float* rstd, const float* x, const float* w, int N, int C, double eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int N, int C, bool accumulate = true);
}  // namespace lrnn::ops::cuda
