#include "ops/embedding/embedding.h"
#include <cstring>
#include "core/check.h"

namespace lrnn::ops {

template <class T>
void embedding_forward(T* out, const int32_t* tok, const T* W, int N, int C, int V) {
  for (int n = 0; n < N; ++n) {
    LRNN_CHECK(tok[n] >= 0 && tok[n] < V, "token {} at position {} outside vocabulary [0, {})", tok[n], n, V);
    std::memcpy(out + size_t(n) * C, W + size_t(tok[n]) * C, sizeof(T) * C);
  }
}

template <class T>
void embedding_backward(T* dW, const T* dout, const int32_t* tok, int N, int C, int V) {
  // Serial on purpose: rows collide on repeated tokens, and a fixed order keeps runs bit-reproducible.
  for (int n = 0; n < N; ++n) {
    LRNN_CHECK(tok[n] >= 0 && tok[n] < V, "token {} at position {} outside vocabulary [0, {})", tok[n], n, V);
    T* row = dW + size_t(tok[n]) * C;
    const T* d = dout + size_t(n) * C;
    for (int c = 0; c < C; ++c) row[c] += d[c];
  }
}

#define INST(T)                                                                        \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, int);    \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int, int, int);
INST(float)
INST(double)
}  // namespace lrnn::ops
