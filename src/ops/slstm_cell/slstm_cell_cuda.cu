// CUDA sLSTM cell (contract: slstm_cell_cuda.h / slstm_cell.h). One block per (batch row b, head
// h) walks the tokens in order; its threads stride over the 4*D gate pre-activations (the
// recurrent term reads y_{t-1} of the head from shared memory and R from global/L2), then over
// the D units (the pointwise update). State c, n, m and y_{t-1} live in shared memory.
// Backward walks the tokens in reverse with the carried dy (R^T dg), dc, dn in shared memory;
// dR [D][4D] and dbias [4D] of the head are summed in shared memory when they fit (else straight
// into global memory with atomics) and added to the outputs with one atomicAdd per element.
#include "ops/slstm_cell/slstm_cell_cuda.h"
#include "core/check.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float log_sigm(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }

unsigned threads_for(int D) {
  int t = ((4 * D + 31) / 32) * 32;
  return unsigned(t > 1024 ? 1024 : t);
}

// smem: yp[D] raw[4D] c[D] n[D] m[D]
__global__ void slstm_forward_kernel(float* __restrict__ y, const float* __restrict__ wx, const float* __restrict__ R,
                                     const float* __restrict__ bias, int Tn, int H, int D, int lx,
                                     float* __restrict__ saved) {
  extern __shared__ float sm[];
  float *yp = sm, *raw = sm + D, *cs = raw + 4 * D, *ns = cs + D, *ms = ns + D;
  const int b = blockIdx.x / H, h = blockIdx.x % H, C = H * D, G4 = 4 * D;
  for (int j = threadIdx.x; j < D; j += blockDim.x) yp[j] = cs[j] = ns[j] = ms[j] = 0.f;
  __syncthreads();
  const float* Rh = R + size_t(h) * D * G4;
  for (int t = 0; t < Tn; ++t) {
    const size_t n = size_t(b) * Tn + t;
    const float* x = wx + n * lx;
    for (int gj = threadIdx.x; gj < G4; gj += blockDim.x) {
      const int g = gj / D, j = gj % D;
      float r = x[size_t(g) * C + size_t(h) * D + j] + bias[(size_t(h) * 4 + g) * D + j];
      if (t > 0)
        for (int a = 0; a < D; ++a) r += yp[a] * Rh[size_t(a) * G4 + gj];
      raw[gj] = r;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
      const int u = h * D + j;
      const float ir = raw[j], fr = raw[D + j], zr = raw[2 * D + j], orr = raw[3 * D + j];
      const float lf = log_sigm(fr);
      const float mn = t == 0 ? ir : fmaxf(ir, lf + ms[j]);
      const float ig = expf(ir - mn);
      const float fg = t == 0 ? 0.f : expf(lf + ms[j] - mn);
      const float c = fg * cs[j] + ig * tanhf(zr);
      const float nn = fg * ns[j] + ig;
      const float yt = sigm(orr) * c / nn;
      cs[j] = c;
      ns[j] = nn;
      ms[j] = mn;
      yp[j] = yt;
      y[n * C + u] = yt;
      if (saved) {
        float* cur = saved + n * 7 * C;
        cur[u] = ir;
        cur[C + u] = fr;
        cur[2 * C + u] = zr;
        cur[3 * C + u] = orr;
        cur[4 * C + u] = c;
        cur[5 * C + u] = nn;
        cur[6 * C + u] = mn;
      }
    }
    __syncthreads();
  }
}

// smem: dg[4D] dyr[D] dc[D] dn[D] yp[D] dbs[4D] (+ dRs[D*4D] when use_smem)
__global__ void slstm_backward_kernel(float* __restrict__ dwx, float* __restrict__ dR, float* __restrict__ dbias,
                                      const float* __restrict__ dy, const float* __restrict__ R,
                                      const float* __restrict__ y, int Tn, int H, int D, int lx,
                                      const float* __restrict__ saved, bool use_smem) {
  extern __shared__ float sm[];
  const int G4 = 4 * D, C = H * D;
  float *dg = sm, *dyr = dg + G4, *dc = dyr + D, *dn = dc + D, *yp = dn + D, *dbs = yp + D, *dRs = dbs + G4;
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const float* Rh = R + size_t(h) * D * G4;
  float* dRh = dR ? dR + size_t(h) * D * G4 : nullptr;
  for (int j = threadIdx.x; j < D; j += blockDim.x) dyr[j] = dc[j] = dn[j] = 0.f;
  for (int gj = threadIdx.x; gj < G4; gj += blockDim.x) dbs[gj] = 0.f;
  if (use_smem)
    for (int e = threadIdx.x; e < D * G4; e += blockDim.x) dRs[e] = 0.f;
  __syncthreads();
  for (int t = Tn - 1; t >= 0; --t) {
    const size_t n = size_t(b) * Tn + t;
    const float* cur = saved + n * 7 * C;
    const float* prev = t > 0 ? cur - 7 * C : nullptr;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
      const int u = h * D + j;
      const float ir = cur[u], fr = cur[C + u], zr = cur[2 * C + u], orr = cur[3 * C + u];
      const float nn = cur[5 * C + u], m = cur[6 * C + u];
      const float yt = y[n * C + u];
      const float o = sigm(orr), z = tanhf(zr), ig = expf(ir - m);
      const float dyu = dy[n * C + u] + dyr[j];
      const float dct = dc[j] + dyu * o / nn;
      const float dnt = dn[j] - dyu * yt / nn;
      dg[j] = ig * (z * dct + dnt);
      dg[2 * D + j] = dct * ig * (1.f - z * z);
      dg[3 * D + j] = dyu * yt * (1.f - o);
      if (prev) {
        const float fg = expf(log_sigm(fr) + prev[6 * C + u] - m);
        dg[D + j] = fg * (dct * prev[4 * C + u] + dnt * prev[5 * C + u]) * sigm(-fr);
        dc[j] = fg * dct;
        dn[j] = fg * dnt;
        yp[j] = y[(n - 1) * C + u];
      } else {
        dg[D + j] = 0.f;
        yp[j] = 0.f;
      }
    }
    __syncthreads();
    float* dx = dwx + n * lx;
    for (int gj = threadIdx.x; gj < G4; gj += blockDim.x) {
      const int g = gj / D, j = gj % D;
      dx[size_t(g) * C + size_t(h) * D + j] += dg[gj];
      dbs[gj] += dg[gj];
    }
    if (t > 0) {
      for (int a = threadIdx.x; a < D; a += blockDim.x) {
        const float* row = Rh + size_t(a) * G4;
        float acc = 0.f;
        for (int gj = 0; gj < G4; ++gj) acc += row[gj] * dg[gj];
        dyr[a] = acc;
      }
      if (dRh)
        for (int e = threadIdx.x; e < D * G4; e += blockDim.x) {
          const float v = yp[e / G4] * dg[e % G4];
          if (use_smem) dRs[e] += v;
          else atomicAdd(dRh + e, v);
        }
    }
    __syncthreads();
  }
  if (dbias)
    for (int gj = threadIdx.x; gj < G4; gj += blockDim.x) atomicAdd(dbias + size_t(h) * G4 + gj, dbs[gj]);
  if (dRh && use_smem)
    for (int e = threadIdx.x; e < D * G4; e += blockDim.x) atomicAdd(dRh + e, dRs[e]);
}

using ::lrnn::cuda::max_smem_optin;

}  // namespace

void slstm_forward(float* y, const float* wx, const float* R, const float* bias, const SLSTMDims& d, float* saved) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.H > 0 && d.D > 0, "bad sLSTM dims");
  if (d.T == 0) return;
  const size_t smem = size_t(8) * d.D * sizeof(float);
  LRNN_CHECK(smem <= 48 * 1024, "sLSTM head dim {} too large for the CUDA kernel", d.D);
  slstm_forward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(
      y, wx, R, bias, d.T, d.H, d.D, d.lx(), saved);
  LRNN_CUDA_LAUNCH_CHECK();
}

void slstm_backward(float* dwx, float* dR, float* dbias, const float* dy, const float* wx, const float* R,
                    const float* bias, const float* y, const SLSTMDims& d, const float* saved) {
  LRNN_CHECK(saved != nullptr, "slstm_backward needs the forward's saved states");
  (void)wx;
  (void)bias;
  if (d.T == 0) return;
  const size_t base = size_t(12) * d.D * sizeof(float);
  const size_t full = base + size_t(4) * d.D * d.D * sizeof(float);
  const bool use_smem = dR && full <= size_t(max_smem_optin());
  const size_t smem = use_smem ? full : base;
  if (smem > 48 * 1024) {
    static bool set = false;  // the opt-in, once (before any graph capture uses it)
    if (!set) {
      LRNN_CUDA_CHECK(cudaFuncSetAttribute(slstm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           max_smem_optin()));
      set = true;
    }
  }
  slstm_backward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(
      dwx, dR, dbias, dy, R, y, d.T, d.H, d.D, d.lx(), saved, use_smem);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
