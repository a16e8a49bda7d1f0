// CUDA (gated) delta rule with n_h Householder sub-steps: the contract of delta_rule_cuda.h, the
// math of delta_rule_cpu.cpp (the reference; see delta_rule.h for the recurrence and layouts).
//
// Parallel decomposition (forward and backward alike)
// ----------------------------------------------------
// The state S [Dk,Dv] of one (b,h) evolves column by column independently: column c only needs
// S[:,c], k, v[c] and beta (u_c = v_c - S[:,c].k ; S[:,c] += beta u_c k), and so does the state
// gradient dS[:,c] in the backward. So
//   * grid.x = B*H sequences, grid.y = tiles of `cols` state columns; a block is 1..4 warps;
//   * in a warp, RG consecutive lanes share one "column group" of NC columns and split its
//     DKP rows (lane rg holds rows rg, rg+RG, rg+2RG, ...): each thread keeps an NR x NC slice
//     of S (and of dS) in registers, NR = DKP/RG;
//   * the only reduction the recurrence itself needs is over rows (S^T k, S^T q, dS^T k): a
//     butterfly of log2(RG) __shfl_xor over the lanes of a column group, which leaves the sum
//     in every one of them, so all RG lanes update their rows with the same u (bitwise).
// DKP is Dk rounded up to 16/32/64/128/256 (the one compile-time switch); rows >= Dk and columns
// >= Dv are zero-padded in shared memory and so stay exactly zero in S and dS. At DKP = 256 a
// column group is 16 lanes (RG), so that a thread holds 16 rows of S, as at 128: the same
// registers, half the columns per warp.
// Per chunk of C = kDeltaChunk tokens the block stages k, q, v, beta logits, g (and dout) in
// shared memory with cp.async, double-buffered where shared memory allows (the next chunk loads
// while this one computes); `plan` picks warps per block and staging depth by the number of
// waves of resident blocks the grid needs (B*H = 1024 at Dk = Dv = 32: one wave on an H200).
//
// Backward
// --------
// Chunks in reverse. For chunk [t0, t1), from its start state (the forward's checkpoint):
//   pass A (forward over the chunk): redo every sub-step, keeping u = v - S^T k of each in
//     shared memory, and dq_t = scale * S_t dout_t (S after token t). With a forget gate, the
//     state before every kG-th token is kept too (shared memory).
//   reverse (t = t1-1 .. t0), with S = the state after token t and dS = dL/dS after token t:
//     dS += scale q_t dout_t^T
//     for j = n_h-1 .. 0:   (as the CPU: S_prev is the state before sub-step j)
//       S_prev = S - k (beta u)^T        (undoes the forward's update: same k, beta, u)
//       w = dS^T k ; du = beta w ; dbeta += w.u ; dk += beta dS u - S_prev du
//       dS -= k du^T ; dv += du ; S = S_prev
//     with a gate a = exp(g_t):  dg_t += sum(dS * S) (S = a S_before: a sum(dS S_before)) ; dS *= a
//   Undoing the gate would divide by a (down to e^-20), so with a gate the state after token
//   t-1 is instead rebuilt from the nearest kept state with the stored u (rank-1 updates only,
//   no reductions). Without a gate S simply runs backwards through the whole chunk: undoing a
//   sub-step only subtracts what the forward added, so rounding errors add up (a few ulps over
//   a chunk) and never grow.
// dv is column-local (each element has one owner thread). dq, dk, dbeta and dg sum over
// columns: each warp reduces its columns with shuffles into its own shared-memory slots, the
// block adds its warps in a fixed order (dq after pass A, the rest at the chunk's end) and adds
// the result to global memory: plain += when one block covers all of Dv (deterministic),
// atomicAdd when the columns are split over blocks (Dv > 32 at Dk > 16).
#include "ops/delta_rule/delta_rule_cuda.h"
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <cuda_pipeline.h>
#include "cuda/rows.cuh"
#include "cuda/runtime.h"

// Argument checks (core/check.h's fmt does not go through nvcc): throws lrnn::Error naming the
// condition and the place.
#define LRNN_DELTA_REQUIRE(cond)                                                                    \
  do {                                                                                              \
    if (!(cond)) ::lrnn::cuda::fail(cudaErrorInvalidValue, "CUDA delta rule: " #cond, __FILE__, __LINE__); \
  } while (0)

namespace lrnn::ops::cuda {
namespace {

constexpr int kC = kDeltaChunk;  // tokens per chunk (= checkpoint interval)
constexpr int kG = 4;            // backward with a gate: keep the state before every kG-th token
constexpr int kMaxWarps = 4;
constexpr unsigned kFull = 0xffffffffu;
static_assert(kC % kG == 0, "kG must divide the chunk");

// Thread layout for a padded key dim DKP (see the header comment).
template <int DKP>
struct Layout {
  static constexpr int RG = DKP == 16 ? 4 : DKP == 256 ? 16 : 8;  // lanes per column group (split the rows)
  static constexpr int NR = DKP / RG;            // rows per thread
  static constexpr int NC = 2;                   // columns per thread
  static constexpr int CGW = 32 / RG;            // column groups per warp
  static constexpr int CPW = CGW * NC;           // columns per warp
  // Blocks of kMaxWarps warps that should fit an SM by registers (the launch bound's register
  // cap): 8 for the small heads, so that B*H = 1024 sequences run in one wave on 132 SMs.
  static constexpr int kMinBlocks = DKP <= 32 ? 8 : DKP == 64 ? 5 : 3;
};

struct Args {
  const float *q, *k, *v, *bl, *g, *dout;
  const float* ckpt_in;                  // backward: the forward's checkpoints (delta_rule.h)
  float *o, *ckpt_out;                   // forward (either may be null)
  float* state;                          // forward, inference: carried state [bh][Dk][Dv] in and out (or null)
  size_t u_off;                          // where the checkpoints' u part starts
  float *dq, *dk, *dv, *dbl, *dg;        // backward (dg null without a gate)
  long long lq, lk, lv, lb;              // token strides
  int T, H, Dk, Dv, nh, nchunks;
  int nseq;                              // B*H
  bool accumulate;                       // backward: add to the gradients (else overwrite: lane kernels)
  bool vec;                              // lane kernels: rows can be staged as 16-byte copies
  int cols;                              // state columns per block (= warps * CPW)
  int nbuf;                              // staging buffers: 2 (double-buffered) or 1
  float bscale, scale;
};

// Shared-memory layout of one block, in floats.
struct Smem {
  int stage;                       // one staging buffer: k | q | v | bl | g | dout
  int k, q, v, bl, g, dout;        // offsets inside a staging buffer
  int coef;                        // beta[C*nh] | dbeta factor[C*nh] | a = exp(g)[C]
  int u, st, red, dbw, dgw, total;  // backward only
};

__host__ __device__ inline Smem smem_layout(int DKP, int nh, int cols, int nbuf, int nwarps, bool bwd, bool gate) {
  Smem s{};
  int o = 0;
  s.k = o; o += kC * nh * DKP;
  s.q = o; o += kC * DKP;
  s.v = o; o += kC * nh * cols;
  s.bl = o; o += kC * nh;
  s.g = o; o += kC;
  s.dout = o; o += bwd ? kC * cols : 0;
  s.stage = o;
  o = nbuf * s.stage;
  s.coef = o; o += kC * (2 * nh + 1);
  if (bwd) {
    s.u = o; o += kC * nh * cols;
    s.st = o; o += gate ? (kC / kG) * DKP * cols : 0;
    s.red = o; o += nwarps * kC * nh * DKP;  // per-warp dq partials (pass A), then dk partials
    s.dbw = o; o += nwarps * kC * nh;
    s.dgw = o; o += nwarps * kC;
  }
  s.total = o;
  return s;
}

// The (b,h) sequence's operands, offset to token 0 of batch b and head h.
struct Seq {
  const float *q, *k, *v, *bl, *g, *dout;
  __device__ Seq(const Args& a, int b, int h) {
    const size_t tok = size_t(b) * a.T;
    q = a.q + tok * a.lq + size_t(h) * a.Dk;
    k = a.k + tok * a.lk + size_t(h) * a.Dk;
    v = a.v + tok * a.lv + size_t(h) * a.Dv;
    bl = a.bl + tok * a.lb + h;
    g = a.g ? a.g + tok * a.H + h : nullptr;
    dout = a.dout ? a.dout + (tok * a.H + h) * a.Dv : nullptr;
  }
};

__device__ __forceinline__ void cp4(float* dst, const float* src) { __pipeline_memcpy_async(dst, src, sizeof(float)); }

// Issues the asynchronous loads of chunk `ci` into staging buffer `buf` (padding written as 0).
template <int DKP>
__device__ void stage_chunk(float* buf, const Smem& L, const Args& a, const Seq& s, int ci, int c0) {
  const int tid = threadIdx.x, NT = blockDim.x, nh = a.nh, cols = a.cols, H = a.H;
  const int t0 = ci * kC, nt = min(kC, a.T - t0);
  float* kS = buf + L.k;
  for (int x = tid; x < nt * nh * DKP; x += NT) {
    const int i = x % DKP, tj = x / DKP, j = tj % nh, t = t0 + tj / nh;
    if (i < a.Dk) cp4(kS + x, s.k + t * a.lk + size_t(j) * H * a.Dk + i);
    else kS[x] = 0.f;
  }
  float* qS = buf + L.q;
  for (int x = tid; x < nt * DKP; x += NT) {
    const int i = x % DKP, t = t0 + x / DKP;
    if (i < a.Dk) cp4(qS + x, s.q + t * a.lq + i);
    else qS[x] = 0.f;
  }
  float* vS = buf + L.v;
  for (int x = tid; x < nt * nh * cols; x += NT) {
    const int col = c0 + x % cols, tj = x / cols, j = tj % nh, t = t0 + tj / nh;
    if (col < a.Dv) cp4(vS + x, s.v + t * a.lv + size_t(j) * H * a.Dv + col);
    else vS[x] = 0.f;
  }
  float* bS = buf + L.bl;
  for (int x = tid; x < nt * nh; x += NT) {
    const int j = x % nh, t = t0 + x / nh;
    cp4(bS + x, s.bl + t * a.lb + size_t(j) * H);
  }
  if (s.g)
    for (int x = tid; x < nt; x += NT) cp4(buf + L.g + x, s.g + size_t(t0 + x) * H);
  if (s.dout) {
    float* doS = buf + L.dout;
    for (int x = tid; x < nt * cols; x += NT) {
      const int col = c0 + x % cols, t = t0 + x / cols;
      if (col < a.Dv) cp4(doS + x, s.dout + size_t(t) * H * a.Dv + col);
      else doS[x] = 0.f;
    }
  }
}

// Waits for chunk `it` (in processing order) and starts loading the one after it.
// order(i) gives the chunk index processed at step i.
template <int DKP, class Order>
__device__ float* next_stage(float* sm, const Smem& L, const Args& a, const Seq& s, int it, int c0, Order order) {
  float* cur = sm + (a.nbuf == 2 ? (it & 1) : 0) * L.stage;
  if (a.nbuf == 2) {
    if (it == 0) {
      stage_chunk<DKP>(cur, L, a, s, order(0), c0);
      __pipeline_commit();
    }
    if (it + 1 < a.nchunks) {
      stage_chunk<DKP>(sm + ((it + 1) & 1) * L.stage, L, a, s, order(it + 1), c0);
      __pipeline_commit();
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
  } else {
    stage_chunk<DKP>(cur, L, a, s, order(it), c0);
    __pipeline_commit();
    __pipeline_wait_prior(0);
  }
  __syncthreads();
  return cur;
}

// beta, the dbeta_logit factor d beta / d logit, and a = exp(g) of the staged chunk.
__device__ void fill_coef(float* coef, const float* buf, const Smem& L, const Args& a, int nt) {
  const int n = nt * a.nh;
  for (int x = threadIdx.x; x < n; x += blockDim.x) {
    const float sg = 1.f / (1.f + expf(-buf[L.bl + x]));
    coef[x] = a.bscale * sg;                          // beta = s sigmoid(x)
    // d beta / dx = beta (1 - sigmoid(x)) = beta sigmoid(-x): 1 - sg is 0 in float from x ~ 17 on
    coef[kC * a.nh + x] = a.bscale * sg / (1.f + expf(buf[L.bl + x]));
  }
  for (int x = threadIdx.x; x < nt; x += blockDim.x) coef[2 * kC * a.nh + x] = a.g ? expf(buf[L.g + x]) : 1.f;
  __syncthreads();
}

// Sums x over the RG lanes of a column group (xor butterfly: every lane gets the same sum).
template <int RG, int N>
__device__ __forceinline__ void sum_rows(float (&x)[N]) {
#pragma unroll
  for (int o = 1; o < RG; o <<= 1)
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] += __shfl_xor_sync(kFull, x[n], o);
}
// Sums x over the column groups of a warp (lanes with the same rg).
template <int RG, int N>
__device__ __forceinline__ void sum_cols(float (&x)[N]) {
#pragma unroll
  for (int o = RG; o < 32; o <<= 1)
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] += __shfl_xor_sync(kFull, x[n], o);
}

// One sub-step on the thread's slice: u = v - S^T k (over all rows), S += k (beta u)^T.
// Returns u in `u` (identical in the RG lanes of the column group).
template <int DKP>
__device__ __forceinline__ void householder(float (&S)[Layout<DKP>::NR][Layout<DKP>::NC], float (&u)[Layout<DKP>::NC],
                                            const float* kk, const float* vv, float beta, int rg) {
  using Lay = Layout<DKP>;
  float kr[Lay::NR];
#pragma unroll
  for (int i = 0; i < Lay::NR; ++i) kr[i] = kk[rg + Lay::RG * i];
#pragma unroll
  for (int n = 0; n < Lay::NC; ++n) {
    float p0 = 0.f, p1 = 0.f;  // two partial sums: shorter dependency chain
#pragma unroll
    for (int i = 0; i < Lay::NR; i += 2) {
      p0 = fmaf(kr[i], S[i][n], p0);
      if (i + 1 < Lay::NR) p1 = fmaf(kr[i + 1], S[i + 1][n], p1);
    }
    u[n] = p0 + p1;
  }
  sum_rows<Lay::RG>(u);
#pragma unroll
  for (int n = 0; n < Lay::NC; ++n) {
    u[n] = vv[n] - u[n];
    const float bu = beta * u[n];
#pragma unroll
    for (int i = 0; i < Lay::NR; ++i) S[i][n] = fmaf(kr[i], bu, S[i][n]);
  }
}

// Writes the thread's slice of the state as checkpoint `c` of sequence bh (c = nchunks: the end).
template <int DKP>
__device__ __forceinline__ void save_state(const Args& a, int bh, int c, const float (&S)[Layout<DKP>::NR][Layout<DKP>::NC],
                                           int rg, int col0) {
  using Lay = Layout<DKP>;
  float* ck = a.ckpt_out + (size_t(bh) * (a.nchunks + 1) + c) * a.Dk * a.Dv;
#pragma unroll
  for (int i = 0; i < Lay::NR; ++i) {
    const int row = rg + Lay::RG * i;
#pragma unroll
    for (int n = 0; n < Lay::NC; ++n)
      if (row < a.Dk && col0 + n < a.Dv) ck[size_t(row) * a.Dv + col0 + n] = S[i][n];
  }
}

// The thread's slice of a [Dk][Dv] state at st: read into S (load) or written from it.
template <int DKP, bool kLoad>
__device__ __forceinline__ void state_io(float* st, const Args& a, float (&S)[Layout<DKP>::NR][Layout<DKP>::NC], int rg,
                                         int col0) {
  using Lay = Layout<DKP>;
#pragma unroll
  for (int i = 0; i < Lay::NR; ++i) {
    const int row = rg + Lay::RG * i;
#pragma unroll
    for (int n = 0; n < Lay::NC; ++n)
      if (row < a.Dk && col0 + n < a.Dv) {
        if constexpr (kLoad) S[i][n] = st[size_t(row) * a.Dv + col0 + n];
        else st[size_t(row) * a.Dv + col0 + n] = S[i][n];
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: o (if non-null) and the checkpoints (if ckpt_out is non-null); from and into the
// carried state (if non-null).
template <int DKP>
__global__ void __launch_bounds__(kMaxWarps * 32, Layout<DKP>::kMinBlocks) delta_fwd_kernel(Args a) {
  using Lay = Layout<DKP>;
  constexpr int NR = Lay::NR, NC = Lay::NC, RG = Lay::RG;
  extern __shared__ float sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int rg = lane % RG, cl0 = (warp * Lay::CGW + lane / RG) * NC;  // first local column
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, c0 = blockIdx.y * a.cols;
  const int nh = a.nh, cols = a.cols;
  const Smem L = smem_layout(DKP, nh, cols, a.nbuf, nw, false, a.g != nullptr);
  const Seq s(a, b, h);
  float* coef = sm + L.coef;
  float S[NR][NC];
#pragma unroll
  for (int i = 0; i < NR; ++i)
#pragma unroll
    for (int n = 0; n < NC; ++n) S[i][n] = 0.f;
  float* carried = a.state ? a.state + size_t(bh) * a.Dk * a.Dv : nullptr;
  if (carried) state_io<DKP, true>(carried, a, S, rg, c0 + cl0);

  for (int ci = 0; ci < a.nchunks; ++ci) {
    const float* buf = next_stage<DKP>(sm, L, a, s, ci, c0, [](int i) { return i; });
    const int t0 = ci * kC, nt = min(kC, a.T - t0);
    fill_coef(coef, buf, L, a, nt);
    if (a.ckpt_out) save_state<DKP>(a, bh, ci, S, rg, c0 + cl0);  // the state before token t0
    for (int tt = 0; tt < nt; ++tt) {
      if (a.g) {
        const float at = coef[2 * kC * nh + tt];
#pragma unroll
        for (int i = 0; i < NR; ++i)
#pragma unroll
          for (int n = 0; n < NC; ++n) S[i][n] *= at;
      }
      for (int j = 0; j < nh; ++j) {
        const int tj = tt * nh + j;
        float u[NC];
        householder<DKP>(S, u, buf + L.k + tj * DKP, buf + L.v + tj * cols + cl0, coef[tj], rg);
        if (a.ckpt_out && rg == 0) {
          float* up = a.ckpt_out + a.u_off + ((size_t(bh) * a.T + t0 + tt) * nh + j) * a.Dv;
#pragma unroll
          for (int n = 0; n < NC; ++n)
            if (c0 + cl0 + n < a.Dv) up[c0 + cl0 + n] = u[n];
        }
      }
      if (a.o) {
        const float* qq = buf + L.q + tt * DKP;
        float o[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) o[n] = 0.f;
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          const float qi = qq[rg + RG * i];
#pragma unroll
          for (int n = 0; n < NC; ++n) o[n] = fmaf(qi, S[i][n], o[n]);
        }
        sum_rows<RG>(o);
        if (rg == 0) {
          float* op = a.o + ((size_t(b) * a.T + t0 + tt) * a.H + h) * a.Dv;
#pragma unroll
          for (int n = 0; n < NC; ++n)
            if (c0 + cl0 + n < a.Dv) op[c0 + cl0 + n] = a.scale * o[n];
        }
      }
    }
    __syncthreads();  // the staging buffer and coef are reused
  }
  if (a.ckpt_out) save_state<DKP>(a, bh, a.nchunks, S, rg, c0 + cl0);  // the state after the last token
  if (carried) state_io<DKP, false>(carried, a, S, rg, c0 + cl0);
}

// Global accumulation: plain when this block is the only one adding to the element.
__device__ __forceinline__ void add_to(float* p, float x, bool atomic) {
  if (atomic) atomicAdd(p, x);
  else *p += x;
}

// ---------------------------------------------------------------------------------------------
// Backward (see the header comment).
template <int DKP>
__global__ void __launch_bounds__(kMaxWarps * 32, Layout<DKP>::kMinBlocks) delta_bwd_kernel(Args a) {
  using Lay = Layout<DKP>;
  constexpr int NR = Lay::NR, NC = Lay::NC, RG = Lay::RG;
  extern __shared__ float sm[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5, NT = blockDim.x;
  const int rg = lane % RG, cgw = lane / RG, cl0 = (warp * Lay::CGW + cgw) * NC;
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, c0 = blockIdx.y * a.cols;
  const int nh = a.nh, cols = a.cols, H = a.H;
  const bool gate = a.g != nullptr, atomic = gridDim.y > 1;
  const Smem L = smem_layout(DKP, nh, cols, a.nbuf, nw, true, gate);
  const Seq s(a, b, h);
  float* coef = sm + L.coef;
  const float* betas = coef;
  const float* gates = coef + 2 * kC * nh;
  float* us = sm + L.u;     // [C*nh][cols]  u of every sub-step
  float* st = sm + L.st;    // [C/G][NR*NC][NT]  state before tokens 0, G, 2G, ... (gate only)
  float* dqw = sm + L.red + warp * kC * nh * DKP;  // [C][DKP] in pass A
  float* dkw = dqw;                                // [C*nh][DKP] in the reverse pass
  float* dbw = sm + L.dbw + warp * kC * nh;
  float* dgw = sm + L.dgw + warp * kC;
  // The (b,h) gradient pointers (same strides as the inputs).
  const size_t tok = size_t(b) * a.T;
  float* dqb = a.dq + tok * a.lq + size_t(h) * a.Dk;
  float* dkb = a.dk + tok * a.lk + size_t(h) * a.Dk;
  float* dvb = a.dv + tok * a.lv + size_t(h) * a.Dv;
  float* dbb = a.dbl + tok * a.lb + h;
  float* dgb = gate ? a.dg + tok * H + h : nullptr;

  float S[NR][NC], dS[NR][NC];
#pragma unroll
  for (int i = 0; i < NR; ++i)
#pragma unroll
    for (int n = 0; n < NC; ++n) dS[i][n] = 0.f;

  const int last = a.nchunks - 1;
  for (int it = 0; it < a.nchunks; ++it) {
    const int ci = last - it;
    // Chunk-start state (loaded first: the loads are in flight while the chunk's inputs land).
    {
      const float* ck = a.ckpt_in + (size_t(bh) * (a.nchunks + 1) + ci) * a.Dk * a.Dv;
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        const int row = rg + RG * i;
#pragma unroll
        for (int n = 0; n < NC; ++n) {
          const int col = c0 + cl0 + n;
          S[i][n] = (row < a.Dk && col < a.Dv) ? ck[size_t(row) * a.Dv + col] : 0.f;
        }
      }
    }
    const float* buf = next_stage<DKP>(sm, L, a, s, it, c0, [last](int i) { return last - i; });
    const int t0 = ci * kC, nt = min(kC, a.T - t0);
    fill_coef(coef, buf, L, a, nt);
    const float* kS = buf + L.k;
    const float* vS = buf + L.v;
    const float* qS = buf + L.q;
    const float* doS = buf + L.dout;

    // Pass A: forward through the chunk; u of every sub-step, dq, kept states.
    for (int tt = 0; tt < nt; ++tt) {
      if (gate) {
        if (tt % kG == 0) {
          float* sp = st + (tt / kG) * NR * NC * NT + tid;
#pragma unroll
          for (int i = 0; i < NR; ++i)
#pragma unroll
            for (int n = 0; n < NC; ++n) sp[(i * NC + n) * NT] = S[i][n];
        }
        const float at = gates[tt];
#pragma unroll
        for (int i = 0; i < NR; ++i)
#pragma unroll
          for (int n = 0; n < NC; ++n) S[i][n] *= at;
      }
      for (int j = 0; j < nh; ++j) {
        const int tj = tt * nh + j;
        float u[NC];
        householder<DKP>(S, u, kS + tj * DKP, vS + tj * cols + cl0, betas[tj], rg);
        if (rg == 0)
#pragma unroll
          for (int n = 0; n < NC; ++n) us[tj * cols + cl0 + n] = u[n];
      }
      // dq_t = scale S_t dout_t (partial over this warp's columns; scale at the flush)
      float dq[NR];
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        float acc = 0.f;
#pragma unroll
        for (int n = 0; n < NC; ++n) acc = fmaf(S[i][n], doS[tt * cols + cl0 + n], acc);
        dq[i] = acc;
      }
      sum_cols<RG>(dq);
      if (cgw == 0)
#pragma unroll
        for (int i = 0; i < NR; ++i) dqw[tt * DKP + rg + RG * i] = dq[i];
    }
    __syncthreads();  // dq slots complete (and us, written by lane rg == 0 of each column group)
    for (int x = tid; x < nt * DKP; x += NT) {
      const int i = x % DKP;
      if (i >= a.Dk) continue;
      float acc = 0.f;
      for (int w = 0; w < nw; ++w) acc += sm[L.red + w * kC * nh * DKP + x];
      add_to(dqb + (t0 + x / DKP) * a.lq + i, a.scale * acc, atomic);
    }
    __syncthreads();  // the slots are reused for dk

    // Reverse through the chunk. S = state after token t1-1 (from pass A).
    for (int tt = nt - 1; tt >= 0; --tt) {
      const float at = gates[tt];
      if (gate && tt < nt - 1) {
        // Rebuild the state after token tt from the kept state before token tt0 = tt - tt%G.
        const int tt0 = tt - tt % kG;
        const float* sp = st + (tt0 / kG) * NR * NC * NT + tid;
#pragma unroll
        for (int i = 0; i < NR; ++i)
#pragma unroll
          for (int n = 0; n < NC; ++n) S[i][n] = sp[(i * NC + n) * NT];
        for (int x = tt0; x <= tt; ++x) {
          const float ax = gates[x];
#pragma unroll
          for (int i = 0; i < NR; ++i)
#pragma unroll
            for (int n = 0; n < NC; ++n) S[i][n] *= ax;
          for (int j = 0; j < nh; ++j) {
            const int tj = x * nh + j;
            const float* kk = kS + tj * DKP;
            const float beta = betas[tj];
#pragma unroll
            for (int n = 0; n < NC; ++n) {
              const float bu = beta * us[tj * cols + cl0 + n];
#pragma unroll
              for (int i = 0; i < NR; ++i) S[i][n] = fmaf(kk[rg + RG * i], bu, S[i][n]);
            }
          }
        }
      }
      // o_t = scale S^T q:  dS += scale q do^T
      {
        float dor[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) dor[n] = doS[tt * cols + cl0 + n];
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          const float sq = a.scale * qS[tt * DKP + rg + RG * i];
#pragma unroll
          for (int n = 0; n < NC; ++n) dS[i][n] = fmaf(sq, dor[n], dS[i][n]);
        }
      }
      for (int j = nh - 1; j >= 0; --j) {
        const int tj = tt * nh + j;
        const float* kk = kS + tj * DKP;
        const float beta = betas[tj];
        float kr[NR], u[NC], bu[NC], w[NC];
#pragma unroll
        for (int i = 0; i < NR; ++i) kr[i] = kk[rg + RG * i];
#pragma unroll
        for (int n = 0; n < NC; ++n) {
          u[n] = us[tj * cols + cl0 + n];
          bu[n] = beta * u[n];
        }
        // S_prev = S - k (beta u)^T ;  w = dS^T k
#pragma unroll
        for (int n = 0; n < NC; ++n) {
          float p0 = 0.f, p1 = 0.f;
#pragma unroll
          for (int i = 0; i < NR; i += 2) {
            p0 = fmaf(kr[i], dS[i][n], p0);
            if (i + 1 < NR) p1 = fmaf(kr[i + 1], dS[i + 1][n], p1);
          }
          w[n] = p0 + p1;
#pragma unroll
          for (int i = 0; i < NR; ++i) S[i][n] = fmaf(-kr[i], bu[n], S[i][n]);
        }
        sum_rows<RG>(w);
        // du = beta w ; dbeta = w.u ; dk = beta dS u - S_prev du ; dS -= k du^T
        float du[NC], db[1] = {0.f}, dk[NR];
#pragma unroll
        for (int n = 0; n < NC; ++n) {
          du[n] = beta * w[n];
          db[0] = fmaf(w[n], u[n], db[0]);
        }
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          float acc = 0.f;
#pragma unroll
          for (int n = 0; n < NC; ++n) acc = fmaf(dS[i][n], bu[n], fmaf(-S[i][n], du[n], acc));
          dk[i] = acc;
#pragma unroll
          for (int n = 0; n < NC; ++n) dS[i][n] = fmaf(-kr[i], du[n], dS[i][n]);
        }
        sum_cols<RG>(dk);
        sum_cols<RG>(db);
        if (cgw == 0)
#pragma unroll
          for (int i = 0; i < NR; ++i) dkw[tj * DKP + rg + RG * i] = dk[i];
        if (lane == 0) dbw[tj] = db[0];
        if (rg == 0) {  // dv += du as a non-blocking atomic add (one owner: deterministic)
          float* dvp = dvb + (t0 + tt) * a.lv + size_t(j) * H * a.Dv;
#pragma unroll
          for (int n = 0; n < NC; ++n)
            if (c0 + cl0 + n < a.Dv) atomicAdd(dvp + c0 + cl0 + n, du[n]);
        }
      }
      if (gate) {
        // S is now exp(g_t) * (state after token t-1):  dg_t = sum(dS * S) ; dS *= a
        float dg[1] = {0.f};
#pragma unroll
        for (int i = 0; i < NR; ++i)
#pragma unroll
          for (int n = 0; n < NC; ++n) {
            dg[0] = fmaf(dS[i][n], S[i][n], dg[0]);
            dS[i][n] *= at;
          }
        sum_rows<RG>(dg);
        sum_cols<RG>(dg);
        if (lane == 0) dgw[tt] = dg[0];
      }
    }
    __syncthreads();

    // Flush the chunk's gradients: sum the warps' slots in order, add to global memory.
    const float* dkw0 = sm + L.red;
    for (int x = tid; x < nt * nh * DKP; x += NT) {
      const int i = x % DKP;
      if (i >= a.Dk) continue;
      const int tj = x / DKP, j = tj % nh, t = t0 + tj / nh;
      float acc = 0.f;
      for (int w = 0; w < nw; ++w) acc += dkw0[w * kC * nh * DKP + x];
      add_to(dkb + t * a.lk + size_t(j) * H * a.Dk + i, acc, atomic);
    }
    const float* dbw0 = sm + L.dbw;
    for (int x = tid; x < nt * nh; x += NT) {
      float acc = 0.f;
      for (int w = 0; w < nw; ++w) acc += dbw0[w * kC * nh + x];
      const int j = x % nh, t = t0 + x / nh;
      add_to(dbb + t * a.lb + size_t(j) * H, acc * coef[kC * nh + x], atomic);
    }
    if (gate) {
      const float* dgw0 = sm + L.dgw;
      for (int x = tid; x < nt; x += NT) {
        float acc = 0.f;
        for (int w = 0; w < nw; ++w) acc += dgw0[w * kC + x];
        add_to(dgb + size_t(t0 + x) * H, acc, atomic);
      }
    }
    __syncthreads();  // staging buffer, coef and the slots are reused
  }
}

// ---------------------------------------------------------------------------------------------
// Lane kernels: one warp per (b,h) sequence, lane c owns state column c (Dk <= 32, Dv <= 32).
//
// For the small heads of the papers' models (Dk = Dv = 16 or 32) the tiled kernels above spend
// most of their instructions on shuffles: every S^T k needs a reduction over rows. Here the
// thread holds the whole column S[:,c] (DK registers), so the forward needs no reduction at
// all: u_c = v_c - S[:,c].k and o_c = S[:,c].q are thread-local dot products with k and q read
// as float4 broadcasts from shared memory. The backward's column-local parts (w = dS^T k,
// du, dv, the state updates) are thread-local as well; what sums over columns — dq_t = S_t do_t,
// dk = beta dS u - S_prev du (vectors over rows) and dbeta = w.u — is reduced across the warp by
// a transposing butterfly (31 shuffles for 32 rows, after which lane l holds row l), and the
// warp writes its rows with one coalesced store. Each (b,h) has one owner warp: every output is
// written by exactly one lane (no atomics, deterministic; with accumulate=false it overwrites).
// The chunk's k, q, v, beta, gate (and dout) are staged per warp in shared memory with
// cp.async (16-byte copies spread over the warp where the strides allow).
// The backward differs from the tiled one in where its states come from: it starts each chunk
// from the forward's checkpoint of the chunk's end state and walks back with the u the forward
// stored (delta_rule.h), so there is no recompute pass; with a gate, a pass over the chunk with
// the stored u (state updates only, no dot products) keeps the state before every kG-th token,
// and the walk back rebuilds from those as the tiled backward does. dq_t = scale S_t do_t is
// summed at the top of the walk's step t, where S is the state after token t.
// Measured at the P1 shapes (B = 1024, T = 40, H = 4, Dk = Dv = 32) with ncu: about 700 warp
// instructions per token in the backward (180 of them FFMA, 65 shuffles) and 240 in the forward;
// both issue on ~64 % of cycles at 16 warps per SM (the register limit), so instruction count
// is what their time follows.
constexpr int kLaneWarps = 4;  // warps (= sequences) per block

struct LaneSmem {
  int k, q, v, b, g, dout, st, total;  // offsets in floats inside one warp's region
};

// v holds the chunk's v rows in the forward and its stored u rows in the backward.
__host__ __device__ inline LaneSmem lane_smem(int DK, int nh, bool bwd, bool gate) {
  LaneSmem s{};
  int o = 0;
  s.k = o; o += kC * nh * DK;  // DK is a multiple of 4: the float4 rows stay 16-byte aligned
  s.q = o; o += kC * DK;
  s.v = o; o += kC * nh * 32;
  s.b = o; o += kC * nh;
  s.g = o; o += kC;
  s.dout = o; o += bwd ? kC * 32 : 0;
  s.st = o; o += (bwd && gate) ? (kC / kG) * DK * 32 : 0;
  s.total = (o + 3) / 4 * 4;
  return s;
}

// Copies `rows` rows of n floats (row r: token r / nh, sub-step r % nh, at src + token * ld +
// sub-step * js) into shared-memory rows of W floats, zero-filling columns [n, W), 16 bytes per
// copy: the warp's 32 lanes take consecutive float4s of the chunk. Needs n, ld, js and the
// addresses 16-byte aligned (Args::vec).
template <int W>
__device__ __forceinline__ void stage_rows4(float* dst, const float* src, int rows, int nh, int ld, int js, int n,
                                            int lane) {
  constexpr int P = W / 4;  // float4s per shared-memory row
  for (int x = lane; x < rows * P; x += 32) {
    const int r = x / P, c = (x % P) * 4;
    float* d = dst + r * W + c;
    if (c < n) {
      const int t = nh == 1 ? r : r / nh, j = r - t * nh;
      __pipeline_memcpy_async(d, src + t * ld + j * js + c, 16);
    } else {
      *reinterpret_cast<float4*>(d) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// Where the lane kernels' v rows come from: the input v (forward) or the checkpoints' u
// (backward), sub-step j of token t at p + t * ld + j * js.
struct Rows {
  const float* p;
  int ld, js;
};

// Stages chunk [t0, t0 + nt) of the warp's sequence; beta logits become beta, g becomes exp(g).
// Rows go as 16-byte copies spread over the warp where Args::vec allows, else one float per
// lane and row (a lane per column).
template <int DK, int NH>
__device__ void lane_stage(float* w, const LaneSmem& L, const Args& a, const Seq& s, Rows vr, int t0, int nt,
                           int lane) {
  const int nh = NH ? NH : a.nh, H = a.H;
  __syncwarp();  // every lane is done with the previous chunk
  if (a.vec) {
    stage_rows4<DK>(w + L.q, s.q + size_t(t0) * a.lq, nt, 1, int(a.lq), 0, a.Dk, lane);
    stage_rows4<DK>(w + L.k, s.k + size_t(t0) * a.lk, nt * nh, nh, int(a.lk), H * a.Dk, a.Dk, lane);
    stage_rows4<32>(w + L.v, vr.p + size_t(t0) * vr.ld, nt * nh, nh, vr.ld, vr.js, a.Dv, lane);
    if (s.dout) stage_rows4<32>(w + L.dout, s.dout + size_t(t0) * H * a.Dv, nt, 1, H * a.Dv, 0, a.Dv, lane);
  } else {
    for (int tt = 0; tt < nt; ++tt) {
      const int t = t0 + tt;
      if (lane < DK) {
        if (lane < a.Dk) cp4(w + L.q + tt * DK + lane, s.q + size_t(t) * a.lq + lane);
        else w[L.q + tt * DK + lane] = 0.f;
      }
      for (int j = 0; j < nh; ++j) {
        const int r = tt * nh + j;
        if (lane < DK) {
          if (lane < a.Dk) cp4(w + L.k + r * DK + lane, s.k + size_t(t) * a.lk + size_t(j) * H * a.Dk + lane);
          else w[L.k + r * DK + lane] = 0.f;
        }
        if (lane < a.Dv) cp4(w + L.v + r * 32 + lane, vr.p + size_t(t) * vr.ld + size_t(j) * vr.js + lane);
        else w[L.v + r * 32 + lane] = 0.f;
      }
      if (s.dout) {
        if (lane < a.Dv) cp4(w + L.dout + tt * 32 + lane, s.dout + size_t(t) * H * a.Dv + lane);
        else w[L.dout + tt * 32 + lane] = 0.f;
      }
    }
  }
  for (int x = lane; x < nt * nh; x += 32) cp4(w + L.b + x, s.bl + size_t(t0 + x / nh) * a.lb + size_t(x % nh) * H);
  if (s.g)
    for (int x = lane; x < nt; x += 32) cp4(w + L.g + x, s.g + size_t(t0 + x) * H);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncwarp();
  for (int x = lane; x < nt * nh; x += 32) w[L.b + x] = a.bscale / (1.f + expf(-w[L.b + x]));
  if (s.g)
    for (int x = lane; x < nt; x += 32) w[L.g + x] = expf(w[L.g + x]);
  __syncwarp();
}

// Each key row is loaded into registers once per sub-step (as float4 broadcasts: about two
// shared-memory wavefronts each, by ncu) and used from there for every product with it.
// m permutes the row's float4s: register 4i + b holds element 4 (i ^ m) + b. The backward keeps
// its states in that order (see transpose_sum); m = 0 is the plain order.
template <int DK>
__device__ __forceinline__ void lane_row(float (&r)[DK], const float* x, int m = 0) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int i = 0; i < DK / 4; ++i) {
    const float4 v = x4[i ^ m];
    r[4 * i] = v.x, r[4 * i + 1] = v.y, r[4 * i + 2] = v.z, r[4 * i + 3] = v.w;
  }
}
template <int DK>
__device__ __forceinline__ float reg_dot(const float (&S)[DK], const float (&r)[DK]) {
  float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < DK; ++i) p[i % 4] = fmaf(r[i], S[i], p[i % 4]);
  return (p[0] + p[1]) + (p[2] + p[3]);
}
template <int DK>
__device__ __forceinline__ void reg_axpy(float (&S)[DK], const float (&r)[DK], float c) {
#pragma unroll
  for (int i = 0; i < DK; ++i) S[i] = fmaf(r[i], c, S[i]);
}

// The same with x a DK-row of shared memory (read as float4 broadcasts, permuted by m).
template <int DK>
__device__ __forceinline__ float lane_dot(const float (&S)[DK], const float* x, int m = 0) {
  float r[DK];
  lane_row<DK>(r, x, m);
  return reg_dot<DK>(S, r);
}
template <int DK>
__device__ __forceinline__ void lane_axpy(float (&S)[DK], const float* x, float c, int m = 0) {
  float r[DK];
  lane_row<DK>(r, x, m);
  reg_axpy<DK>(S, r, c);
}

// Transposing butterfly: sums the vectors x[0..M) of the 32 lanes. At offset O a lane keeps the
// half of its live elements selected by its bit O and adds the partner's copy of that half, so
// the live elements halve at each level until one is left (then plain butterfly adds). Lane l
// ends with the total of element l >> (5 - log2 M) (M = 32: row l; M = 16: row l/2).
template <int M, int O, int N>
__device__ __forceinline__ void tsum(float (&x)[N], int lane) {
  if constexpr (O >= 1) {
    if constexpr (M > 1) {
      constexpr int Hm = M / 2;
      const bool up = (lane & O) != 0;
#pragma unroll
      for (int e = 0; e < Hm; ++e) {
        const float send = up ? x[e] : x[e + Hm];
        const float keep = up ? x[e + Hm] : x[e];
        x[e] = keep + __shfl_xor_sync(kFull, send, O);
      }
      tsum<Hm, O / 2>(x, lane);
    } else {
      x[0] += __shfl_xor_sync(kFull, x[0], O);
      tsum<1, O / 2>(x, lane);
    }
  }
}

// The backward's column sums without the selects. tsum spends two selects per shuffle choosing
// which half a lane keeps; if instead lane l stores element e of its vector at register
// e ^ 4 perm(l), where perm(l) holds the lane bits that the levels on whole float4s test (bits
// 4..2 of l at DK = 32, bits 4..3 at DK = 16: perm < DK/4), then at those levels every lane keeps
// its registers [0, M/2) and sends [M/2, M), and the partner's register holds the same element.
// The states S and dS are kept in that order (lane_row with m = perm(l) reads k and q rows the
// same way), so the sums need no reordering; the last levels, inside a float4, are tsum's.
template <int DK>
__device__ __forceinline__ int lane_perm(int lane) {
  return lane >> (DK == 32 ? 2 : 3);
}
template <int M, int O, int N>
__device__ __forceinline__ void tsum_perm(float (&x)[N], int lane) {
  if constexpr (M > 4) {
    constexpr int Hm = M / 2;
#pragma unroll
    for (int e = 0; e < Hm; ++e) x[e] += __shfl_xor_sync(kFull, x[e + Hm], O);
    tsum_perm<Hm, O / 2>(x, lane);
  } else {
    tsum<M, O>(x, lane);
  }
}
// Sums x_i = xi(i) (i in the permuted order) over the warp's lanes; lane l gets row
// l >> (5 - log2 DK). The first level computes the elements as it sends them (half the registers).
template <int DK, class F>
__device__ __forceinline__ float transpose_sum(F&& xi, int lane) {
  static_assert(DK == 16 || DK == 32, "lane kernels: DK is 16 or 32");
  constexpr int Hm = DK / 2;
  float y[Hm];
#pragma unroll
  for (int e = 0; e < Hm; ++e) y[e] = xi(e) + __shfl_xor_sync(kFull, xi(e + Hm), 16);
  tsum_perm<Hm, 8>(y, lane);
  return y[0];
}
using ::lrnn::cuda::warp_sum;

// Writes or adds one gradient element. Each element has one owner lane, so the add may be an
// atomic (a fire-and-forget reduction: the warp does not wait for the old value, where `*p += x`
// would stall it for a memory round trip per token) and still gives old + x exactly.
__device__ __forceinline__ void put(float* p, float x, bool accumulate) {
  if (accumulate) atomicAdd(p, x);
  else *p = x;
}

// NH: sub-steps per token known at compile time (1: DeltaNet; 2-4 at DK = 32, with_fixed_nh), or 0
// (a.nh). At most 128 registers: 16 warps per SM (unbounded, NH = 1 takes 145 at DK = 32: 12 warps).
template <int DK, int NH>
__global__ void __launch_bounds__(kLaneWarps * 32, 4) delta_lane_fwd_kernel(Args a) {
  extern __shared__ float4 sm4[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.x * (blockDim.x >> 5) + warp;  // (launch_lane may give a block fewer than kLaneWarps warps)
  if (bh >= a.nseq) return;  // whole warps leave; nothing below synchronises the block
  const int b = bh / a.H, h = bh % a.H, nh = NH ? NH : a.nh;
  const LaneSmem L = lane_smem(DK, nh, false, a.g != nullptr);
  float* w = reinterpret_cast<float*>(sm4) + warp * L.total;
  const Seq s(a, b, h);
  const bool col = lane < a.Dv;
  const size_t ostride = size_t(a.H) * a.Dv;  // o: one row per token
  float* ob = a.o && col ? a.o + (size_t(b) * a.T * a.H + h) * a.Dv + lane : nullptr;
  // Checkpoints (training): the lane's column of each chunk-start state and of the end state,
  // and the u of every sub-step.
  float* ckb = a.ckpt_out && col ? a.ckpt_out + size_t(bh) * (a.nchunks + 1) * a.Dk * a.Dv + lane : nullptr;
  float* ub = ckb ? a.ckpt_out + a.u_off + size_t(bh) * a.T * nh * a.Dv + lane : nullptr;
  float S[DK];
  float* carried = a.state && col ? a.state + size_t(bh) * a.Dk * a.Dv + lane : nullptr;  // column `lane`
#pragma unroll
  for (int i = 0; i < DK; ++i) S[i] = carried && i < a.Dk ? carried[size_t(i) * a.Dv] : 0.f;
  auto save = [&](int c) {
    float* ck = ckb + size_t(c) * a.Dk * a.Dv;
#pragma unroll
    for (int i = 0; i < DK; ++i)
      if (i < a.Dk) ck[size_t(i) * a.Dv] = S[i];
  };
  const Rows vr{s.v, int(a.lv), a.H * a.Dv};
  for (int ci = 0; ci < a.nchunks; ++ci) {
    const int t0 = ci * kC, nt = min(kC, a.T - t0);
    lane_stage<DK, NH>(w, L, a, s, vr, t0, nt, lane);
    if (ckb) save(ci);
    float* op = ob ? ob + size_t(t0) * ostride : nullptr;
    float* up = ub ? ub + size_t(t0) * nh * a.Dv : nullptr;
    for (int tt = 0; tt < nt; ++tt) {
      if (a.g) {
        const float at = w[L.g + tt];
#pragma unroll
        for (int i = 0; i < DK; ++i) S[i] *= at;
      }
      for (int j = 0; j < nh; ++j) {
        const int r = tt * nh + j;
        float kr[DK];
        lane_row<DK>(kr, w + L.k + r * DK);
        const float u = w[L.v + r * 32 + lane] - reg_dot<DK>(S, kr);
        reg_axpy<DK>(S, kr, w[L.b + r] * u);
        if (up) {
          *up = u;
          up += a.Dv;
        }
      }
      if (op) {
        *op = a.scale * lane_dot<DK>(S, w + L.q + tt * DK);
        op += ostride;
      }
    }
  }
  if (ckb) save(a.nchunks);
  if (carried)
#pragma unroll
    for (int i = 0; i < DK; ++i)
      if (i < a.Dk) carried[size_t(i) * a.Dv] = S[i];
}

template <int DK, int NH, int MinBlocks>
__global__ void __launch_bounds__(kLaneWarps * 32, MinBlocks) delta_lane_bwd_kernel(Args a) {
  extern __shared__ float4 sm4[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.x * (blockDim.x >> 5) + warp;  // (launch_lane may give a block fewer than kLaneWarps warps)
  if (bh >= a.nseq) return;
  const int b = bh / a.H, h = bh % a.H, nh = NH ? NH : a.nh, H = a.H;
  const bool gate = a.g != nullptr, col = lane < a.Dv, acc = a.accumulate;
  const LaneSmem L = lane_smem(DK, nh, true, gate);
  float* w = reinterpret_cast<float*>(sm4) + warp * L.total;
  const Seq s(a, b, h);
  // S and dS hold row e of the lane's column at register e ^ 4m (see transpose_sum).
  const int m = lane_perm<DK>(lane);
  // Rows of the transposed sums: lane l holds row e = l >> (5 - log2 DK); one lane per row writes.
  constexpr int kShift = DK == 32 ? 0 : 1;
  const int e = lane >> kShift;
  const bool writer = (lane & ((1 << kShift) - 1)) == 0 && e < a.Dk;
  const size_t tok = size_t(b) * a.T;
  float* dqb = a.dq + tok * a.lq + size_t(h) * a.Dk + e;
  float* dkb = a.dk + tok * a.lk + size_t(h) * a.Dk + e;
  float* dvb = a.dv + tok * a.lv + size_t(h) * a.Dv + lane;
  float* dbb = a.dbl + tok * a.lb + h;
  float* dgb = gate ? a.dg + tok * H + h : nullptr;
  const size_t jk = size_t(H) * a.Dk, jv = size_t(H) * a.Dv;  // sub-step strides of dk, dv

  float S[DK], dS[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) dS[i] = 0.f;
  // The forward's checkpoints: state c of the sequence (the lane's column, rows permuted), and
  // the stored u, staged in place of v.
  const float* ckb = a.ckpt_in + size_t(bh) * (a.nchunks + 1) * a.Dk * a.Dv + lane;
  auto load_state = [&](int c) {
    const float* ck = ckb + size_t(c) * a.Dk * a.Dv;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      const int row = i ^ (4 * m);
      S[i] = (col && row < a.Dk) ? ck[size_t(row) * a.Dv] : 0.f;
    }
  };
  const Rows ur{a.ckpt_in + a.u_off + size_t(bh) * a.T * nh * a.Dv, nh * a.Dv, a.Dv};
  // With a gate: S advances through token tt of the staged chunk with the stored u (the gate,
  // then the sub-steps' rank-1 updates; no dot products).
  auto replay = [&](int tt) {
    const float at = w[L.g + tt];
#pragma unroll
    for (int i = 0; i < DK; ++i) S[i] *= at;
    for (int j = 0; j < nh; ++j) {
      const int r = tt * nh + j;
      lane_axpy<DK>(S, w + L.k + r * DK, w[L.b + r] * w[L.v + r * 32 + lane], m);
    }
  };
  for (int ci = a.nchunks - 1; ci >= 0; --ci) {
    const int t0 = ci * kC, nt = min(kC, a.T - t0);
    lane_stage<DK, NH>(w, L, a, s, ur, t0, nt, lane);
    if (gate) {
      // Forward through the chunk from its start state with the stored u, keeping the state
      // before every kG-th token.
      load_state(ci);
      for (int tt = 0; tt < nt; ++tt) {
        if (tt % kG == 0) {
          float* sp = w + L.st + (tt / kG) * DK * 32 + lane;
#pragma unroll
          for (int i = 0; i < DK; ++i) sp[i * 32] = S[i];
        }
        replay(tt);
      }
    } else {
      load_state(ci + 1);  // the state after the chunk's last token
    }
    // Reverse through the chunk. S = the state after token t0 + nt - 1.
    for (int tt = nt - 1; tt >= 0; --tt) {
      const int t = t0 + tt;
      if (gate && tt < nt - 1) {
        // Rebuild the state after token tt from the kept state before token tt - tt % kG.
        const int tk = tt - tt % kG;
        const float* sp = w + L.st + (tk / kG) * DK * 32 + lane;
#pragma unroll
        for (int i = 0; i < DK; ++i) S[i] = sp[i * 32];
        for (int y = tk; y <= tt; ++y) replay(y);
      }
      // o_t = scale S^T q with S the state after token t:  dq = scale S do ; dS += scale q do^T
      const float dot = w[L.dout + tt * 32 + lane];  // 0 in lanes >= Dv
      const float dq = transpose_sum<DK>([&](int i) { return S[i] * dot; }, lane);
      if (writer) put(dqb + size_t(t) * a.lq, a.scale * dq, acc);
      lane_axpy<DK>(dS, w + L.q + tt * DK, a.scale * dot, m);
      for (int j = nh - 1; j >= 0; --j) {
        const int r = tt * nh + j;
        float kr[DK];
        lane_row<DK>(kr, w + L.k + r * DK, m);
        const float beta = w[L.b + r], u = w[L.v + r * 32 + lane], bu = beta * u;
        reg_axpy<DK>(S, kr, -bu);  // S_prev = S - k (beta u)^T
        const float wv = reg_dot<DK>(dS, kr);  // w = dS^T k
        const float du = beta * wv;
        // dk = beta dS u - S_prev du (summed over columns) ; dS -= k du^T
        const float dkv = transpose_sum<DK>([&](int i) { return fmaf(dS[i], bu, -S[i] * du); }, lane);
        reg_axpy<DK>(dS, kr, -du);
        if (writer) put(dkb + size_t(t) * a.lk + j * jk, dkv, acc);
        if (col) put(dvb + size_t(t) * a.lv + j * jv, du, acc);
        const float db = warp_sum(wv * u);  // dbeta = w . u ; d beta / d logit = beta (1 - beta / s)
        if (lane == 0) put(dbb + size_t(t) * a.lb + size_t(j) * H, db * beta * (1.f - beta / a.bscale), acc);
      }
      if (gate) {
        // S is now exp(g_t) * (state after token t-1):  dg_t = sum(dS * S) ; dS *= a
        const float at = w[L.g + tt];
        float p = 0.f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
          p = fmaf(dS[i], S[i], p);
          dS[i] *= at;
        }
        const float dg = warp_sum(p);
        if (lane == 0) put(dgb + size_t(t) * H, dg, acc);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

int padded_dk(int Dk) {
  LRNN_DELTA_REQUIRE(Dk >= 1 && Dk <= 256);  // head key dims up to 256
  return Dk <= 16 ? 16 : Dk <= 32 ? 32 : Dk <= 64 ? 64 : Dk <= 128 ? 128 : 256;
}

using ::lrnn::cuda::max_smem_optin;

// Allows the kernel all the dynamic shared memory it may have (once per kernel).
template <auto Kernel>
void allow_smem() {
  static const bool done = [] {
    ::lrnn::cuda::allow_max_dynamic_smem(reinterpret_cast<const void*>(Kernel));
    return true;
  }();
  (void)done;
}

struct Launch {
  int nw = 0, nbuf = 0, ytiles = 0;
  size_t smem = 0;
  long long waves = 0;
};

// Picks warps per block (1..4) and staging depth (1 or 2 buffers). Every block is one long
// sequential loop over T, so what counts is how many rounds ("waves") of resident blocks the
// grid needs: fewest waves first, then more warps per block (fewer column tiles: less
// re-staging of k and q, and deterministic sums when one tile covers Dv), then double-buffering.
// Plans are cached per kernel and shape (the occupancy queries cost microseconds per call).
template <auto Kernel>
Launch plan(int DKP, int CPW, const DeltaRuleDims& d, bool bwd, bool gate) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, bool, long long>, Launch> cache;
  const auto key = std::make_tuple(d.Dv, d.n_h, gate, (long long)d.B * d.H);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  allow_smem<Kernel>();
  const int W = (d.Dv + CPW - 1) / CPW;  // warps needed to cover Dv
  Launch best;
  for (int nw = std::min(W, kMaxWarps); nw >= 1; nw = nw > 1 ? (nw + 1) / 2 : 0) {
    for (int nbuf = 2; nbuf >= 1; --nbuf) {
      const size_t smem = sizeof(float) * smem_layout(DKP, d.n_h, nw * CPW, nbuf, nw, bwd, gate).total;
      if (smem > size_t(max_smem_optin())) continue;
      int per_sm = 0;
      LRNN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, nw * 32, smem));
      if (per_sm <= 0) continue;
      const int ytiles = (W + nw - 1) / nw;
      const long long blocks = (long long)d.B * d.H * ytiles, slots = (long long)per_sm * ::lrnn::cuda::num_sms();
      const Launch c{nw, nbuf, ytiles, smem, (blocks + slots - 1) / slots};
      if (!best.nw || c.waves < best.waves) best = c;  // candidates come in order of preference
    }
    if (nw == 1) break;
  }
  const bool shared_memory_fits = best.nw > 0;  // false: n_h too large for this Dk
  LRNN_DELTA_REQUIRE(shared_memory_fits);
  cache.emplace(key, best);
  return best;
}

Args make_args(const DeltaRuleDims& d) {
  Args a{};
  a.T = d.T, a.H = d.H, a.Dk = d.Dk, a.Dv = d.Dv, a.nh = d.n_h;
  a.nseq = d.B * d.H;
  a.accumulate = true;
  a.nchunks = (d.T + kC - 1) / kC;
  a.lq = d.lq(), a.lk = d.lk(), a.lv = d.lv(), a.lb = d.lb();
  a.u_off = delta_rule_ckpt_u_offset(d);
  a.bscale = float(beta_scale(d.range));
  a.scale = float(d.out_scale());
  return a;
}

// Whether the lane kernels may stage rows as 16-byte copies: row lengths, token and sub-step
// strides and base addresses all multiples of 4 floats, and a chunk's row offsets within int.
bool vec_rows(const Args& a, bool bwd) {
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const long long span = (long long)kC * std::max({a.lq, a.lk, a.lv}) + (long long)a.nh * a.H * std::max(a.Dk, a.Dv);
  return a.Dk % 4 == 0 && a.Dv % 4 == 0 && a.lq % 4 == 0 && a.lk % 4 == 0 && a.lv % 4 == 0 && al(a.q) && al(a.k) &&
         al(a.v) && (!bwd || (al(a.dout) && al(a.ckpt_in + a.u_off))) && span < (1LL << 31);
}

void check_dims(const DeltaRuleDims& d) {
  LRNN_DELTA_REQUIRE(d.B >= 0 && d.T >= 0 && d.H > 0 && d.Dk > 0 && d.Dv > 0 && d.n_h >= 1);
  LRNN_DELTA_REQUIRE(size_t(d.B) * d.H <= 0x7fffffffu);
}

std::atomic<int> g_kernel{int(DeltaKernel::Auto)};

// Warps per block of a lane kernel (0: the lane kernels do not apply to these dims).
template <int DKP, auto Kernel>
int lane_warps(const DeltaRuleDims& d, bool bwd, bool gate) {
  if constexpr (DKP > 32) {
    return 0;
  } else {
    if (DeltaKernel(g_kernel.load()) != DeltaKernel::Auto || d.Dv > 32) return 0;
    allow_smem<Kernel>();
    const size_t per_warp = sizeof(float) * lane_smem(DKP, d.n_h, bwd, gate).total;
    return int(std::min<size_t>(kLaneWarps, size_t(max_smem_optin()) / per_warp));
  }
}

template <int DKP, auto Kernel>
bool launch_lane(const Args& a, const DeltaRuleDims& d, bool bwd) {
  const int nw = lane_warps<DKP, Kernel>(d, bwd, a.g != nullptr);
  if (nw == 0) return false;
  const size_t smem = sizeof(float) * nw * lane_smem(DKP, d.n_h, bwd, a.g != nullptr).total;
  const unsigned blocks = unsigned((a.nseq + nw - 1) / nw);
  Kernel<<<blocks, nw * 32, smem, lrnn::cuda::stream()>>>(a);
  LRNN_CUDA_LAUNCH_CHECK();
  return true;
}

// Calls f(std::integral_constant<int, NH>) with n_h as a compile-time constant where the lane
// kernels have it: 1 (DeltaNet) at every head size, and at DK = 32 (the DeltaProduct
// state-tracking models, P2's 8 heads of 32) 2, 3 and 4; else NH = 0 (n_h read at run time).
template <int DKP, class F>
bool with_fixed_nh(int nh, F&& f) {
  using std::integral_constant;
  if (nh == 1) return f(integral_constant<int, 1>{});
  if constexpr (DKP == 32) {
    if (nh == 2) return f(integral_constant<int, 2>{});
    if (nh == 3) return f(integral_constant<int, 3>{});
    if (nh == 4) return f(integral_constant<int, 4>{});
  }
  return f(integral_constant<int, 0>{});
}

template <int DKP>
void forward_dkp(Args a, const DeltaRuleDims& d) {
  if constexpr (DKP <= 32) {
    a.vec = vec_rows(a, false);
    if (with_fixed_nh<DKP>(d.n_h, [&](auto nh) {
          return launch_lane<DKP, delta_lane_fwd_kernel<DKP, decltype(nh)::value>>(a, d, false);
        }))
      return;
  }
  using Lay = Layout<DKP>;
  auto kernel = delta_fwd_kernel<DKP>;
  const Launch l = plan<delta_fwd_kernel<DKP>>(DKP, Lay::CPW, d, false, a.g != nullptr);
  a.cols = l.nw * Lay::CPW;
  a.nbuf = l.nbuf;
  kernel<<<dim3(unsigned(d.B * d.H), unsigned(l.ytiles)), l.nw * 32, l.smem, lrnn::cuda::stream()>>>(a);
  LRNN_CUDA_LAUNCH_CHECK();
}

// Zeroes rows x cols of a token-strided gradient (the tiled kernels only add).
__global__ void zero_strided(float* p, long long rows, int cols, long long ld) {
  const long long n = rows * cols;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
    p[(e / cols) * ld + e % cols] = 0.f;
}
void zero_grad(float* p, long long rows, int cols, long long ld) {
  if (!p || rows * cols == 0) return;
  const long long n = rows * cols;
  const unsigned blocks = unsigned(std::min<long long>((n + 255) / 256, 4096));
  zero_strided<<<blocks, 256, 0, lrnn::cuda::stream()>>>(p, rows, cols, ld);
  LRNN_CUDA_LAUNCH_CHECK();
}

template <int DKP>
void backward_dkp(Args a, const DeltaRuleDims& d) {
  if constexpr (DKP <= 32) {
    // Two builds of the lane backward: unbounded registers (164-190 at DK = 32 per ptxas -v: 8
    // warps per SM, no spills) and capped at 128 (16 warps per SM, 64-164 bytes spilled). Measured
    // on the H200 (P1 shapes, T = 40, tests' DISABLED_Timing, before n_h became a compile-time
    // case): the capped one wins when there are many sequences per SM (B = 1024, 31 per SM: 185
    // vs 208 us) and loses with few (B = 256, 7.8 per SM: 66 vs 53 us); the switch sits between
    // the two measured points, at 12 sequences per SM.
    // (A cap of 96 registers, 20 warps per SM, spills ~600 bytes and runs 3x slower.)
    a.vec = vec_rows(a, true);
    const bool many = a.nseq > 12 * ::lrnn::cuda::num_sms();
    if (with_fixed_nh<DKP>(d.n_h, [&](auto nh) {
          constexpr int NH = decltype(nh)::value;
          return many ? launch_lane<DKP, delta_lane_bwd_kernel<DKP, NH, 4>>(a, d, true)
                      : launch_lane<DKP, delta_lane_bwd_kernel<DKP, NH, 1>>(a, d, true);
        }))
      return;
  }
  if (!a.accumulate) {  // overwrite: the tiled kernel adds (with atomics when columns are split)
    const long long N = (long long)d.B * d.T;
    zero_grad(a.dq, N, d.H * d.Dk, a.lq);
    zero_grad(a.dk, N, d.n_h * d.H * d.Dk, a.lk);
    zero_grad(a.dv, N, d.n_h * d.H * d.Dv, a.lv);
    zero_grad(a.dbl, N, d.n_h * d.H, a.lb);
    zero_grad(a.dg, N, d.H, d.H);
  }
  using Lay = Layout<DKP>;
  auto kernel = delta_bwd_kernel<DKP>;
  const Launch l = plan<delta_bwd_kernel<DKP>>(DKP, Lay::CPW, d, true, a.g != nullptr);
  a.cols = l.nw * Lay::CPW;
  a.nbuf = l.nbuf;
  kernel<<<dim3(unsigned(d.B * d.H), unsigned(l.ytiles)), l.nw * 32, l.smem, lrnn::cuda::stream()>>>(a);
  LRNN_CUDA_LAUNCH_CHECK();
}

#define LRNN_DELTA_CUDA_DISPATCH(FN, ...)       \
  switch (padded_dk(d.Dk)) {                    \
    case 16: return FN<16>(__VA_ARGS__);        \
    case 32: return FN<32>(__VA_ARGS__);        \
    case 64: return FN<64>(__VA_ARGS__);        \
    case 128: return FN<128>(__VA_ARGS__);      \
    default: return FN<256>(__VA_ARGS__);       \
  }

void run_forward(const Args& a, const DeltaRuleDims& d) { LRNN_DELTA_CUDA_DISPATCH(forward_dkp, a, d) }
void run_backward(const Args& a, const DeltaRuleDims& d) { LRNN_DELTA_CUDA_DISPATCH(backward_dkp, a, d) }

}  // namespace

void set_delta_rule_kernel(DeltaKernel k) { g_kernel.store(int(k)); }

// Measured crossover (tests/cuda DeltaRuleCuda.DISABLED_Timing, forward + backward): see
// delta_rule_chunked_cuda_pays' comment in delta_rule_chunked_cuda.cu.
namespace {
bool chunked(const DeltaRuleDims& d, bool gated) {
  switch (DeltaKernel(g_kernel.load())) {
    case DeltaKernel::Chunked: return true;
    case DeltaKernel::Tiled: return false;
    default: return delta_rule_chunked_cuda_pays(d, gated);
  }
}
}  // namespace

size_t delta_rule_ckpt_size(const DeltaRuleDims& d, bool gated) {
  if (DeltaKernel(g_kernel.load()) != DeltaKernel::Auto) return ops::delta_rule_ckpt_size(d);
  if (chunked(d, gated)) return delta_rule_gpu_chunked_ckpt_size(d);
  return delta_rule_recurrent_ckpt_size(d);
}

void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                        const float* g, const DeltaRuleDims& d, float* ckpt, float* state) {
  check_dims(d);
  // A carried state (inference: a sequence read piece by piece) goes through either form: the
  // chunked one for long pieces (a prompt), the recurrent ones for short pieces (a generated
  // token) and for head dims the chunked form does not take.
  if (chunked(d, g != nullptr) && (!state || delta_rule_chunked_cuda_applies(d))) {
    LRNN_DELTA_REQUIRE(delta_rule_chunked_cuda_applies(d));  // head dims multiples of 16, <= 128
    delta_rule_forward_chunked(o, q, k, v, beta_logit, g, d, ckpt, state);
    return;
  }
  if (d.B == 0 || d.T == 0) return;
  Args a = make_args(d);
  a.q = q, a.k = k, a.v = v, a.bl = beta_logit, a.g = g;
  a.o = o, a.ckpt_out = ckpt, a.state = state;
  run_forward(a, d);
}

void delta_rule_backward(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                         const float* q, const float* k, const float* v, const float* beta_logit, const float* g,
                         const DeltaRuleDims& d, const float* ckpt, bool accumulate) {
  check_dims(d);
  if (d.B == 0 || d.T == 0) return;
  LRNN_DELTA_REQUIRE(!g || dg);  // a forget gate needs its gradient
  if (chunked(d, g != nullptr)) {
    LRNN_DELTA_REQUIRE(delta_rule_chunked_cuda_applies(d));
    delta_rule_backward_chunked(dq, dk, dv, dbeta_logit, dg, dout, q, k, v, beta_logit, g, d, ckpt, accumulate);
    return;
  }
  Args a = make_args(d);
  a.q = q, a.k = k, a.v = v, a.bl = beta_logit, a.g = g, a.dout = dout;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dbl = dbeta_logit, a.dg = dg;
  a.accumulate = accumulate;
  float* tmp = nullptr;
  if (!ckpt) {
    // Not used in captured graphs (training passes the forward's checkpoints): recompute them
    // (the recurrent kernels' part of the layout).
    LRNN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&tmp), delta_rule_recurrent_ckpt_size(d) * sizeof(float),
                                    lrnn::cuda::stream()));
    Args f = a;
    f.dout = nullptr;
    f.o = nullptr, f.ckpt_out = tmp;
    run_forward(f, d);
    ckpt = tmp;
  }
  a.ckpt_in = ckpt;
  run_backward(a, d);
  if (tmp) LRNN_CUDA_CHECK(cudaFreeAsync(tmp, lrnn::cuda::stream()));
}

size_t delta_rule_varlen_ckpt_size(const DeltaRuleDims& d, bool gated, const int64_t* cu, int N) {
  check_varlen(d, cu, N);
  size_t n = 0;
  for (int i = 0; i < N; ++i) n += delta_rule_ckpt_size(varlen_piece(d, cu, i).d, gated);
  return n;
}

void delta_rule_forward_varlen(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                               const float* g, const DeltaRuleDims& d, const int64_t* cu, int N, float* ckpt,
                               float* state) {
  const bool gated = g != nullptr;
  each_varlen_piece(d, cu, N, [&](const DeltaRuleDims& pd) { return delta_rule_ckpt_size(pd, gated); },
                    [&](int i, const VarlenPiece& p, size_t c) {
                      delta_rule_forward(o + p.o, q + p.q, k + p.k, v + p.v, beta_logit + p.b, g ? g + p.g : nullptr,
                                         p.d, ckpt ? ckpt + c : nullptr,
                                         state ? state + size_t(i) * d.H * d.Dk * d.Dv : nullptr);
                    });
}

void delta_rule_backward_varlen(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                                const float* q, const float* k, const float* v, const float* beta_logit,
                                const float* g, const DeltaRuleDims& d, const int64_t* cu, int N, const float* ckpt,
                                bool accumulate) {
  const bool gated = g != nullptr;
  each_varlen_piece(d, cu, N, [&](const DeltaRuleDims& pd) { return delta_rule_ckpt_size(pd, gated); },
                    [&](int, const VarlenPiece& p, size_t c) {
                      delta_rule_backward(dq + p.q, dk + p.k, dv + p.v, dbeta_logit + p.b, g ? dg + p.g : nullptr,
                                          dout + p.o, q + p.q, k + p.k, v + p.v, beta_logit + p.b,
                                          g ? g + p.g : nullptr, p.d, ckpt ? ckpt + c : nullptr, accumulate);
                    });
}

}  // namespace lrnn::ops::cuda
