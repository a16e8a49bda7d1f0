// The packed-context sampler on shards of the Shakespeare corpus: a batch is a pure function of
// (seed, step), so a resumed run (a new process, new objects, starting at step s) sees exactly the
// batches of an uninterrupted one; R = 1, 2 and 4 ranks together make the same global batch; an
// epoch visits every window once; labels are the inputs shifted by one; evaluation walks the
// validation split in order.
#include <gtest/gtest.h>
#include <map>
#include <set>

#include "core/check.h"
#include "data/shards.h"
#include "lm_util.h"

using namespace lrnn;
using namespace lrnn::test;
using namespace lrnn::data;

namespace {

class SamplerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("lm_sampler"));
    fs::path model = train_small_tokenizer(*dir_);
    auto files = corpus_files();
    files.resize(std::min<size_t>(files.size(), 6));
    RunResult r = run_lrnn("tokenize --tokenizer '" + model.string() + "' --input" + join_paths(files) + " --out '" +
                           (*dir_ / "data").string() + "' --val-fraction 0.2 --shard-tokens 50000");
    EXPECT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path data() { return *dir_ / "data"; }
  static fs::path* dir_;
};
fs::path* SamplerTest::dir_ = nullptr;

bool same(const Batch& a, const Batch& b) {
  return a.B == b.B && a.T == b.T && a.tokens == b.tokens && a.labels == b.labels && a.lengths == b.lengths;
}

TEST_F(SamplerTest, WindowsAreShiftedPairsOfTheStream) {
  TokenStream s = TokenStream::open(data(), "train");
  PackedSampler p(s, 64, 11);
  Batch b = p.batch(3, 8);
  ASSERT_EQ(b.B, 8);
  ASSERT_EQ(b.T, 64);
  ASSERT_EQ(b.tokens.size(), 8u * 64);
  for (int r = 0; r < 8; ++r) {
    const uint64_t start = p.sample_start(3 * 8 + uint64_t(r));
    std::vector<int32_t> w = s.read(start, 65);
    for (int t = 0; t < 64; ++t) {
      ASSERT_EQ(b.tokens[size_t(r) * 64 + size_t(t)], w[size_t(t)]);
      ASSERT_EQ(b.labels[size_t(r) * 64 + size_t(t)], w[size_t(t) + 1]);
    }
    EXPECT_EQ(b.lengths[size_t(r)], 64);
  }
}

TEST_F(SamplerTest, ResumedRunSeesTheUninterruptedBatches) {
  const int B = 16, T = 128, steps = 60, resume_at = 37;
  std::vector<Batch> uninterrupted;
  {
    TokenStream s = TokenStream::open(data(), "train");
    PackedSampler p(s, T, 5);
    for (int step = 0; step < steps; ++step) uninterrupted.push_back(p.batch(step, B));
  }
  // "Resume": everything opened anew, starting at step 37 (past an epoch boundary for the check below).
  TokenStream s2 = TokenStream::open(data(), "train");
  PackedSampler p2(s2, T, 5);
  for (int step = resume_at; step < steps; ++step)
    ASSERT_TRUE(same(p2.batch(step, B), uninterrupted[size_t(step)])) << "step " << step;
  // A different seed, a different order.
  PackedSampler other(s2, T, 6);
  EXPECT_FALSE(same(other.batch(resume_at, B), uninterrupted[resume_at]));
}

TEST_F(SamplerTest, RanksSplitTheSameGlobalBatch) {
  TokenStream s = TokenStream::open(data(), "train");
  PackedSampler p(s, 96, 2);
  const int B = 8;
  for (int64_t step : {0, 1, 17, 1000}) {
    Batch global = p.batch(step, B);
    for (int R : {2, 4}) {
      Batch joined;
      joined.T = 96;
      for (int r = 0; r < R; ++r) {
        Batch part = p.batch(step, B, r, R);
        ASSERT_EQ(part.B, B / R);
        joined.B += part.B;
        joined.tokens.insert(joined.tokens.end(), part.tokens.begin(), part.tokens.end());
        joined.labels.insert(joined.labels.end(), part.labels.begin(), part.labels.end());
        joined.lengths.insert(joined.lengths.end(), part.lengths.begin(), part.lengths.end());
      }
      EXPECT_TRUE(same(joined, global)) << "step " << step << ", " << R << " ranks";
    }
  }
  EXPECT_THROW(p.batch(0, 6, 0, 4), UserError);  // 6 rows do not split over 4 ranks
  EXPECT_THROW(p.batch(0, 8, 4, 4), UserError);
  EXPECT_THROW(p.batch(-1, 8), UserError);
  // Sample numbers step * B are 64-bit: a step where they would wrap is refused.
  EXPECT_THROW(p.batch(int64_t(1) << 60, 8), UserError);
  EXPECT_NO_THROW(p.batch(int64_t(1) << 58, 8));
}

TEST_F(SamplerTest, AnEpochVisitsEveryWindowOnce) {
  TokenStream s = TokenStream::open(data(), "train");
  const int T = 512;
  PackedSampler p(s, T, 9);
  const uint64_t M = p.windows_per_epoch();
  ASSERT_EQ(M, s.size() / T - 1);
  ASSERT_GT(M, 100u);
  for (uint64_t epoch : {0ull, 1ull, 7ull}) {
    std::set<uint64_t> starts;
    uint64_t offset = p.sample_start(epoch * M) % T;
    for (uint64_t j = 0; j < M; ++j) {
      const uint64_t st = p.sample_start(epoch * M + j);
      ASSERT_EQ(st % T, offset) << "one offset per epoch";
      ASSERT_LE(st + T + 1, s.size());
      starts.insert(st);
    }
    EXPECT_EQ(starts.size(), M) << "epoch " << epoch << " repeats a window";
    EXPECT_EQ(*starts.begin(), offset);
    EXPECT_EQ(*starts.rbegin(), offset + (M - 1) * T);
  }
  // Orders differ between epochs and are not the identity.
  std::vector<uint64_t> e0, e1;
  for (uint64_t j = 0; j < 20; ++j) {
    e0.push_back(p.sample_start(j) / T);
    e1.push_back(p.sample_start(M + j) / T);
  }
  EXPECT_NE(e0, e1);
  int in_order = 0;
  for (size_t j = 1; j < e0.size(); ++j) in_order += e0[j] == e0[j - 1] + 1;
  EXPECT_LT(in_order, 5);
}

TEST_F(SamplerTest, EvaluationWalksTheValidationSplitInOrder) {
  TokenStream v = TokenStream::open(data(), "val");
  const int T = 256, B = 12;
  PackedSampler p(v, T, 0);
  const uint64_t W = p.eval_windows();
  ASSERT_EQ(W, (v.size() - 1) / T);
  const uint64_t nb = p.eval_batches(B);
  ASSERT_EQ(nb, (W + B - 1) / B);
  uint64_t seen = 0;
  for (uint64_t i = 0; i < nb; ++i) {
    Batch g = p.eval_batch(i, B);
    for (int r = 0; r < g.B; ++r) {
      std::vector<int32_t> w = v.read((seen + uint64_t(r)) * T, T + 1);
      ASSERT_TRUE(std::equal(w.begin(), w.end() - 1, g.tokens.begin() + r * T));
      ASSERT_TRUE(std::equal(w.begin() + 1, w.end(), g.labels.begin() + r * T));
    }
    // Three ranks of the same batch, in rank order, are the batch (the last ones may be short or empty).
    std::vector<int32_t> joined;
    for (int r = 0; r < 3; ++r) {
      Batch part = p.eval_batch(i, B, r, 3);
      joined.insert(joined.end(), part.tokens.begin(), part.tokens.end());
    }
    EXPECT_EQ(joined, g.tokens);
    seen += uint64_t(g.B);
  }
  EXPECT_EQ(seen, W);
  EXPECT_THROW(p.eval_batch(nb, B), UserError);
  EXPECT_THROW(PackedSampler(v, int(v.size()), 0), UserError);  // not one context of T + 1
}

}  // namespace
