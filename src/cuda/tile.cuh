// Launching the tile kernels (attention, mLSTM): a block per (batch row, head) holding a
// sequence's rows and its T x T matrices in shared memory, with the head dim a compile-time DT
// where it is 16, 32 or 64 (loops unroll, indices become shifts), else 0 (any). Included by .cu
// files only.
#pragma once
#include <cstddef>
#include <type_traits>
#include "core/check.h"
#include "cuda/runtime.h"

namespace lrnn::cuda {

// Launches K<DT>::fn with DT chosen from the head dim D, on `blocks` blocks of `threads` threads
// and `bytes` of dynamic shared memory; each kernel is opted in to `cap` bytes once, on its first
// launch (before any graph capture uses it).
template <template <int> class K, class... Args>
void launch_by_head_dim(int D, unsigned blocks, unsigned threads, size_t bytes, size_t cap, Args... args) {
  auto go = [&](auto dt) {
    constexpr auto kernel = K<decltype(dt)::value>::fn;
    static const bool allowed = [&] {
      LRNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(cap)));
      return true;
    }();
    (void)allowed;
    kernel<<<blocks, threads, bytes, stream()>>>(args...);
    LRNN_CUDA_LAUNCH_CHECK();
  };
  switch (D) {
    case 16: return go(std::integral_constant<int, 16>{});
    case 32: return go(std::integral_constant<int, 32>{});
    case 64: return go(std::integral_constant<int, 64>{});
    default: return go(std::integral_constant<int, 0>{});
  }
}

}  // namespace lrnn::cuda
