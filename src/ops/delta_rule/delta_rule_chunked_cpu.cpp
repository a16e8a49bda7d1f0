// The delta rule in chunked (WY) form on the CPU: the recurrence of delta_rule.h rewritten so that
// a chunk of tokens is a few matrix products (OpenBLAS) and two triangular solves instead of one
// matrix-vector product per token. Same contract, same results to rounding; delta_rule_cpu.cpp's
// recurrent loop stays the reference and the choice for short sequences.
//
// The sub-steps of all tokens form one sequence of events e (token t, sub-step j = e mod n_h) with
// key k_e, value v_e, beta_e and log decay g_e (the token's gate on its first sub-step, else 0).
// In a chunk of L events starting from state S0, with G_i = g_0 + ... + g_i, gamma_i = exp(G_i):
//   S after event i = gamma_i S0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T,
//   u_i = beta_i (v_i - exp(g_i) S_{i-1}^T k_i)        (what event i writes)
// which in matrix form (rows = events) is the unit lower-triangular system
//   M U~ = diag(beta) V - diag(beta gamma) K S0,   M = I + diag(beta) A,
//   A_ij = (k_i . k_j) exp(G_i - G_j) for j < i (else 0),
// solved as U = M^-1 diag(beta) V and W = M^-1 diag(beta gamma) K (trsm), U~ = U - W S0. Then
//   o_i     = scale (gamma_i S0^T q_i + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) u~_j)   (reading events)
//   S_next  = gamma_{L-1} S0 + K^T diag(exp(G_{L-1} - G)) U~.
// Only exponents G_i - G_j with i >= j are formed (<= 0: the gates are log decays), so strong
// decays underflow to 0 instead of overflowing.
//
// The backward recomputes a chunk from its start state (the forward's checkpoint) and runs the
// same products transposed: d(S_next) -> dK, dU~, dG; the outputs -> dS0, dQ, dK, dU~, dG;
// U~ = U - W S0 -> dU, dW, dS0; the solves -> M^-T dU, M^-T dW (trsm) and dM; M -> dbeta, dK, dG;
// finally dg from dG by a reverse cumulative sum inside the chunk.
//
// Error analysis. The triangular solve is where the rounding goes. Its exact result is the
// recurrence's own u vectors, u_i = beta_i (v_i - (decayed state)^T k_i): bounded, since with unit
// keys every transition I - beta k k^T (beta up to 2, eigenvalues in [-1, 1]) has norm <= 1, so
// M^-1 does not blow up even at beta = 2 (M's strictly lower entries reach 2 in magnitude). The
// solve's rounding grows with the chunk's length L, not with T; the state is carried from chunk to
// chunk by one product each. Everything is computed in T (fp32 in training, fp64 in the gradient
// checks), accumulation included, as in the recurrent reference. The tests compare both forms in
// fp64 and bound this form's fp32 error by twice the recurrent loop's at the same inputs
// (tests/ops/test_delta_rule_chunked.cpp prints the measured factors).
#include <algorithm>
#include <cmath>
#include "core/check.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/delta_rule/delta_rule_seq.h"
#include "ops/linear/linear.h"

namespace lrnn::ops {

namespace {

using detail::Offsets;
using detail::Seq;


// The products of one chunk: its events gathered into contiguous rows, then the WY form.
template <class T>
struct Chunk {
  int Dk, Dv, nh, Ct, Lmax;  // Ct tokens, at most Lmax = Ct n_h events, per chunk
  T bscale;
  // Scratch, per thread (sizes for Lmax events).
  T *K, *V, *beta, *gam, *A, *M, *U, *W, *Ut, *Q, *P;
  // G_i, the cumulative log decay, in double whatever T: the decay between two events is
  // exp(G_i - G_j), a difference of sums that grow along the chunk (fp32 sums would lose the
  // small differences of nearby events deep in a chunk; measured: 10x the fp32 error).
  double* G;
  int* rows;  // the chunk row each reading event (the token's last sub-step) is at
  int L = 0, R = 0, t0 = 0;
  bool gated = false;

  Chunk(int Dk_, int Dv_, int nh_, T bscale_)
      : Dk(Dk_), Dv(Dv_), nh(nh_), Ct(delta_rule_chunk_tokens(nh_)), Lmax(Ct * nh_), bscale(bscale_) {
    const size_t L2 = size_t(Lmax) * Lmax;
    K = thread_scratch<T, 20>(size_t(Lmax) * Dk);
    V = thread_scratch<T, 21>(size_t(Lmax) * Dv);
    beta = thread_scratch<T, 22>(size_t(Lmax) * 2);
    gam = beta + Lmax;
    G = thread_scratch<double, 19>(size_t(Lmax));
    A = thread_scratch<T, 23>(L2);
    M = thread_scratch<T, 24>(L2);
    U = thread_scratch<T, 25>(size_t(Lmax) * Dv);
    W = thread_scratch<T, 26>(size_t(Lmax) * Dk);
    Ut = thread_scratch<T, 27>(size_t(Lmax) * Dv);
    Q = thread_scratch<T, 28>(size_t(Ct) * Dk);
    P = thread_scratch<T, 29>(size_t(Ct) * Lmax);
    rows = thread_scratch<int, 30>(size_t(Ct));
  }

  // exp(G_i - G_j) for j <= i: the decay from event j to event i.
  T decay(int i, int j) const { return T(std::exp(G[i] - G[j])); }
  // Events of one token: no gate lies between them (a token's gate acts at its first sub-step),
  // so a term in exp(G_i - G_j) has no gate gradient. The backward leaves such terms out of dG
  // rather than adding them to G_i and taking them from G_j: they are of order one, and their
  // rounding residue would swamp a true gate gradient of order exp(-20).
  bool same_token(int i, int j) const { return i / nh == j / nh; }

  // Gathers tokens [t0_, t1) and forms A, M, U, W and U~ = U - W S0 (and Q, P with `outputs`).
  void prepare(const Seq<T>& s, int t0_, int t1, const T* S0, bool outputs) {
    t0 = t0_;
    L = (t1 - t0) * nh;
    R = outputs ? t1 - t0 : 0;
    gated = s.g != nullptr;
    double acc = 0;
    for (int i = 0; i < L; ++i) {
      const int t = t0 + i / nh, j = i % nh;
      std::copy_n(s.kt(t, j), Dk, K + size_t(i) * Dk);
      std::copy_n(s.vt(t, j), Dv, V + size_t(i) * Dv);
      beta[i] = bscale * sigmoid(s.blt(t, j));
      if (gated && j == 0) acc += double(s.gt(t));
      G[i] = acc;
      gam[i] = T(std::exp(acc));
    }
    // A = strict lower part of (K K^T) . exp(G_i - G_j); M = diag(beta) A (trsm reads its strict
    // lower part and takes the unit diagonal).
    gemm<T>(false, true, L, L, Dk, T(1), K, Dk, K, Dk, T(0), A, L);
    for (int i = 0; i < L; ++i) {
      T* a = A + size_t(i) * L;
      T* m = M + size_t(i) * L;
      for (int c = 0; c < i; ++c) {
        a[c] *= gated ? decay(i, c) : T(1);
        m[c] = beta[i] * a[c];
      }
      std::fill(a + i, a + L, T(0));
    }
    for (int i = 0; i < L; ++i) {
      for (int c = 0; c < Dv; ++c) U[size_t(i) * Dv + c] = beta[i] * V[size_t(i) * Dv + c];
      const T bg = beta[i] * gam[i];
      for (int c = 0; c < Dk; ++c) W[size_t(i) * Dk + c] = bg * K[size_t(i) * Dk + c];
    }
    trsm_unit_lower<T>(false, L, Dv, M, L, U, Dv);
    trsm_unit_lower<T>(false, L, Dk, M, L, W, Dk);
    std::copy_n(U, size_t(L) * Dv, Ut);
    gemm<T>(false, false, L, Dv, Dk, T(-1), W, Dk, S0, Dv, T(1), Ut, Dv);
    if (!R) return;
    // The reading events (each token's last sub-step): their queries, and
    // P = (Q K^T) . exp(G_row - G_j) for j <= row, else 0.
    for (int r = 0; r < R; ++r) {
      rows[r] = r * nh + nh - 1;
      std::copy_n(s.qt(t0 + r), Dk, Q + size_t(r) * Dk);
    }
    gemm<T>(false, true, R, L, Dk, T(1), Q, Dk, K, Dk, T(0), P, L);
    for (int r = 0; r < R; ++r) {
      const int i = rows[r];
      T* p = P + size_t(r) * L;
      if (gated)
        for (int c = 0; c < i; ++c) p[c] *= decay(i, c);
      std::fill(p + i + 1, p + L, T(0));
    }
  }

  // S <- the state after the chunk (S holds S0 on entry). Ud: L x Dv scratch.
  void advance(T* S, T* Ud) const {
    for (int i = 0; i < L; ++i) {
      const T d = gated ? decay(L - 1, i) : T(1);
      for (int c = 0; c < Dv; ++c) Ud[size_t(i) * Dv + c] = d * Ut[size_t(i) * Dv + c];
    }
    if (gated) {
      const T gl = gam[L - 1];
      for (size_t i = 0; i < size_t(Dk) * Dv; ++i) S[i] *= gl;
    }
    gemm<T>(true, false, Dk, Dv, L, T(1), K, Dk, Ud, Dv, T(1), S, Dv);
  }
};

}  // namespace

int delta_rule_chunk_tokens(int n_h) {
  // 64 events a chunk (the triangular system is L x L in events), in whole checkpoint intervals.
  return std::max(kDeltaChunk, kDeltaChunkedEvents / std::max(n_h, 1) / kDeltaChunk * kDeltaChunk);
}

// Measured (bench/bench_delta_rule, forward + backward on one thread as a data-parallel worker runs
// it, cpu2b: AMD EPYC Zen 4, OpenBLAS 0.3.21; ms, recurrent vs chunked, median of 3):
//   head dim 32, T 40-128, n_h 1-4:       8-27 vs 15-49   (the recurrent loop 1.3-2x faster)
//   head dim 64, T 512-1024, no gate:     58 vs 60, 53 vs 56 (even)
//   head dim 64, T 512, forget gate:      112 vs 71       (chunked 1.6x)
//   head dim 128, T 2048, no gate:        207 vs 131      (chunked 1.6x)
//   head dim 128, T 2048, gate, n_h 2:    527 vs 242      (chunked 2.2x)
// so the chunked form took gated heads from 64 and all heads from 128, once a chunk was full.
// Re-measured after the recurrent backward's sums became trees (2026-11-29, AMD EPYC with AVX-512,
// median of 3): head dim 64, T 512: 27 vs 31 ms without a gate, 38 vs 38 with one; head dim 128,
// T 2048: 94 vs 80, with a gate and n_h 2: 199 vs 145. Again after its dq and dk rows were summed
// sixteen at a time (2026-11-29, the same machine, median of 3): head dim 64, T 512: 22 vs 30 ms
// without a gate, 33 vs 38 with one; head dim 128, T 2048: 92 vs 81, with a gate and n_h 2: 193 vs
// 147. So the chunked form takes all heads from head dim 128 (gated head dim 64 is now the
// recurrent loop's, 1.14x), once a chunk is full.
bool delta_rule_chunked_pays(const DeltaRuleDims& d) {
  return d.T >= delta_rule_chunk_tokens(d.n_h) && std::min(d.Dk, d.Dv) >= 128;
}

template <class T>
void delta_rule_forward_chunked(T* o, const T* q, const T* k, const T* v, const T* beta_logit, const T* g,
                                const DeltaRuleDims& d, T* ckpt, T* state) {
  const int B = d.B, Tn = d.T, H = d.H, Dk = d.Dk, Dv = d.Dv, nh = d.n_h;
  LRNN_CHECK(B > 0 && Tn >= 0 && H > 0 && Dk > 0 && Dv > 0 && nh >= 1, "bad delta rule dims");
  LRNN_CHECK(!(ckpt && state), "delta_rule_forward: a carried state is for inference (no checkpoints)");
  const T bscale = T(beta_scale(d.range)), scale = T(d.out_scale());
  const size_t SS = size_t(Dk) * Dv;
  const int n16 = (Tn + kDeltaChunk - 1) / kDeltaChunk;  // checkpoint slots (delta_rule.h)
#pragma omp parallel
  {
    Chunk<T> ch(Dk, Dv, nh, bscale);
    T* S = thread_scratch<T, 31>(SS);
    T* O = thread_scratch<T, 32>(size_t(ch.Ct) * Dv);
    T* Ud = thread_scratch<T, 33>(size_t(ch.Lmax) * Dv);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H;
      Seq<T> s(d, Offsets(d, b, h), q, k, v, beta_logit, g);
      T* carried = state ? state + size_t(bh) * SS : nullptr;
      if (carried) std::copy_n(carried, SS, S);
      else std::fill_n(S, SS, T(0));
      T* states = ckpt ? ckpt + size_t(bh) * (n16 + 1) * SS : nullptr;
      for (int t0 = 0; t0 < Tn; t0 += ch.Ct) {
        const int t1 = std::min(Tn, t0 + ch.Ct);
        if (states) std::copy_n(S, SS, states + size_t(t0 / kDeltaChunk) * SS);
        ch.prepare(s, t0, t1, S, true);
        // O = scale (diag(gamma) Q S0 + P U~)
        gemm<T>(false, false, ch.R, Dv, Dk, scale, ch.Q, Dk, S, Dv, T(0), O, Dv);
        for (int r = 0; r < ch.R; ++r) {
          const T gr = ch.gam[ch.rows[r]];
          for (int c = 0; c < Dv; ++c) O[size_t(r) * Dv + c] *= gr;
        }
        gemm<T>(false, false, ch.R, Dv, ch.L, scale, ch.P, ch.L, ch.Ut, Dv, T(1), O, Dv);
        for (int r = 0; r < ch.R; ++r) std::copy_n(O + size_t(r) * Dv, Dv, o + ((size_t(b) * Tn + t0 + r) * H + h) * Dv);
        ch.advance(S, Ud);
      }
      if (states) std::copy_n(S, SS, states + size_t(n16) * SS);
      if (carried) std::copy_n(S, SS, carried);
    }
  }
}

template <class T>
void delta_rule_backward_chunked(T* dq, T* dk, T* dv, T* dbeta_logit, T* dg, const T* dout, const T* q,
                                 const T* k, const T* v, const T* beta_logit, const T* g, const DeltaRuleDims& d,
                                 const T* saved) {
  const int B = d.B, Tn = d.T, H = d.H, Dk = d.Dk, Dv = d.Dv, nh = d.n_h;
  const size_t SS = size_t(Dk) * Dv;
  const T bscale = T(beta_scale(d.range)), scale = T(d.out_scale());
  const int Ct = delta_rule_chunk_tokens(nh), Lmax = Ct * nh;
  const int n16 = (Tn + kDeltaChunk - 1) / kDeltaChunk, nch = (Tn + Ct - 1) / Ct;
#pragma omp parallel
  {
    Chunk<T> ch(Dk, Dv, nh, bscale);
    T* starts = thread_scratch<T, 34>(size_t(nch) * SS);  // state at each chunk's start
    T* dS = thread_scratch<T, 35>(SS);                   // d loss / d (state after the chunk)
    T* dS0 = thread_scratch<T, 36>(SS);
    T* Ud = thread_scratch<T, 37>(size_t(Lmax) * Dv);
    T* dUt = thread_scratch<T, 38>(size_t(Lmax) * Dv);   // then M^-T dU (dBv)
    T* dW = thread_scratch<T, 39>(size_t(Lmax) * Dk);    // then M^-T dW (dBk)
    T* dK = thread_scratch<T, 40>(size_t(Lmax) * Dk);
    T* KdS = thread_scratch<T, 41>(size_t(Lmax) * Dv);
    T* dM = thread_scratch<T, 42>(size_t(Lmax) * Lmax);
    T* dO = thread_scratch<T, 43>(size_t(Ct) * Dv);
    T* dOg = thread_scratch<T, 44>(size_t(Ct) * Dv);
    T* QS = thread_scratch<T, 45>(size_t(Ct) * Dv);
    T* dQ = thread_scratch<T, 46>(size_t(Ct) * Dk);
    T* dP = thread_scratch<T, 47>(size_t(Ct) * Lmax);
    T* dG = thread_scratch<T, 48>(size_t(Lmax) * 2);
    T* dbeta = dG + Lmax;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H;
      const Offsets off(d, b, h);
      Seq<T> s(d, off, q, k, v, beta_logit, g);
      // Chunk start states: the forward's checkpoints, or a forward pass without outputs.
      if (saved) {
        for (int c = 0; c < nch; ++c)
          std::copy_n(saved + (size_t(bh) * (n16 + 1) + size_t(c) * (Ct / kDeltaChunk)) * SS, SS,
                      starts + size_t(c) * SS);
      } else {
        std::fill_n(starts, SS, T(0));
        for (int c = 0; c + 1 < nch; ++c) {
          std::copy_n(starts + size_t(c) * SS, SS, starts + size_t(c + 1) * SS);
          ch.prepare(s, c * Ct, (c + 1) * Ct, starts + size_t(c) * SS, false);
          ch.advance(starts + size_t(c + 1) * SS, Ud);
        }
      }
      std::fill_n(dS, SS, T(0));
      for (int c = nch - 1; c >= 0; --c) {
        const int t0 = c * Ct, t1 = std::min(Tn, t0 + Ct);
        const T* S0 = starts + size_t(c) * SS;
        ch.prepare(s, t0, t1, S0, true);
        const int L = ch.L, R = ch.R;
        std::fill_n(dG, size_t(L), T(0));
        std::fill_n(dbeta, size_t(L), T(0));
        // S_next = gamma_L S0 + K^T diag(D) U~, D_i = exp(G_{L-1} - G_i).
        const T gl = ch.gated ? ch.gam[L - 1] : T(1);
        T dGL = 0;
        for (size_t i = 0; i < SS; ++i) {
          dGL += dS[i] * S0[i];
          dS0[i] = gl * dS[i];
        }
        dGL *= gl;
        for (int i = 0; i < L; ++i) {
          const T di = ch.gated ? ch.decay(L - 1, i) : T(1);
          for (int c2 = 0; c2 < Dv; ++c2) Ud[size_t(i) * Dv + c2] = di * ch.Ut[size_t(i) * Dv + c2];
        }
        gemm<T>(false, true, L, Dk, Dv, T(1), Ud, Dv, dS, Dv, T(0), dK, Dk);        // dK = diag(D) U~ dS^T
        gemm<T>(false, false, L, Dv, Dk, T(1), ch.K, Dk, dS, Dv, T(0), KdS, Dv);    // K dS
        for (int i = 0; i < L; ++i) {
          const T di = ch.gated ? ch.decay(L - 1, i) : T(1);
          T dd = 0;
          for (int c2 = 0; c2 < Dv; ++c2) {
            const size_t x = size_t(i) * Dv + c2;
            dUt[x] = di * KdS[x];
            dd += KdS[x] * ch.Ut[x];
          }
          // D_i = exp(G_{L-1} - G_i): +dd D_i to G_{L-1}, -dd D_i to G_i (see same_token).
          if (!ch.same_token(L - 1, i)) {
            dGL += dd * di;
            dG[i] -= dd * di;
          }
        }
        // o_r = scale (gamma_r S0^T q_r + P_r U~)
        for (int r = 0; r < R; ++r) {
          const T gr = ch.gam[ch.rows[r]];
          const T* src = dout + ((size_t(b) * Tn + t0 + r) * H + h) * Dv;
          for (int c2 = 0; c2 < Dv; ++c2) {
            dO[size_t(r) * Dv + c2] = src[c2];
            dOg[size_t(r) * Dv + c2] = gr * src[c2];
          }
        }
        gemm<T>(true, false, Dk, Dv, R, scale, ch.Q, Dk, dOg, Dv, T(1), dS0, Dv);   // dS0 += scale Q^T diag(gamma) dO
        gemm<T>(false, false, R, Dv, Dk, T(1), ch.Q, Dk, S0, Dv, T(0), QS, Dv);    // Q S0
        for (int r = 0; r < R; ++r) {
          T acc = 0;
          for (int c2 = 0; c2 < Dv; ++c2) acc += QS[size_t(r) * Dv + c2] * dOg[size_t(r) * Dv + c2];
          dG[ch.rows[r]] += scale * acc;
        }
        gemm<T>(false, true, R, Dk, Dv, scale, dOg, Dv, S0, Dv, T(0), dQ, Dk);     // dQ = scale diag(gamma) dO S0^T
        gemm<T>(true, false, L, Dv, R, scale, ch.P, L, dO, Dv, T(1), dUt, Dv);     // dU~ += scale P^T dO
        gemm<T>(false, true, R, L, Dv, scale, dO, Dv, ch.Ut, Dv, T(0), dP, L);     // dP = scale dO U~^T
        for (int r = 0; r < R; ++r) {
          const int i = ch.rows[r];
          T* dp = dP + size_t(r) * L;
          const T* p = ch.P + size_t(r) * L;
          T row = 0;
          for (int c2 = 0; c2 < i; ++c2) {
            if (!ch.same_token(i, c2)) {  // d/dG of P_rc = (q . k_c) exp(G_i - G_c)
              const T e = dp[c2] * p[c2];
              row += e;
              dG[c2] -= e;
            }
            if (ch.gated) dp[c2] *= ch.decay(i, c2);  // now d(Q K^T)
          }
          dG[i] += row;
          std::fill(dp + i + 1, dp + L, T(0));
        }
        gemm<T>(false, false, R, Dk, L, T(1), dP, L, ch.K, Dk, T(1), dQ, Dk);      // dQ += d(QK^T) K
        gemm<T>(true, false, L, Dk, R, T(1), dP, L, ch.Q, Dk, T(1), dK, Dk);       // dK += d(QK^T)^T Q
        for (int r = 0; r < R; ++r) {
          T* dqq = dq + off.q + size_t(t0 + r) * s.lq;
          for (int c2 = 0; c2 < Dk; ++c2) dqq[c2] += dQ[size_t(r) * Dk + c2];
        }
        // U~ = U - W S0: dU = dU~, dW = -dU~ S0^T, dS0 -= W^T dU~.
        gemm<T>(false, true, L, Dk, Dv, T(-1), dUt, Dv, S0, Dv, T(0), dW, Dk);
        gemm<T>(true, false, Dk, Dv, L, T(-1), ch.W, Dk, dUt, Dv, T(1), dS0, Dv);
        // U = M^-1 diag(beta) V, W = M^-1 diag(beta gamma) K: the right sides' gradients are
        // M^-T dU and M^-T dW; dM = -(M^-T dU) U^T - (M^-T dW) W^T.
        trsm_unit_lower<T>(true, L, Dv, ch.M, L, dUt, Dv);
        trsm_unit_lower<T>(true, L, Dk, ch.M, L, dW, Dk);
        gemm<T>(false, true, L, L, Dv, T(-1), dUt, Dv, ch.U, Dv, T(0), dM, L);
        gemm<T>(false, true, L, L, Dk, T(-1), dW, Dk, ch.W, Dk, T(1), dM, L);
        for (int i = 0; i < L; ++i) {
          const T bi = ch.beta[i], gi = ch.gam[i];
          const T* vi = ch.V + size_t(i) * Dv;
          const T* ki = ch.K + size_t(i) * Dk;
          const int t = t0 + i / nh, j = i % nh;
          T* dvv = dv + off.v + s.vidx(t, j);
          T dv_dot = 0, dk_dot = 0;
          for (int c2 = 0; c2 < Dv; ++c2) {
            dvv[c2] += bi * dUt[size_t(i) * Dv + c2];
            dv_dot += vi[c2] * dUt[size_t(i) * Dv + c2];
          }
          for (int c2 = 0; c2 < Dk; ++c2) {
            dk_dot += ki[c2] * dW[size_t(i) * Dk + c2];
            dK[size_t(i) * Dk + c2] += bi * gi * dW[size_t(i) * Dk + c2];
          }
          dbeta[i] += dv_dot + gi * dk_dot;
          dG[i] += bi * gi * dk_dot;
        }
        // M = I + diag(beta) A: dbeta_i += sum_j dM_ij A_ij; dA = diag(beta) dM (strict lower);
        // A = (K K^T) . exp(G_i - G_j): F = dA . exp(...) gives dK += F K + F^T K.
        for (int i = 0; i < L; ++i) {
          T* dm = dM + size_t(i) * L;
          const T* a = ch.A + size_t(i) * L;
          T db = 0, row = 0;
          for (int c2 = 0; c2 < i; ++c2) {
            db += dm[c2] * a[c2];
            const T da = ch.beta[i] * dm[c2];
            if (!ch.same_token(i, c2)) {
              const T e = da * a[c2];
              row += e;
              dG[c2] -= e;
            }
            dm[c2] = ch.gated ? da * ch.decay(i, c2) : da;  // F
          }
          dbeta[i] += db;
          dG[i] += row;
          std::fill(dm + i, dm + L, T(0));
        }
        gemm<T>(false, false, L, Dk, L, T(1), dM, L, ch.K, Dk, T(1), dK, Dk);
        gemm<T>(true, false, L, Dk, L, T(1), dM, L, ch.K, Dk, T(1), dK, Dk);
        // Scatter: dk, dbeta_logit; the gates from dG by a reverse cumulative sum (G_i sums the
        // gates of events 0..i), G_{L-1}'s own gradient first.
        dG[L - 1] += dGL;
        T acc = 0;
        for (int i = L - 1; i >= 0; --i) {
          const int t = t0 + i / nh, j = i % nh;
          T* dkk = dk + off.k + s.kidx(t, j);
          for (int c2 = 0; c2 < Dk; ++c2) dkk[c2] += dK[size_t(i) * Dk + c2];
          const T lg = s.blt(t, j);
          dbeta_logit[off.b + s.bidx(t, j)] += dbeta[i] * ch.beta[i] * sigmoid(-lg);  // (delta_rule_cpu.cpp)
          acc += dG[i];
          if (ch.gated && j == 0) dg[off.g + size_t(t) * H] += acc;
        }
        std::copy_n(dS0, SS, dS);
      }
    }
  }
}

#define INST(T)                                                                                             \
  template void delta_rule_forward_chunked<T>(T*, const T*, const T*, const T*, const T*, const T*,        \
                                              const DeltaRuleDims&, T*, T*);                                \
  template void delta_rule_backward_chunked<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                               const T*, const T*, const DeltaRuleDims&, const T*);
INST(float)
INST(double)

}  // namespace lrnn::ops
