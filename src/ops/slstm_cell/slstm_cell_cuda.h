// CUDA sLSTM cell: the same contract as slstm_cell.h (device pointers, fp32, cuda::stream(); the
// same `saved` layout, slstm_saved_size elements). Head dims 8, 16, 32: a group of D lanes per
// (batch row, head), no barriers, dR and dbias summed per block and then in a fixed order
// (deterministic); other head dims: one block per (batch row, head) walks the sequence (dR, dbias
// by atomics). Backward accumulates into dwx, dR, dbias (dR, dbias may be null).
#pragma once
#include "ops/slstm_cell/slstm_cell.h"
namespace lrnn::ops::cuda {
// Auto: the lane kernels for head dims 8, 16, 32; Block: always the block kernels (tests).
enum class SlstmKernel { Auto, Block };
void set_slstm_kernel(SlstmKernel k);
void slstm_forward(float* y, const float* wx, const float* R, const float* bias, const SLSTMDims& d,
                   float* saved = nullptr);
void slstm_backward(float* dwx, float* dR, float* dbias, const float* dy, const float* wx, const float* R,
                    const float* bias, const float* y, const SLSTMDims& d, const float* saved);
}  // namespace lrnn::ops::cuda
