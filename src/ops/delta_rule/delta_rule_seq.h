// One (batch, head) sequence of the delta rule's operands, as the CPU kernels read it (the
// recurrent reference in delta_rule_cpu.cpp and the chunked form in delta_rule_chunked_cpu.cpp).
#pragma once
#include <cstddef>
#include "ops/delta_rule/delta_rule.h"

namespace lrnn::ops::detail {

// Strided views of one (b, h) sequence.
// Element offsets of sequence b, head h in each operand (shared by the inputs and their grads).
struct Offsets {
  size_t q, k, v, b, g;
  Offsets(const DeltaRuleDims& d, int b_, int h) {
    const size_t tok = size_t(b_) * d.T;
    q = tok * d.lq() + size_t(h) * d.Dk;
    k = tok * d.lk() + size_t(h) * d.Dk;
    v = tok * d.lv() + size_t(h) * d.Dv;
    b = tok * d.lb() + h;
    g = tok * d.H + h;
  }
};

template <class T>
struct Seq {
  const T *q, *k, *v, *bl, *g;
  size_t lq, lk, lv, lb;   // token strides
  int H, Dk, Dv;
  Seq(const DeltaRuleDims& d, const Offsets& o, const T* q_, const T* k_, const T* v_, const T* b_, const T* g_)
      : q(q_ + o.q), k(k_ + o.k), v(v_ + o.v), bl(b_ + o.b), g(g_ ? g_ + o.g : nullptr),
        lq(d.lq()), lk(d.lk()), lv(d.lv()), lb(d.lb()), H(d.H), Dk(d.Dk), Dv(d.Dv) {}
  const T* qt(int t) const { return q + t * lq; }
  const T* kt(int t, int j) const { return k + t * lk + size_t(j) * H * Dk; }
  const T* vt(int t, int j) const { return v + t * lv + size_t(j) * H * Dv; }
  T blt(int t, int j) const { return bl[t * lb + size_t(j) * H]; }
  T gt(int t) const { return g[size_t(t) * H]; }
  size_t kidx(int t, int j) const { return t * lk + size_t(j) * H * Dk; }   // for dk
  size_t vidx(int t, int j) const { return t * lv + size_t(j) * H * Dv; }   // for dv
  size_t bidx(int t, int j) const { return t * lb + size_t(j) * H; }        // for dbeta
};

}  // namespace lrnn::ops::detail
