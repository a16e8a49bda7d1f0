// CUDA mLSTM cell (contract: mlstm_cell_cuda.h / mlstm_cell.h). One block per (batch row b, head
// h), one thread per row i / column j of the D x D state C (row-padded in shared memory, so row
// and column walks are both free of bank conflicts), walking the tokens in order.
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

using ::lrnn::cuda::max_smem_optin;

template <class K>
void allow_smem(K kernel, size_t smem, bool& done) {
  LRNN_CHECK(smem <= size_t(max_smem_optin()), "mLSTM head dim too large for the CUDA kernel ({} bytes of shared memory)",
             smem);
  if (smem > 48 * 1024 && !done) {
    LRNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_optin()));
    done = true;
  }
}

unsigned threads_for(int D) { return unsigned(((D + 31) / 32) * 32); }

}  // namespace

void mlstm_forward(float* h, const float* q, const float* k, const float* v, const float* igate, const float* fgate,
                   const MLSTMDims& d, float* ckpt) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.H > 0 && d.D > 0 && d.D <= 1024, "bad mLSTM dims");
  if (d.T == 0) return;
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
  const size_t smem = (2 * size_t(d.D) * (d.D + 1) + 3 * size_t(d.D) + 32) * sizeof(float);
  static bool done = false;
  allow_smem(mlstm_backward_kernel, smem, done);
  mlstm_backward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(
      dq, dk, dv, digate, dfgate, dh, q, k, v, igate, fgate, d, ckpt);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
