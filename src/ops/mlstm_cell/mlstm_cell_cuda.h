// CUDA mLSTM cell: the same contract as mlstm_cell.h (device pointers, fp32, cuda::stream(); the
// same chunk-start checkpoints `ckpt`, mlstm_ckpt_size elements). One block per (batch row, head)
// walks the sequence with the D x D state in shared memory; backward accumulates into dq, dk, dv,
// digate, dfgate. Without ckpt the backward replays every prefix from t = 0 (O(T^2), tests only).
#pragma once
#include "ops/mlstm_cell/mlstm_cell.h"
namespace lrnn::ops::cuda {
void mlstm_forward(float* h, const float* q, const float* k, const float* v, const float* igate, const float* fgate,
                   const MLSTMDims& d, float* ckpt = nullptr);
void mlstm_backward(float* dq, float* dk, float* dv, float* digate, float* dfgate, const float* dh, const float* q,
                    const float* k, const float* v, const float* igate, const float* fgate, const MLSTMDims& d,
                    const float* ckpt = nullptr);
}  // namespace lrnn::ops::cuda
