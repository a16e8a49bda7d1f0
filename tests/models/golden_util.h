// What every golden test shares: loading a golden file written by an independent float64 PyTorch
// twin (tools/golden_*.py), building the model it describes with its parameters, and checking
// it — logits, loss and every gradient (check_forward_backward; also the model's config.json
// where the golden carries one), and five clipped AdamW steps (check_adamw). A test names its
// cases and tolerances and calls check_golden.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
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

// The golden's config is the model block as JSON (model_type may be left to the test), key by key.
inline YAML::Node model_block(const nlohmann::json& cfg, const std::string& model_type) {
  YAML::Node b;
  if (!model_type.empty()) b["model_type"] = model_type;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_boolean()) b[it.key()] = bool(v);
    else if (v.is_number_integer()) b[it.key()] = int(v);
    else if (v.is_number()) b[it.key()] = double(v);
    else b[it.key()] = v.get<std::string>();
  }
  return b;
}

// The golden's model with the golden's initial parameters (every tensor's shape checked, and no
// tensor of the golden left over).
template <class T>
std::unique_ptr<Model<T>> build(const Golden& g, const std::string& model_type) {
  auto m = create_model<T>(model_block(g.cfg, model_type), "golden", 0);
  for (auto& e : m->layout().entries()) {
    const auto& t = g.st.at("param." + e.name);
    EXPECT_EQ(t.shape, e.shape) << e.name;
    auto v = t.to_f64();
    for (size_t i = 0; i < e.numel; ++i) m->params[e.offset + i] = T(v[i]);
  }
  EXPECT_EQ(g.st.tensors.size(), 6 + 3 * m->layout().entries().size()) << "golden has tensors the model lacks";
  return m;
}

// Loss, logits and every parameter gradient to `tol` (the loss to 10 * tol); where the golden
// carries a config.json (hf_config), the model's must be the same.
template <class T>
void check_forward_backward(const Golden& g, const std::string& model_type, double tol) {
  auto m = build<T>(g, model_type);
  std::fill(m->grads.begin(), m->grads.end(), T(0));
  double loss = m->forward(g.tokens.data(), g.labels.data(), g.B, g.T);
  if (!g.hf.is_null()) {
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
void check_adamw(const Golden& g, const std::string& model_type, double tol, double param_tol) {
  if (param_tol == 0) param_tol = 10 * tol;
  auto m = build<T>(g, model_type);
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

// A golden test's tolerances in one precision (relative to the largest magnitude of each tensor).
struct Tolerances {
  double forward;     // logits and gradients (the loss: 10x)
  double adamw;       // the AdamW trajectory's losses (gradient norms: 10x)
  double params = 0;  // the parameters after the AdamW steps (0: 10 * adamw)
};
constexpr Tolerances kDouble{1e-10, 1e-9}, kFloat{2e-4, 2e-4};

// The whole check of one golden file in precision T: forward and backward, then the AdamW steps.
// model_type: for goldens whose config has none.
template <class T>
void check_golden(const std::string& file, const Tolerances& tol, const std::string& model_type = "") {
  SCOPED_TRACE(file);
  const Golden g = load(file);
  {
    SCOPED_TRACE("forward and backward");
    check_forward_backward<T>(g, model_type, tol.forward);
  }
  SCOPED_TRACE("AdamW trajectory");
  check_adamw<T>(g, model_type, tol.adamw, tol.params);
}

// A parametrised golden test's name: its file's case (golden_<case>.safetensors -> <case>).
inline std::string case_name(const ::testing::TestParamInfo<const char*>& info) {
  const std::string file = info.param;
  return file.substr(7, file.size() - 7 - 12);
}

}  // namespace lrnn::golden
