// Token embedding.  out[N,C] = W[tok[n], :]
// Backward accumulates: dW[tok[n], :] += dout[n, :]. Tokens must lie in [0, V).
#pragma once
#include <cstdint>

namespace lrnn::ops {
template <class T>
void embedding_forward(T* out, const int32_t* tok, const T* W, int N, int C, int V);
template <class T>
void embedding_backward(T* dW, const T* dout, const int32_t* tok, int N, int C, int V);
}  // namespace lrnn::ops
