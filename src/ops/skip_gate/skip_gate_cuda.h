// CUDA mLSTM output gate: the same contract as skip_gate.h (device pointers, fp32,
// cuda::stream()). Backward accumulates into dh, dx, dskip, dz.
#pragma once
namespace lrnn::ops::cuda {
void skip_gate_forward(float* out, const float* h, const float* x, const float* skip, const float* z, int N, int I,
                       int ldx = 0, int ldz = 0);
void skip_gate_backward(float* dh, float* dx, float* dskip, float* dz, const float* dout, const float* h,
                        const float* x, const float* skip, const float* z, int N, int I, int ldx = 0, int ldz = 0);
}  // namespace lrnn::ops::cuda
