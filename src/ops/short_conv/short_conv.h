// Causal depthwise short convolution followed by SiLU (fla ShortConvolution; Mamba's conv1d
// with its bias):
//   pre[b,t,c] = bias[c] + sum_{j<K} w[c,j] * x[b, t-(K-1)+j, c]   (x = 0 before t = 0)
//   out = silu(pre)
// x, out [B,T,C]; w [C,K] (PyTorch's Conv1d weight [C,1,K]); bias [C] or null (no bias).
// With K = 0 the op is a plain SiLU (of x + bias).
// prev [B,K-1,C] (forward only, may be null): the K-1 inputs before each sequence's first token,
// in place of zeros — the conv's state when a sequence is read piece by piece.
// ldx / ldo: elements between tokens of x (and dx) / out (and dout); 0 means C.
// Backward recomputes `pre` and accumulates into dw and dbias (dw, dbias may be null). dx is
// accumulated into (dx += ...) when `accumulate` is true (the default), and overwritten when it is
// false: its previous content (even NaN) is then never read. Only the first C elements of each
// token row of dx are written; the rest of a strided row (ldx > C) is left alone either way.
#pragma once

namespace lrnn::ops {
template <class T>
void short_conv_forward(T* out, const T* x, const T* w, int B, int T_, int C, int K, int ldx = 0, int ldo = 0,
                        const T* bias = nullptr, const T* prev = nullptr);
template <class T>
void short_conv_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, int B, int T_, int C, int K,
                         int ldx = 0, int ldo = 0, const T* bias = nullptr, T* dbias = nullptr,
                         bool accumulate = true);
// short_conv_forward, then l2norm_forward(y, rstd, out, B T_, D, eps, Cn / D, ldo, ldn) over the
// first Cn channels (heads of D) of each token: the delta rule's q|k, whose un-normalised values
// nothing else reads. The CUDA version does both in one pass and does not write out's first Cn
// channels; here they hold the conv's output.
template <class T>
void short_conv_l2norm_forward(T* out, T* y, T* rstd, const T* x, const T* w, int B, int T_, int C, int K, int ldx,
                               int ldo, int Cn, int D, double eps, int ldn = 0, const T* prev = nullptr);
// After a piece of T_ tokens: tail [B,K-1,C] (the inputs before the piece, `prev` above) becomes
// the inputs before the next piece, the last K-1 rows of tail followed by x [B,T_,C] (token
// stride ldx, 0 = C). Nothing to do for K <= 1.
template <class T>
void short_conv_advance_tail(T* tail, const T* x, int B, int T_, int C, int K, int ldx = 0);
}  // namespace lrnn::ops
