// Counter-based RNG (Philox4x32-10, Salmon et al. 2011). A number depends only on
// (key, counter), never on call order, so the CPU and a GPU kernel produce identical streams
// and a resumed run regenerates exactly the data of the step it resumes at.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace lrnn {

struct U32x4 { uint32_t v[4]; };

LRNN_HD U32x4 philox4x32(U32x4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(M0) * ctr.v[0], p1 = uint64_t(M1) * ctr.v[2];
    U32x4 n;
    n.v[0] = uint32_t(p1 >> 32) ^ ctr.v[1] ^ k0;
    n.v[1] = uint32_t(p1);
    n.v[2] = uint32_t(p0 >> 32) ^ ctr.v[3] ^ k1;
    n.v[3] = uint32_t(p0);
    ctr = n;
    k0 += W0; k1 += W1;
  }
  return ctr;
}

// A stream of random numbers addressed by (seed, stream, index). `stream` separates uses
// (data, init, dropout...), `index` is the position inside the stream.
struct Rng {
  uint64_t seed = 0;
  uint64_t stream = 0;

  LRNN_HD U32x4 block(uint64_t index) const {
    U32x4 c{{uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)}};
    return philox4x32(c, uint32_t(seed), uint32_t(seed >> 32));
  }
  LRNN_HD uint32_t u32(uint64_t i) const { return block(i >> 2).v[i & 3]; }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  LRNN_HD float uniform(uint64_t i) const { return float(u32(i) >> 8) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n): multiply-shift, bias below 2^-32 * n.
  LRNN_HD uint32_t below(uint64_t i, uint32_t n) const {
    return uint32_t((uint64_t(u32(i)) * n) >> 32);
  }
  // Standard normal by Box-Muller on two 32-bit draws (computed in double, same on every backend).
  LRNN_HD double normal(uint64_t i) const {
    U32x4 b = block(i);
    double u1 = (double(b.v[0]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
    double u2 = double(b.v[1]) * (1.0 / 4294967296.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  }
  Rng sub(uint64_t s) const { return Rng{seed, stream * 1000003ull + s + 1}; }
};

}  // namespace lrnn
