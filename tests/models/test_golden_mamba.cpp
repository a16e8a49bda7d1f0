// Mamba against an independent PyTorch implementation (tools/golden_mamba.py, float64, token-loop
// scan; its [0,1] case also agrees with HF transformers' MambaForCausalLM): logits, loss, every
// gradient, and five clipped AdamW steps, for both eigenvalue ranges. Checked in double (to
// ~1e-10) and in float (the production path, to the precision fp32 allows).
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
  b["model_type"] = "mamba";
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "state_size", "expand", "conv_kernel",
                        "time_step_rank"})
    b[k] = int(g.cfg[k]);
  for (const char* k : {"allow_neg_eigval", "use_bias", "use_conv_bias"}) b[k] = bool(g.cfg[k]);
  b["layer_norm_epsilon"] = double(g.cfg["layer_norm_epsilon"]);
  auto m = create_model<T>(b, "golden", 0);
  for (auto& e : m->layout().entries()) {
    auto v = g.st.at("param." + e.name).to_f64();
    EXPECT_EQ(g.st.at("param." + e.name).shape, e.shape) << e.name;
    for (size_t i = 0; i < e.numel; ++i) m->params[e.offset + i] = T(v[i]);
  }
  EXPECT_EQ(g.st.tensors.size(), 6 + 3 * m->layout().entries().size()) << "golden has tensors the model lacks";
  return m;
}

constexpr const char* kNeg = "golden_mamba_neg.safetensors";
constexpr const char* kPos = "golden_mamba_pos_bias.safetensors";

}  // namespace

TEST(GoldenMamba, SignedDouble) { golden::check_forward_backward<double>(kNeg, 1e-10, build<double>); }
TEST(GoldenMamba, UnitWithBiasesDouble) { golden::check_forward_backward<double>(kPos, 1e-10, build<double>); }
TEST(GoldenMamba, SignedFloat) { golden::check_forward_backward<float>(kNeg, 2e-4, build<float>); }
TEST(GoldenMamba, UnitWithBiasesFloat) { golden::check_forward_backward<float>(kPos, 2e-4, build<float>); }
TEST(GoldenMamba, AdamWTrajectoryDouble) {
  golden::check_adamw<double>(kNeg, 1e-9, build<double>);
  golden::check_adamw<double>(kPos, 1e-9, build<double>);
}
TEST(GoldenMamba, AdamWTrajectoryFloat) {
  golden::check_adamw<float>(kNeg, 2e-4, build<float>);
  golden::check_adamw<float>(kPos, 2e-4, build<float>);
}
