// CUDA SwiGLU (contract: swiglu_cuda.h / swiglu.h): element-wise over [N, I], gate/up rows ld
// apart, out packed. float4 accesses when I, ld and the pointers allow, scalar otherwise.
#include "ops/swiglu/swiglu_cuda.h"
#include <cstdint>
#include <cuda_bf16.h>
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float fwd(float g, float u) { return g * sigmoid(g) * u; }
// dgate += d * u * silu'(g), dup += d * silu(g) (the kernels start dg, du at 0 to overwrite)
__device__ __forceinline__ void bwd(float& dg, float& du, float d, float g, float u) {
  const float s = sigmoid(g);
  dg += d * u * s * (1.f + g * (1.f - s));
  du += d * g * s;
}

// Scalar: element e of the [N, I] grid.
__global__ void swiglu_forward_kernel(float* __restrict__ out, const float* __restrict__ gate,
                                      const float* __restrict__ up, int N, int I, int ld) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I, i = e % I, k = n * ld + i;
  out[e] = fwd(gate[k], up[k]);
}

// Acc false: overwrite, the old dgate / dup never read.
template <bool Acc>
__global__ void swiglu_backward_kernel(float* __restrict__ dgate, float* __restrict__ dup,
                                       const float* __restrict__ dout, const float* __restrict__ gate,
                                       const float* __restrict__ up, int N, int I, int ld) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I, i = e % I, k = n * ld + i;
  float dg = Acc ? dgate[k] : 0.f, du = Acc ? dup[k] : 0.f;
  bwd(dg, du, dout[e], gate[k], up[k]);
  dgate[k] = dg;
  dup[k] = du;
}

// float4: I4 = I / 4, ld4 = ld / 4.
__global__ void swiglu_forward_kernel4(float4* __restrict__ out, const float4* __restrict__ gate,
                                       const float4* __restrict__ up, int N, int I4, int ld4) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I4) return;
  const size_t n = e / I4, i = e % I4, k = n * ld4 + i;
  const float4 g = gate[k], u = up[k];
  out[e] = make_float4(fwd(g.x, u.x), fwd(g.y, u.y), fwd(g.z, u.z), fwd(g.w, u.w));
}

template <bool Acc>
__global__ void swiglu_backward_kernel4(float4* __restrict__ dgate, float4* __restrict__ dup,
                                        const float4* __restrict__ dout, const float4* __restrict__ gate,
                                        const float4* __restrict__ up, int N, int I4, int ld4) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I4) return;
  const size_t n = e / I4, i = e % I4, k = n * ld4 + i;
  const float4 g = gate[k], u = up[k], d = dout[e];
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 dg = Acc ? dgate[k] : zero, du = Acc ? dup[k] : zero;
  bwd(dg.x, du.x, d.x, g.x, u.x);
  bwd(dg.y, du.y, d.y, g.y, u.y);
  bwd(dg.z, du.z, d.z, g.z, u.z);
  bwd(dg.w, du.w, d.w, g.w, u.w);
  dgate[k] = dg;
  dup[k] = du;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- bf16 storage (fp32 arithmetic): VW = 8 elements (16 bytes) per thread, or 1 ----------

using bf = __nv_bfloat16;

template <int VW>
__device__ __forceinline__ void load_bf(float (&r)[VW], const bf* p) {
  if constexpr (VW == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      r[2 * j] = f.x;
      r[2 * j + 1] = f.y;
    }
  } else {
    r[0] = __bfloat162float(*p);
  }
}
template <int VW>
__device__ __forceinline__ void store_bf(bf* p, const float (&r)[VW]) {
  if constexpr (VW == 8) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(r[2 * j], r[2 * j + 1]);
      w[j] = *reinterpret_cast<const unsigned*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    *p = __float2bfloat16_rn(r[0]);
  }
}

// Element group e of the [N, I / VW] grid; Iv = I / VW, ldv = ld / VW.
template <int VW>
__global__ void swiglu_forward_bf16(bf* __restrict__ out, const bf* __restrict__ gate, const bf* __restrict__ up,
                                    int N, int Iv, int ldv) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * Iv) return;
  const size_t n = e / Iv, i = e % Iv, k = (n * ldv + i) * VW;
  float g[VW], u[VW], y[VW];
  load_bf(g, gate + k);
  load_bf(u, up + k);
#pragma unroll
  for (int j = 0; j < VW; ++j) y[j] = fwd(g[j], u[j]);
  store_bf(out + e * VW, y);
}

template <int VW, bool Acc>
__global__ void swiglu_backward_bf16(bf* __restrict__ dgate, bf* __restrict__ dup, const bf* __restrict__ dout,
                                     const bf* __restrict__ gate, const bf* __restrict__ up, int N, int Iv, int ldv) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * Iv) return;
  const size_t n = e / Iv, i = e % Iv, k = (n * ldv + i) * VW;
  float g[VW], u[VW], d[VW], dg[VW], du[VW];
  load_bf(g, gate + k);
  load_bf(u, up + k);
  load_bf(d, dout + e * VW);
  if constexpr (Acc) {
    load_bf(dg, dgate + k);
    load_bf(du, dup + k);
  } else {
#pragma unroll
    for (int j = 0; j < VW; ++j) dg[j] = du[j] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < VW; ++j) bwd(dg[j], du[j], d[j], g[j], u[j]);
  store_bf(dgate + k, dg);
  store_bf(dup + k, du);
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int N, int I, int ld) {
  if (!ld) ld = I;
  if (N <= 0 || I <= 0) return;
  auto s = ::lrnn::cuda::stream();
  if (I % 4 == 0 && ld % 4 == 0 && aligned16(out) && aligned16(gate) && aligned16(up)) {
    const size_t n = size_t(N) * (I / 4);
    swiglu_forward_kernel4<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), N,
        I / 4, ld / 4);
  } else {
    swiglu_forward_kernel<<<::lrnn::cuda::blocks_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(out, gate, up, N,
                                                                                                  I, ld);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int N, int I,
                     int ld, bool accumulate) {
  if (!ld) ld = I;
  if (N <= 0 || I <= 0) return;
  auto s = ::lrnn::cuda::stream();
  if (I % 4 == 0 && ld % 4 == 0 && aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
      aligned16(up)) {
    const size_t n = size_t(N) * (I / 4);
    auto kernel = accumulate ? swiglu_backward_kernel4<true> : swiglu_backward_kernel4<false>;
    kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(dgate), reinterpret_cast<float4*>(dup), reinterpret_cast<const float4*>(dout),
        reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), N, I / 4, ld / 4);
  } else {
    auto kernel = accumulate ? swiglu_backward_kernel<true> : swiglu_backward_kernel<false>;
    kernel<<<::lrnn::cuda::blocks_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(dgate, dup, dout, gate, up, N, I,
                                                                                  ld);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

void swiglu_forward(bf16* out_, const bf16* gate_, const bf16* up_, int N, int I, int ld) {
  if (!ld) ld = I;
  if (N <= 0 || I <= 0) return;
  auto* out = reinterpret_cast<bf*>(out_);
  auto* gate = reinterpret_cast<const bf*>(gate_);
  auto* up = reinterpret_cast<const bf*>(up_);
  auto s = ::lrnn::cuda::stream();
  if (I % 8 == 0 && ld % 8 == 0 && aligned16(out) && aligned16(gate) && aligned16(up)) {
    const size_t n = size_t(N) * (I / 8);
    swiglu_forward_bf16<8><<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, s>>>(out, gate, up, N, I / 8, ld / 8);
  } else {
    swiglu_forward_bf16<1><<<::lrnn::cuda::blocks_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(out, gate, up, N, I,
                                                                                                  ld);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

void swiglu_backward(bf16* dgate_, bf16* dup_, const bf16* dout_, const bf16* gate_, const bf16* up_, int N, int I,
                     int ld, bool accumulate) {
  if (!ld) ld = I;
  if (N <= 0 || I <= 0) return;
  auto* dgate = reinterpret_cast<bf*>(dgate_);
  auto* dup = reinterpret_cast<bf*>(dup_);
  auto* dout = reinterpret_cast<const bf*>(dout_);
  auto* gate = reinterpret_cast<const bf*>(gate_);
  auto* up = reinterpret_cast<const bf*>(up_);
  auto s = ::lrnn::cuda::stream();
  if (I % 8 == 0 && ld % 8 == 0 && aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
      aligned16(up)) {
    auto kernel = accumulate ? swiglu_backward_bf16<8, true> : swiglu_backward_bf16<8, false>;
    kernel<<<::lrnn::cuda::blocks_for(size_t(N) * (I / 8), kThreads), kThreads, 0, s>>>(dgate, dup, dout, gate, up, N,
                                                                                         I / 8, ld / 8);
  } else {
    auto kernel = accumulate ? swiglu_backward_bf16<1, true> : swiglu_backward_bf16<1, false>;
    kernel<<<::lrnn::cuda::blocks_for(size_t(N) * I, kThreads), kThreads, 0, s>>>(dgate, dup, dout, gate, up, N, I,
                                                                                  ld);
  }
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
