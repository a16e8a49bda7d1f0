// CUDA log-space forget gate: the same contract as forget_gate.h (device pointers, fp32;
// accumulate = false overwrites da without reading it, dA_log and ddt_bias always accumulate).
#pragma once
namespace lrnn::ops::cuda {
void forget_gate_forward(float* g, const float* a, const float* A_log, const float* dt_bias, int N, int H,
                         int lda = 0);
void forget_gate_backward(float* da, float* dA_log, float* ddt_bias, const float* dg, const float* a,
                          const float* A_log, const float* dt_bias, int N, int H, int lda = 0,
                          bool accumulate = true);
}  // namespace lrnn::ops::cuda
