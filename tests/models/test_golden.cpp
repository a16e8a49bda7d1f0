// DeltaNet against an independent PyTorch implementation (tools/golden_deltanet.py, float64):
// logits, loss, every gradient, and five clipped AdamW steps. Checked in double (to ~1e-10) and
// in float (the production path, to the precision fp32 allows). Cases: eigenvalues in [-1,1]
// with short conv; [0,1] without; a language model with tied embeddings.
#include <gtest/gtest.h>
#include "golden_util.h"

using namespace lrnn;

namespace {

const char* kFiles[] = {"golden_deltanet_neg.safetensors", "golden_deltanet_pos_noconv.safetensors",
                        "golden_deltanet_lm_tied.safetensors"};

class GoldenDeltaNet : public ::testing::TestWithParam<const char*> {};
TEST_P(GoldenDeltaNet, Double) { golden::check_golden<double>(GetParam(), golden::kDouble, "delta_net"); }
TEST_P(GoldenDeltaNet, Float) { golden::check_golden<float>(GetParam(), golden::kFloat, "delta_net"); }
INSTANTIATE_TEST_SUITE_P(Files, GoldenDeltaNet, ::testing::ValuesIn(kFiles), golden::case_name);

}  // namespace
