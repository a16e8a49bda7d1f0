// CUDA mLSTM output gate (contract: skip_gate_cuda.h / skip_gate.h): one thread per element;
// dskip by a column reduction (32 channels x 8 row lanes per block, atomics per block).
#include "ops/skip_gate/skip_gate_cuda.h"
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void sg_forward_kernel(float* __restrict__ out, const float* __restrict__ h, const float* __restrict__ x,
                                  const float* __restrict__ skip, const float* __restrict__ z, int N, int I, int ldx,
                                  int ldz) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I;
  const int c = int(e % I);
  const float zz = z[n * ldz + c];
  out[e] = (h[e] + skip[c] * x[n * ldx + c]) * zz * sigm(zz);
}

__global__ void sg_backward_kernel(float* __restrict__ dh, float* __restrict__ dx, float* __restrict__ dz,
                                   const float* __restrict__ dout, const float* __restrict__ h,
                                   const float* __restrict__ x, const float* __restrict__ skip,
                                   const float* __restrict__ z, int N, int I, int ldx, int ldz) {
  const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size_t(N) * I) return;
  const size_t n = e / I;
  const int c = int(e % I);
  const float zz = z[n * ldz + c], s = sigm(zz), sz = zz * s, xx = x[n * ldx + c], d = dout[e];
  const float g = d * sz;
  dh[e] += g;
  dx[n * ldx + c] += g * skip[c];
  dz[n * ldz + c] += d * (h[e] + skip[c] * xx) * (s * (1.f + zz * (1.f - s)));
}

__global__ void sg_dskip_kernel(float* __restrict__ dskip, const float* __restrict__ dout,
                                const float* __restrict__ x, const float* __restrict__ z, int N, int I, int ldx,
                                int ldz) {
  __shared__ float red[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (c < I)
    for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += gridDim.y * 8) {
      const float zz = z[size_t(n) * ldz + c];
      acc += dout[size_t(n) * I + c] * zz * sigm(zz) * x[size_t(n) * ldx + c];
    }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < I) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += red[k][threadIdx.x];
    atomicAdd(dskip + c, s);
  }
}

}  // namespace

void skip_gate_forward(float* out, const float* h, const float* x, const float* skip, const float* z, int N, int I,
                       int ldx, int ldz) {
  if (!ldx) ldx = I;
  if (!ldz) ldz = I;
  const size_t n = size_t(N) * I;
  if (!n) return;
  sg_forward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(out, h, x, skip, z,
                                                                                                    N, I, ldx, ldz);
  LRNN_CUDA_LAUNCH_CHECK();
}

void skip_gate_backward(float* dh, float* dx, float* dskip, float* dz, const float* dout, const float* h,
                        const float* x, const float* skip, const float* z, int N, int I, int ldx, int ldz) {
  if (!ldx) ldx = I;
  if (!ldz) ldz = I;
  const size_t n = size_t(N) * I;
  if (!n) return;
  sg_backward_kernel<<<::lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, ::lrnn::cuda::stream()>>>(
      dh, dx, dz, dout, h, x, skip, z, N, I, ldx, ldz);
  LRNN_CUDA_LAUNCH_CHECK();
  unsigned splits = unsigned((N + 63) / 64);
  if (splits > 256) splits = 256;
  sg_dskip_kernel<<<dim3(unsigned((I + 31) / 32), splits), dim3(32, 8), 0, ::lrnn::cuda::stream()>>>(dskip, dout, x, z,
                                                                                                     N, I, ldx, ldz);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
