// CUDA GELU gate: the same contract as geglu.h (device pointers, fp32, cuda::stream(); Phi from
// erfcf). Backward accumulates into dgate and dup, or overwrites them (accumulate = false: not
// read).
#pragma once
namespace lrnn::ops::cuda {
void geglu_forward(float* out, const float* gate, const float* up, int N, int I, int ld = 0);
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int N, int I,
                    int ld = 0, bool accumulate = true);
}  // namespace lrnn::ops::cuda
