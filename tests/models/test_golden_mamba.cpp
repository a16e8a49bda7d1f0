// Mamba against an independent PyTorch implementation (tools/golden_mamba.py, float64, token-loop
// scan; its [0,1] case also agrees with HF transformers' MambaForCausalLM): logits, loss, every
// gradient, and five clipped AdamW steps, for both eigenvalue ranges ([-1,1]; [0,1] with biases).
// Checked in double (to ~1e-10) and in float (the production path, to the precision fp32 allows).
#include <gtest/gtest.h>
#include "golden_util.h"

using namespace lrnn;

namespace {

const char* kFiles[] = {"golden_mamba_neg.safetensors", "golden_mamba_pos_bias.safetensors"};

class GoldenMamba : public ::testing::TestWithParam<const char*> {};
TEST_P(GoldenMamba, Double) { golden::check_golden<double>(GetParam(), golden::kDouble, "mamba"); }
TEST_P(GoldenMamba, Float) { golden::check_golden<float>(GetParam(), golden::kFloat, "mamba"); }
INSTANTIATE_TEST_SUITE_P(Files, GoldenMamba, ::testing::ValuesIn(kFiles), golden::case_name);

}  // namespace
