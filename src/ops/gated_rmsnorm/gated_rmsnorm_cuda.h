// CUDA gated RMSNorm (fla FusedRMSNormGated): the same contract as gated_rmsnorm.h (accumulate =
// false overwrites dx and dg without reading them; dw always accumulates).
#pragma once
namespace lrnn::ops::cuda {
void gated_rmsnorm_forward(float* y, float* rstd, const float* x, const float* g, const float* w, int N, int heads,
                           int D, double eps, int ldg = 0);
void gated_rmsnorm_backward(float* dx, float* dg, float* dw, const float* dy, const float* x, const float* g,
                            const float* w, const float* rstd, int N, int heads, int D, int ldg = 0,
                            bool accumulate = true);
}  // namespace lrnn::ops::cuda
