// (Gated) DeltaProduct and Gated DeltaNet against an independent PyTorch implementation
// (tools/golden_deltaproduct.py, float64, a loop over tokens and sub-steps): logits, loss, every
// gradient, and five clipped AdamW steps. Cases: n_h = 2 with both gates (expand_v 2, short
// conv, [-1,1]); n_h = 3, [-1,1], short conv, no gates; Gated DeltaNet (output gate, [0,1]).
// Checked in double (to ~1e-10) and in float (the production path, to what fp32 allows).
#include <gtest/gtest.h>
#include "golden_util.h"
#include <cmath>
#include "io/safetensors.h"
#include "models/model.h"
#include "ops/adamw/adamw.h"

using namespace lrnn;

namespace {

// The golden's config is the engine's model block (fla's keys) as JSON.
template <class T>
std::unique_ptr<Model<T>> build(const golden::Golden& g) {
  YAML::Node b;
  for (auto it = g.cfg.begin(); it != g.cfg.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_boolean()) b[it.key()] = bool(v);
    else if (v.is_number_integer()) b[it.key()] = int(v);
    else if (v.is_number()) b[it.key()] = double(v);
    else b[it.key()] = v.get_ref<const std::string&>();
  }
  auto m = create_model<T>(b, "golden", 0);
  for (auto& e : m->layout().entries()) {
    EXPECT_EQ(g.st.at("param." + e.name).shape, e.shape) << e.name;
    auto v = g.st.at("param." + e.name).to_f64();
    for (size_t i = 0; i < e.numel; ++i) m->params[e.offset + i] = T(v[i]);
  }
  EXPECT_EQ(g.st.tensors.size(), 6 + 3 * m->layout().entries().size()) << "golden has tensors the model lacks";
  return m;
}

const char* kFiles[] = {"golden_deltaproduct_nh2_gates.safetensors", "golden_deltaproduct_nh3_conv.safetensors",
                        "golden_gated_deltanet.safetensors"};

class GoldenDeltaProduct : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GoldenDeltaProduct, ForwardBackwardDouble) { golden::check_forward_backward<double>(GetParam(), 1e-10, build<double>); }
TEST_P(GoldenDeltaProduct, ForwardBackwardFloat) { golden::check_forward_backward<float>(GetParam(), 2e-4, build<float>); }
TEST_P(GoldenDeltaProduct, AdamWTrajectoryDouble) { golden::check_adamw<double>(GetParam(), 1e-9, build<double>); }
TEST_P(GoldenDeltaProduct, AdamWTrajectoryFloat) { golden::check_adamw<float>(GetParam(), 2e-4, build<float>); }

INSTANTIATE_TEST_SUITE_P(Cases, GoldenDeltaProduct, ::testing::ValuesIn(kFiles), [](const auto& info) {
  std::string s = info.param;
  s = s.substr(7, s.size() - 7 - 12);  // golden_<case>.safetensors
  for (auto& ch : s)
    if (ch == '_') ch = 'X';
  return s;
});
