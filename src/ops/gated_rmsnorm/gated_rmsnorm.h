// RMSNorm with a SiLU output gate — fla's FusedRMSNormGated (activation 'swish', the norm
// before the gate), the output norm of Gated DeltaNet / Gated DeltaProduct:
//   y = x / sqrt(mean(x^2) + eps) * w * silu(g)
// over rows of D: x, y [R,D] packed with R = N * heads (N tokens of `heads` rows each); the gate
// row of token n, head h starts at g + n*ldg + h*D (ldg 0: heads*D), so the gate can stay inside
// a fused projection; w [D]; rstd [R] saved for the backward.
// Backward accumulates into dx [R,D], dg (the layout of g) and dw [D] (dw may be null; summed in a
// fixed order: deterministic for a fixed thread count). With z = x*rstd*w and s = silu(g):
//   dg += dy * z * silu'(g) ;  dw += sum dy * s * x * rstd ;
//   dx += rstd * (e - x * rstd^2 * mean(e * x)),  e = dy * s * w
// With accumulate = false the input gradients dx and dg are overwritten instead: their previous
// content is never read (NaN included), and only the gate's [N, heads*D] elements of dg are
// written (the other columns of an ldg-strided row are left alone). The CPU reference zero-fills
// each row just before its unchanged accumulating loops: bit for bit the zero-fill + accumulate
// result. dw, the parameter gradient, always accumulates.
#pragma once

namespace lrnn::ops {
template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* g, const T* w, int N, int heads, int D,
                           double eps, int ldg = 0);
template <class T>
void gated_rmsnorm_backward(T* dx, T* dg, T* dw, const T* dy, const T* x, const T* g, const T* w,
                            const T* rstd, int N, int heads, int D, int ldg = 0, bool accumulate = true);
}  // namespace lrnn::ops
