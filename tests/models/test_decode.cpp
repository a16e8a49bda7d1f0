// Piecewise reading (Model::new_decode_state / forward_continue): a sequence read in pieces of
// any sizes gives the logits of one forward over the whole sequence, for every model type that
// has a decode state; the others say so. And the decode state's size does not grow with the
// length for the linear RNNs.
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include <vector>
#include "core/check.h"
#include "core/rng.h"
#include "infer/decoder.h"
#include "model_test_util.h"

namespace lrnn::test {
namespace {

struct Case {
  std::string name, block;
  bool grows = false;  // the state grows with the length (the Transformer's KV cache)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"deltanet_unit", "{model_type: delta_net, vocab_size: 7, hidden_size: 8, num_hidden_layers: 2, num_heads: 2,"
                        " intermediate_size: 12, initializer_range: 0.5}"},
      {"deltanet_signed_conv3", "{model_type: delta_net, vocab_size: 7, hidden_size: 8, num_hidden_layers: 2, num_heads: 2,"
                                " conv_size: 3, allow_neg_eigval: true, intermediate_size: 12, initializer_range: 0.5}"},
      {"deltanet_no_conv", "{model_type: delta_net, vocab_size: 7, hidden_size: 8, num_hidden_layers: 1, num_heads: 2,"
                           " use_short_conv: false, allow_neg_eigval: true, intermediate_size: 12, initializer_range: 0.5}"},
      {"gated_deltanet", "{model_type: gated_deltanet, vocab_size: 7, hidden_size: 8, num_hidden_layers: 2, num_heads: 2,"
                         " head_dim: 3, allow_neg_eigval: true, intermediate_size: 12, initializer_range: 0.5}"},
      {"gated_deltaproduct_3", "{model_type: gated_deltaproduct, vocab_size: 7, hidden_size: 8, num_hidden_layers: 2,"
                               " num_heads: 2, head_dim: 3, num_householder: 3, allow_neg_eigval: true,"
                               " intermediate_size: 12, initializer_range: 0.5}"},
      {"mamba_unit", "{model_type: mamba, vocab_size: 7, hidden_size: 8, state_size: 4, num_hidden_layers: 2,"
                     " expand: 2, conv_kernel: 3, time_step_rank: 2, initializer_range: 0.5}"},
      {"mamba_signed_k4", "{model_type: mamba, vocab_size: 7, hidden_size: 8, state_size: 16, num_hidden_layers: 2,"
                          " expand: 2, conv_kernel: 4, allow_neg_eigval: true, initializer_range: 0.5}"},
      {"llama", "{model_type: llama, vocab_size: 7, hidden_size: 8, num_hidden_layers: 2, num_attention_heads: 2,"
                " intermediate_size: 12, initializer_range: 0.5, rope_theta: 50.0}", /*grows=*/true},
  };
  return c;
}

class Decode : public ::testing::TestWithParam<Case> {};

// Random tokens; the logits of one forward, then of pieces of 1, 3, 1, 5, ... tokens.
TEST_P(Decode, PiecesEqualOneForward) {
  const Case& c = GetParam();
  auto m = jittered(YAML::Load(c.block), 11, 0.2);
  const int V = m->vocab_size(), T = 23;
  std::vector<int32_t> tok(T);
  Rng r{3, 4};
  for (int i = 0; i < T; ++i) tok[size_t(i)] = int32_t(r.below(uint64_t(i), uint32_t(V)));
  m->forward(tok.data(), nullptr, 1, T);
  const std::vector<double> whole(m->logits(), m->logits() + size_t(T) * V);

  auto st = m->new_decode_state(1);
  ASSERT_TRUE(st) << c.name << ": no decode state";
  const size_t bytes0 = st->bytes();
  const int pieces[] = {1, 3, 1, 5, 2, 4, 7};
  int at = 0;
  double worst = 0;
  for (int p : pieces) {
    const int n = std::min(p, T - at);
    if (n <= 0) break;
    m->forward_continue(tok.data() + at, 1, n, *st);
    for (int i = 0; i < n * V; ++i) worst = std::max(worst, std::abs(m->logits()[i] - whole[size_t(at) * V + size_t(i)]));
    at += n;
  }
  ASSERT_EQ(at, T);
  EXPECT_EQ(st->position, T);
  // Double precision: only the summation order of the recurrences differs (none here) — the
  // pieces see exactly the inputs of the whole forward.
  EXPECT_LT(worst, 1e-12) << c.name;
  if (!c.grows) {
    EXPECT_EQ(st->bytes(), bytes0) << c.name << ": a linear RNN's state must not grow";
  }
}

// Two sequences side by side (B = 2) read in pieces equal each read alone.
TEST_P(Decode, BatchOfTwoEqualsEachAlone) {
  const Case& c = GetParam();
  auto m = jittered(YAML::Load(c.block), 12, 0.2);
  const int V = m->vocab_size(), T = 9;
  std::vector<int32_t> tok(2 * T);
  Rng r{5, 6};
  for (int i = 0; i < 2 * T; ++i) tok[size_t(i)] = int32_t(r.below(uint64_t(i), uint32_t(V)));
  std::vector<double> alone;
  for (int b = 0; b < 2; ++b) {
    auto st = m->new_decode_state(1);
    for (int t = 0; t < T; ++t) {
      m->forward_continue(tok.data() + b * T + t, 1, 1, *st);
      alone.insert(alone.end(), m->logits(), m->logits() + V);
    }
  }
  auto st = m->new_decode_state(2);
  std::vector<int32_t> col(2);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    col = {tok[size_t(t)], tok[size_t(T + t)]};
    m->forward_continue(col.data(), 2, 1, *st);
    for (int b = 0; b < 2; ++b)
      for (int v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(m->logits()[b * V + v] - alone[(size_t(b) * T + t) * V + v]));
  }
  EXPECT_LT(worst, 1e-12) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Models, Decode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Decode, ModelsWithoutStateAreRefusedByName) {
  auto m = create_model<float>(YAML::Load("{model_type: lstm, vocab_size: 5, embedding_dim: 3, hidden_size: 4, num_layers: 1}"),
                               "t", 1);
  if (m->new_decode_state(1)) GTEST_SKIP() << "lstm has a decode state now; pick another model without one";
  try {
    Decoder d(*m);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("lstm"), std::string::npos) << e.what();
  }
}

// Sampling: greedy is the argmax (first of equal maxima); top_k = 1 is greedy at any temperature;
// a fixed (seed, index) draws the same token; the draws follow the distribution.
TEST(Sampling, GreedyTopKAndFrequencies) {
  const std::vector<float> lg{0.f, 2.f, 2.f, -1.f, 1.f};
  SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(sample_token(lg.data(), 5, o, 0), 1);
  o.temperature = 3.0;
  o.top_k = 1;
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(sample_token(lg.data(), 5, o, i), 1);
  o.top_k = 0;
  o.seed = 9;
  EXPECT_EQ(sample_token(lg.data(), 5, o, 17), sample_token(lg.data(), 5, o, 17));
  // Frequencies at temperature 1 against softmax, over 20000 draws: the standard error of each
  // frequency is below 0.0036, the bound is 5 standard errors.
  o.temperature = 1.0;
  std::vector<double> lp;
  log_softmax(lg.data(), 5, lp);
  std::vector<int> count(5, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[size_t(sample_token(lg.data(), 5, o, uint64_t(i)))];
  for (int v = 0; v < 5; ++v) EXPECT_NEAR(double(count[size_t(v)]) / n, std::exp(lp[size_t(v)]), 0.018) << v;
  // top_p = 0.5: only the two tokens of logit 2 (each 0.37 of the mass) remain: 0.37 < 0.5 <= 0.74.
  o.top_p = 0.5;
  for (int i = 0; i < 200; ++i) {
    int t = sample_token(lg.data(), 5, o, uint64_t(i));
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
}

TEST(Sampling, TopLogprobsOrderAndTies) {
  const std::vector<float> lg{-2.f, -1.f, -1.f, -0.5f, 30.f, -40.f};
  std::vector<double> lp;
  log_softmax(lg.data(), 4, lp);
  const double lse = log_sum_exp(lg.data(), 4);
  auto top = top_logprobs(lg.data(), 4, lse, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 3);
  EXPECT_EQ(top[1].first, 1);
  EXPECT_EQ(top[2].first, 2);
  for (auto [id, l] : top) EXPECT_EQ(l, lp[size_t(id)]) << id;  // the same bits as the whole row
  EXPECT_TRUE(top_logprobs(lg.data(), 4, lse, 0).empty());
  EXPECT_EQ(top_logprobs(lg.data(), 4, lse, 9).size(), 4u);
  // Large and small logits: no overflow, and the probabilities sum to 1.
  const double big = log_sum_exp(lg.data(), 6);
  EXPECT_NEAR(big, 30.0, 1e-12);
  double total = 0;
  for (float x : lg) total += std::exp(double(x) - big);
  EXPECT_NEAR(total, 1.0, 1e-12);
}

}  // namespace
}  // namespace lrnn::test
