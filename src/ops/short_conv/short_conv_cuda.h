// CUDA causal depthwise short conv + SiLU: the same contract as short_conv.h (device pointers,
// fp32, cuda::stream()). Backward accumulates into dw, dbias, and into dx unless accumulate is
// false (dx is then overwritten, its old content never read). dw / dbias sums are deterministic
// for K <= 4 (per-block partials in the device scratch, added in a fixed order).
#pragma once
namespace lrnn::ops::cuda {
void short_conv_forward(float* out, const float* x, const float* w, int B, int T_, int C, int K, int ldx = 0,
                        int ldo = 0, const float* bias = nullptr, const float* prev = nullptr);
// short_conv_forward with the first Cn channels of each token L2-normalised per head of D, as
// l2norm_forward(y, rstd, out, B T, D, eps, Cn / D, ldo, ldn) would do after it (the delta rule's
// q|k): those go to y ([B T, ldn], 0 = Cn) and rstd ([B T, Cn / D]) only, the other channels to
// out (its first Cn channels are not written). One pass when the rows allow float4 (and D is 16,
// 32 or 64), else the two ops in turn. No bias.
void short_conv_l2norm_forward(float* out, float* y, float* rstd, const float* x, const float* w, int B, int T_,
                               int C, int K, int ldx, int ldo, int Cn, int D, double eps, int ldn = 0,
                               const float* prev = nullptr);
void short_conv_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int B, int T_,
                         int C, int K, int ldx = 0, int ldo = 0, const float* bias = nullptr,
                         float* dbias = nullptr, bool accumulate = true);
void short_conv_advance_tail(float* tail, const float* x, int B, int T_, int C, int K, int ldx = 0);
}  // namespace lrnn::ops::cuda
