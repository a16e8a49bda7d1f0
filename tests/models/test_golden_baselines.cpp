// The baselines against independent PyTorch float64 implementations (tools/golden_baselines.py):
// the Transformer against a hand-written Llama (itself checked against transformers'
// LlamaForCausalLM), the LSTM LM against torch.nn.LSTM. Logits, loss, every gradient, five
// clipped AdamW steps, and the config.json lrnn exports (the goldens carry it). Double to
// ~1e-10, float to fp32 precision.
#include <gtest/gtest.h>
#include "golden_util.h"

using namespace lrnn;

namespace {

const char* kFiles[] = {"golden_llama_2layer.safetensors", "golden_llama_long_theta100.safetensors",
                        "golden_lstm_2layer.safetensors", "golden_lstm_saturated.safetensors"};

class GoldenBaselines : public ::testing::TestWithParam<const char*> {};
TEST_P(GoldenBaselines, Double) { golden::check_golden<double>(GetParam(), golden::kDouble); }
TEST_P(GoldenBaselines, Float) { golden::check_golden<float>(GetParam(), golden::kFloat); }
INSTANTIATE_TEST_SUITE_P(Files, GoldenBaselines, ::testing::ValuesIn(kFiles), golden::case_name);

}  // namespace
