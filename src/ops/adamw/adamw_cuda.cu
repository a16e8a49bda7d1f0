#include "ops/adamw/adamw_cuda.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include "cuda/runtime.h"

namespace lrnn::ops::cuda {

namespace {

// The streaming passes (norm, finite check, update) read the gradient, parameters and moments in
// groups of W = 4 floats (float4 loads, the mask's 4 bytes as one word) when every pointer allows
// it, one float otherwise; the N % W elements past the last group are taken one by one. The norm
// and the finite check leave one partial per block (kNormBlocks of them, summed or or-ed by one
// block in a fixed order), so their blocks are large (kStreamThreads): 256 blocks of 256 threads
// with scalar loads held the optimizer of a 117M-parameter LM at 2.8 ms a step; these, 1.41 ms
// (H200; its three passes move ~5.7 GB, ~1.2 ms at the memory's speed).
constexpr int kNormBlocks = 256, kThreads = 256, kStreamThreads = 1024;

template <int W>
struct Group {
  float x[W];
};
template <int W>
__device__ __forceinline__ Group<W> load_group(const float* p, size_t i) {
  Group<W> r;
  if constexpr (W == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p + i);
    r.x[0] = t.x, r.x[1] = t.y, r.x[2] = t.z, r.x[3] = t.w;
  } else {
    r.x[0] = p[i];
  }
  return r;
}
template <int W>
__device__ __forceinline__ void store_group(float* p, size_t i, const Group<W>& r) {
  if constexpr (W == 4) *reinterpret_cast<float4*>(p + i) = make_float4(r.x[0], r.x[1], r.x[2], r.x[3]);
  else p[i] = r.x[0];
}
// decay flags of the group (all set without a mask)
template <int W>
__device__ __forceinline__ unsigned mask_group(const uint8_t* mask, size_t i) {
  if (!mask) return 0xffffffffu;
  if constexpr (W == 4) {
    const uchar4 t = *reinterpret_cast<const uchar4*>(mask + i);
    return unsigned(t.x != 0) | unsigned(t.y != 0) << 1 | unsigned(t.z != 0) << 2 | unsigned(t.w != 0) << 3;
  } else {
    return mask[i] != 0;
  }
}

// Calls f(i, W-group) over [0, N) as groups of W from this thread's grid-stride share, then the
// tail one by one: every element once, the same thread for the same N, W and grid.
template <int W, class F>
__device__ __forceinline__ void for_groups(size_t N, F f) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  const size_t groups = N / W;
  for (size_t k = tid; k < groups; k += stride) f(k * W, std::integral_constant<int, W>{});
  if constexpr (W > 1)
    for (size_t i = groups * W + tid; i < N; i += stride) f(i, std::integral_constant<int, 1>{});
}

// Whether every pointer allows groups of 4 (16-byte floats, 4-byte mask).
bool groups_of_4(std::initializer_list<const void*> floats, const uint8_t* mask) {
  for (const void* p : floats)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return reinterpret_cast<uintptr_t>(mask) % 4 == 0;
}

// Per-block partial sums of g^2 (in double: 10^8 squares of different sizes).
template <int W>
__global__ void __launch_bounds__(kStreamThreads) sumsq_partials(double* part, const float* g, size_t N) {
  double acc = 0;
  for_groups<W>(N, [&](size_t i, auto w) {
    const auto x = load_group<decltype(w)::value>(g, i);
    for (float e : x.x) acc += double(e) * double(e);
  });
  __shared__ double sh[kStreamThreads];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kStreamThreads / 2; s > 0; s >>= 1) {
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
template <int W>
__global__ void __launch_bounds__(kStreamThreads)
    finite_partials(int* part, const float* p, const float* g, const float* m, const float* v, const uint8_t* mask,
                    size_t N, const StepStats* s, float b1, float b2, float eps, float wd, double beta1,
                    double beta2) {
  int bad = 0;
  if (s->finite) {
    const AdamWConsts<float> c = consts_of(s, b1, b2, eps, wd, beta1, beta2);
    const float scale = s->scale;
    for_groups<W>(N, [&](size_t i, auto w) {
      constexpr int V = decltype(w)::value;
      const auto pg = load_group<V>(p, i), gg = load_group<V>(g, i), mg = load_group<V>(m, i), vg = load_group<V>(v, i);
      const unsigned d = mask_group<V>(mask, i);
      for (int j = 0; j < V; ++j) {
        auto e = adamw_element(pg.x[j], gg.x[j] * scale, mg.x[j], vg.x[j], (d >> j) & 1u, c);
        bad |= !(isfinite(e.p) && isfinite(e.m) && isfinite(e.v));
      }
    });
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

template <int W>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const uint8_t* mask, size_t N,
                             const StepStats* s, float b1, float b2, float eps, float wd, double beta1,
                             double beta2) {
  if (!s->finite) return;
  const AdamWConsts<float> c = consts_of(s, b1, b2, eps, wd, beta1, beta2);
  const float scale = s->scale;
  for_groups<W>(N, [&](size_t i, auto w) {
    constexpr int V = decltype(w)::value;
    auto pg = load_group<V>(p, i), mg = load_group<V>(m, i), vg = load_group<V>(v, i);
    const auto gg = load_group<V>(g, i);
    const unsigned d = mask_group<V>(mask, i);
    for (int j = 0; j < V; ++j) {
      auto e = adamw_element(pg.x[j], gg.x[j] * scale, mg.x[j], vg.x[j], (d >> j) & 1u, c);
      pg.x[j] = e.p, mg.x[j] = e.m, vg.x[j] = e.v;
    }
    store_group<V>(m, i, mg);
    store_group<V>(v, i, vg);
    store_group<V>(p, i, pg);
  });
}

}  // namespace

void optimizer_prepare(StepStats* s, const float* loss, const float* grads, size_t N, const float* lr_table,
                       int64_t table_size, double max_norm, StepReduce* ranks) {
  auto* part = static_cast<double*>(lrnn::cuda::scratch(kNormBlocks * sizeof(double)));
  if (groups_of_4({grads}, nullptr))
    sumsq_partials<4><<<kNormBlocks, kStreamThreads, 0, lrnn::cuda::stream()>>>(part, grads, N);
  else
    sumsq_partials<1><<<kNormBlocks, kStreamThreads, 0, lrnn::cuda::stream()>>>(part, grads, N);
  LRNN_CUDA_LAUNCH_CHECK();
  if (ranks) ranks->sum(part, kNormBlocks);  // partial sums of every rank's slice, block by block
  prepare<<<1, kNormBlocks, 0, lrnn::cuda::stream()>>>(s, part, loss, lr_table, table_size, max_norm);
  LRNN_CUDA_LAUNCH_CHECK();
}

void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t N,
                  StepStats* s, double beta1, double beta2, double eps, double weight_decay, StepReduce* ranks) {
  const float b1 = float(beta1), b2 = float(beta2), e = float(eps), wd = float(weight_decay);
  const bool g4 = groups_of_4({params, grads, m, v}, decay_mask);
  auto* part = static_cast<int*>(lrnn::cuda::scratch(kNormBlocks * sizeof(int)));
  auto* finite = g4 ? finite_partials<4> : finite_partials<1>;
  finite<<<kNormBlocks, kStreamThreads, 0, lrnn::cuda::stream()>>>(part, params, grads, m, v, decay_mask, N, s, b1, b2,
                                                                   e, wd, beta1, beta2);
  LRNN_CUDA_LAUNCH_CHECK();
  if (ranks) ranks->max(part, kNormBlocks);  // a non-finite update on any rank skips the step everywhere
  commit<<<1, kNormBlocks, 0, lrnn::cuda::stream()>>>(s, part);
  LRNN_CUDA_LAUNCH_CHECK();
  // One wave of 4 blocks of 256 on each SM (48 registers: 5 would fit, and a second, partial wave
  // would leave SMs idle while it runs), each thread with its 4 groups' loads in flight.
  const size_t work = g4 ? N / 4 : N;
  const unsigned blocks = unsigned(std::clamp<size_t>(lrnn::cuda::blocks_for(work, kThreads), 1,
                                                      size_t(lrnn::cuda::num_sms()) * 4));
  auto* update = g4 ? adamw_kernel<4> : adamw_kernel<1>;
  update<<<blocks, kThreads, 0, lrnn::cuda::stream()>>>(params, grads, m, v, decay_mask, N, s, b1, b2, e, wd, beta1,
                                                        beta2);
  LRNN_CUDA_LAUNCH_CHECK();
}

}  // namespace lrnn::ops::cuda
