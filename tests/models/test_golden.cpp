// DeltaNet against an independent PyTorch implementation (tools/golden_deltanet.py, float64):
// logits, loss, every gradient, and five clipped AdamW steps. Checked in double (to ~1e-10) and
// in float (the production path, to the precision fp32 allows).
#include <gtest/gtest.h>
#include "golden_util.h"
#include <cmath>
#include "io/safetensors.h"
#include "models/model.h"
#include "ops/adamw/adamw.h"

using namespace lrnn;

namespace {

template <class T>
std::unique_ptr<Model<T>> build(const golden::Golden& g) {
  YAML::Node b;
  b["model_type"] = "delta_net";
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "conv_size", "intermediate_size"})
    b[k] = int(g.cfg[k]);
  b["use_short_conv"] = bool(g.cfg["use_short_conv"]);
  b["allow_neg_eigval"] = bool(g.cfg["allow_neg_eigval"]);
  b["norm_eps"] = double(g.cfg["norm_eps"]);
  auto m = create_model<T>(b, "golden", 0);
  for (auto& e : m->layout().entries()) {
    auto v = g.st.at("param." + e.name).to_f64();
    EXPECT_EQ(g.st.at("param." + e.name).shape, e.shape) << e.name;
    for (size_t i = 0; i < e.numel; ++i) m->params[e.offset + i] = T(v[i]);
  }
  EXPECT_EQ(g.st.tensors.size(), 6 + 3 * m->layout().entries().size()) << "golden has tensors the model lacks";
  return m;
}

}  // namespace

TEST(GoldenDeltaNet, SignedWithConvDouble) { golden::check_forward_backward<double>("golden_deltanet_neg.safetensors", 1e-10, build<double>); }
TEST(GoldenDeltaNet, UnitNoConvDouble) { golden::check_forward_backward<double>("golden_deltanet_pos_noconv.safetensors", 1e-10, build<double>); }
TEST(GoldenDeltaNet, SignedWithConvFloat) { golden::check_forward_backward<float>("golden_deltanet_neg.safetensors", 2e-4, build<float>); }
TEST(GoldenDeltaNet, UnitNoConvFloat) { golden::check_forward_backward<float>("golden_deltanet_pos_noconv.safetensors", 2e-4, build<float>); }
TEST(GoldenDeltaNet, AdamWTrajectoryDouble) {
  golden::check_adamw<double>("golden_deltanet_neg.safetensors", 1e-9, build<double>);
  golden::check_adamw<double>("golden_deltanet_pos_noconv.safetensors", 1e-9, build<double>);
}
TEST(GoldenDeltaNet, AdamWTrajectoryFloat) {
  golden::check_adamw<float>("golden_deltanet_neg.safetensors", 2e-4, build<float>);
  golden::check_adamw<float>("golden_deltanet_pos_noconv.safetensors", 2e-4, build<float>);
}
