// The device twin of core/arena.h: a bump allocator over one cudaMalloc, sized once per
// (batch, length) and reset every step, so pointers stay fixed and a captured graph stays valid
// as long as the arena does not grow.
#pragma once
#include "core/arena.h"
#include "cuda/runtime.h"

namespace lrnn::cuda {

class DeviceArena {
 public:
  // Make room for `bytes`; growing reallocates (and invalidates earlier pointers).
  void reserve(size_t bytes) {
    if (bytes <= buf_.size()) return;
    LRNN_CUDA_CHECK(cudaStreamSynchronize(stream()));  // nothing in flight may still use the old buffer
    buf_.resize(0);
    buf_.resize(Arena::round(bytes));
    used_ = 0;
    ++generation_;
  }
  void reset() { used_ = 0; }
  template <class T> T* alloc(size_t n) {
    size_t bytes = Arena::round(n * sizeof(T));
    LRNN_CHECK(used_ + bytes <= buf_.size(), "device arena: {} + {} bytes exceeds capacity {}", used_, bytes,
               buf_.size());
    T* p = reinterpret_cast<T*>(buf_.data() + used_);
    used_ += bytes;
    return p;
  }
  size_t used() const { return used_; }
  // Bumped on every reallocation: graphs captured at an older generation are stale.
  int generation() const { return generation_; }

 private:
  Buffer<std::byte> buf_;
  size_t used_ = 0;
  int generation_ = 0;
};

}  // namespace lrnn::cuda
