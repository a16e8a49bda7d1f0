// Hand-set state trackers for the delta rule with Householder sub-steps: group words whose
// elements act on the state as products of reflections I - 2 k k^T (beta = 2), with the exact
// answers a test compares against. Parity (n_h 1), S3 (n_h 2), Z5 as 5-cycles and all of S5 (n_h
// 4, transpositions along (e_a - e_b)/sqrt 2, exactly representable directions), and Z5 as
// rotations by 72 degrees (two reflections whose directions are irrational: fp32 inputs only).
// Used by the CPU tests (tests/ops) and the CUDA tests (tests/cuda).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <vector>
#include "core/rng.h"
#include "ops/delta_rule/delta_rule.h"

namespace lrnn::test {

struct GroupWord {
  const char* name;
  int n_h, coords;                               // sub-steps per token; the group acts on R^coords
  std::vector<std::vector<std::vector<double>>> keys;  // per element, per sub-step: a unit key (empty: none)
  std::vector<std::vector<double>> mats;         // per element, its coords x coords matrix (row-major)
};

// Reflection normal across the line at angle phi in the plane of coordinates 0, 1.
inline std::vector<double> normal_at(double phi) { return {-std::sin(phi), std::cos(phi)}; }

inline GroupWord parity_group() {
  return {"parity", 1, 1, {{{}}, {{1.0}}}, {{1.0}, {-1.0}}};
}
inline GroupWord cyclic5() {  // rotation by 72 j degrees = reflection across 0, then across 36 j degrees
  GroupWord g{"Z5", 2, 2, {}, {}};
  const double pi = std::acos(-1.0);
  for (int j = 0; j < 5; ++j) {
    const double th = 2 * pi * j / 5;
    g.keys.push_back(j == 0 ? std::vector<std::vector<double>>{{}, {}}
                            : std::vector<std::vector<double>>{normal_at(0), normal_at(th / 2)});
    g.mats.push_back({std::cos(th), -std::sin(th), std::sin(th), std::cos(th)});
  }
  return g;
}
inline GroupWord symmetric3() {  // permutation matrices; a transposition (a b) reflects along e_a - e_b
  GroupWord g{"S3", 2, 3, {}, {}};
  const double r = 1 / std::sqrt(2.0);
  auto t = [&](int a, int b) {
    std::vector<double> k(3, 0.0);
    k[a] = r, k[b] = -r;
    return k;
  };
  auto perm = [](std::vector<int> p) {  // the matrix sending e_i to e_p[i]
    std::vector<double> m(9, 0.0);
    for (int i = 0; i < 3; ++i) m[p[i] * 3 + i] = 1.0;
    return m;
  };
  g.keys = {{{}, {}}, {t(0, 1), {}}, {t(1, 2), {}}, {t(0, 2), {}}, {t(0, 1), t(1, 2)}, {t(1, 2), t(0, 1)}};
  // The products in the order the sub-steps apply (second after first): (12)(01) and (01)(12).
  g.mats = {perm({0, 1, 2}), perm({1, 0, 2}), perm({0, 2, 1}), perm({2, 1, 0}), perm({2, 0, 1}), perm({1, 2, 0})};
  return g;
}

// A tracker's inputs: a random word of T elements (the rng's seed depends on the group's size), as
// keys, beta logits (+40: beta = 2; -40: an unused sub-step), read-out queries q_t = qv, zero values.
struct TrackerInput {
  ops::DeltaRuleDims d;
  std::vector<float> q, k, v, bl;
  std::vector<double> qv;  // the read-out on the group's coordinates: sum_c (c + 1) e_c
  std::vector<int> word;
};
inline TrackerInput tracker_input(const GroupWord& g, int T, int D) {
  const int C = g.coords, E = int(g.mats.size());
  TrackerInput in{{}, std::vector<float>(size_t(T) * D, 0.f),
                  std::vector<float>(size_t(T) * g.n_h * D, 0.f), std::vector<float>(size_t(T) * g.n_h * D, 0.f),
                  std::vector<float>(size_t(T) * g.n_h), std::vector<double>(C), std::vector<int>(T)};
  in.d.B = 1, in.d.T = T, in.d.H = 1, in.d.Dk = in.d.Dv = D, in.d.n_h = g.n_h;
  in.d.range = ops::EigenRange::Signed, in.d.scale = 1;
  for (int c = 0; c < C; ++c) in.qv[c] = c + 1;
  Rng rng{uint64_t(17 + E), 3};
  for (int t = 0; t < T; ++t) {
    const int e = int(rng.u32(uint64_t(t)) % uint32_t(E));
    in.word[t] = e;
    for (int c = 0; c < C; ++c) in.q[size_t(t) * D + c] = float(in.qv[c]);
    for (int j = 0; j < g.n_h; ++j) {
      const auto& key = g.keys[e][j];
      in.bl[size_t(t) * g.n_h + j] = key.empty() ? -40.f : 40.f;
      for (size_t c = 0; c < key.size(); ++c) in.k[(size_t(t) * g.n_h + j) * D + c] = float(key[c]);
      if (key.empty()) in.k[(size_t(t) * g.n_h + j) * D] = 1.f;  // a unit key with beta ~ 0
    }
  }
  return in;
}

// Permutations of `n` coordinates, each as its shortest word of at most n_h transpositions (a
// transposition (a b) reflects along (e_a - e_b) / sqrt 2; the word is padded with unused
// sub-steps); `keep` picks the elements (all of S_n, or a subgroup).
inline GroupWord permutations(const char* name, int n, int n_h, const std::function<bool(const std::vector<int>&)>& keep) {
  GroupWord g{name, n_h, n, {}, {}};
  const double r = 1 / std::sqrt(2.0);
  std::vector<std::pair<int, int>> ts{{-1, -1}};  // (-1, -1): an unused sub-step
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) ts.push_back({a, b});
  std::map<std::vector<int>, std::vector<int>> shortest;  // permutation -> its word (indices into ts)
  std::vector<int> word(n_h, 0);
  for (;;) {
    std::vector<int> p(n);  // the permutation after the sub-steps in order: e_i -> e_p[i]
    std::iota(p.begin(), p.end(), 0);
    int len = 0;
    for (int w : word)
      if (w) {
        ++len;
        for (int& x : p) x = x == ts[w].first ? ts[w].second : x == ts[w].second ? ts[w].first : x;
      }
    auto it = shortest.find(p);
    auto used = [&](const std::vector<int>& ws) { return int(std::count_if(ws.begin(), ws.end(), [](int w) { return w; })); };
    if (keep(p) && (it == shortest.end() || len < used(it->second))) shortest[p] = word;
    int j = 0;
    while (j < n_h && ++word[j] == int(ts.size())) word[j++] = 0;
    if (j == n_h) break;
  }
  for (const auto& [p, w] : shortest) {
    std::vector<std::vector<double>> keys;
    for (int x : w) {
      std::vector<double> k;
      if (x) k.assign(n, 0.0), k[ts[x].first] = r, k[ts[x].second] = -r;
      keys.push_back(k);
    }
    g.keys.push_back(keys);
    std::vector<double> m(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i) m[p[i] * n + i] = 1.0;
    g.mats.push_back(m);
  }
  return g;
}

// The trackers that every precision must carry: parity (n_h 1), S3 (n_h 2), Z5 as the powers of
// the 5-cycle 0 -> 1 -> 2 -> 3 -> 4 -> 0 and all of S5 (n_h 4).
inline std::vector<GroupWord> exact_trackers() {
  GroupWord s5 = permutations("S5", 5, 4, [](const std::vector<int>&) { return true; });
  GroupWord z5 = permutations("Z5 (5-cycles)", 5, 4, [](const std::vector<int>& p) {
    for (int s = 0; s < 5; ++s) {
      bool shift = true;
      for (int i = 0; i < 5; ++i) shift = shift && p[i] == (i + s) % 5;
      if (shift) return true;
    }
    return false;
  });
  return {parity_group(), symmetric3(), z5, s5};
}

// Value gradients through a tracker's whole word: with the loss L = g . o_{T-1}, g = e_0 (only the
// last read-out has a gradient), event e's value gradient is dv_e = beta_e (q^T R_last ...
// R_{e+1} k_e) g, the gradient carried back through every later transition R = I - beta k k^T;
// the exact reflections give it in double. Returns the worst deviation of `dv` ([T][n_h][D]) from
// it over every event and column, relative to |q|, and the event where it is.
struct GradientDeviation {
  double worst = 0;
  int64_t event = -1;
};
inline std::vector<float> last_readout_gradient(const TrackerInput& in) {
  std::vector<float> dout(size_t(in.d.T) * in.d.Dv, 0.f);
  dout[size_t(in.d.T - 1) * in.d.Dv] = 1.f;
  return dout;
}
inline GradientDeviation value_gradient_deviation(const GroupWord& g, const TrackerInput& in,
                                                  const std::vector<float>& dv) {
  const int D = in.d.Dv;
  const size_t NE = size_t(in.d.T) * g.n_h;
  double qn = 0;
  for (double x : in.qv) qn += x * x;
  qn = std::sqrt(qn);
  GradientDeviation r;
  std::vector<double> w(in.qv);  // R_{e+1} ... R_last q
  for (size_t e = NE; e-- > 0;) {
    const auto& key = g.keys[in.word[e / g.n_h]][e % g.n_h];
    double s = 0;
    for (size_t c = 0; c < key.size(); ++c) s += w[c] * key[c];
    const double beta = key.empty() ? 0.0 : 2.0;
    for (int c = 0; c < D; ++c) {
      const double dev = std::fabs(double(dv[e * D + c]) - (c == 0 ? beta * s : 0.0)) / qn;
      if (dev > r.worst) r.worst = dev, r.event = int64_t(e);
    }
    for (size_t c = 0; c < key.size(); ++c) w[c] -= beta * key[c] * s;  // w <- R_e w
  }
  return r;
}

}  // namespace lrnn::test
