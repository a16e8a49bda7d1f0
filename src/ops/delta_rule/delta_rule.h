// The (gated) delta rule with n_h Householder sub-steps per token — DeltaNet, DeltaProduct and
// Gated DeltaNet/DeltaProduct in one recurrent kernel. The eigenvalue range is a parameter.
//
// Per (batch b, head h), state S [Dk,Dv] = 0, for each token t:
//   S = exp(g_t) * S                                   (only if g != null: forget gate, log space)
//   for j in 0..n_h-1:                                 (sub-step j of token t)
//     beta = s * sigmoid(beta_logit[t,j])              (s = 1 for [0,1], 2 for [-1,1])
//     u    = v[t,j] - S^T k[t,j]
//     S    = S + beta * k[t,j] u^T                     (= (I - beta k k^T) S + beta k v^T)
//   o_t = scale * S^T q_t
// Layouts (row-major, what the projections produce; token strides may be larger, see ld*):
//   q [B,T,H,Dk]   k [B,T,n_h,H,Dk]   v [B,T,n_h,H,Dv]   beta_logit [B,T,n_h,H]   g [B,T,H]
//   o [B,T,H,Dv]
// Keys are expected L2-normalised (the eigenvalues of I - beta k k^T are then 1 and 1 - beta).
// The state is kept in T (fp32 or fp64), never lower.
// Backward accumulates into dq, dk, dv, dbeta_logit and dg (dg only when g != null). It
// recomputes the states chunk by chunk (C = kDeltaChunk tokens) from the state at each chunk
// start (or end), so memory is O(T/C·Dk·Dv + T·n_h·Dv) per (b,h). The checkpoints come from the
// forward when it was given a `ckpt` buffer (training), else they are recomputed.
#pragma once
#include <cstdint>
#include "ops/common/math.h"

namespace lrnn::ops {

struct DeltaRuleDims {
  int B = 0, T = 0, H = 0, Dk = 0, Dv = 0;
  int n_h = 1;                              // Householder sub-steps per token
  EigenRange range = EigenRange::Unit;
  double scale = 0;                         // output scale; 0 means Dk^-1/2
  // Elements from one token to the next in q, k, v, beta_logit (and their gradients); 0 means
  // packed as above. Lets the kernel read straight out of a fused q|k|v|beta projection.
  int ldq = 0, ldk = 0, ldv = 0, ldb = 0;
  double out_scale() const;
  int lq() const { return ldq ? ldq : H * Dk; }
  int lk() const { return ldk ? ldk : n_h * H * Dk; }
  int lv() const { return ldv ? ldv : n_h * H * Dv; }
  int lb() const { return ldb ? ldb : n_h * H; }
};

constexpr int kDeltaChunk = 16;
// The checkpoint buffer a training forward fills for the backward (delta_rule_ckpt_size elements):
//   states [B*H][ceil(T/C) + 1][Dk*Dv]  the state before each chunk's first token, then the state
//                                       after the last token
//   u      [B*H][T][n_h][Dv]            u = v - S^T k of every sub-step, from element
//                                       delta_rule_ckpt_u_offset(d) on
// The backward may use any of it (the CUDA lane kernels walk back from the end states with the
// stored u; the others recompute inside each chunk from its start state).
// The buffer is large enough for the GPU's chunked form too (delta_rule_chunked_cuda.cu), which
// keeps its own layout in it (GpuChunkedCkpt): the state before each of its chunks of
// delta_rule_gpu_chunk_tokens(n_h) tokens and after the last, then U~ (the chunk's corrected
// values), then what its prep step formed for each chunk (keys, queries, W, U, the inverse, beta,
// the log decays, the masked query-key products), so that the backward reads them instead of
// forming them again.
size_t delta_rule_ckpt_size(const DeltaRuleDims& d);
size_t delta_rule_ckpt_u_offset(const DeltaRuleDims& d);
size_t delta_rule_recurrent_ckpt_size(const DeltaRuleDims& d);  // the states and u above alone
constexpr int kGpuChunkEvents = 64;
int delta_rule_gpu_chunk_tokens(int n_h);  // 64 / n_h tokens (at least 1)
// The GPU chunked form's checkpoint: element offsets of its arrays (each starting on a multiple of
// 64 elements), per chunk ch = bh * nchunks + c, with E = kGpuChunkEvents and Rp the chunk's
// tokens rounded up to 16:
//   states [B*H][nchunks + 1][Dk][Dv]   U~ [ch][E][Dv]
//   keys   [ch][E][Dk] (rounded as the products read them)   queries [ch][Rp][Dk]
//   W [ch][E][Dk]   U [ch][E][Dv]   inverse [ch][E][E]   beta [ch][E]   log decays [ch][E] (double)
//   masked query-key products [ch][Rp][E]
// At head dims 128 and n_h = 1 that is 65,728 floats a chunk of 64 tokens (the states and U~
// alone: 24,576).
struct GpuChunkedCkpt {
  size_t states, ut, keys, queries, w, u, inverse, beta, log_decay, qk, total;
};
GpuChunkedCkpt delta_rule_gpu_chunked_ckpt_layout(const DeltaRuleDims& d);
size_t delta_rule_gpu_chunked_ckpt_size(const DeltaRuleDims& d);  // its total

// ckpt (optional): receives the checkpoints above.
// state (optional, inference: not with ckpt) [B,H,Dk,Dv]: the recurrence starts from it instead of
// 0 and it receives the state after the last token — a sequence read piece by piece.
template <class T>
void delta_rule_forward(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                        const DeltaRuleDims& d, T* ckpt = nullptr, T* state = nullptr);

// ckpt (optional): the forward's checkpoints for the same inputs.
// accumulate = false: the gradients are written, not added to (their previous content, even
// NaN, is ignored) — what a caller wants that would otherwise zero them first.
template <class T>
void delta_rule_backward(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                         const T* k, const T* v, const T* beta_logit, const T* g,
                         const DeltaRuleDims& d, const T* ckpt = nullptr, bool accumulate = true);

// Variable-length sequences packed in one row (fla's cu_seqlens): with d.B = 1 and d.T = cu[N],
// sequence i is tokens [cu[i], cu[i+1]) (cu[0] = 0, non-decreasing; empty sequences allowed),
// and each starts from a zero state — documents packed into one context that must not see each
// other — or, for inference, from state[i] ([N,H,Dk,Dv], which receives its final state). Each
// sequence runs through delta_rule_forward / delta_rule_backward above (algorithm by its own
// length), one after the other; their checkpoints (each the recurrent layout, which both CPU
// algorithms fill) lie back to back in `ckpt` (delta_rule_varlen_ckpt_size elements).
size_t delta_rule_varlen_ckpt_size(const DeltaRuleDims& d, const int64_t* cu_seqlens, int N);
// Checks cu_seqlens against d (B = 1, 0 .. T, non-decreasing); throws with the reason.
void check_varlen(const DeltaRuleDims& d, const int64_t* cu_seqlens, int N);
// Sequence i of a packed row: its dims (B = 1, T = its length, the row's token strides) and the
// element offsets of its first token in each operand (q, k, v, beta_logit, g, o and their grads).
struct VarlenPiece {
  DeltaRuleDims d;
  size_t q, k, v, b, g, o;
};
VarlenPiece varlen_piece(const DeltaRuleDims& d, const int64_t* cu_seqlens, int i);
// Checks cu_seqlens, then calls f(i, piece, ckpt_offset) for each non-empty sequence i in order,
// with its checkpoints at ckpt_offset (the sizes, ckpt_size(piece.d), of those before it summed).
template <class CkptSize, class F>
void each_varlen_piece(const DeltaRuleDims& d, const int64_t* cu_seqlens, int N, CkptSize ckpt_size, F f) {
  check_varlen(d, cu_seqlens, N);
  size_t c = 0;
  for (int i = 0; i < N; ++i) {
    const VarlenPiece p = varlen_piece(d, cu_seqlens, i);
    if (p.d.T == 0) continue;  // an empty sequence: its state (if any) passes through
    f(i, p, c);
    c += ckpt_size(p.d);
  }
}
template <class T>
void delta_rule_forward_varlen(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                               const DeltaRuleDims& d, const int64_t* cu_seqlens, int N, T* ckpt = nullptr,
                               T* state = nullptr);
template <class T>
void delta_rule_backward_varlen(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q, const T* k,
                                const T* v, const T* beta_logit, const T* g, const DeltaRuleDims& d,
                                const int64_t* cu_seqlens, int N, const T* ckpt = nullptr, bool accumulate = true);

// Two algorithms behind the two functions above (CPU), chosen by shape (delta_rule_chunked_pays):
// the recurrent loop (the reference: a token at a time, matrix-vector products) and the chunked
// WY form (delta_rule_chunked_cpu.cpp: chunks of about kDeltaChunkedEvents sub-steps, as matrix
// products and triangular solves on OpenBLAS). Both have the contract above (the chunked backward adds to
// its gradients); a forward's checkpoints are for the backward of the same algorithm (the chunked
// one keeps the state at the start of each of its chunks in the same buffer).
constexpr int kDeltaChunkedEvents = 64;
int delta_rule_chunk_tokens(int n_h);  // tokens per chunk: a multiple of kDeltaChunk
bool delta_rule_chunked_pays(const DeltaRuleDims& d);
// Which algorithm the two functions above run: Auto (by shape), or always one of them (tests run
// whole models through either). Process-wide; not for concurrent use.
enum class DeltaAlgorithm { Auto, Recurrent, Chunked };
void set_delta_rule_algorithm(DeltaAlgorithm a);
template <class T>
void delta_rule_forward_chunked(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                                const DeltaRuleDims& d, T* ckpt = nullptr, T* state = nullptr);
template <class T>
void delta_rule_backward_chunked(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                                 const T* k, const T* v, const T* beta_logit, const T* g,
                                 const DeltaRuleDims& d, const T* ckpt = nullptr);
// The recurrent loop alone (tests and benchmarks compare the two).
template <class T>
void delta_rule_forward_recurrent(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                                  const DeltaRuleDims& d, T* ckpt = nullptr, T* state = nullptr);
template <class T>
void delta_rule_backward_recurrent(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                                   const T* k, const T* v, const T* beta_logit, const T* g,
                                   const DeltaRuleDims& d, const T* ckpt = nullptr);

}  // namespace lrnn::ops
