#include "ops/adamw/adamw_cuda.h"
#include <cmath>
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {

namespace {

constexpr int kNormBlocks = 256, kThreads = 256;

// Per-block partial sums of g^2 (in double: 10^6 squares of different sizes).
__global__ void sumsq_partials(double* part, const float* g, size_t N) {
  double acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += size_t(gridDim.x) * blockDim.x)
    acc += double(g[i]) * double(g[i]);
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// One block: the partials in a fixed order, then the step's bookkeeping.
__global__ void prepare(StepStats* s, const double* part, const float* loss, const float* lr_table, int64_t table_size,
                        double max_norm) {
  __shared__ double sh[kNormBlocks];
  sh[threadIdx.x] = part[threadIdx.x];
  __syncthreads();
  for (int k = kNormBlocks / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const double norm = sqrt(sh[0]);
  const float l = *loss;
  const bool finite = isfinite(l) && isfinite(norm);
  const int64_t step = s->step;
  s->lr = lr_table[step < table_size ? step : table_size - 1];
  s->loss = l;
  s->norm = float(norm);
  s->finite = finite;
  double f = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
  s->scale = float(f < 1.0 ? f : 1.0);
  if (finite) {
    s->adam_step += 1;
    s->loss_sum += double(l);
    s->loss_n += 1;
  } else {
    s->skipped += 1;
  }
  s->step = step + 1;
}

// The step's AdamW constants from the device-side counters (the step was counted as applied).
__device__ AdamWConsts<float> consts_of(const StepStats* s, float b1, float b2, float eps, float wd, double beta1,
                                        double beta2) {
  const double lr = s->lr;
  const double bc1 = 1.0 - pow(beta1, double(s->adam_step)), bc2 = 1.0 - pow(beta2, double(s->adam_step));
  return {b1, b2, eps, float(lr / bc1), float(1.0 / sqrt(bc2)), float(1.0 - lr * wd)};
}

// Pass 1: would the update leave every parameter and moment finite? One flag per block.
__global__ void finite_partials(int* part, const float* p, const float* g, const float* m, const float* v,
                                const uint8_t* mask, size_t N, const StepStats* s, float b1, float b2, float eps,
                                float wd, double beta1, double beta2) {
  int bad = 0;
  if (s->finite) {
    const AdamWConsts<float> c = consts_of(s, b1, b2, eps, wd, beta1, beta2);
    const float scale = s->scale;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += size_t(gridDim.x) * blockDim.x) {
      auto e = adamw_element(p[i], g[i] * scale, m[i], v[i], !mask || mask[i], c);
      bad |= !(isfinite(e.p) && isfinite(e.m) && isfinite(e.v));
    }
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) part[blockIdx.x] = bad;
}

// One block: a step whose update would not be finite is skipped after all (the counters that
// prepare() set for an applied step are taken back).
__global__ void commit(StepStats* s, const int* part) {
  const int bad = __syncthreads_or(part[threadIdx.x]);
  if (threadIdx.x != 0 || !bad || !s->finite) return;
  s->finite = 0;
  s->adam_step -= 1;
  s->skipped += 1;
  s->loss_sum -= double(s->loss);
  s->loss_n -= 1;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const uint8_t* mask, size_t N,
                             const StepStats* s, float b1, float b2, float eps, float wd, double beta1,
                             double beta2) {
  if (!s->finite) return;
  const AdamWConsts<float> c = consts_of(s, b1, b2, eps, wd, beta1, beta2);
  const float scale = s->scale;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += size_t(gridDim.x) * blockDim.x) {
    auto e = adamw_element(p[i], g[i] * scale, m[i], v[i], !mask || mask[i], c);
    m[i] = e.m;
    v[i] = e.v;
    p[i] = e.p;
  }
}

}  // namespace

void optimizer_prepare(StepStats* s, const float* loss, const float* grads, size_t N, const float* lr_table,
                       int64_t table_size, double max_norm, StepReduce* ranks) {
  auto* part = static_cast<double*>(lrnn::cuda::scratch(kNormBlocks * sizeof(double)));
  sumsq_partials<<<kNormBlocks, kThreads, 0, lrnn::cuda::stream()>>>(part, grads, N);
  LRNN_CUDA_LAUNCH_CHECK();
  if (ranks) ranks->sum(part, kNormBlocks);  // partial sums of every rank's slice, block by block
  prepare<<<1, kNormBlocks, 0, lrnn::cuda::stream()>>>(s, part, loss, lr_table, table_size, max_norm);
  LRNN_CUDA_LAUNCH_CHECK();
}

void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t N,
                  StepStats* s, double beta1, double beta2, double eps, double weight_decay, StepReduce* ranks) {
  const float b1 = float(beta1), b2 = float(beta2), e = float(eps), wd = float(weight_decay);
  auto* part = static_cast<int*>(lrnn::cuda::scratch(kNormBlocks * sizeof(int)));
  finite_partials<<<kNormBlocks, kThreads, 0, lrnn::cuda::stream()>>>(part, params, grads, m, v, decay_mask, N, s, b1,
                                                                       b2, e, wd, beta1, beta2);
  LRNN_CUDA_LAUNCH_CHECK();
  if (ranks) ranks->max(part, kNormBlocks);  // a non-finite update on any rank skips the step everywhere
  commit<<<1, kNormBlocks, 0, lrnn::cuda::stream()>>>(s, part);
  LRNN_CUDA_LAUNCH_CHECK();
  unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(N, kThreads), 1024));
  adamw_kernel<<<blocks, kThreads, 0, lrnn::cuda::stream()>>>(params, grads, m, v, decay_mask, N, s, b1, b2, e, wd,
                                                               beta1, beta2);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
