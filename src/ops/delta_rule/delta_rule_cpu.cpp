#include "ops/delta_rule/delta_rule.h"
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>
#include "core/check.h"
#include "ops/delta_rule/delta_rule_seq.h"

namespace lrnn::ops {

double DeltaRuleDims::out_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(Dk)); }

namespace {

using detail::Offsets;
using detail::Seq;

template <class T>
inline T beta_of(T logit, T s) { return s * sigmoid(logit); }

// acc[c] += f * sum_i x_i S_i[c] over the Dk rows of S (f = -1: acc -= S^T x). The rows go in
// fours, each four's products summed as a tree before they meet acc, so the chain of dependent
// additions into acc is Dk / 4 long instead of Dk (its latency bounded the token loop).
template <class T>
[[gnu::always_inline]] inline void add_rows(T* __restrict acc, const T* __restrict S, const T* __restrict x, T f,
                                            int Dk, int Dv) {
  int i = 0;
  for (; i + 4 <= Dk; i += 4) {
    const T x0 = f * x[i], x1 = f * x[i + 1], x2 = f * x[i + 2], x3 = f * x[i + 3];
    const T *S0 = S + size_t(i) * Dv, *S1 = S0 + Dv, *S2 = S1 + Dv, *S3 = S2 + Dv;
#pragma omp simd
    for (int c = 0; c < Dv; ++c) acc[c] += (x0 * S0[c] + x1 * S1[c]) + (x2 * S2[c] + x3 * S3[c]);
  }
  for (; i < Dk; ++i) {
    const T xi = f * x[i];
    const T* Si = S + size_t(i) * Dv;
#pragma omp simd
    for (int c = 0; c < Dv; ++c) acc[c] += xi * Si[c];
  }
}

// One sub-step from state Sin to Sout: u = v - Sin^T k ; Sout = Sin + beta k u^T. Writes u
// (needed by the backward). Sout may be Sin (the forward steps in place; the backward keeps every
// state of a chunk and writes each one next to the last): u is complete before Sout is written.
template <class T>
[[gnu::always_inline]] inline void householder_step_from(T* Sout, const T* Sin, T* __restrict u, const T* __restrict kk,
                                                         const T* __restrict vv, T beta, int Dk, int Dv) {
  for (int c = 0; c < Dv; ++c) u[c] = vv[c];
  add_rows(u, Sin, kk, T(-1), Dk, Dv);
  for (int i = 0; i < Dk; ++i) {
    const T bk = beta * kk[i];
    const T* Si = Sin + size_t(i) * Dv;
    T* So = Sout + size_t(i) * Dv;
#pragma omp simd
    for (int c = 0; c < Dv; ++c) So[c] = Si[c] + bk * u[c];
  }
}

template <class T>
[[gnu::always_inline]] inline void householder_step(T* S, T* u, const T* kk, const T* vv, T beta, int Dk, int Dv) {
  householder_step_from(S, S, u, kk, vv, beta, Dk, Dv);
}

template <class T>
[[gnu::always_inline]] inline void read_out(T* __restrict o, const T* __restrict S, const T* __restrict qq, T scale, int Dk, int Dv) {
  for (int c = 0; c < Dv; ++c) o[c] = 0;
  add_rows(o, S, qq, scale, Dk, Dv);
}

// Advances S through token t (gate, then the n_h sub-steps). u: Dv scratch, or n_h*Dv that
// receives the u of every sub-step (ustride = Dv).
template <class T>
[[gnu::always_inline]] inline void token_step(T* S, T* u, const Seq<T>& s, int t, T bscale, int Dk, int Dv, int nh,
                                              int ustride = 0) {
  if (s.g) {
    const T a = std::exp(s.gt(t));
    for (int i = 0; i < Dk * Dv; ++i) S[i] *= a;
  }
  for (int j = 0; j < nh; ++j)
    householder_step(S, u + size_t(j) * ustride, s.kt(t, j), s.vt(t, j), beta_of(s.blt(t, j), bscale), Dk, Dv);
}

constexpr int kChunk = kDeltaChunk;

}  // namespace

size_t delta_rule_ckpt_u_offset(const DeltaRuleDims& d) {
  return size_t(d.B) * d.H * ((d.T + kChunk - 1) / kChunk + 1) * d.Dk * d.Dv;
}
int delta_rule_gpu_chunk_tokens(int n_h) { return std::max(1, kGpuChunkEvents / std::max(n_h, 1)); }
GpuChunkedCkpt delta_rule_gpu_chunked_ckpt_layout(const DeltaRuleDims& d) {
  const size_t Ct = delta_rule_gpu_chunk_tokens(d.n_h), nc = (size_t(d.T) + Ct - 1) / Ct, bh = size_t(d.B) * d.H;
  const size_t nch = bh * nc, E = kGpuChunkEvents, Rp = (Ct + 15) / 16 * 16, Dk = d.Dk, Dv = d.Dv;
  GpuChunkedCkpt L{};
  size_t at = 0;
  auto region = [&](size_t& off, size_t n) {
    off = at;
    at += (n + 63) / 64 * 64;
  };
  region(L.states, bh * (nc + 1) * Dk * Dv);
  region(L.ut, nch * E * Dv);
  region(L.keys, nch * E * Dk);
  region(L.queries, nch * Rp * Dk);
  region(L.w, nch * E * Dk);
  region(L.u, nch * E * Dv);
  region(L.inverse, nch * E * E);
  region(L.beta, nch * E);
  region(L.log_decay, nch * E * 2);  // doubles
  region(L.qk, nch * Rp * E);
  L.total = at;
  return L;
}
size_t delta_rule_gpu_chunked_ckpt_size(const DeltaRuleDims& d) { return delta_rule_gpu_chunked_ckpt_layout(d).total; }
size_t delta_rule_recurrent_ckpt_size(const DeltaRuleDims& d) {
  return delta_rule_ckpt_u_offset(d) + size_t(d.B) * d.H * d.T * d.n_h * d.Dv;
}
size_t delta_rule_ckpt_size(const DeltaRuleDims& d) {
  return std::max(delta_rule_recurrent_ckpt_size(d), delta_rule_gpu_chunked_ckpt_size(d));
}

// Asks the caches for n values at p, a request per 64-byte line. The backward's token loops ask for
// the next token's rows a token ahead: in a training step they come from memory (activations of a
// whole batch), and perf had the P1 step's delta rule backward waiting on those loads (with this,
// its share of the step 11.0 -> 8.8 %, the step about -3 %; the same in the forward changed
// nothing, and the op alone on small cached inputs is not the case this serves).
template <class T>
inline void prefetch_row(const T* p, int n) {
  for (int c = 0; c < n; c += int(64 / sizeof(T))) __builtin_prefetch(p + c);
}
// Token t's q, k and v rows (every sub-step's).
template <class T>
inline void prefetch_token_inputs(const Seq<T>& s, int t, int Dk, int Dv, int nh) {
  prefetch_row(s.qt(t), Dk);
  for (int j = 0; j < nh; ++j) prefetch_row(s.kt(t, j), Dk), prefetch_row(s.vt(t, j), Dv);
}

// DK, DV > 0: head dims known at compile time (the loops unroll and vectorise fully); 0: any.
template <class T, int DK, int DV>
static void forward_impl(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                         const DeltaRuleDims& d, T* ckpt, T* state) {
  const int B = d.B, Tn = d.T, H = d.H, Dk = DK ? DK : d.Dk, Dv = DV ? DV : d.Dv, nh = d.n_h;
  LRNN_CHECK(B > 0 && Tn >= 0 && H > 0 && Dk > 0 && Dv > 0 && nh >= 1, "bad delta rule dims");
  const T bscale = T(beta_scale(d.range)), scale = T(d.out_scale());
#pragma omp parallel
  {
    T* S = thread_scratch<T, 0>(size_t(Dk) * Dv);
    T* u = thread_scratch<T, 1>(Dv);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H;
      Seq<T> s(d, Offsets(d, b, h), q, k, v, beta_logit, g);
      T* carried = state ? state + size_t(bh) * Dk * Dv : nullptr;
      if (carried) std::copy_n(carried, size_t(Dk) * Dv, S);
      else std::fill_n(S, size_t(Dk) * Dv, T(0));
      const int nchunks = (Tn + kChunk - 1) / kChunk;
      T* states = ckpt ? ckpt + size_t(bh) * (nchunks + 1) * Dk * Dv : nullptr;
      T* us = ckpt ? ckpt + delta_rule_ckpt_u_offset(d) + size_t(bh) * Tn * nh * Dv : nullptr;
      for (int t = 0; t < Tn; ++t) {
        if (states && t % kChunk == 0) std::copy_n(S, size_t(Dk) * Dv, states + size_t(t / kChunk) * Dk * Dv);
        if (us) token_step(S, us + size_t(t) * nh * Dv, s, t, bscale, Dk, Dv, nh, Dv);
        else token_step(S, u, s, t, bscale, Dk, Dv, nh);
        read_out(o + ((size_t(b) * Tn + t) * H + h) * Dv, S, s.qt(t), scale, Dk, Dv);
      }
      if (states) std::copy_n(S, size_t(Dk) * Dv, states + size_t(nchunks) * Dk * Dv);
      if (carried) std::copy_n(S, size_t(Dk) * Dv, carried);
    }
  }
}

// out[i] += f * tree_sum(term(i, ·), n) for i in [0, rows): sixteen rows at a time where n allows.
template <class T, class Term>
[[gnu::always_inline]] inline void row_sums(T* out, T f, Term term, int rows, int n) {
  int i = 0;
  if (n % 16 == 0)
    for (; i + 16 <= rows; i += 16) add_tree_sums16<T>(out + i, f, [&](int r, size_t c) { return term(i + r, c); }, size_t(n));
  for (; i < rows; ++i) out[i] += f * tree_sum<T>([&](size_t c) { return term(i, c); }, size_t(n));
}

template <class T, int DK, int DV>
static void backward_impl(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                          const T* k, const T* v, const T* beta_logit, const T* g,
                          const DeltaRuleDims& d, const T* saved) {
  const int B = d.B, Tn = d.T, H = d.H, Dk = DK ? DK : d.Dk, Dv = DV ? DV : d.Dv, nh = d.n_h;
  const size_t SS = size_t(Dk) * Dv;
  const T bscale = T(beta_scale(d.range)), scale = T(d.out_scale());
  const int nchunks = (Tn + kChunk - 1) / kChunk;
  const int ev = nh + (g ? 1 : 0);  // events per token: the gate (if any), then n_h sub-steps
#pragma omp parallel
  {
    T* ckpt = thread_scratch<T, 2>(size_t(nchunks + 1) * SS);    // state at each chunk start
    T* st = thread_scratch<T, 3>((size_t(kChunk) * ev + 1) * SS);  // states between events of one chunk
    T* us = thread_scratch<T, 4>(size_t(kChunk) * nh * Dv);        // u of every sub-step of one chunk
    T* dS = thread_scratch<T, 5>(SS);
    T* w = thread_scratch<T, 6>(Dv);
    T* du = thread_scratch<T, 7>(Dv);
    T* tmp = thread_scratch<T, 8>(Dv);
    T* bu = thread_scratch<T, 9>(Dv);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H;
      const Offsets off(d, b, h);
      Seq<T> s(d, off, q, k, v, beta_logit, g);
      // Pass 1: states at chunk starts (read from the forward's checkpoints when it saved them).
      const T* starts = saved ? saved + size_t(bh) * (nchunks + 1) * SS : ckpt;
      if (!saved) {
        std::fill_n(ckpt, SS, T(0));
        for (int c = 0; c + 1 < nchunks; ++c) {
          std::copy_n(ckpt + c * SS, SS, ckpt + (c + 1) * SS);
          for (int t = c * kChunk; t < (c + 1) * kChunk; ++t)
            token_step(ckpt + (c + 1) * SS, tmp, s, t, bscale, Dk, Dv, nh);
        }
      }
      // Pass 2: chunks in reverse; recompute the chunk's states, then walk back through it.
      std::fill_n(dS, SS, T(0));
      for (int c = nchunks - 1; c >= 0; --c) {
        const int t0 = c * kChunk, t1 = std::min(Tn, t0 + kChunk);
        std::copy_n(starts + c * SS, SS, st);
        for (int t = t0; t < t1; ++t) {
          if (t + 1 < t1) prefetch_token_inputs(s, t + 1, Dk, Dv, nh);
          T* base = st + size_t(t - t0) * ev * SS;  // state before token t
          if (g) {
            const T a = std::exp(s.gt(t));
            for (size_t i = 0; i < SS; ++i) base[SS + i] = a * base[i];
          }
          T* first = g ? base + SS : base;  // state before sub-step 0
          for (int j = 0; j < nh; ++j) {
            const T* Sj = first + size_t(j) * SS;
            householder_step_from(first + size_t(j + 1) * SS, Sj, us + (size_t(t - t0) * nh + j) * Dv, s.kt(t, j),
                                  s.vt(t, j), beta_of(s.blt(t, j), bscale), Dk, Dv);
          }
        }
        for (int t = t1 - 1; t >= t0; --t) {
          if (t > 0) {  // the previous token's rows (its k and v are cached by the recompute above)
            prefetch_row(s.qt(t - 1), Dk), prefetch_row(dq + off.q + (t - 1) * s.lq, Dk);
            prefetch_row(dout + ((size_t(b) * Tn + t - 1) * H + h) * Dv, Dv);
            for (int j = 0; j < nh; ++j)
              prefetch_row(dk + off.k + s.kidx(t - 1, j), Dk), prefetch_row(dv + off.v + s.vidx(t - 1, j), Dv);
          }
          const T* base = st + size_t(t - t0) * ev * SS;
          const T* Spost = base + size_t(ev) * SS;  // state after token t
          // o_t = scale S^T q:  dS += scale q do^T ; dq = scale S do
          const T* dot_ = dout + ((size_t(b) * Tn + t) * H + h) * Dv;
          const T* qq = s.qt(t);
          T* dqq = dq + off.q + t * s.lq;
          for (int i = 0; i < Dk; ++i) {
            T* dSi = dS + size_t(i) * Dv;
            const T sq = scale * qq[i];
#pragma omp simd
            for (int c = 0; c < Dv; ++c) dSi[c] += sq * dot_[c];
          }
          row_sums(dqq, scale, [&](int i, size_t c) { return Spost[size_t(i) * Dv + c] * dot_[c]; }, Dk, Dv);
          for (int j = nh - 1; j >= 0; --j) {
            const T* Sprev = base + size_t((g ? 1 : 0) + j) * SS;
            const T* u = us + (size_t(t - t0) * nh + j) * Dv;
            const T* kk = s.kt(t, j);
            const T lg = s.blt(t, j), beta = beta_of(lg, bscale);
            // w = dS^T k ; du = beta w ; dbeta = w . u
            std::fill_n(w, Dv, T(0));
            add_rows(w, dS, kk, T(1), Dk, Dv);
            for (int c = 0; c < Dv; ++c) {
              du[c] = beta * w[c];
              bu[c] = beta * u[c];
            }
            const T dbeta = tree_sum<T>([&](size_t c) { return w[c] * u[c]; }, Dv);
            // dk_i = dS_i . (beta u) - Sprev_i . du (one sum a row) ; dS -= k du^T
            T* dkk = dk + off.k + s.kidx(t, j);
            row_sums(dkk, T(1), [&](int i, size_t c) { return dS[size_t(i) * Dv + c] * bu[c] - Sprev[size_t(i) * Dv + c] * du[c]; },
                     Dk, Dv);
            for (int i = 0; i < Dk; ++i) {
              const T ki = kk[i];
              T* dSi = dS + size_t(i) * Dv;
#pragma omp simd
              for (int c = 0; c < Dv; ++c) dSi[c] -= ki * du[c];
            }
            T* dvv = dv + off.v + s.vidx(t, j);
            for (int c = 0; c < Dv; ++c) dvv[c] += du[c];
            // beta = s sigmoid(x)  =>  d beta / dx = beta (1 - sigmoid(x)) = beta sigmoid(-x) (not
            // 1 - sigmoid(x), which is 0 in float from x ~ 17 on, where beta = 2 is a reflection)
            dbeta_logit[off.b + s.bidx(t, j)] += dbeta * beta * sigmoid(-lg);
          }
          if (g) {
            // S_gated = a S_prev:  dg = a (dS . S_prev) ; dS_prev = a dS
            const T a = std::exp(s.gt(t));
            dg[off.g + size_t(t) * H] += a * tree_sum<T>([&](size_t i) { return dS[i] * base[i]; }, SS);
            for (size_t i = 0; i < SS; ++i) dS[i] *= a;
          }
        }
      }
    }
  }
}

// The single place where head dims become compile-time constants.
#define LRNN_DELTA_DISPATCH(FN, ...)                                          \
  if (d.Dk == d.Dv) switch (d.Dk) {                                           \
      case 16: return FN<T, 16, 16>(__VA_ARGS__);                             \
      case 32: return FN<T, 32, 32>(__VA_ARGS__);                             \
      case 64: return FN<T, 64, 64>(__VA_ARGS__);                             \
      case 128: return FN<T, 128, 128>(__VA_ARGS__);                          \
      default: break;                                                         \
    }                                                                         \
  return FN<T, 0, 0>(__VA_ARGS__);

template <class T>
void delta_rule_forward_recurrent(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                                  const DeltaRuleDims& d, T* ckpt, T* state) {
  LRNN_CHECK(!(ckpt && state), "delta_rule_forward: a carried state is for inference (no checkpoints)");
  LRNN_DELTA_DISPATCH(forward_impl, o, q, k, v, beta_logit, g, d, ckpt, state)
}

namespace {
std::atomic<int> g_algorithm{int(DeltaAlgorithm::Auto)};
bool use_chunked(const DeltaRuleDims& d) {
  switch (DeltaAlgorithm(g_algorithm.load())) {
    case DeltaAlgorithm::Chunked: return true;
    case DeltaAlgorithm::Recurrent: return false;
    default: return delta_rule_chunked_pays(d);
  }
}
}  // namespace

void set_delta_rule_algorithm(DeltaAlgorithm a) { g_algorithm.store(int(a)); }

template <class T>
void delta_rule_forward(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                        const DeltaRuleDims& d, T* ckpt, T* state) {
  if (use_chunked(d)) delta_rule_forward_chunked(o, q, k, v, beta_logit, g, d, ckpt, state);
  else delta_rule_forward_recurrent(o, q, k, v, beta_logit, g, d, ckpt, state);
}

// Zeroes rows x cols of a token-strided gradient.
template <class T>
void zero_rows(T* p, size_t rows, size_t cols, size_t ld) {
  if (!p) return;
  for (size_t r = 0; r < rows; ++r) std::fill_n(p + r * ld, cols, T(0));
}

template <class T>
void delta_rule_backward(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                         const T* k, const T* v, const T* beta_logit, const T* g,
                         const DeltaRuleDims& d, const T* saved, bool accumulate) {
  if (!accumulate) {
    const size_t N = size_t(d.B) * d.T, H = d.H, n = d.n_h;
    zero_rows(dq, N, H * d.Dk, d.lq());
    zero_rows(dk, N, n * H * d.Dk, d.lk());
    zero_rows(dv, N, n * H * d.Dv, d.lv());
    zero_rows(dbeta_logit, N, n * H, d.lb());
    if (g) zero_rows(dg, N, H, H);
  }
  if (use_chunked(d)) delta_rule_backward_chunked(dq, dk, dv, dbeta_logit, dg, dout, q, k, v, beta_logit, g, d, saved);
  else delta_rule_backward_recurrent(dq, dk, dv, dbeta_logit, dg, dout, q, k, v, beta_logit, g, d, saved);
}

template <class T>
void delta_rule_backward_recurrent(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                                   const T* k, const T* v, const T* beta_logit, const T* g,
                                   const DeltaRuleDims& d, const T* saved) {
  LRNN_DELTA_DISPATCH(backward_impl, dq, dk, dv, dbeta_logit, dg, dout, q, k, v, beta_logit, g, d, saved)
}

// ---- variable-length sequences packed in one row ----

VarlenPiece varlen_piece(const DeltaRuleDims& d, const int64_t* cu, int i) {
  VarlenPiece p{d, 0, 0, 0, 0, 0, 0};
  p.d.B = 1;
  p.d.T = int(cu[i + 1] - cu[i]);
  p.d.ldq = d.lq(), p.d.ldk = d.lk(), p.d.ldv = d.lv(), p.d.ldb = d.lb();
  const size_t t0 = size_t(cu[i]);
  p.q = t0 * d.lq(), p.k = t0 * d.lk(), p.v = t0 * d.lv(), p.b = t0 * d.lb();
  p.g = t0 * d.H, p.o = t0 * d.H * d.Dv;
  return p;
}
void check_varlen(const DeltaRuleDims& d, const int64_t* cu, int N) {
  LRNN_CHECK(cu && N >= 1, "delta rule varlen: cu_seqlens with N >= 1 sequences expected");
  LRNN_CHECK(d.B == 1, "delta rule varlen: the sequences are packed in one row (B = 1), got B = {}", d.B);
  LRNN_CHECK(cu[0] == 0 && cu[N] == d.T, "delta rule varlen: cu_seqlens must run from 0 to T = {}, got {} .. {}", d.T,
             cu[0], cu[N]);
  for (int i = 0; i < N; ++i)
    LRNN_CHECK(cu[i + 1] >= cu[i], "delta rule varlen: cu_seqlens decreases at {} ({} -> {})", i, cu[i], cu[i + 1]);
}

size_t delta_rule_varlen_ckpt_size(const DeltaRuleDims& d, const int64_t* cu, int N) {
  check_varlen(d, cu, N);
  size_t n = 0;
  for (int i = 0; i < N; ++i) n += delta_rule_recurrent_ckpt_size(varlen_piece(d, cu, i).d);
  return n;
}

template <class T>
void delta_rule_forward_varlen(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                               const DeltaRuleDims& d, const int64_t* cu, int N, T* ckpt, T* state) {
  each_varlen_piece(d, cu, N, [](const DeltaRuleDims& pd) { return delta_rule_recurrent_ckpt_size(pd); },
                    [&](int i, const VarlenPiece& p, size_t c) {
                      delta_rule_forward(o + p.o, q + p.q, k + p.k, v + p.v, beta_logit + p.b, g ? g + p.g : nullptr,
                                         p.d, ckpt ? ckpt + c : nullptr,
                                         state ? state + size_t(i) * d.H * d.Dk * d.Dv : nullptr);
                    });
}

template <class T>
void delta_rule_backward_varlen(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q, const T* k,
                                const T* v, const T* beta_logit, const T* g, const DeltaRuleDims& d,
                                const int64_t* cu, int N, const T* ckpt, bool accumulate) {
  each_varlen_piece(d, cu, N, [](const DeltaRuleDims& pd) { return delta_rule_recurrent_ckpt_size(pd); },
                    [&](int, const VarlenPiece& p, size_t c) {
                      delta_rule_backward(dq + p.q, dk + p.k, dv + p.v, dbeta_logit + p.b, g ? dg + p.g : nullptr,
                                          dout + p.o, q + p.q, k + p.k, v + p.v, beta_logit + p.b,
                                          g ? g + p.g : nullptr, p.d, ckpt ? ckpt + c : nullptr, accumulate);
                    });
}

#define INST(T)                                                                              \
  template void delta_rule_forward_varlen<T>(T*, const T*, const T*, const T*, const T*, const T*, \
                                             const DeltaRuleDims&, const int64_t*, int, T*, T*);   \
  template void delta_rule_backward_varlen<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*,    \
                                              const T*, const T*, const T*, const DeltaRuleDims&, \
                                              const int64_t*, int, const T*, bool);                \
  template void delta_rule_forward<T>(T*, const T*, const T*, const T*, const T*, const T*,  \
                                      const DeltaRuleDims&, T*, T*);                         \
  template void delta_rule_forward_recurrent<T>(T*, const T*, const T*, const T*, const T*,  \
                                                const T*, const DeltaRuleDims&, T*, T*);     \
  template void delta_rule_backward_recurrent<T>(T*, T*, T*, T*, T*, const T*, const T*,     \
                                                 const T*, const T*, const T*, const T*,     \
                                                 const DeltaRuleDims&, const T*);            \
  template void delta_rule_backward<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*,     \
                                       const T*, const T*, const T*, const DeltaRuleDims&,   \
                                       const T*, bool);
INST(float)
INST(double)
}  // namespace lrnn::ops
