// CUDA sLSTM cell (contract: slstm_cell_cuda.h / slstm_cell.h). Head dims 8, 16 and 32 run the
// lane kernels (below: a group of lanes per sequence, no barriers). Other head dims run the
// block kernels: one block per (batch row b, head h) walks the tokens in order; its threads
// stride over the 4*D gate pre-activations (the recurrent term reads y_{t-1} of the head from
// shared memory and R from global/L2), then over the D units (the pointwise update). State c, n, m and y_{t-1} live in shared memory.
// Backward walks the tokens in reverse with the carried dy (R^T dg), dc, dn in shared memory;
// dR [D][4D] and dbias [4D] of the head are summed in shared memory when they fit (else straight
// into global memory with atomics) and added to the outputs with one atomicAdd per element.
#include "ops/slstm_cell/slstm_cell_cuda.h"
#include "core/check.h"
#include "cuda/runtime.h"
#include "ops/elementwise/elementwise_cuda.h"

#include <algorithm>
#include <atomic>
#include <type_traits>

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

// ---------------------------------------------------------------------------------------------
// Lane kernels (D = 8, 16, 32): a group of D lanes per (batch row, head) sequence, lane j owning
// unit j, 32 / D sequences of one head per warp; the recurrence needs no barrier. The recurrent
// term of unit j, sum_a y_{t-1}[a] R[a,g,j], takes y_{t-1}[a] from lane a by a shuffle.
// Forward: the column R[.,g,j] of every gate in registers (4 D floats).
// Backward: R of the head in shared memory; dy_{t-1}[a] = sum_{g,j} R[a,g,j] dg[g,j] is a sum over
// the group's lanes of per-lane vectors (lane j: R[a,.,j] . dg[.,j] for every a), done by
// recursive halving (D - 1 shuffles; lane a ends with entry a). Lane j keeps dR[a,g,j] and
// dbias[g,j] of its sequences in registers; a block (P blocks per head, each walking every P-th
// group of sequences) adds its warps' sums in a fixed order and writes them to scratch, and
// add_partials sums the P blocks (deterministic: no atomics).
constexpr int kLaneWarps = 4;

template <int D>
__global__ void __launch_bounds__(kLaneWarps * 32) slstm_lane_forward(float* __restrict__ y,
                                                                     const float* __restrict__ wx,
                                                                     const float* __restrict__ R,
                                                                     const float* __restrict__ bias, int B, int Tn,
                                                                     int H, int lx, float* __restrict__ saved) {
  constexpr int SPW = 32 / D, G4 = 4 * D;
  const int lane = threadIdx.x & 31, j = lane & (D - 1), base = lane & ~(D - 1);
  const int gw = blockIdx.x * kLaneWarps + (threadIdx.x >> 5);
  const int h = gw % H, b = (gw / H) * SPW + lane / D, C = H * D, u = h * D + j;
  if ((gw / H) * SPW >= B) return;  // whole warp past the batch
  const bool active = b < B;
  float Rr[D][4], bi[4];
  const float* Rh = R + size_t(h) * D * G4;
#pragma unroll
  for (int a = 0; a < D; ++a)
#pragma unroll
    for (int g = 0; g < 4; ++g) Rr[a][g] = __ldg(Rh + a * G4 + g * D + j);
#pragma unroll
  for (int g = 0; g < 4; ++g) bi[g] = __ldg(bias + h * G4 + g * D + j);
  float yp = 0.f, cs = 0.f, ns = 0.f, ms = 0.f;
  // Token t's inputs are loaded during step t - 1 (their latency overlaps a step's work).
  float xin[4];
  auto load = [&](int t, float (&v)[4]) {
    const float* x = wx + (size_t(active ? b : 0) * Tn + t) * lx + u;
#pragma unroll
    for (int g = 0; g < 4; ++g) v[g] = active && t < Tn ? __ldg(x + g * C) : 0.f;
  };
  load(0, xin);
  for (int t = 0; t < Tn; ++t) {
    const size_t n = size_t(active ? b : 0) * Tn + t;
    float raw[4], xnext[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) raw[g] = xin[g] + bi[g];
    load(t + 1, xnext);
#pragma unroll
    for (int g = 0; g < 4; ++g) xin[g] = xnext[g];
    if (t > 0) {
#pragma unroll
      for (int a = 0; a < D; ++a) {
        const float ya = __shfl_sync(0xffffffffu, yp, base + a);
#pragma unroll
        for (int g = 0; g < 4; ++g) raw[g] = fmaf(ya, Rr[a][g], raw[g]);
      }
    }
    const float ir = raw[0], fr = raw[1], zr = raw[2], orr = raw[3];
    const float lf = log_sigm(fr);
    const float mn = t == 0 ? ir : fmaxf(ir, lf + ms);
    const float ig = expf(ir - mn);
    const float fg = t == 0 ? 0.f : expf(lf + ms - mn);
    const float c = fg * cs + ig * tanhf(zr);
    const float nn = fg * ns + ig;
    const float yt = sigm(orr) * c / nn;
    cs = c;
    ns = nn;
    ms = mn;
    yp = yt;
    if (active) {
      y[n * C + u] = yt;
      if (saved) {
        float* cur = saved + n * 7 * C + u;
        cur[0] = ir;
        cur[C] = fr;
        cur[2 * C] = zr;
        cur[3 * C] = orr;
        cur[4 * C] = c;
        cur[5 * C] = nn;
        cur[6 * C] = mn;
      }
    }
  }
}

// The sum over the D lanes of a group of each lane's vector v[0..D-1]; lane j of the group ends
// with entry j in v[0].
template <int O, int D>
__device__ __forceinline__ void halve(float (&v)[D], bool upper) {
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = upper ? v[i] : v[i + O];
    const float keep = upper ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
template <int D>
__device__ __forceinline__ void group_transpose_sum(float (&v)[D], int lane) {
  if constexpr (D >= 32) halve<16>(v, lane & 16);
  if constexpr (D >= 16) halve<8>(v, lane & 8);
  if constexpr (D >= 8) halve<4>(v, lane & 4);
  halve<2>(v, lane & 2);
  halve<1>(v, lane & 1);
}

// Blocks (p, h): P per head. smem: Rs [D][4D] (R of head h), then the block's sums dRs [D][4D]
// and dbs [4D].
template <int D>
__global__ void __launch_bounds__(kLaneWarps * 32) slstm_lane_backward(
    float* __restrict__ dwx, float* __restrict__ dR_part, float* __restrict__ db_part, const float* __restrict__ dy,
    const float* __restrict__ R, const float* __restrict__ y, int B, int Tn, int H, int lx,
    const float* __restrict__ saved) {
  constexpr int SPW = 32 / D, G4 = 4 * D;
  extern __shared__ float sm[];
  float *Rs = sm, *dRs = sm + D * G4, *dbs = dRs + D * G4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = lane & (D - 1), base = lane & ~(D - 1);
  const int p = blockIdx.x, P = gridDim.x, h = blockIdx.y, C = H * D, u = h * D + j;
  const float* Rh = R + size_t(h) * D * G4;
  for (int e = threadIdx.x; e < D * G4; e += blockDim.x) Rs[e] = Rh[e];
  __syncthreads();
  float acc[D][4], db[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int a = 0; a < D; ++a)
#pragma unroll
    for (int g = 0; g < 4; ++g) acc[a][g] = 0.f;
  for (int first = (p * kLaneWarps + warp) * SPW; first < B; first += P * kLaneWarps * SPW) {
    const int b = first + lane / D;
    const bool active = b < B;
    const size_t n0 = size_t(active ? b : 0) * Tn;
    float dyr = 0.f, dc = 0.f, dn = 0.f;
    // Token t's saved values (cur), token t - 1's (prev, with y_{t-1}) and dy_t are in registers
    // when step t starts: each token's loads are issued a step early, so their latency overlaps
    // a step's work (else every step waits on them).
    struct Tok {
      float ir, fr, zr, orr, c, n, m, y;
    };
    auto load = [&](int t) {
      Tok k{};
      if (t >= 0) {
        const float* sv = saved + (n0 + t) * 7 * C + u;
        k = {sv[0], sv[C], sv[2 * C], sv[3 * C], sv[4 * C], sv[5 * C], sv[6 * C], y[(n0 + t) * C + u]};
      }
      return k;
    };
    Tok cur = load(Tn - 1), prev = load(Tn - 2);
    float dy_t = active ? dy[(n0 + Tn - 1) * C + u] : 0.f;
    for (int t = Tn - 1; t >= 0; --t) {
      const size_t n = n0 + t;
      const Tok next = load(t - 2);
      const float dy_next = active && t > 0 ? dy[(n - 1) * C + u] : 0.f;
      const float ir = cur.ir, fr = cur.fr, zr = cur.zr, orr = cur.orr, nn = cur.n, m = cur.m, yt = cur.y;
      const float cp = prev.c, np_ = prev.n, mp = prev.m, ypv = prev.y;
      const float o = sigm(orr), z = tanhf(zr), ig = expf(ir - m);
      const float dyu = dy_t + dyr;
      const float dct = dc + dyu * o / nn;
      const float dnt = dn - dyu * yt / nn;
      float dg[4];
      dg[0] = ig * (z * dct + dnt);
      dg[2] = dct * ig * (1.f - z * z);
      dg[3] = dyu * yt * (1.f - o);
      dg[1] = 0.f;
      if (t > 0) {
        const float fg = expf(log_sigm(fr) + mp - m);
        dg[1] = fg * (dct * cp + dnt * np_) * sigm(-fr);
        dc = fg * dct;
        dn = fg * dnt;
      }
      if (!active) dg[0] = dg[1] = dg[2] = dg[3] = 0.f;
      if (active) {
        float* dx = dwx + n * lx + u;
#pragma unroll
        for (int g = 0; g < 4; ++g) dx[g * C] += dg[g];
      }
#pragma unroll
      for (int g = 0; g < 4; ++g) db[g] += dg[g];
      if (t > 0) {
        float part[D];
#pragma unroll
        for (int a = 0; a < D; ++a) {
          const float* ra = Rs + a * G4 + j;
          part[a] = ra[0] * dg[0] + ra[D] * dg[1] + ra[2 * D] * dg[2] + ra[3 * D] * dg[3];
        }
        group_transpose_sum<D>(part, lane);
        dyr = part[0];
#pragma unroll
        for (int a = 0; a < D; ++a) {
          const float ya = __shfl_sync(0xffffffffu, ypv, base + a);
#pragma unroll
          for (int g = 0; g < 4; ++g) acc[a][g] = fmaf(ya, dg[g], acc[a][g]);
        }
      }
      cur = prev;
      prev = next;
      dy_t = dy_next;
    }
  }
  // The warp's groups (fixed butterfly), then the block's warps in order, then scratch.
#pragma unroll
  for (int o = D; o < 32; o <<= 1) {
#pragma unroll
    for (int a = 0; a < D; ++a)
#pragma unroll
      for (int g = 0; g < 4; ++g) acc[a][g] += __shfl_xor_sync(0xffffffffu, acc[a][g], o);
#pragma unroll
    for (int g = 0; g < 4; ++g) db[g] += __shfl_xor_sync(0xffffffffu, db[g], o);
  }
  for (int w = 0; w < kLaneWarps; ++w) {
    if (warp == w && lane < D) {
#pragma unroll
      for (int a = 0; a < D; ++a)
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          float& s = dRs[a * G4 + g * D + j];
          s = w ? s + acc[a][g] : acc[a][g];
        }
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        float& s = dbs[g * D + j];
        s = w ? s + db[g] : db[g];
      }
    }
    __syncthreads();
  }
  float* dst = dR_part + (size_t(p) * H + h) * D * G4;
  for (int e = threadIdx.x; e < D * G4; e += blockDim.x) dst[e] = dRs[e];
  float* dstb = db_part + (size_t(p) * H + h) * G4;
  for (int e = threadIdx.x; e < G4; e += blockDim.x) dstb[e] = dbs[e];
}

using ::lrnn::cuda::max_smem_optin;

std::atomic<int> g_kernel{int(SlstmKernel::Auto)};

bool use_lanes(const SLSTMDims& d) {
  return SlstmKernel(g_kernel.load()) == SlstmKernel::Auto && (d.D == 8 || d.D == 16 || d.D == 32);
}

// Calls f(std::integral_constant<int, D>) for the lane kernels' head dims.
template <class F>
void lane_dispatch(int D, F&& f) {
  switch (D) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, 32>{});
  }
}

}  // namespace

void set_slstm_kernel(SlstmKernel k) { g_kernel.store(int(k)); }

void slstm_forward(float* y, const float* wx, const float* R, const float* bias, const SLSTMDims& d, float* saved) {
  LRNN_CHECK(d.B > 0 && d.T >= 0 && d.H > 0 && d.D > 0, "bad sLSTM dims");
  if (d.T == 0) return;
  if (use_lanes(d)) {
    lane_dispatch(d.D, [&](auto dt) {
      constexpr int D = decltype(dt)::value;
      const int warps = d.H * ((d.B + 32 / D - 1) / (32 / D));
      slstm_lane_forward<D><<<unsigned((warps + kLaneWarps - 1) / kLaneWarps), kLaneWarps * 32, 0,
                              ::lrnn::cuda::stream()>>>(y, wx, R, bias, d.B, d.T, d.H, d.lx(), saved);
    });
    LRNN_CUDA_LAUNCH_CHECK();
    return;
  }
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
  if (use_lanes(d)) {
    lane_dispatch(d.D, [&](auto dt) {
      constexpr int D = decltype(dt)::value;
      // P blocks per head, as many as give each warp one group of sequences, within the scratch.
      const size_t per = size_t(d.H) * (4 * D * D + 4 * D);  // floats of one block column's sums
      const int groups = (d.B + 32 / D - 1) / (32 / D);
      const int cap = int(::lrnn::cuda::kScratchBytes / (per * sizeof(float)));
      const int P = std::max(1, std::min((groups + kLaneWarps - 1) / kLaneWarps, cap));
      auto* part = static_cast<float*>(::lrnn::cuda::scratch(size_t(P) * per * sizeof(float)));
      float* dR_part = part;
      float* db_part = part + size_t(P) * d.H * 4 * D * D;
      const size_t smem = (size_t(2) * 4 * D * D + 4 * D) * sizeof(float);
      slstm_lane_backward<D><<<dim3(unsigned(P), unsigned(d.H)), kLaneWarps * 32, smem, ::lrnn::cuda::stream()>>>(
          dwx, dR_part, db_part, dy, R, y, d.B, d.T, d.H, d.lx(), saved);
      LRNN_CUDA_LAUNCH_CHECK();
      if (dR) add_partials(dR, dR_part, P, size_t(d.H) * 4 * D * D);
      if (dbias) add_partials(dbias, db_part, P, size_t(d.H) * 4 * D);
    });
    return;
  }
  const size_t base = size_t(12) * d.D * sizeof(float);
  const size_t full = base + size_t(4) * d.D * d.D * sizeof(float);
  const bool use_smem = dR && full <= size_t(max_smem_optin());
  const size_t smem = use_smem ? full : base;
  if (smem > 48 * 1024) {
    static bool set = false;  // the opt-in, once (before any graph capture uses it)
    if (!set) {
      ::lrnn::cuda::allow_max_dynamic_smem(reinterpret_cast<const void*>(slstm_backward_kernel));
      set = true;
    }
  }
  slstm_backward_kernel<<<unsigned(d.B * d.H), threads_for(d.D), smem, ::lrnn::cuda::stream()>>>(
      dwx, dR, dbias, dy, R, y, d.T, d.H, d.D, d.lx(), saved, use_smem);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
