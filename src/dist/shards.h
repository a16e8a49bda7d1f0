// How ZeRO-1 cuts the flat parameter vector among data-parallel ranks (train/engine_cuda.cpp):
// rank r owns [r·S, r·S + S) of a buffer padded to N·S elements, with S a multiple of 64 (every
// slice starts 256-byte aligned for fp32, as NCCL's reduce-scatter and all-gather want equal,
// contiguous pieces). One rank owns everything, unpadded.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace lrnn::dist {

struct Shards {
  size_t total = 0;     // P, the model's parameters
  size_t per_rank = 0;  // S
  int ranks = 1;        // N

  static Shards of(size_t total, int ranks) {
    Shards s;
    s.total = total;
    s.ranks = ranks;
    s.per_rank = ranks <= 1 ? total : (total + size_t(ranks) * 64 - 1) / (size_t(ranks) * 64) * 64;
    return s;
  }
  size_t padded() const { return per_rank * size_t(ranks); }
  // The part of [0, total) that rank r owns (empty for ranks that hold only padding).
  size_t begin(int r) const { return std::min(total, size_t(r) * per_rank); }
  size_t end(int r) const { return std::min(total, begin(r) + per_rank); }
  // Rank r's slice of a full per-parameter vector, zero past `total`.
  template <class T>
  std::vector<T> slice(const std::vector<T>& full, int r) const {
    std::vector<T> s(per_rank, T(0));
    std::copy(full.begin() + std::ptrdiff_t(begin(r)), full.begin() + std::ptrdiff_t(end(r)), s.begin());
    return s;
  }
};

}  // namespace lrnn::dist
