// CUDA sLSTM cell: the same contract as slstm_cell.h (device pointers, fp32, cuda::stream(); the
// same `saved` layout, slstm_saved_size elements). One block per (batch row, head) walks the
// sequence; backward accumulates into dwx, dR, dbias (dR, dbias may be null).
#pragma once
#include "ops/slstm_cell/slstm_cell.h"
namespace lrnn::ops::cuda {
void slstm_forward(float* y, const float* wx, const float* R, const float* bias, const SLSTMDims& d,
                   float* saved = nullptr);
void slstm_backward(float* dwx, float* dR, float* dbias, const float* dy, const float* wx, const float* R,
                    const float* bias, const float* y, const SLSTMDims& d, const float* saved);
}  // namespace lrnn::ops::cuda
