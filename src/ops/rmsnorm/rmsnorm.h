// RMSNorm over the last dimension (fla/Llama): out = x / sqrt(mean(x^2) + eps) * w.
//   x, out [N,C]; w [C]; rstd [N] saved for the backward.
// Backward accumulates into dw [C] (dw may be null) and, when `accumulate` is true (the default),
// into dx [N,C]; with accumulate = false dx is overwritten (its previous content, even NaN, is
// never read). dw always accumulates.
#pragma once

namespace lrnn::ops {
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps);
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N, int C,
                      bool accumulate = true);
}  // namespace lrnn::ops
