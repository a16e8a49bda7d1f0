// task.train_pool: training on a fixed set of sequences in epochs (P2's protocol) instead of fresh
// ones every step. Each epoch visits every id of the pool exactly once, in an order of its own;
// the batches are the pool's samples and nothing else; a step's batch is the same whenever it is
// computed (resume); the lm task refuses the key.
#include <gtest/gtest.h>
#include <algorithm>
#include <numeric>
#include <set>
#include <vector>
#include "core/check.h"
#include "tasks/task.h"

using namespace lrnn;

TEST(TrainPool, EachEpochIsAPermutationOfThePool) {
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 1000ull, 4096ull, 100000ull}) {
    std::vector<uint64_t> first, second;
    for (uint64_t p = 0; p < 2 * n; ++p) (p < n ? first : second).push_back(pool_id(7, p, n));
    for (auto* e : {&first, &second}) {
      std::vector<uint64_t> sorted = *e;
      std::sort(sorted.begin(), sorted.end());
      std::vector<uint64_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(sorted, all) << "pool of " << n;
    }
    if (n >= 17) {
      EXPECT_NE(first, second) << "two epochs in the same order, pool of " << n;
      // Not the identity, nor a shift of it: fewer than 10 % of the ids at their own position.
      int fixed = 0;
      for (uint64_t p = 0; p < n; ++p) fixed += first[p] == p;
      EXPECT_LT(fixed, int(n / 10) + 2) << "pool of " << n;
    }
  }
  std::vector<uint64_t> s1, s2;
  for (uint64_t p = 0; p < 20; ++p) s1.push_back(pool_id(1, p, 1000)), s2.push_back(pool_id(2, p, 1000));
  EXPECT_NE(s1, s2) << "the seed does not change the order";
}

// With a pool of 50 and batches of 16, three epochs' worth of steps use exactly 50 distinct
// sequences (each the pool's sample of its id), every sequence 3 times; without a pool every
// sequence is new.
TEST(TrainPool, BatchesComeFromThePool) {
  TaskConfig c;
  c.name = "word_problem";
  c.group = "S5";
  c.bos = true;
  c.train_len = {24, 24};
  c.train_pool = 50;
  auto pooled = create_task(c);
  c.train_pool = 0;
  auto fresh = create_task(c);
  std::multiset<std::vector<int32_t>> seen_pool;
  std::set<std::vector<int32_t>> seen_fresh;
  int rows = 0;
  for (int64_t step = 0; step * 16 < 150; ++step) {
    const Batch a = pooled->train_batch(3, step, 16, c.train_len), b = fresh->train_batch(3, step, 16, c.train_len);
    for (int i = 0; i < 16 && rows < 150; ++i, ++rows) {
      seen_pool.insert(std::vector<int32_t>(a.tokens.begin() + i * a.T, a.tokens.begin() + (i + 1) * a.T));
      seen_fresh.insert(std::vector<int32_t>(b.tokens.begin() + i * b.T, b.tokens.begin() + (i + 1) * b.T));
    }
  }
  std::set<std::vector<int32_t>> distinct(seen_pool.begin(), seen_pool.end());
  EXPECT_EQ(distinct.size(), 50u);
  for (auto& s : distinct) EXPECT_EQ(seen_pool.count(s), 3u);
  EXPECT_EQ(seen_fresh.size(), 150u);
  std::set<std::vector<int32_t>> pool;
  for (uint64_t id = 0; id < 50; ++id) pool.insert(pooled->sample(3, Split::Train, id, 24).input);
  EXPECT_EQ(distinct, pool);
  // A step's batch does not depend on what was computed before it (a resumed run's first step).
  const Batch again = create_task([&] { TaskConfig d = c; d.train_pool = 50; return d; }())->train_batch(3, 7, 16, c.train_len);
  EXPECT_EQ(again.tokens, pooled->train_batch(3, 7, 16, c.train_len).tokens);
}

TEST(TrainPool, TheLmTaskRefusesIt) {
  TaskConfig c;
  c.name = "lm";
  c.train_pool = 100;
  EXPECT_THROW(create_task(c), UserError);
}
