// A bump allocator for activations: sized once per (batch, length), reset every step, so the
// training loop allocates nothing after its first step.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include "core/check.h"

namespace lrnn {

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Make room for `bytes`; keeps contents only if no growth is needed.
  void reserve(size_t bytes) {
    if (bytes <= cap_) return;
    buf_.reset(static_cast<std::byte*>(std::aligned_alloc(64, round(bytes))));
    LRNN_CHECK(buf_ != nullptr, "arena: out of memory asking for {} bytes", bytes);
    cap_ = round(bytes);
    used_ = 0;
    ++generation_;
  }
  void reset() { used_ = 0; }
  template <class T> T* alloc(size_t n) {
    size_t bytes = round(n * sizeof(T));
    LRNN_CHECK(used_ + bytes <= cap_, "arena: {} + {} bytes exceeds capacity {}", used_, bytes, cap_);
    T* p = reinterpret_cast<T*>(buf_.get() + used_);
    used_ += bytes;
    return p;
  }
  size_t used() const { return used_; }
  // Bumped on every reallocation (earlier pointers are stale).
  int generation() const { return generation_; }
  static size_t round(size_t b) { return (b + 63) / 64 * 64; }

 private:
  struct Free { void operator()(std::byte* p) const { std::free(p); } };
  std::unique_ptr<std::byte, Free> buf_;
  size_t cap_ = 0, used_ = 0;
  int generation_ = 0;
};

// Counts bytes for a planned sequence of allocations (first pass), so the arena is sized exactly.
struct ArenaPlan {
  size_t bytes = 0;
  template <class T> void add(size_t n) { bytes += Arena::round(n * sizeof(T)); }
};

}  // namespace lrnn
