// Mamba-2 style forget gate in log space (fla Gated DeltaNet / Gated DeltaProduct, `a_proj`,
// `A_log`, `dt_bias`), one value per token and head:
//   g[n,h] = -exp(A_log[h]) * softplus(a[n,h] + dt_bias[h])      (g <= 0; the decay is exp(g))
// a (and da) has lda elements from one token to the next (0: H), so the logits can stay inside a
// fused projection; g (and dg) [N,H] packed; A_log, dt_bias [H].
// softplus(x) = max(x, 0) + log1p(exp(-|x|)): smooth and finite everywhere (PyTorch's
// F.softplus returns x itself above x = 20, which differs from it by < 2.1e-9).
// Backward accumulates, with s = sigmoid(a + dt_bias):
//   da += -exp(A_log) * s * dg ;  ddt_bias += sum_n (same) ;  dA_log += sum_n g * dg
// (dA_log and ddt_bias may be null; their sums are reduced in a fixed order: deterministic for a
// fixed thread count).
// With accumulate = false da, the input gradient, is overwritten instead: its previous content is
// never read (NaN included), and only its [N, H] elements are written (the other columns of an
// lda-strided row are left alone). The CPU reference zero-fills each token's da just before its
// unchanged accumulating loop: bit for bit the zero-fill + accumulate result. dA_log and
// ddt_bias, the parameter gradients, always accumulate.
#pragma once

namespace lrnn::ops {
template <class T>
void forget_gate_forward(T* g, const T* a, const T* A_log, const T* dt_bias, int N, int H, int lda = 0);
template <class T>
void forget_gate_backward(T* da, T* dA_log, T* ddt_bias, const T* dg, const T* a, const T* A_log,
                          const T* dt_bias, int N, int H, int lda = 0, bool accumulate = true);
}  // namespace lrnn::ops
