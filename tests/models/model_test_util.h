// What the model tests (test_deltanet, test_gated_deltaproduct, test_mamba, test_xlstm,
// test_baselines) share: a small double model with its parameters moved off their initial
// values, the whole-model finite-difference gradient check, the causality check, and the
// statistics of a parameter tensor the initialisation tests compare with the reference inits.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "core/rng.h"
#include "models/model.h"

namespace lrnn::test {

// The model of `block` in double with every parameter moved by jitter * N(0, 1), so that every
// path carries signal (norm weights away from 1, gates and recurrent kernels away from 0).
inline std::unique_ptr<Model<double>> jittered(const YAML::Node& block, uint64_t seed, double jitter) {
  auto m = create_model<double>(block, "test", seed);
  Rng r{seed, 9};
  for (size_t i = 0; i < m->params.size(); ++i) m->params[i] += jitter * r.normal(i);
  return m;
}

// The worst relative error max |num - analytic| / max(1e-2, |num|) of the loss gradient against
// central differences, over ~7 entries of every parameter tensor, on random tokens with a third
// of the labels ignored. `where` names the entry. fourth_order: the 4-point stencil with
// h = 1e-4 (for models whose loss has large higher derivatives), else 2 points with h = 1e-5.
inline double whole_model_fd_error(Model<double>& m, int B, int T, std::string* where, bool fourth_order = false) {
  const int V = m.vocab_size();
  std::vector<int32_t> tok(B * T), lab(B * T);
  Rng r{5, 1};
  for (int i = 0; i < B * T; ++i) {
    tok[i] = int32_t(r.below(i, V));
    lab[i] = (i % 3 == 1) ? -1 : int32_t(r.below(i + 100, V));
  }
  std::fill(m.grads.begin(), m.grads.end(), 0.0);
  m.forward(tok.data(), lab.data(), B, T);
  m.backward();
  std::vector<double> g = m.grads;
  double worst = 0;
  for (auto& e : m.layout().entries()) {
    for (size_t i = 0; i < e.numel; i += std::max<size_t>(1, e.numel / 6)) {
      double& p = m.params[e.offset + i];
      const double p0 = p, h = fourth_order ? 1e-4 : 1e-5;
      auto at = [&](double x) {
        p = x;
        return m.forward(tok.data(), lab.data(), B, T);
      };
      double num = fourth_order ? (8 * (at(p0 + h) - at(p0 - h)) - (at(p0 + 2 * h) - at(p0 - 2 * h))) / (12 * h)
                                : (at(p0 + h) - at(p0 - h)) / (2 * h);
      p = p0;
      double err = std::abs(num - g[e.offset + i]) / std::max(1e-2, std::abs(num));
      if (err > worst) {
        worst = err;
        *where = e.name + "[" + std::to_string(i) + "]";
        if (fourth_order) *where += ": analytic " + std::to_string(g[e.offset + i]) + " numeric " + std::to_string(num);
      }
    }
  }
  return worst;
}

// The same, checked against `tol`.
inline void whole_model_gradcheck(Model<double>& m, int B = 2, int T = 7, double tol = 1e-5) {
  std::string where;
  const double worst = whole_model_fd_error(m, B, T, &where);
  EXPECT_LT(worst, tol) << "worst at " << where;
}

// Changing the token at position 4 of sequence 0 leaves the logits before 4, and those of
// sequence 1, unchanged (bitwise), and changes those at 4.
inline void check_causal(Model<double>& m) {
  const int B = 2, T = 8, V = m.vocab_size();
  std::vector<int32_t> tok{1, 2, 3, 4, 0, 1, 2, 3, 4, 4, 4, 1, 2, 0, 0, 1};
  m.forward(tok.data(), nullptr, B, T);
  std::vector<double> before(m.logits(), m.logits() + B * T * V);
  tok[4] = 3;
  m.forward(tok.data(), nullptr, B, T);
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) {
      if (t < 4) {
        EXPECT_EQ(before[t * V + v], m.logits()[t * V + v]) << t;
      }
      EXPECT_EQ(before[(T + t) * V + v], m.logits()[(T + t) * V + v]) << t;
    }
  double changed = 0;
  for (int v = 0; v < V; ++v) changed += std::abs(before[4 * V + v] - m.logits()[4 * V + v]);
  EXPECT_GT(changed, 1e-6);
}

// Root mean square, largest magnitude and mean of one parameter tensor.
struct Stats {
  double rms, max_abs, mean;
};
inline Stats stats(const Model<float>& m, const std::string& name) {
  auto& e = m.layout().at(name);
  double s = 0, mx = 0, sum = 0;
  for (size_t i = 0; i < e.numel; ++i) {
    double x = m.params[e.offset + i];
    s += x * x;
    sum += x;
    mx = std::max(mx, std::abs(x));
  }
  return {std::sqrt(s / e.numel), mx, sum / e.numel};
}

}  // namespace lrnn::test
