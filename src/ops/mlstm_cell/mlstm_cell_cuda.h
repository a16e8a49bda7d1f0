// CUDA mLSTM cell: the same contract as mlstm_cell.h (device pointers, fp32, cuda::stream()).
// Two kernel families, chosen by the dims (so a forward and its backward always agree):
// - tile kernels (T up to ~64 at D = 64: the T x T matrices and the rows of q, k, v, dh fit in
//   shared memory): the parallel form, a block per (batch row, head); they neither write nor
//   need `ckpt` (the backward rebuilds everything from its inputs);
// - recurrent kernels (longer sequences): a block per (batch row, head) walks the sequence with
//   the D x D state in shared memory and fills the chunk-start checkpoints `ckpt`
//   (mlstm_ckpt_size elements) for the backward; without ckpt the backward replays every prefix
//   from t = 0 (O(T^2), tests only).
// Backward accumulates into dq, dk, dv, digate, dfgate.
#pragma once
#include "ops/mlstm_cell/mlstm_cell.h"
namespace lrnn::ops::cuda {
// Auto: the tile kernels where they fit; Recurrent: always the recurrent kernels (tests). Set it
// between a forward and its backward and the backward may look for checkpoints never written.
enum class MlstmKernel { Auto, Recurrent };
void set_mlstm_kernel(MlstmKernel k);
void mlstm_forward(float* h, const float* q, const float* k, const float* v, const float* igate, const float* fgate,
                   const MLSTMDims& d, float* ckpt = nullptr);
void mlstm_backward(float* dq, float* dk, float* dv, float* digate, float* dfgate, const float* dh, const float* q,
                    const float* k, const float* v, const float* igate, const float* fgate, const MLSTMDims& d,
                    const float* ckpt = nullptr);
}  // namespace lrnn::ops::cuda
