// CUDA mLSTM cell (contract: mlstm_cell_cuda.h / mlstm_cell.h). Two kernel families: the tile
// kernels (the parallel form, below) where a sequence fits in shared memory, and for longer ones
// the recurrent kernels: one block per (batch row b, head h), one thread per row i / column j of
// the D x D state C (row-padded in shared memory, so row and column walks are both free of bank
// conflicts), walking the tokens in order.
// Forward: thread j updates column j of C and forms (C^T q)_j; thread i updates n_i; n . q is a
// block reduction. The state at every chunk start (t % kMLSTMChunk == 0) goes to ckpt in the
// CPU layout [B*H][chunks][D*D + D + 1].
// Backward: tokens in reverse; the state before token t is rebuilt from its chunk's checkpoint
// (replaying at most kMLSTMChunk - 1 tokens; from t = 0 without ckpt), the state after it on the
// fly; then the CPU reference's adjoint formulas (dC, dn carried in shared memory, the
// stabiliser's adjoint dM in registers), with the row sums and column sums as two passes.
#include "ops/mlstm_cell/mlstm_cell_cuda.h"
#include "core/check.h"
#include "cuda/runtime.h"
#include "cuda/rows.cuh"
#include "cuda/tile.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace lrnn::ops::cuda {
namespace {

constexpr int kChunk = kMLSTMChunk;

__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float log_sigm(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }

// The sum of v over the block, returned to every thread (red: 32 floats of shared memory).
__device__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  const int nw = blockDim.x >> 5;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}

struct Gates {
  float m, a, b;
  bool f_branch;
  __device__ Gates(float ipre, float fpre, float m_prev, bool first) {
    const float lf = log_sigm(fpre);
    f_branch = !first && lf + m_prev >= ipre;
    m = f_branch ? lf + m_prev : ipre;
    a = first ? 0.f : expf(lf + m_prev - m);
    b = expf(ipre - m);
  }
};

struct Views {
  const float *q, *k, *v, *ig, *fg;
  size_t oq, ok, ov, og;
  int lq, lk, lv, lg;
};

__device__ Views views(const MLSTMDims& d, int b, int h, const float* q, const float* k, const float* v,
                       const float* ig, const float* fg) {
  Views s;
  s.lq = d.ldq ? d.ldq : d.H * d.D;
  s.lk = d.ldk ? d.ldk : d.H * d.D;
  s.lv = d.ldv ? d.ldv : d.H * d.D;
  s.lg = d.ldg ? d.ldg : d.H;
  const size_t tok = size_t(b) * d.T;
  s.oq = tok * s.lq + size_t(h) * d.D;
  s.ok = tok * s.lk + size_t(h) * d.D;
  s.ov = tok * s.lv + size_t(h) * d.D;
  s.og = tok * s.lg + h;
  s.q = q + s.oq; s.k = k + s.ok; s.v = v + s.ov; s.ig = ig + s.og; s.fg = fg + s.og;
  return s;
}

// smem: C [D][D+1], n [D], red [32]
__global__ void mlstm_forward_kernel(float* __restrict__ hout, const float* __restrict__ q,
                                     const float* __restrict__ k, const float* __restrict__ v,
                                     const float* __restrict__ ig, const float* __restrict__ fg, MLSTMDims d,
                                     float* __restrict__ ckpt) {
  extern __shared__ float sm[];
  const int D = d.D, LD = D + 1, H = d.H, Tn = d.T;
  float *Cs = sm, *ns = Cs + size_t(D) * LD, *red = ns + D;
  const int bh = blockIdx.x, b = bh / H, hh = bh % H, r = threadIdx.x;
  const Views s = views(d, b, hh, q, k, v, ig, fg);
  const float ks = 1.f / sqrtf(float(D));
  const int nchunks = (Tn + kChunk - 1) / kChunk;
  const size_t SS = size_t(D) * D + D + 1;
  if (r < D) {
    for (int i = 0; i < D; ++i) Cs[size_t(i) * LD + r] = 0.f;
    ns[r] = 0.f;
  }
  float m = 0.f;
  __syncthreads();
  for (int t = 0; t < Tn; ++t) {
    if (ckpt && t % kChunk == 0) {
      float* dst = ckpt + (size_t(bh) * nchunks + t / kChunk) * SS;
      if (r < D) {
        for (int i = 0; i < D; ++i) dst[size_t(i) * D + r] = Cs[size_t(i) * LD + r];
        dst[size_t(D) * D + r] = ns[r];
      }
      if (r == 0) dst[size_t(D) * D + D] = m;
    }
    const Gates g(s.ig[size_t(t) * s.lg], s.fg[size_t(t) * s.lg], m, t == 0);
    const float* qt = s.q + size_t(t) * s.lq;
    const float* kt = s.k + size_t(t) * s.lk;
    const float* vt = s.v + size_t(t) * s.lv;
    float hj = 0.f, part = 0.f;
    if (r < D) {
      const float vj = vt[r];
      for (int i = 0; i < D; ++i) {
        const float bk = g.b * ks * kt[i];
        float& c = Cs[size_t(i) * LD + r];
        c = g.a * c + bk * vj;
        hj += qt[i] * c;
      }
      const float nr = g.a * ns[r] + g.b * ks * kt[r];
      ns[r] = nr;
      part = nr * qt[r];
    }
    const float sdot = block_sum(part, red);
    const float den = fmaxf(fabsf(sdot), expf(-g.m)) + float(kMLSTMEps);
    if (r < D) hout[((size_t(b) * Tn + t) * H + hh) * D + r] = hj / den;
    m = g.m;
    __syncthreads();
  }
}

// smem: Cp [D][D+1], dC [D][D+1], np [D], dn [D], dnum [D], red [32]
__global__ void mlstm_backward_kernel(float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                                      float* __restrict__ dig, float* __restrict__ dfg, const float* __restrict__ dout,
                                      const float* __restrict__ q, const float* __restrict__ k,
                                      const float* __restrict__ v, const float* __restrict__ ig,
                                      const float* __restrict__ fg, MLSTMDims d, const float* __restrict__ ckpt) {
  extern __shared__ float sm[];
  const int D = d.D, LD = D + 1, H = d.H, Tn = d.T;
  float *Cp = sm, *dC = Cp + size_t(D) * LD, *np = dC + size_t(D) * LD, *dn = np + D, *dnum = dn + D,
        *red = dnum + D;
  const int bh = blockIdx.x, b = bh / H, hh = bh % H, r = threadIdx.x;
  const Views s = views(d, b, hh, q, k, v, ig, fg);
  const float ks = 1.f / sqrtf(float(D)), eps = float(kMLSTMEps);
  const int nchunks = (Tn + kChunk - 1) / kChunk;
  const size_t SS = size_t(D) * D + D + 1;
  if (r < D) {
    for (int j = 0; j < D; ++j) dC[size_t(r) * LD + j] = 0.f;
    dn[r] = 0.f;
  }
  float dM = 0.f;
  for (int t = Tn - 1; t >= 0; --t) {
    // The state before token t: thread r owns row r throughout the replay.
    const int start = ckpt ? (t / kChunk) * kChunk : 0;
    float mp = 0.f;
    if (ckpt) {
      const float* src = ckpt + (size_t(bh) * nchunks + t / kChunk) * SS;
      if (r < D) {
        for (int j = 0; j < D; ++j) Cp[size_t(r) * LD + j] = src[size_t(r) * D + j];
        np[r] = src[size_t(D) * D + r];
      }
      mp = src[size_t(D) * D + D];
    } else if (r < D) {
      for (int j = 0; j < D; ++j) Cp[size_t(r) * LD + j] = 0.f;
      np[r] = 0.f;
    }
    for (int u = start; u < t; ++u) {
      const Gates gu(s.ig[size_t(u) * s.lg], s.fg[size_t(u) * s.lg], mp, u == 0);
      if (r < D) {
        const float* vu = s.v + size_t(u) * s.lv;
        const float bk = gu.b * ks * s.k[size_t(u) * s.lk + r];
        for (int j = 0; j < D; ++j) {
          float& c = Cp[size_t(r) * LD + j];
          c = gu.a * c + bk * vu[j];
        }
        np[r] = gu.a * np[r] + gu.b * ks * s.k[size_t(u) * s.lk + r];
      }
      mp = gu.m;
    }
    __syncthreads();
    const float fpre = s.fg[size_t(t) * s.lg];
    const Gates g(s.ig[size_t(t) * s.lg], fpre, mp, t == 0);
    const float* qt = s.q + size_t(t) * s.lq;
    const float* kt = s.k + size_t(t) * s.lk;
    const float* vt = s.v + size_t(t) * s.lv;
    const float* dh = dout + ((size_t(b) * Tn + t) * H + hh) * D;
    // Output: h = num / den, num = C_t^T q, den = max(|n_t . q|, exp(-m_t)) + eps.
    float part = 0.f, hnum = 0.f, nt_r = 0.f;
    if (r < D) {
      nt_r = g.a * np[r] + g.b * ks * kt[r];
      part = nt_r * qt[r];
      const float vj = vt[r];
      for (int i = 0; i < D; ++i) hnum += qt[i] * (g.a * Cp[size_t(i) * LD + r] + g.b * ks * kt[i] * vj);
    }
    const float sdot = block_sum(part, red);
    const float floor_ = expf(-g.m);
    const float den = fmaxf(fabsf(sdot), floor_) + eps;
    float dpart = 0.f;
    if (r < D) {
      dnum[r] = dh[r] / den;
      dpart = dh[r] * (hnum / den);
    }
    const float dhh = block_sum(dpart, red);  // its barriers publish dnum
    const float dden = -dhh / den;
    const float ds = fabsf(sdot) >= floor_ ? (sdot >= 0.f ? dden : -dden) : 0.f;
    dM += eps * dden;
    // Column pass (thread r = column j): dv_j = b sum_i x_ij k'_i, x = dC + q dnum^T.
    if (r < D) {
      const float dj = dnum[r];
      float acc = 0.f;
      for (int i = 0; i < D; ++i) acc += (dC[size_t(i) * LD + r] + qt[i] * dj) * (ks * kt[i]);
      dv[s.ov + size_t(t) * s.lv + r] += g.b * acc;
    }
    __syncthreads();
    // Row pass (thread r = row i).
    float pa = 0.f, pb = 0.f;
    if (r < D) {
      const float qi = qt[r], kpi = ks * kt[r];
      float acc_q = 0.f, acc_u = 0.f, acc_a = 0.f;
      for (int j = 0; j < D; ++j) {
        const float cp = Cp[size_t(r) * LD + j];
        const float ct = g.a * cp + g.b * ks * kt[r] * vt[j];
        acc_q += ct * dnum[j];
        float& dc = dC[size_t(r) * LD + j];
        const float x = dc + qi * dnum[j];
        acc_u += x * vt[j];
        acc_a += x * cp;
        dc = g.a * x;
      }
      const float dni = dn[r] + ds * qi;
      dq[s.oq + size_t(t) * s.lq + r] += acc_q + ds * nt_r;
      acc_a += dni * np[r];
      pa = acc_a;
      pb = kpi * (acc_u + dni);
      dk[s.ok + size_t(t) * s.lk + r] += g.b * ks * (acc_u + dni);
      dn[r] = g.a * dni;
    }
    const float da = block_sum(pa, red);
    const float db = block_sum(pb, red);
    float dlf = t == 0 ? 0.f : da * g.a;
    float di = db * g.b;
    if (g.f_branch) {
      dlf += dM;
    } else {
      di += dM;
      dM = 0.f;
    }
    if (r == 0) {
      dig[s.og + size_t(t) * s.lg] += di;
      dfg[s.og + size_t(t) * s.lg] += dlf * sigm(-fpre);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernels: the parallel (quadratic) form, which the recurrence above equals (the xlstm
// package's own `parallel_stabilized_simple`). With F_i = sum_{s<=i} lf_s (in double, so the
// differences below keep full precision) and m_i the recurrent stabiliser:
//   w_ij = exp(F_i - F_j + igate_j - m_i)  (j <= i),  c_ij = (q_i . k_j / sqrt(D)) w_ij,
//   r_i = sum_j c_ij,  nrm_i = max(|r_i|, exp(-m_i)) + eps,  h_i = sum_j c_ij v_j / nrm_i.
// One block per (b,h) holds the rows of q, k, v (and dh) and the T x T matrices in shared memory.
// Backward, with dp_ij = dh_i . v_j:
//   dh_i . h_i = sum_j c_ij dp_ij / nrm_i,  dnrm_i = -(dh_i . h_i) / nrm_i,
//   dr_i = sign(r_i) dnrm_i where |r_i| >= exp(-m_i) (else 0),  dc_ij = dp_ij / nrm_i + dr_i,
//   dq_i = sum_j dc_ij w_ij k_j / sqrt(D),  dk_j = sum_i dc_ij w_ij q_i / sqrt(D),
//   dv_j = sum_i c_ij dh_i / nrm_i,  dL_ij = dc_ij c_ij (the gradient of the exponent),
//   digate_j = sum_{i>=j} dL_ij,  dlf_s = sum_{i>=s} sum_{j<s} dL_ij.
// The stabiliser: c, r and exp(-m) all scale with exp(-m_i), so the output depends on m_i only
// through eps: dm_i = eps dnrm_i, routed through the recurrence's max exactly as the recurrent
// backward routes it (to lf_t while the forget branch attains the max, else to igate_t).
// No checkpoints: the backward rebuilds everything from q, k, v and the gates.
constexpr int kTileThreads = 128;
constexpr size_t kTileMaxSmem = 128 * 1024;  // above this (backward) the recurrent kernels run

// Layout: rows of q, k, v (dh) padded to TR = T rounded up to 4 rows (zeros) and to DP floats
// (D + 4 where the head dim is a compile-time 16/32/64 and rows are read as float4, else D + 1:
// either way a warp reading consecutive rows hits distinct banks); the T x T matrices as TR x TR
// (row stride TR, a multiple of 4: read as float4 along rows and, four columns at a time, down
// columns), zero outside j <= i < T.
__host__ __device__ inline int tile_rows(int T) { return (T + 3) & ~3; }
__host__ __device__ inline int tile_dp(int D) { return (D == 16 || D == 32 || D == 64) ? D + 4 : D + 1; }
struct TileSmem {
  int q, k, v, dh, w, c, x, vec, f, total;  // offsets in floats (f: T doubles, 8-byte aligned)
};
__host__ __device__ inline TileSmem tile_smem(int T, int D, bool bwd) {
  const int TR = tile_rows(T), rows = TR * tile_dp(D), mat = TR * TR;
  TileSmem s{};
  int o = 0;
  s.q = o; o += rows;
  s.k = o; o += rows;
  s.v = o; o += rows;
  s.dh = o; o += bwd ? rows : 0;
  s.c = o; o += mat;
  s.w = o; o += bwd ? mat : 0;
  s.x = o; o += bwd ? mat : 0;
  s.vec = o; o += 10 * T;  // per-token vectors (lf, igate, m, per-row stats, gate sums)
  o = (o + 1) & ~1;
  s.f = o; o += 2 * T;
  s.total = o;
  return s;
}

// NR sources of T rows of D floats (token strides ld) into shared rows of DP, rows T..TR-1 zero;
// float4 where DT is set and the rows are 16-byte aligned, all sources' loads in one loop (in
// flight together: ncu showed the block waiting on them).
template <int DT, int NR>
__device__ __forceinline__ void load_rows(float* const (&dst)[NR], const float* const (&src)[NR], const int (&ld)[NR],
                                          int T, int D, int DP) {
  const int TR = tile_rows(T);
  bool vec = DT != 0;
#pragma unroll
  for (int r = 0; r < NR; ++r) vec = vec && ld[r] % 4 == 0 && reinterpret_cast<uintptr_t>(src[r]) % 16 == 0;
  if (vec) {
    constexpr int V = DT / 4 > 0 ? DT / 4 : 1;
    for (int x = threadIdx.x; x < TR * V; x += blockDim.x) {
      const int t = x / V, c = (x - t * V) * 4;
      float4 v[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r)
        v[r] = t < T ? __ldg(reinterpret_cast<const float4*>(src[r] + size_t(t) * ld[r] + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int r = 0; r < NR; ++r) *reinterpret_cast<float4*>(dst[r] + t * DP + c) = v[r];
    }
    return;
  }
  for (int x = threadIdx.x; x < TR * D; x += blockDim.x) {
    const int t = x / D, c = x - t * D;
    float v[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) v[r] = t < T ? __ldg(src[r] + size_t(t) * ld[r] + c) : 0.f;
#pragma unroll
    for (int r = 0; r < NR; ++r) dst[r][t * DP + c] = v[r];
  }
}
// DT: the head dim at compile time (16, 32, 64: float4 rows), or 0 (any D, scalar).
template <int DT>
__device__ __forceinline__ float row_dot(const float* a, const float* b, int D) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if constexpr (DT != 0) {
#pragma unroll
    for (int c = 0; c < DT; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(a + c), y = *reinterpret_cast<const float4*>(b + c);
      acc[0] = fmaf(x.x, y.x, acc[0]);
      acc[1] = fmaf(x.y, y.y, acc[1]);
      acc[2] = fmaf(x.z, y.z, acc[2]);
      acc[3] = fmaf(x.w, y.w, acc[3]);
    }
  } else {
#pragma unroll 4
    for (int c = 0; c < D; ++c) acc[c & 3] = fmaf(a[c], b[c], acc[c & 3]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
using ::lrnn::cuda::warp_sum;
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void fma4(float (&acc)[4], float4 m, float x) {
  acc[0] = fmaf(m.x, x, acc[0]);
  acc[1] = fmaf(m.y, x, acc[1]);
  acc[2] = fmaf(m.z, x, acc[2]);
  acc[3] = fmaf(m.w, x, acc[3]);
}
// acc[k] = sum_{j < r0 + 4} M[r0 + k][j] X[j][c] for the four rows r0.. of a lower-triangular M
// (zero right of the diagonal): M rows as float4, X down column c.
__device__ __forceinline__ void tri_rows(float (&acc)[4], const float* M, int TR, int r0, const float* X, int DP,
                                         int c) {
  for (int j = 0; j < r0 + 4; j += 4) {
    const float x0 = X[j * DP + c], x1 = X[(j + 1) * DP + c], x2 = X[(j + 2) * DP + c], x3 = X[(j + 3) * DP + c];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 m = ld4(M + (r0 + k) * TR + j);
      acc[k] = fmaf(m.x, x0, fmaf(m.y, x1, fmaf(m.z, x2, fmaf(m.w, x3, acc[k]))));
    }
  }
}

// Loads the gates of the sequence: lf, igate into shared vectors; thread 0 then walks the
// recurrence for F (double), m and the branch flags (fb: 1 where m_t = lf_t + m_{t-1}).
__device__ void tile_gates(float* lf, float* ig, float* m, float* fb, double* F, const Views& s, int T) {
  for (int t = threadIdx.x; t < T; t += blockDim.x) {
    lf[t] = log_sigm(s.fg[size_t(t) * s.lg]);
    ig[t] = s.ig[size_t(t) * s.lg];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double acc = 0.0;
    float mp = 0.f;
    for (int t = 0; t < T; ++t) {
      acc += double(lf[t]);
      F[t] = acc;
      const bool f_branch = t > 0 && lf[t] + mp >= ig[t];
      mp = f_branch ? lf[t] + mp : ig[t];
      m[t] = mp;
      fb[t] = f_branch ? 1.f : 0.f;
    }
  }
  __syncthreads();
}

template <int DT>
__global__ void __launch_bounds__(kTileThreads) mlstm_tile_forward(float* __restrict__ hout,
                                                                   const float* __restrict__ q,
                                                                   const float* __restrict__ k,
                                                                   const float* __restrict__ v,
                                                                   const float* __restrict__ ig,
                                                                   const float* __restrict__ fg, MLSTMDims d) {
  extern __shared__ __align__(16) float sm[];
  const int bh = blockIdx.x, b = bh / d.H, hh = bh % d.H, T = d.T, D = DT ? DT : d.D, DP = tile_dp(D);
  const int TR = tile_rows(T), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const TileSmem L = tile_smem(T, D, false);
  float *Qs = sm + L.q, *Ks = sm + L.k, *Vs = sm + L.v, *Cm = sm + L.c, *vec = sm + L.vec;
  float *lf = vec, *igs = vec + T, *ms = vec + 2 * T, *fb = vec + 3 * T, *inv = vec + 4 * T;
  double* F = reinterpret_cast<double*>(sm + L.f);
  const Views s = views(d, b, hh, q, k, v, ig, fg);
  load_rows<DT, 3>({Qs, Ks, Vs}, {s.q, s.k, s.v}, {s.lq, s.lk, s.lv}, T, D, DP);
  tile_gates(lf, igs, ms, fb, F, s, T);
  const float ks = 1.f / sqrtf(float(D)), eps = float(kMLSTMEps);
  for (int x = tid; x < TR * TR; x += blockDim.x) {
    const int i = x / TR, j = x - i * TR;
    Cm[x] = j <= i && i < T
                ? ks * row_dot<DT>(Qs + i * DP, Ks + j * DP, D) * expf(float(F[i] - F[j]) + igs[j] - ms[i])
                : 0.f;
  }
  __syncthreads();
  for (int i = warp; i < T; i += nw) {
    float r = 0.f;
    for (int j = lane; j <= i; j += 32) r += Cm[i * TR + j];
    r = warp_sum(r);
    if (lane == 0) inv[i] = 1.f / (fmaxf(fabsf(r), expf(-ms[i])) + eps);
  }
  __syncthreads();
  float* O = hout + (size_t(b) * T * d.H + hh) * D;
  const size_t ldo = size_t(d.H) * D;
  for (int x = tid; x < (TR / 4) * D; x += blockDim.x) {
    const int r0 = (x / D) * 4, c = x - (x / D) * D;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    tri_rows(acc, Cm, TR, r0, Vs, DP, c);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      if (r0 + kk < T) O[(r0 + kk) * ldo + c] = acc[kk] * inv[r0 + kk];
  }
}

template <int DT>
__global__ void __launch_bounds__(kTileThreads) mlstm_tile_backward(
    float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ dig,
    float* __restrict__ dfg, const float* __restrict__ dout, const float* __restrict__ q, const float* __restrict__ k,
    const float* __restrict__ v, const float* __restrict__ ig, const float* __restrict__ fg, MLSTMDims d) {
  extern __shared__ __align__(16) float sm[];
  const int bh = blockIdx.x, b = bh / d.H, hh = bh % d.H, T = d.T, D = DT ? DT : d.D, DP = tile_dp(D);
  const int TR = tile_rows(T), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const TileSmem L = tile_smem(T, D, true);
  float *Qs = sm + L.q, *Ks = sm + L.k, *Vs = sm + L.v, *Gs = sm + L.dh, *Cm = sm + L.c, *Wm = sm + L.w,
        *Xm = sm + L.x, *vec = sm + L.vec;
  float *lf = vec, *igs = vec + T, *ms = vec + 2 * T, *fb = vec + 3 * T, *inv = vec + 4 * T, *drs = vec + 5 * T,
        *dms = vec + 6 * T, *col = vec + 7 * T, *pre = vec + 8 * T, *dia = vec + 9 * T;
  double* F = reinterpret_cast<double*>(sm + L.f);
  const Views s = views(d, b, hh, q, k, v, ig, fg);
  const size_t ldo = size_t(d.H) * D;
  load_rows<DT, 4>({Qs, Ks, Vs, Gs}, {s.q, s.k, s.v, dout + (size_t(b) * T * d.H + hh) * D},
                   {s.lq, s.lk, s.lv, int(ldo)}, T, D, DP);
  tile_gates(lf, igs, ms, fb, F, s, T);
  const float ks = 1.f / sqrtf(float(D)), eps = float(kMLSTMEps);
  for (int x = tid; x < TR * TR; x += blockDim.x) {
    const int i = x / TR, j = x - i * TR;
    float w = 0.f, c = 0.f, dp = 0.f;
    if (j <= i && i < T) {
      w = expf(float(F[i] - F[j]) + igs[j] - ms[i]);
      c = ks * row_dot<DT>(Qs + i * DP, Ks + j * DP, D) * w;
      dp = row_dot<DT>(Gs + i * DP, Vs + j * DP, D);
    }
    Wm[x] = w;
    Cm[x] = c;
    Xm[x] = dp;
  }
  __syncthreads();
  for (int i = warp; i < T; i += nw) {  // per row: r, dh . h -> 1/nrm, dr, dm
    float r = 0.f, hd = 0.f;
    for (int j = lane; j <= i; j += 32) {
      const float c = Cm[i * TR + j];
      r += c;
      hd = fmaf(c, Xm[i * TR + j], hd);
    }
    r = warp_sum(r);
    hd = warp_sum(hd);
    if (lane == 0) {
      const float floor_ = expf(-ms[i]);
      const float in = 1.f / (fmaxf(fabsf(r), floor_) + eps);
      const float dnrm = -hd * in * in;
      inv[i] = in;
      drs[i] = fabsf(r) >= floor_ ? (r >= 0.f ? dnrm : -dnrm) : 0.f;
      dms[i] = eps * dnrm;
    }
  }
  __syncthreads();
  for (int x = tid; x < TR * TR; x += blockDim.x) {
    const int i = x / TR, j = x - i * TR;
    if (j <= i && i < T) {
      const float c = Cm[x], dc = fmaf(Xm[x], inv[i], drs[i]);
      Xm[x] = dc * Wm[x];  // ds (without 1/sqrt(D))
      Wm[x] = dc * c;      // dL
      Cm[x] = c * inv[i];
    }
  }
  __syncthreads();
  float* dQ = dq + s.oq;
  float* dK = dk + s.ok;
  float* dV = dv + s.ov;
  for (int x = tid; x < (TR / 4) * D; x += blockDim.x) {  // rows r0..r0+3, column c
    const int r0 = (x / D) * 4, c = x - (x / D) * D;
    // The outputs' old values first: their loads overlap the sums.
    float oq[4], ok[4], ov[4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const bool in = r0 + kk < T;
      oq[kk] = in ? dQ[size_t(r0 + kk) * s.lq + c] : 0.f;
      ok[kk] = in ? dK[size_t(r0 + kk) * s.lk + c] : 0.f;
      ov[kk] = in ? dV[size_t(r0 + kk) * s.lv + c] : 0.f;
    }
    float aq[4] = {0.f, 0.f, 0.f, 0.f}, ak[4] = {0.f, 0.f, 0.f, 0.f}, av[4] = {0.f, 0.f, 0.f, 0.f};
    tri_rows(aq, Xm, TR, r0, Ks, DP, c);  // queries r0..: sum_{j <= r} ds_rj k_j
    for (int i = r0; i < T; ++i) {       // keys r0..: sum_{i >= r} ds_ir q_i, c_ir dh_i / nrm_i
      fma4(ak, ld4(Xm + i * TR + r0), Qs[i * DP + c]);
      fma4(av, ld4(Cm + i * TR + r0), Gs[i * DP + c]);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      if (r0 + kk < T) {
        dQ[size_t(r0 + kk) * s.lq + c] = oq[kk] + ks * aq[kk];
        dK[size_t(r0 + kk) * s.lk + c] = ok[kk] + ks * ak[kk];
        dV[size_t(r0 + kk) * s.lv + c] = ov[kk] + av[kk];
      }
  }
  // Gate sums of dL (read-only above, so no barrier before): column s, row s left of the diagonal.
  for (int t = tid; t < T; t += blockDim.x) {
    float cs = 0.f, ps = 0.f;
    for (int i = t; i < T; ++i) cs += Wm[i * TR + t];
    for (int j = 0; j < t; ++j) ps += Wm[t * TR + j];
    col[t] = cs;
    pre[t] = ps;
    dia[t] = Wm[t * TR + t];
  }
  __syncthreads();
  if (tid == 0) {
    // dlf_s = sum_{i>=s} sum_{j<s} dL_ij: B_0 = 0, B_{s+1} = B_s - (row s left of the diagonal)
    // + (column s below the diagonal).
    double B = 0.0;
    for (int t = 0; t < T; ++t) {
      const double next = B - double(pre[t]) + (double(col[t]) - double(dia[t]));
      pre[t] = float(B);  // dlf_t
      B = next;
    }
    float dM = 0.f;
    for (int t = T - 1; t >= 0; --t) {
      dM += dms[t];
      float dlf = pre[t], di = col[t];
      if (fb[t] != 0.f) {
        dlf += dM;
      } else {
        di += dM;
        dM = 0.f;
      }
      pre[t] = dlf;
      col[t] = di;
    }
  }
  __syncthreads();
  for (int t = tid; t < T; t += blockDim.x) {
    dig[s.og + size_t(t) * s.lg] += col[t];
    dfg[s.og + size_t(t) * s.lg] += pre[t] * sigm(-s.fg[size_t(t) * s.lg]);
  }
}

using ::lrnn::cuda::max_smem_optin;

std::atomic<int> g_kernel{int(MlstmKernel::Auto)};

// Shared memory of the tile kernel for these dims, or 0 where the recurrent kernels run.
// Whether the tile kernels run follows from the backward's size, for the forward too (a tile
// forward writes no checkpoints for a recurrent backward).
size_t tile_bytes(const MLSTMDims& d, bool bwd) {
  if (MlstmKernel(g_kernel.load()) != MlstmKernel::Auto) return 0;
  const size_t need = sizeof(float) * size_t(tile_smem(d.T, d.D, true).total);
  if (need > std::min<size_t>(kTileMaxSmem, size_t(max_smem_optin()))) return 0;
  return sizeof(float) * size_t(tile_smem(d.T, d.D, bwd).total);
}

template <int DT>
struct TileForward {
  static constexpr auto fn = mlstm_tile_forward<DT>;
};
template <int DT>
struct TileBackward {
  static constexpr auto fn = mlstm_tile_backward<DT>;
};

// Launches K<DT>::fn, a block per (b,h), if its shared memory fits; false where the recurrent
// kernels must run instead.
template <template <int> class K, class... Args>
bool launch_tile(const MLSTMDims& d, bool bwd, Args... args) {
  const size_t bytes = tile_bytes(d, bwd);
  if (!bytes) return false;
  ::lrnn::cuda::launch_by_head_dim<K>(d.D, unsigned(d.B * d.H), kTileThreads, bytes, kTileMaxSmem, args...);
  return true;
}

template <class K>
void allow_smem(K kernel, size_t smem, bool& done) {
  LRNN_CHECK(smem <= size_t(max_smem_optin()), "mLSTM head dim too large for the CUDA kernel ({} bytes of shared memory)",
             smem);
  if (smem > 48 * 1024 && !done) {
    ::lrnn::cuda::allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
    done = true;
  }
}

unsigned threads_for(int D) { return unsigned(((D + 31) / 32) * 32); }

}  // namespace

void set_mlstm_kernel(MlstmKernel k) { g_kernel.store(int(k)); }

void mlstm_forward(float* h, const float* q, const float* k, const float* v, const float* igate, const float* fgate,
                   const MLSTMDims& d, float* ckpt) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.H > 0 && d.D > 0 && d.D <= 1024, "bad mLSTM dims");
  if (d.T == 0) return;
  if (launch_tile<TileForward>(d, false, h, q, k, v, igate, fgate, d)) return;
  const size_t smem = (size_t(d.D) * (d.D + 1) + d.D + 32) * sizeof(float);
  static bool done = false;
  allow_smem(mlstm_forward_kernel, smem, done);
  mlstm_forward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(h, q, k, v, igate,
                                                                                               fgate, d, ckpt);
  LRNN_CUDA_LAUNCH_CHECK();
}

void mlstm_backward(float* dq, float* dk, float* dv, float* digate, float* dfgate, const float* dh, const float* q,
                    const float* k, const float* v, const float* igate, const float* fgate, const MLSTMDims& d,
                    const float* ckpt) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.H > 0 && d.D > 0 && d.D <= 1024, "bad mLSTM dims");
  if (d.T == 0) return;
  if (launch_tile<TileBackward>(d, true, dq, dk, dv, digate, dfgate, dh, q, k, v, igate, fgate, d)) return;
  const size_t smem = (2 * size_t(d.D) * (d.D + 1) + 3 * size_t(d.D) + 32) * sizeof(float);
  static bool done = false;
  allow_smem(mlstm_backward_kernel, smem, done);
  mlstm_backward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(
      dq, dk, dv, digate, dfgate, dh, q, k, v, igate, fgate, d, ckpt);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
