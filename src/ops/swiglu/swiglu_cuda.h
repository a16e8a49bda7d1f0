// CUDA SwiGLU: the same contract as swiglu.h (device pointers, fp32). Backward accumulates into
// dgate and dup, or overwrites them (accumulate = false: not read).
#pragma once
#include "core/dtype.h"
namespace lrnn::ops::cuda {
void swiglu_forward(float* out, const float* gate, const float* up, int N, int I, int ld = 0);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int N, int I,
                     int ld = 0, bool accumulate = true);
// The same over bf16 storage (mixed precision: fp32 arithmetic, results rounded to bf16).
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int N, int I, int ld = 0);
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int N, int I,
                     int ld = 0, bool accumulate = true);
}  // namespace lrnn::ops::cuda
