// CUDA LSTM layer: the contract of lstm_cell.h (device pointers, time-major layouts, gate order
// i, f, g, o, activated gates kept in `gates`), launched on cuda::stream(). The input GEMM over
// all T*B rows and the recurrent [B,H]x[H,4H] GEMM of every step go through cuBLAS (ops::cuda::gemm,
// so they follow cuda::set_gemm_precision); a fused kernel per step applies the gates. Backward
// accumulates into dx (may be null), dW_ih, dW_hh, db_ih, db_hh, and needs `work`
// (lstm_backward_work_size(d) floats, overwritten).
#pragma once
#include <cstdint>
#include "ops/lstm_cell/lstm_cell.h"

namespace lrnn::ops::cuda {

void lstm_forward(float* h, float* c, float* gates, const float* x, const float* W_ih, const float* W_hh,
                  const float* b_ih, const float* b_hh, const LstmDims& d);
void lstm_backward(float* dx, float* dW_ih, float* dW_hh, float* db_ih, float* db_hh, const float* dh,
                   const float* x, const float* W_ih, const float* W_hh, const float* h, const float* c,
                   const float* gates, const LstmDims& d, float* work);
void lstm_time_major_ids(int32_t* out, const int32_t* in, int B, int T_);
void lstm_batch_major(float* out, const float* in, int B, int T_, int C);

}  // namespace lrnn::ops::cuda
