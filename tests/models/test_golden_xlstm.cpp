// mLSTM and sLSTM LMs against an independent PyTorch implementation (tools/golden_xlstm.py,
// float64 token loops): logits, loss, every gradient, and five clipped AdamW steps with the xlstm
// package's weight-decay groups. Checked in double (to ~1e-10) and in float (the production path).
#include <gtest/gtest.h>
#include "golden_util.h"

using namespace lrnn;

namespace {

const char* kFiles[] = {"golden_mlstm_conv.safetensors", "golden_mlstm_bias_noconv.safetensors",
                        "golden_slstm_conv.safetensors", "golden_slstm_noconv.safetensors"};

// Double: the parameters after the AdamW steps to 1e-8. Float, against the yardstick of a plain
// fp32 implementation: the PyTorch twin in float32 on the same cases reaches 6.1e-4 on a gradient
// (mLSTM input-gate bias: the output is nearly invariant to the input gates' scale, so that
// gradient is a cancellation) and 1.4e-3 on the parameters after five AdamW steps. That gradient
// is as sensitive to the exp's last bits as to the order of operations: lrnn reaches 1.25e-3 with
// its vectorised float exp (mean error 0.2 ulp), 3.7e-4 with libm's expf, and reached 6.7e-4 with
// an earlier, less accurate vectorised exp; so its bound is 2.5x the twin's, 1.5e-3.
constexpr golden::Tolerances kDouble{1e-10, 1e-9, 1e-8}, kFloat{1.5e-3, 2e-4, 1e-2};

class GoldenXLSTM : public ::testing::TestWithParam<const char*> {};
TEST_P(GoldenXLSTM, Double) { golden::check_golden<double>(GetParam(), kDouble); }
TEST_P(GoldenXLSTM, Float) { golden::check_golden<float>(GetParam(), kFloat); }
INSTANTIATE_TEST_SUITE_P(Files, GoldenXLSTM, ::testing::ValuesIn(kFiles), golden::case_name);

}  // namespace
