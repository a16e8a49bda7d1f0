// L2 normalisation per head: y = x / sqrt(sum(x^2) + eps)   (fla l2norm, eps 1e-6).
//   N tokens of `heads` rows of D; x (and dx) has ldx elements per token, y (and dy) ldy
//   (0: heads * D); rstd [N * heads] saved.
// Backward: dx += r (dy - y (y . dy)) when `accumulate` is true (the default); with false dx is
// overwritten (dx = r (dy - y (y . dy)); its previous content, even NaN, is never read). Only the
// heads * D elements of each token row of dx are written (the rest of a strided row is left alone).
#pragma once

namespace lrnn::ops {
template <class T>
void l2norm_forward(T* y, T* rstd, const T* x, int N, int D, double eps, int heads = 1, int ldx = 0, int ldy = 0);
template <class T>
void l2norm_backward(T* dx, const T* dy, const T* y, const T* rstd, int N, int D, int heads = 1, int ldx = 0,
                     int ldy = 0, bool accumulate = true);
}  // namespace lrnn::ops
