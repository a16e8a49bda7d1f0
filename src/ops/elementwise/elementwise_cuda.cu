#include "ops/elementwise/elementwise_cuda.h"
#include <cuda_bf16.h>
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {

namespace {
__global__ void add_kernel(float4* y, const float4* x, size_t n4) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    float4 a = y[i], b = x[i];
    y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}
__global__ void add_tail(float* y, const float* x, size_t from, size_t n) {
  size_t i = from + size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}
// Four elements per thread when both pointers allow (16-byte loads, 8-byte stores), else one.
__global__ void to_bf16_kernel4(uint2* y, const float4* x, size_t n4) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    y[i] = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}
__global__ void to_bf16_tail(__nv_bfloat16* y, const float* x, size_t from, size_t n) {
  size_t i = from + size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void add_partials_kernel(float* __restrict__ out, const float* __restrict__ part, int parts, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int p = 0; p < parts; ++p) s += part[size_t(p) * n + i];
  out[i] += s;
}
}  // namespace

void add_partials(float* out, const float* part, int parts, size_t n) {
  if (!n) return;
  add_partials_kernel<<<lrnn::cuda::blocks_for(n, 256), 256, 0, lrnn::cuda::stream()>>>(out, part, parts, n);
  LRNN_CUDA_LAUNCH_CHECK();
}

void to_bf16(bf16* y_, const float* x, size_t n) {
  if (!n) return;
  auto* y = reinterpret_cast<__nv_bfloat16*>(y_);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  const size_t n4 = aligned ? n / 4 : 0;
  if (n4) {
    unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(n4, 256), 4096));
    to_bf16_kernel4<<<blocks, 256, 0, lrnn::cuda::stream()>>>(reinterpret_cast<uint2*>(y),
                                                               reinterpret_cast<const float4*>(x), n4);
    LRNN_CUDA_LAUNCH_CHECK();
  }
  if (n4 * 4 < n) {
    to_bf16_tail<<<lrnn::cuda::blocks_for(n - n4 * 4, 256), 256, 0, lrnn::cuda::stream()>>>(y, x, n4 * 4, n);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

void add_inplace(float* y, const float* x, size_t n) {
  if (!n) return;
  const bool aligned = (reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
  size_t n4 = aligned ? n / 4 : 0;
  if (n4) {
    unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(n4, 256), 4096));
    add_kernel<<<blocks, 256, 0, lrnn::cuda::stream()>>>(reinterpret_cast<float4*>(y),
                                                          reinterpret_cast<const float4*>(x), n4);
    LRNN_CUDA_LAUNCH_CHECK();
  }
  if (n4 * 4 < n) {
    add_tail<<<lrnn::cuda::blocks_for(n - n4 * 4, 256), 256, 0, lrnn::cuda::stream()>>>(y, x, n4 * 4, n);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

void zero(float* p, size_t n) {
  if (n) LRNN_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), lrnn::cuda::stream()));
}

}  // namespace lrnn::ops::cuda
