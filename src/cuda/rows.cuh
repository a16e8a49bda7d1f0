// Device helpers shared by the row-wise CUDA kernels (RMSNorm, L2 norm, short conv): vector loads
// and stores of VW = 1, 2 or 4 floats, sums over groups of lanes, and the plan that maps a row
// of D floats onto a group of G lanes holding NCH vectors each. Included by .cu files only.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace lrnn::cuda {

// VW consecutive floats from read-only data (through the non-coherent cache) / from data the
// kernel itself writes, and the store. p must be VW * 4-byte aligned.
template <int VW>
__device__ __forceinline__ void load_ro(float (&r)[VW], const float* p) {
  if constexpr (VW == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    r[0] = t.x, r[1] = t.y, r[2] = t.z, r[3] = t.w;
  } else if constexpr (VW == 2) {
    const float2 t = __ldg(reinterpret_cast<const float2*>(p));
    r[0] = t.x, r[1] = t.y;
  } else {
    r[0] = __ldg(p);
  }
}
template <int VW>
__device__ __forceinline__ void load_rw(float (&r)[VW], const float* p) {
  if constexpr (VW == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    r[0] = t.x, r[1] = t.y, r[2] = t.z, r[3] = t.w;
  } else if constexpr (VW == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    r[0] = t.x, r[1] = t.y;
  } else {
    r[0] = *p;
  }
}
template <int VW>
__device__ __forceinline__ void store(float* p, const float (&r)[VW]) {
  if constexpr (VW == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
  } else if constexpr (VW == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(r[0], r[1]);
  } else {
    *p = r[0];
  }
}

// The same store into bf16 storage (rounded to nearest even); p must be VW * 2-byte aligned.
template <int VW>
__device__ __forceinline__ void store(__nv_bfloat16* p, const float (&r)[VW]) {
  if constexpr (VW == 4) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(r[0], r[1]), hi = __floats2bfloat162_rn(r[2], r[3]);
    uint2 u;
    u.x = *reinterpret_cast<const unsigned*>(&lo);
    u.y = *reinterpret_cast<const unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p) = u;
  } else if constexpr (VW == 2) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(r[0], r[1]);
  } else {
    *p = __float2bfloat16_rn(r[0]);
  }
}

// The slices of a row of `len` floats that lane gl of a G-lane group holds: vectors gl, gl + G,
// ..., each VW floats from p + (gl + i G) VW; zeros past the row's end or when !ok (a group
// past the last row, which still takes part in the group's shuffles).
template <int VW, int G, int NCH>
__device__ __forceinline__ void load_row(float (&v)[NCH][VW], const float* p, int len, int gl, bool ok) {
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int e = (gl + i * G) * VW;
    if (ok && e < len) {
      load_ro(v[i], p + e);
    } else {
#pragma unroll
      for (int k = 0; k < VW; ++k) v[i][k] = 0.f;
    }
  }
}

// Sum over the G lanes of a group (all 32 lanes of the warp must call it).
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return group_sum<32>(v); }

// The sum of squares of a row held by a group of G lanes as load_row leaves it.
template <int VW, int G, int NCH>
__device__ __forceinline__ float row_sum_squares(const float (&v)[NCH][VW]) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < NCH; ++i)
#pragma unroll
    for (int k = 0; k < VW; ++k) ss += v[i][k] * v[i][k];
  return group_sum<G>(ss);
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// A row of D floats read as vectors of VW: G lanes per row (4..32; groups of 32 hold NCH = 2, 4
// or 8 vectors per lane). G = 0: the row is too long for the vector kernels.
struct RowPlan {
  int VW = 1, G = 0, NCH = 1;
};
inline RowPlan plan_row(int D, int vw) {
  RowPlan p;
  p.VW = vw;
  const int nv = (D + vw - 1) / vw;  // vectors per row
  if (nv <= 32) {
    p.G = nv <= 4 ? 4 : nv <= 8 ? 8 : nv <= 16 ? 16 : 32;
  } else {
    const int per_lane = (nv + 31) / 32;
    if (per_lane > 8) return p;
    p.G = 32;
    p.NCH = per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
  }
  return p;
}
// Runs f.run<VW, G, NCH>() for a plan with VW 4 or 1; false when no vector kernel fits.
template <class F>
bool dispatch_rows(const RowPlan& p, const F& f) {
#define LRNN_ROW_CASE(vw_, g_, nch_)               \
  if (p.VW == vw_ && p.G == g_ && p.NCH == nch_) { \
    f.template run<vw_, g_, nch_>();               \
    return true;                                   \
  }
#define LRNN_ROW_CASES(vw_)                                                                             \
  LRNN_ROW_CASE(vw_, 4, 1) LRNN_ROW_CASE(vw_, 8, 1) LRNN_ROW_CASE(vw_, 16, 1) LRNN_ROW_CASE(vw_, 32, 1) \
  LRNN_ROW_CASE(vw_, 32, 2) LRNN_ROW_CASE(vw_, 32, 4) LRNN_ROW_CASE(vw_, 32, 8)
  LRNN_ROW_CASES(4)
  LRNN_ROW_CASES(1)
#undef LRNN_ROW_CASES
#undef LRNN_ROW_CASE
  return false;
}

}  // namespace lrnn::cuda
