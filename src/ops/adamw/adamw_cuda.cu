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

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const uint8_t* mask, size_t N,
                             const StepStats* s, float b1, float b2, float eps, float wd, double beta1,
                             double beta2) {
  if (!s->finite) return;
  const double lr = s->lr;
  const double bc1 = 1.0 - pow(beta1, double(s->adam_step)), bc2 = 1.0 - pow(beta2, double(s->adam_step));
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / sqrt(bc2));
  const float decay = float(1.0 - lr * wd), scale = s->scale;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += size_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * scale;
    float pi = p[i];
    if (!mask || mask[i]) pi *= decay;
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void optimizer_prepare(StepStats* s, const float* loss, const float* grads, size_t N, const float* lr_table,
                       int64_t table_size, double max_norm) {
  auto* part = static_cast<double*>(lrnn::cuda::scratch(kNormBlocks * sizeof(double)));
  sumsq_partials<<<kNormBlocks, kThreads, 0, lrnn::cuda::stream()>>>(part, grads, N);
  LRNN_CUDA_LAUNCH_CHECK();
  prepare<<<1, kNormBlocks, 0, lrnn::cuda::stream()>>>(s, part, loss, lr_table, table_size, max_norm);
  LRNN_CUDA_LAUNCH_CHECK();
}

void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t N,
                  const StepStats* s, double beta1, double beta2, double eps, double weight_decay) {
  unsigned blocks = unsigned(std::min<size_t>(lrnn::cuda::blocks_for(N, kThreads), 1024));
  adamw_kernel<<<blocks, kThreads, 0, lrnn::cuda::stream()>>>(params, grads, m, v, decay_mask, N, s, float(beta1),
                                                               float(beta2), float(eps), float(weight_decay), beta1,
                                                               beta2);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
