// The baselines against independent PyTorch float64 implementations (tools/golden_baselines.py):
// the Transformer against a hand-written Llama (itself checked against transformers'
// LlamaForCausalLM), the LSTM LM against torch.nn.LSTM. Logits, loss, every gradient, five
// clipped AdamW steps, and the config.json lrnn exports. Double to ~1e-10, float to fp32 precision.
#include <gtest/gtest.h>
#include "golden_util.h"
#include <cmath>
#include "io/safetensors.h"
#include "models/model.h"
#include "ops/adamw/adamw.h"

using namespace lrnn;

namespace {

// The golden's model block (JSON) as the YAML block lrnn reads.
YAML::Node block_of(const nlohmann::json& j) {
  YAML::Node b;
  for (auto& [k, v] : j.items()) {
    if (v.is_string()) b[k] = v.get<std::string>();
    else if (v.is_boolean()) b[k] = v.get<bool>();
    else if (v.is_number_integer()) b[k] = v.get<int64_t>();
    else b[k] = v.get<double>();
  }
  return b;
}

template <class T>
std::unique_ptr<Model<T>> build(const golden::Golden& g) {
  auto m = create_model<T>(block_of(g.cfg), "golden", 0);
  for (auto& e : m->layout().entries()) {
    const auto& t = g.st.at("param." + e.name);
    EXPECT_EQ(t.shape, e.shape) << e.name;
    auto v = t.to_f64();
    for (size_t i = 0; i < e.numel; ++i) m->params[e.offset + i] = T(v[i]);
  }
  EXPECT_EQ(g.st.tensors.size(), 6 + 3 * m->layout().entries().size()) << "golden has tensors the model lacks";
  return m;
}

const char* kFiles[] = {"golden_llama_2layer.safetensors", "golden_llama_long_theta100.safetensors",
                        "golden_lstm_2layer.safetensors", "golden_lstm_saturated.safetensors"};

}  // namespace

class GoldenBaselines : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Files, GoldenBaselines, ::testing::ValuesIn(kFiles),
                         [](const auto& info) { return std::string(info.param).substr(7, std::string(info.param).size() - 19); });

TEST_P(GoldenBaselines, ForwardBackwardDouble) { golden::check_forward_backward<double>(GetParam(), 1e-10, build<double>, true); }
TEST_P(GoldenBaselines, ForwardBackwardFloat) { golden::check_forward_backward<float>(GetParam(), 2e-4, build<float>, true); }
TEST_P(GoldenBaselines, AdamWTrajectoryDouble) { golden::check_adamw<double>(GetParam(), 1e-9, build<double>); }
TEST_P(GoldenBaselines, AdamWTrajectoryFloat) { golden::check_adamw<float>(GetParam(), 2e-4, build<float>); }
