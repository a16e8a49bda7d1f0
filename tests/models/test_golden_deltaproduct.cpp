// (Gated) DeltaProduct and Gated DeltaNet against an independent PyTorch implementation
// (tools/golden_deltaproduct.py, float64, a loop over tokens and sub-steps): logits, loss, every
// gradient, and five clipped AdamW steps. Cases: n_h = 2 with both gates (expand_v 2, short
// conv, [-1,1]); n_h = 3, [-1,1], short conv, no gates; Gated DeltaNet (output gate, [0,1]).
// Checked in double (to ~1e-10) and in float (the production path, to what fp32 allows).
#include <gtest/gtest.h>
#include "golden_util.h"

using namespace lrnn;

namespace {

const char* kFiles[] = {"golden_deltaproduct_nh2_gates.safetensors", "golden_deltaproduct_nh3_conv.safetensors",
                        "golden_gated_deltanet.safetensors"};

class GoldenDeltaProduct : public ::testing::TestWithParam<const char*> {};
TEST_P(GoldenDeltaProduct, Double) { golden::check_golden<double>(GetParam(), golden::kDouble); }
TEST_P(GoldenDeltaProduct, Float) { golden::check_golden<float>(GetParam(), golden::kFloat); }
INSTANTIATE_TEST_SUITE_P(Files, GoldenDeltaProduct, ::testing::ValuesIn(kFiles), golden::case_name);

}  // namespace
