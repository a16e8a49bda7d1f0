// CUDA GELU gate (contract: geglu_cuda.h / geglu.h): one thread per element.
#include "ops/geglu/geglu_cuda.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float phi(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
__device__ __forceinline__ float density(float x) { return 0.39894228040143267794f * expf(-0.5f * x * x); }

__global__ void geglu_forward_kernel(float* __restrict__ out, const float* __restrict__ gate,
                                     const float* __restrict__ up, int N, int I, int ld) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I, i = e % I, s = n * ld + i;
  const float g = gate[s];
  out[e] = g * phi(g) * up[s];
}

// Acc false: overwrite (accumulate onto 0), the old dgate / dup never read.
template <bool Acc>
__global__ void geglu_backward_kernel(float* __restrict__ dgate, float* __restrict__ dup,
                                      const float* __restrict__ dout, const float* __restrict__ gate,
                                      const float* __restrict__ up, int N, int I, int ld) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I, i = e % I, s = n * ld + i;
  const float x = gate[s], P = phi(x), d = dout[e];
  dgate[s] = (Acc ? dgate[s] : 0.f) + d * up[s] * (P + x * density(x));
  dup[s] = (Acc ? dup[s] : 0.f) + d * x * P;
}

}  // namespace

void geglu_forward(float* out, const float* gate, const float* up, int N, int I, int ld) {
  if (!ld) ld = I;
  const size_t n = size_t(N) * I;
  if (!n) return;
  geglu_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(out, gate, up,
                                                                                                       N, I, ld);
  LRNN_CUDA_LAUNCH_CHECK();
}

void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int N, int I,
                    int ld, bool accumulate) {
  if (!ld) ld = I;
  const size_t n = size_t(N) * I;
  if (!n) return;
  auto kernel = accumulate ? geglu_backward_kernel<true> : geglu_backward_kernel<false>;
  kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
      dgate, dup, dout, gate, up, N, I, ld);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
