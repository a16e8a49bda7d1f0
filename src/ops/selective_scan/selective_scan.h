// Mamba-1 selective scan (diagonal state space), with the eigenvalue range as a parameter:
// one kernel for Mamba [0,1] and Mamba [-1,1].
//
// Per sequence b and channel c (d_inner channels), state h[c, 0..N) = 0, for each token t:
//   delta   = softplus(dt[t,c] + dt_bias[c])                  (PyTorch softplus, threshold 20)
//   A[c,n]  = -exp(A_log[c,n])
//   e       = exp(delta * A[c,n])                             (in (0, 1])
//   abar    = e              for EigenRange::Unit   -> eigenvalues in [0, 1]
//           = 2 e - 1        for EigenRange::Signed -> eigenvalues in [-1, 1]
//   h[c,n]  = abar * h[c,n] + delta * B[t,n] * x[t,c]
//   y[t,c]  = (sum_n C[t,n] h[c,n] + D[c] x[t,c]) * silu(z[t,c])
// dt_bias, D and z may be null (no bias, no skip, no gate).
//
// Layouts (row-major, token strides may be larger than packed, see ld*):
//   x, dt, z [B,T,Di]   B, C [B,T,N] (one stride for both: the x_proj output holds dt|B|C)
//   A_log [Di,N]   dt_bias, D [Di]   y [B,T,Di] (packed)
// Gradients share the layout and stride of their input.
//
// Backward ACCUMULATES into every non-null gradient. It needs h_{t-1} at every step (for
// d abar: dabar/ddelta = s A e, which for [-1,1] is A (abar + 1), not A abar), so it recomputes
// the states chunk by chunk (kScanChunk tokens) from the state at each chunk start. The
// chunk-start states come from the forward when it was given a `ckpt` buffer (training), else
// they are recomputed. State and accumulators are kept in T (fp32 or fp64).
#pragma once
#include <cstddef>
#include "ops/common/math.h"

namespace lrnn::ops {

struct SelectiveScanDims {
  int B = 0, T = 0;
  int Di = 0;                          // channels (Mamba's d_inner)
  int N = 0;                           // state size per channel (Mamba's d_state)
  EigenRange range = EigenRange::Unit;
  // Elements from one token to the next; 0 means packed (Di for x/dt/z, N for B/C).
  int ldx = 0, lddt = 0, ldz = 0, ldbc = 0;
  int lx() const { return ldx ? ldx : Di; }
  int ldt() const { return lddt ? lddt : Di; }
  int lz() const { return ldz ? ldz : Di; }
  int lbc() const { return ldbc ? ldbc : N; }
};

template <class T>
struct SelectiveScanInputs {
  const T* x = nullptr;        // [B,T,Di] after the causal conv and SiLU
  const T* dt = nullptr;       // [B,T,Di] dt_proj output before its bias and the softplus
  const T* dt_bias = nullptr;  // [Di] or null
  const T* A_log = nullptr;    // [Di,N]
  const T* B = nullptr;        // [B,T,N]
  const T* C = nullptr;        // [B,T,N]
  const T* D = nullptr;        // [Di] or null
  const T* z = nullptr;        // [B,T,Di] gate or null
};

template <class T>
struct SelectiveScanGrads {  // each may be null when not needed
  T *x = nullptr, *dt = nullptr, *dt_bias = nullptr, *A_log = nullptr;
  T *B = nullptr, *C = nullptr, *D = nullptr, *z = nullptr;
};

constexpr int kScanChunk = 16;
// Elements of the chunk-start state buffer: [B][ceil(T/kScanChunk)][N*Di].
size_t selective_scan_ckpt_size(const SelectiveScanDims& d);

// ckpt (optional): receives the states at chunk starts for the backward.
// state (optional, inference: not with ckpt) [B][N*Di] (state index outer, channel inner): the
// scan starts from it instead of 0 and it receives the state after the last token.
template <class T>
void selective_scan_forward(T* y, const SelectiveScanInputs<T>& in, const SelectiveScanDims& d,
                            T* ckpt = nullptr, T* state = nullptr);

// dy [B,T,Di] packed. ckpt (optional): the forward's chunk-start states for the same inputs.
template <class T>
void selective_scan_backward(const SelectiveScanGrads<T>& grad, const T* dy, const SelectiveScanInputs<T>& in,
                             const SelectiveScanDims& d, const T* ckpt = nullptr);

// Δ = softplus(x) with PyTorch's threshold (x > 20: x); exposed for tests and the model's docs.
template <class T>
T scan_softplus(T x);

}  // namespace lrnn::ops
