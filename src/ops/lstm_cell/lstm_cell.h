// One LSTM layer over a whole sequence, `torch.nn.LSTM` semantics (gate order i, f, g, o;
// h_0 = c_0 = 0; both biases):
//   z_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          [4H] = (z_i, z_f, z_g, z_o)
//   i = σ(z_i)  f = σ(z_f)  g = tanh(z_g)  o = σ(z_o)
//   c_t = f c_{t-1} + i g        h_t = o tanh(c_t)
// Layouts are time-major, as torch.nn.LSTM's default (batch_first=False):
//   x [T,B,I], h and c [T,B,H], gates [T,B,4H] (the activated i, f, g, o, kept for the backward).
//   W_ih [4H,I], W_hh [4H,H], b_ih and b_hh [4H].
// The input part of z is one GEMM over all T·B rows; the recurrent part is one [B,H]x[H,4H] GEMM
// per step. Time-major rows make h_{t-1} of every sequence one contiguous block, so the backward
// also gets dW_hh from a single GEMM over all steps.
// Backward (BPTT) accumulates into dx (may be null), dW_ih, dW_hh, db_ih, db_hh, given dh [T,B,H]
// (the gradient of the loss with respect to every h_t from above). `work` (optional on the CPU,
// required by the CUDA version) is scratch of lstm_backward_work_size(d) elements that the
// backward may overwrite; without it the CPU version uses per-thread scratch.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lrnn::ops {

struct LstmDims {
  int T = 0, B = 0, I = 0, H = 0;
};

template <class T>
void lstm_forward(T* h, T* c, T* gates, const T* x, const T* W_ih, const T* W_hh, const T* b_ih,
                  const T* b_hh, const LstmDims& d);

template <class T>
void lstm_backward(T* dx, T* dW_ih, T* dW_hh, T* db_ih, T* db_hh, const T* dh, const T* x,
                   const T* W_ih, const T* W_hh, const T* h, const T* c, const T* gates,
                   const LstmDims& d, T* work = nullptr);

// Elements of the backward's scratch: dz [T*B, 4H], the carried dh and dc [B, H], a column sum [4H].
inline size_t lstm_backward_work_size(const LstmDims& d) {
  return size_t(d.T) * d.B * 4 * d.H + 2 * size_t(d.B) * d.H + 4 * size_t(d.H);
}

// Layout helpers of the LSTM language model (time-major inside, batch-major outside):
//   lstm_time_major_ids:  out[t*B + b] = in[b*T + t]                 (token ids, labels)
//   lstm_batch_major:     out[(b*T + t)*C + c] = in[(t*B + b)*C + c] (logits back to [B,T,C])
// T (the float type) only selects the backend's instantiation; the ids are int32.
template <class T>
void lstm_time_major_ids(int32_t* out, const int32_t* in, int B, int T_);
template <class T>
void lstm_batch_major(T* out, const T* in, int B, int T_, int C);

}  // namespace lrnn::ops
