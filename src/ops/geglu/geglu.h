// GELU-gated unit of the xlstm package's GatedFeedForward (act_fn "gelu", the exact erf form):
//   out = gelu(gate) * up,   gelu(x) = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt 2)) / 2
// over N rows of I columns; gate and up rows are ld elements apart (0: I), e.g. the two halves of
// one fused [N, 2I] projection with ld = 2I; out [N, I] is packed.
// Backward accumulates: dgate += dout * up * gelu'(gate), gelu' = Phi(x) + x phi(x);
//                       dup += dout * gelu(gate)   (dgate, dup share the stride of gate, up).
// With accumulate = false it overwrites dgate and dup instead: their previous content is never
// read (NaN included), and only their [N, I] elements are written (the rest of an ld-strided row
// is left alone). The CPU reference zero-fills each row just before its unchanged accumulating
// loop: bit for bit the zero-fill + accumulate result.
// float uses a vectorisable Phi (Abramowitz-Stegun 7.1.26, absolute error < 1e-7); double std::erfc.
#pragma once

namespace lrnn::ops {
template <class T>
void geglu_forward(T* out, const T* gate, const T* up, int N, int I, int ld = 0);
template <class T>
void geglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N, int I, int ld = 0,
                    bool accumulate = true);
// The standard normal CDF as the op computes it (exposed for tests).
template <class T>
T normal_cdf(T x);
}  // namespace lrnn::ops
