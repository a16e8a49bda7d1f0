// What every golden test shares: loading a golden file written by an independent float64 PyTorch
// twin (tools/golden_*.py), and checking a model built from it — logits, loss and every gradient
// (check_forward_backward), and five clipped AdamW steps (check_adamw). Each test file supplies
// only how to build its model from the golden's config.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include "io/safetensors.h"
#include "models/model.h"
#include "ops/adamw/adamw.h"

namespace lrnn::golden {

struct Golden {
  io::SafeTensors st;
  nlohmann::json cfg, hf, adam;  // hf: the public config.json, where the golden carries one
  std::vector<int32_t> tokens, labels;
  int B = 0, T = 0;
};

inline Golden load(const std::string& name) {
  Golden g;
  g.st = io::read_safetensors(std::string(LRNN_TEST_DATA) + "/" + name);
  g.cfg = nlohmann::json::parse(g.st.metadata.at("config"));
  if (g.st.metadata.count("hf_config")) g.hf = nlohmann::json::parse(g.st.metadata.at("hf_config"));
  g.adam = nlohmann::json::parse(g.st.metadata.at("adamw"));
  auto& in = g.st.at("inputs");
  g.B = int(in.shape[0]);
  g.T = int(in.shape[1]);
  for (auto x : in.to_i64()) g.tokens.push_back(int32_t(x));
  for (auto x : g.st.at("labels").to_i64()) g.labels.push_back(int32_t(x));
  return g;
}

// max |a - b| / (max |b| + tiny)
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return d / (s + 1e-30);
}
template <class T>
double rel_err(const T* a, const std::vector<double>& b) {
  return rel_err(std::vector<double>(a, a + b.size()), b);
}

template <class T>
using Builder = std::unique_ptr<Model<T>> (*)(const Golden&);

// Loss, logits and every parameter gradient; with check_hf also the model's config.json.
template <class T>
void check_forward_backward(const std::string& file, double tol, Builder<T> build, bool check_hf = false) {
  Golden g = load(file);
  auto m = build(g);
  std::fill(m->grads.begin(), m->grads.end(), T(0));
  double loss = m->forward(g.tokens.data(), g.labels.data(), g.B, g.T);
  if (check_hf) {
    EXPECT_EQ(m->hf_config(), g.hf) << "config.json differs from the one the golden tool loaded into PyTorch";
  }
  EXPECT_NEAR(loss, g.st.at("loss").to_f64()[0], tol * 10);
  EXPECT_LT(rel_err(m->logits(), g.st.at("logits").to_f64()), tol);
  m->backward();
  for (auto& e : m->layout().entries())
    EXPECT_LT(rel_err(m->grads.data() + e.offset, g.st.at("grad." + e.name).to_f64()), tol) << e.name;
}

// The golden's AdamW trajectory (clipping, decay groups): losses and gradient norms to `tol`,
// the final parameters to `param_tol` (0: 10 * tol).
template <class T>
void check_adamw(const std::string& file, double tol, Builder<T> build, double param_tol = 0) {
  if (param_tol == 0) param_tol = 10 * tol;
  Golden g = load(file);
  auto m = build(g);
  const size_t P = m->params.size();
  std::vector<T> mom(P, 0), vel(P, 0);
  std::vector<uint8_t> decay(P, 0);
  for (auto& e : m->layout().entries())
    if (e.weight_decay) std::fill(decay.begin() + e.offset, decay.begin() + e.offset + e.numel, 1);
  auto losses = g.st.at("adam.loss").to_f64(), norms = g.st.at("adam.grad_norm").to_f64();
  for (int k = 0; k < int(g.adam["steps"]); ++k) {
    std::fill(m->grads.begin(), m->grads.end(), T(0));
    double loss = m->forward(g.tokens.data(), g.labels.data(), g.B, g.T);
    m->backward();
    double norm = ops::global_norm(m->grads.data(), P);
    EXPECT_NEAR(loss, losses[k], tol * std::max(1.0, losses[k])) << "step " << k;
    EXPECT_NEAR(norm, norms[k], tol * 10 * norms[k]) << "step " << k;
    ops::clip_by_global_norm(m->grads.data(), P, norm, double(g.adam["max_grad_norm"]));
    ops::AdamWParams ap{double(g.adam["lr"]), double(g.adam["beta1"]), double(g.adam["beta2"]),
                        double(g.adam["eps"]), double(g.adam["weight_decay"]), k + 1};
    ops::adamw_update(m->params.data(), m->grads.data(), mom.data(), vel.data(), decay.data(), P, ap);
  }
  for (auto& e : m->layout().entries())
    EXPECT_LT(rel_err(m->params.data() + e.offset, g.st.at("adam.param." + e.name).to_f64()), param_tol) << e.name;
}

}  // namespace lrnn::golden
