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
__global__ void add_scaled_kernel(float* __restrict__ y, const float* __restrict__ x, float a, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
__global__ void scale_by_kernel(float* __restrict__ y, const float* __restrict__ a, size_t n) {
  const float f = *a;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) y[i] *= f;
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
// A thread per element, adding the parts in order (few parts).
__global__ void add_partials_kernel(float* __restrict__ out, const float* __restrict__ part, int parts, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int p = 0; p < parts; ++p) s += part[size_t(p) * n + i];
  out[i] += s;
}
// A block per element (many parts, few elements): thread t adds parts t, t + 256, ..., then the
// block adds the threads' sums by a tree of fixed shape. (A thread per element walking 1024 parts
// alone took ~10 us.)
constexpr int kTreeThreads = 256;
__global__ void __launch_bounds__(kTreeThreads) add_partials_tree(float* __restrict__ out,
                                                                 const float* __restrict__ part, int parts, size_t n) {
  __shared__ float red[kTreeThreads];
  const size_t i = blockIdx.x;
  float s = 0.f;
  for (int p = threadIdx.x; p < parts; p += kTreeThreads) s += part[size_t(p) * n + i];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = kTreeThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[i] += red[0];
}
}  // namespace

void add_partials(float* out, const float* part, int parts, size_t n) {
  if (!n || parts <= 0) return;
  if (parts >= 64 && n <= 4096) {
    add_partials_tree<<<unsigned(n), kTreeThreads, 0, lrnn::cuda::stream()>>>(out, part, parts, n);
  } else {
    add_partials_kernel<<<lrnn::cuda::blocks_for(n, 256), 256, 0, lrnn::cuda::stream()>>>(out, part, parts, n);
  }
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

void add_scaled(float* y, const float* x, float a, size_t n) {
  if (!n) return;
  add_scaled_kernel<<<lrnn::cuda::blocks_for(n, 256), 256, 0, lrnn::cuda::stream()>>>(y, x, a, n);
  LRNN_CUDA_LAUNCH_CHECK();
}

void scale_by(float* y, const float* a, size_t n) {
  if (!n) return;
  const unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(n, 256), 4096));
  scale_by_kernel<<<blocks, 256, 0, lrnn::cuda::stream()>>>(y, a, n);
  LRNN_CUDA_LAUNCH_CHECK();
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
