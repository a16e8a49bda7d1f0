// xLSTM LMs (mLSTM and sLSTM stacks): parameter table with the xlstm package's names and
// initialisation, whole-model finite-difference gradient checks in double, causality, config errors.
#include <gtest/gtest.h>
#include <cmath>
#include "core/rng.h"
#include "model_test_util.h"
#include "models/xlstm.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

std::unique_ptr<Model<double>> tiny(const std::string& type, const std::string& extra, uint64_t seed = 3) {
  auto block = YAML::Load("{model_type: " + type + ", vocab_size: 5, embedding_dim: 8, num_blocks: 2, num_heads: 2,"
                          " round_proj_up_to_multiple_of: 4" + extra + "}");
  return jittered(block, seed, 0.3);  // gates, norms and recurrent kernels away from their (often zero) inits
}

std::unique_ptr<Model<float>> p1(const std::string& type) {
  return create_model<float>(YAML::Load("{model_type: " + type + ", vocab_size: 3, embedding_dim: 128, num_blocks: 2, num_heads: 4}"),
                             "test", 7);
}

}  // namespace

TEST(XLSTM, ParameterTableOfP1MlstmModel) {
  auto m = p1("mlstm");
  // per block: norm 128, proj_up 512x128, q/k/v 3x64x4x4, conv 256x4 + 256, igate/fgate 2x(4x768 + 4),
  // outnorm 256, skip 256, proj_down 128x256; plus embedding, post norm, lm_head.
  EXPECT_EQ(m->layout().count(), 219792u);
  auto& L = m->layout();
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.1.xlstm.proj_up.weight").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.q_proj.weight").shape, (std::vector<int64_t>{64, 4, 4}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.conv1d.conv.weight").shape, (std::vector<int64_t>{256, 1, 4}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.mlstm_cell.igate.weight").shape, (std::vector<int64_t>{4, 768}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.mlstm_cell.fgate.bias").shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.1.xlstm.proj_down.weight").shape, (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(L.at("xlstm_block_stack.post_blocks_norm.weight").shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(L.find("xlstm_block_stack.blocks.0.xlstm.proj_up.bias"), nullptr);  // bias: false
  EXPECT_EQ(L.find("xlstm_block_stack.blocks.0.ffn.proj_up.weight"), nullptr);  // mLSTM blocks have no FFN
  // The package's weight-decay groups.
  EXPECT_FALSE(L.at("token_embedding.weight").weight_decay);
  EXPECT_TRUE(L.at("lm_head.weight").weight_decay);
  EXPECT_TRUE(L.at("xlstm_block_stack.blocks.0.xlstm.conv1d.conv.weight").weight_decay);
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.conv1d.conv.bias").weight_decay);
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.learnable_skip").weight_decay);
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.mlstm_cell.outnorm.weight").weight_decay);
  EXPECT_TRUE(L.at("xlstm_block_stack.blocks.0.xlstm.mlstm_cell.igate.weight").weight_decay);
  auto cfg = m->hf_config();
  EXPECT_EQ(cfg["mlstm_block"]["mlstm"]["num_heads"], 4);
  EXPECT_EQ(cfg["slstm_at"], nlohmann::json::array());
  EXPECT_TRUE(cfg["slstm_block"].is_null());
}

TEST(XLSTM, ParameterTableOfP1SlstmModel) {
  auto m = p1("slstm");
  // per block: norm 128, conv 128x4 + 128, 4 gates 4x32x32, recurrent kernel 4x32x128, bias 512,
  // group norm 128, ffn_norm 128, ffn up 384x128 (1.3 x 128 -> 192), ffn down 128x192.
  EXPECT_EQ(m->layout().count(), 216960u);
  auto& L = m->layout();
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.fgate.weight").shape, (std::vector<int64_t>{4, 32, 32}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.0.xlstm.slstm_cell._recurrent_kernel_").shape, (std::vector<int64_t>{4, 32, 128}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.1.xlstm.slstm_cell._bias_").shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.1.ffn.proj_up.weight").shape, (std::vector<int64_t>{384, 128}));
  EXPECT_EQ(L.at("xlstm_block_stack.blocks.1.ffn.proj_down.weight").shape, (std::vector<int64_t>{128, 192}));
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.slstm_cell._recurrent_kernel_").weight_decay);
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.slstm_cell._bias_").weight_decay);
  EXPECT_FALSE(L.at("xlstm_block_stack.blocks.0.xlstm.group_norm.weight").weight_decay);
  EXPECT_TRUE(L.at("xlstm_block_stack.blocks.0.xlstm.zgate.weight").weight_decay);
  auto cfg = m->hf_config();
  EXPECT_EQ(cfg["slstm_at"], "all");
  EXPECT_EQ(cfg["slstm_block"]["feedforward"]["proj_factor"], 1.3);
  EXPECT_EQ(cfg["slstm_block"]["slstm"]["backend"], "cuda");
}

TEST(XLSTM, InitFollowsThePackage) {
  auto m = p1("mlstm");
  const double small = std::sqrt(2.0 / (5 * 128));
  EXPECT_NEAR(stats(*m, "token_embedding.weight").rms, small, 0.01);
  EXPECT_NEAR(stats(*m, "xlstm_block_stack.blocks.0.xlstm.proj_up.weight").rms, small, 0.002);
  EXPECT_NEAR(stats(*m, "xlstm_block_stack.blocks.0.xlstm.proj_down.weight").rms, 2.0 / 2 / std::sqrt(128.0), 0.003);
  EXPECT_LE(stats(*m, "xlstm_block_stack.blocks.0.xlstm.conv1d.conv.bias").max_abs, 0.5);  // U(-1/sqrt(4), 1/sqrt(4))
  EXPECT_EQ(stats(*m, "xlstm_block_stack.blocks.0.xlstm.mlstm_cell.igate.weight").max_abs, 0.0);
  EXPECT_EQ(stats(*m, "xlstm_block_stack.blocks.0.xlstm_norm.weight").max_abs, 0.0);  // scale 1 + 0
  EXPECT_EQ(stats(*m, "xlstm_block_stack.blocks.0.xlstm.learnable_skip").mean, 1.0);
  auto& fb = m->layout().at("xlstm_block_stack.blocks.1.xlstm.mlstm_cell.fgate.bias");
  for (int h = 0; h < 4; ++h) EXPECT_FLOAT_EQ(m->params[fb.offset + h], 3.0f + h);  // linspace(3, 6, 4)
  auto s = p1("slstm");
  auto& b0 = s->layout().at("xlstm_block_stack.blocks.0.xlstm.slstm_cell._bias_");
  auto& b1 = s->layout().at("xlstm_block_stack.blocks.1.xlstm.slstm_cell._bias_");
  // powerlaw_blockdependent forget-gate biases: -(-5 + 12 (j/31)^(0.3 + 1.3 * block/(L-1))), per head.
  for (int h = 0; h < 4; ++h) {
    EXPECT_FLOAT_EQ(s->params[b0.offset + (h * 4 + 1) * 32 + 0], 5.0f);
    EXPECT_FLOAT_EQ(s->params[b0.offset + (h * 4 + 1) * 32 + 31], -7.0f);
    EXPECT_FLOAT_EQ(s->params[b1.offset + (h * 4 + 1) * 32 + 10], float(-(-5.0 + 12.0 * std::pow(10.0 / 31, 1.6))));
    EXPECT_EQ(s->params[b0.offset + (h * 4 + 0) * 32 + 7], 0.0f);  // input gate
    EXPECT_EQ(s->params[b0.offset + (h * 4 + 2) * 32 + 7], 0.0f);  // z
  }
  EXPECT_EQ(stats(*s, "xlstm_block_stack.blocks.0.xlstm.slstm_cell._recurrent_kernel_").max_abs, 0.0);
}

TEST(XLSTM, WholeModelGradientMlstmWithConvAndBiases) { whole_model_gradcheck(*tiny("mlstm", ", bias: true")); }
TEST(XLSTM, WholeModelGradientMlstmNoConvWideBlocks) {
  whole_model_gradcheck(*tiny("mlstm", ", conv1d_kernel_size: 0, qkv_proj_blocksize: 8, num_heads: 1"));
}
TEST(XLSTM, WholeModelGradientSlstmWithConv) { whole_model_gradcheck(*tiny("slstm", "")); }
TEST(XLSTM, WholeModelGradientSlstmNoConvNoGroupNormWeight) {
  whole_model_gradcheck(*tiny("slstm", ", conv1d_kernel_size: 0, group_norm_weight: false, num_heads: 1"));
}

TEST(XLSTM, CausalAndBatchIndependent) {
  for (const char* type : {"mlstm", "slstm"}) {
    SCOPED_TRACE(type);
    auto m = tiny(type, "");
    check_causal(*m);
    const int B = 2, T = 8, V = 5;
    std::vector<int32_t> tok{1, 2, 3, 4, 3, 1, 2, 3, 4, 4, 4, 1, 2, 0, 0, 1};
    // Training and inference forwards agree.
    std::vector<int32_t> lab(B * T, 1);
    m->forward(tok.data(), lab.data(), B, T);
    std::vector<double> train(m->logits(), m->logits() + B * T * V);
    m->forward(tok.data(), nullptr, B, T);
    for (int i = 0; i < B * T * V; ++i) EXPECT_EQ(train[i], m->logits()[i]);
  }
}

TEST(XLSTM, FloatMatchesDouble) {
  for (const char* type : {"mlstm", "slstm"}) {
    SCOPED_TRACE(type);
    auto d = tiny(type, "");
    auto f = create_model<float>(YAML::Load(std::string("{model_type: ") + type +
                                            ", vocab_size: 5, embedding_dim: 8, num_blocks: 2, num_heads: 2, round_proj_up_to_multiple_of: 4}"),
                                 "test", 3);
    for (size_t i = 0; i < d->params.size(); ++i) f->params[i] = float(d->params[i]);
    const int B = 3, T = 50;
    std::vector<int32_t> tok(B * T), lab(B * T);
    Rng r{8, 1};
    for (int i = 0; i < B * T; ++i) tok[i] = int32_t(r.below(i, 5)), lab[i] = int32_t(r.below(i + 500, 5));
    double ld = d->forward(tok.data(), lab.data(), B, T), lf = f->forward(tok.data(), lab.data(), B, T);
    EXPECT_NEAR(lf, ld, 1e-4 * std::abs(ld));
    std::fill(d->grads.begin(), d->grads.end(), 0.0);
    std::fill(f->grads.begin(), f->grads.end(), 0.f);
    d->backward();
    f->backward();
    double gmax = 0, err = 0;
    for (size_t i = 0; i < d->grads.size(); ++i) {
      gmax = std::max(gmax, std::abs(d->grads[i]));
      err = std::max(err, std::abs(d->grads[i] - double(f->grads[i])));
    }
    EXPECT_LT(err, 1e-3 * gmax);
  }
}

TEST(XLSTM, RejectsBadConfig) {
  auto bad = [](const std::string& y) { return create_model<float>(YAML::Load(y), "x", 0); };
  EXPECT_THROW(bad("{model_type: slstm, embedding_dim: 10, num_heads: 4}"), UserError);
  EXPECT_THROW(bad("{model_type: mlstm, embedding_dim: 64, num_heads: 3}"), UserError);  // inner 128
  EXPECT_THROW(bad("{model_type: mlstm, embedding_dim: 64, qkv_proj_blocksize: 5}"), UserError);
  EXPECT_THROW(bad("{model_type: mlstm, bias_init: small_init}"), UserError);  // sLSTM-only key
  EXPECT_THROW(bad("{model_type: slstm, bias: true}"), UserError);             // mLSTM-only key
  EXPECT_THROW(bad("{model_type: slstm, recurrent_weight_init: ones}"), UserError);
  EXPECT_THROW(bad("{model_type: slstm, hidden_size: 64}"), UserError);
  try {
    bad("{model_type: mlstm, embedding_dim: 64, num_heads: 3}");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("x: model.num_heads"), std::string::npos) << e.what();
  }
  // Other initialisations build.
  EXPECT_NO_THROW(bad("{model_type: slstm, embedding_dim: 16, num_heads: 2, bias_init: standard, recurrent_weight_init: standard}"));
  EXPECT_NO_THROW(bad("{model_type: slstm, embedding_dim: 16, num_heads: 2, bias_init: small_init}"));
}
