// CUDA LSTM layer (contract: lstm_cell_cuda.h / lstm_cell.h).
//
// Forward: z = b_ih + b_hh broadcast, += x W_ih^T (one GEMM over all steps); then per step t the
// recurrent GEMM z_t += h_{t-1} W_hh^T and a gate kernel (one thread per (b, j)) that activates
// i, f, g, o in place and writes c_t, h_t. Backward (BPTT) per step, from t = T-1 down: a gate
// kernel turns dh_t (from above + carried) into dz_t and carries dc through f; the GEMM
// dh_carry = dz_t W_hh gives the recurrent part for step t-1. Then dW_hh, dW_ih, dx are one GEMM
// each over all steps, and the bias gradient is a deterministic column sum of dz.
#include <algorithm>
#include "cuda/runtime.h"
#include "core/check.h"
#include "ops/linear/linear_cuda.h"
#include "ops/lstm_cell/lstm_cell_cuda.h"

namespace lrnn::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void bias_fill(float* __restrict__ z, const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                          size_t total, int G) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int j = int(i % G);
  z[i] = b_ih[j] + b_hh[j];
}

// z [B, 4H] pre-activations of step t -> activated gates (in place); c_t, h_t [B, H].
__global__ void gates_forward(float* __restrict__ z, float* __restrict__ ct, float* __restrict__ ht,
                              const float* __restrict__ cprev, int B, int H) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  const int b = idx / H, j = idx % H;
  float* zr = z + size_t(b) * 4 * H;
  const float i = sigmoidf_(zr[j]), f = sigmoidf_(zr[H + j]), g = tanhf(zr[2 * H + j]), o = sigmoidf_(zr[3 * H + j]);
  zr[j] = i;
  zr[H + j] = f;
  zr[2 * H + j] = g;
  zr[3 * H + j] = o;
  const float cc = (cprev ? f * cprev[idx] : 0.f) + i * g;
  ct[idx] = cc;
  ht[idx] = o * tanhf(cc);
}

// One step of BPTT: dz_t from the activated gates, dh_t (from above) + dhr (from step t+1), dc
// (carried, updated in place to dc_t * f for step t-1).
__global__ void gates_backward(float* __restrict__ dz, float* __restrict__ dc, const float* __restrict__ dhr,
                               const float* __restrict__ a, const float* __restrict__ ct,
                               const float* __restrict__ cprev, const float* __restrict__ dht, int B, int H) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  const int b = idx / H, j = idx % H;
  const float* ar = a + size_t(b) * 4 * H;
  float* dr = dz + size_t(b) * 4 * H;
  const float i = ar[j], f = ar[H + j], g = ar[2 * H + j], o = ar[3 * H + j];
  const float tc = tanhf(ct[idx]);
  const float dhj = dht[idx] + dhr[idx];
  const float dcj = dc[idx] + dhj * o * (1.f - tc * tc);
  const float cpj = cprev ? cprev[idx] : 0.f;
  dr[j] = dcj * g * i * (1.f - i);
  dr[H + j] = dcj * cpj * f * (1.f - f);
  dr[2 * H + j] = dcj * i * (1.f - g * g);
  dr[3 * H + j] = dhj * tc * o * (1.f - o);
  dc[idx] = dcj * f;
}

__global__ void zero_kernel(float* p, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 0.f;
}

// db_ih[j] += s, db_hh[j] += s, s = sum_n dz[n, j]: a block per 32 columns, threads stride over
// rows, fixed order (deterministic).
__global__ void bias_grad2(float* __restrict__ db_ih, float* __restrict__ db_hh, const float* __restrict__ dz,
                           size_t N, int G) {
  __shared__ float part[8][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (j < G)
    for (size_t n = threadIdx.y; n < N; n += 8) s += dz[n * G + j];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < G) {
    float t = 0.f;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
    db_ih[j] += t;
    db_hh[j] += t;
  }
}

__global__ void time_major_ids(int32_t* __restrict__ out, const int32_t* __restrict__ in, int B, int T_) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // index into out = t*B + b
  if (i >= B * T_) return;
  const int t = i / B, b = i % B;
  out[i] = in[size_t(b) * T_ + t];
}

__global__ void batch_major(float* __restrict__ out, const float* __restrict__ in, int B, int T_, int C) {
  const size_t total = size_t(B) * T_ * C;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C;  // b*T + t in out
    const int c = int(i % C);
    const int b = int(row / T_), t = int(row % T_);
    out[i] = in[(size_t(t) * B + b) * C + c];
  }
}

void check(const LstmDims& d) {
  LRNN_CHECK(d.T > 0 && d.B > 0 && d.I > 0 && d.H > 0, "lstm: bad dims T={} B={} I={} H={}", d.T, d.B, d.I, d.H);
}

}  // namespace

void lstm_forward(float* h, float* c, float* gates, const float* x, const float* W_ih, const float* W_hh,
                  const float* b_ih, const float* b_hh, const LstmDims& d) {
  check(d);
  const int Tn = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
  const size_t N = size_t(Tn) * B;
  cudaStream_t s = lrnn::cuda::stream();
  bias_fill<<<lrnn::cuda::blocks_for(N * G, kThreads), kThreads, 0, s>>>(gates, b_ih, b_hh, N * G, G);
  LRNN_CUDA_LAUNCH_CHECK();
  gemm(false, true, int(N), G, I, 1.f, x, I, W_ih, I, 1.f, gates, G);
  const unsigned nb = lrnn::cuda::blocks_for(size_t(B) * H, kThreads);
  for (int t = 0; t < Tn; ++t) {
    float* z = gates + size_t(t) * B * G;
    if (t > 0) gemm(false, true, B, G, H, 1.f, h + size_t(t - 1) * B * H, H, W_hh, H, 1.f, z, G);
    const float* cprev = t > 0 ? c + size_t(t - 1) * B * H : nullptr;
    gates_forward<<<nb, kThreads, 0, s>>>(z, c + size_t(t) * B * H, h + size_t(t) * B * H, cprev, B, H);
    LRNN_CUDA_LAUNCH_CHECK();
  }
}

void lstm_backward(float* dx, float* dW_ih, float* dW_hh, float* db_ih, float* db_hh, const float* dh,
                   const float* x, const float* W_ih, const float* W_hh, const float* h, const float* c,
                   const float* gates, const LstmDims& d, float* work) {
  check(d);
  LRNN_CHECK(work != nullptr, "lstm_backward (CUDA) needs its work buffer (lstm_backward_work_size)");
  const int Tn = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
  const size_t N = size_t(Tn) * B, BH = size_t(B) * H;
  cudaStream_t s = lrnn::cuda::stream();
  float* dz = work;
  float* dhr = dz + N * G;
  float* dc = dhr + BH;
  zero_kernel<<<lrnn::cuda::blocks_for(2 * BH, kThreads), kThreads, 0, s>>>(dhr, 2 * BH);
  LRNN_CUDA_LAUNCH_CHECK();
  const unsigned nb = lrnn::cuda::blocks_for(BH, kThreads);
  for (int t = Tn - 1; t >= 0; --t) {
    float* dzt = dz + size_t(t) * B * G;
    const float* cprev = t > 0 ? c + size_t(t - 1) * BH : nullptr;
    gates_backward<<<nb, kThreads, 0, s>>>(dzt, dc, dhr, gates + size_t(t) * B * G, c + size_t(t) * BH, cprev,
                                           dh + size_t(t) * BH, B, H);
    LRNN_CUDA_LAUNCH_CHECK();
    if (t > 0) gemm(false, false, B, H, G, 1.f, dzt, G, W_hh, H, 0.f, dhr, H);
  }
  if (Tn > 1) gemm(true, false, G, H, int(N - B), 1.f, dz + size_t(B) * G, G, h, H, 1.f, dW_hh, H);
  gemm(true, false, G, I, int(N), 1.f, dz, G, x, I, 1.f, dW_ih, I);
  if (dx) gemm(false, false, int(N), I, G, 1.f, dz, G, W_ih, I, 1.f, dx, I);
  bias_grad2<<<dim3((G + 31) / 32), dim3(32, 8), 0, s>>>(db_ih, db_hh, dz, N, G);
  LRNN_CUDA_LAUNCH_CHECK();
}

void lstm_time_major_ids(int32_t* out, const int32_t* in, int B, int T_) {
  const size_t n = size_t(B) * T_;
  time_major_ids<<<lrnn::cuda::blocks_for(n, kThreads), kThreads, 0, lrnn::cuda::stream()>>>(out, in, B, T_);
  LRNN_CUDA_LAUNCH_CHECK();
}

void lstm_batch_major(float* out, const float* in, int B, int T_, int C) {
  const size_t n = size_t(B) * T_ * C;
  const unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(n, kThreads), 65535));
  batch_major<<<blocks, kThreads, 0, lrnn::cuda::stream()>>>(out, in, B, T_, C);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
