// CUDA causal depthwise short conv + SiLU: the same contract as short_conv.h (device pointers,
// fp32, cuda::stream()). Backward accumulates into dw, dbias, and into dx unless accumulate is
// false (dx is then overwritten, its old content never read). dw / dbias sums are deterministic
// for K <= 4 (per-block partials in the device scratch, added in a fixed order).
#pragma once
namespace lrnn::ops::cuda {
void short_conv_forward(float* out, const float* x, const float* w, int B, int T_, int C, int K, int ldx = 0,
                        int ldo = 0, const float* bias = nullptr);
void short_conv_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int B, int T_,
                         int C, int K, int ldx = 0, int ldo = 0, const float* bias = nullptr,
                         float* dbias = nullptr, bool accumulate = true);
}  // namespace lrnn::ops::cuda
