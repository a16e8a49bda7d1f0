// SwiGLU gate of the MLP: out = silu(gate) * up, over N rows of I columns.
//   gate and up rows are ld elements apart (0: I) — e.g. the two halves of one fused
//   [N, 2I] projection with ld = 2I; out [N, I] is packed.
// Backward accumulates: dgate += dout * up * silu'(gate); dup += dout * silu(gate)
// (dgate, dup share the stride of gate, up). With accumulate = false it overwrites them instead:
// their previous content is never read (NaN included), and only their [N, I] elements are
// written (the rest of an ld-strided row is left alone). The CPU reference zero-fills each row
// just before its unchanged accumulating loop: bit for bit the zero-fill + accumulate result.
#pragma once
#include <cstddef>

namespace lrnn::ops {
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int N, int I, int ld = 0);
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N, int I, int ld = 0,
                     bool accumulate = true);
}  // namespace lrnn::ops
