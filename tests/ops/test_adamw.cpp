// AdamW's finite check on the CPU: an update that would leave a parameter or moment non-finite is
// detected before anything is written (the engines then skip the step), and an ordinary one is not.
#include <gtest/gtest.h>
#include <cmath>
#include <vector>
#include "ops/adamw/adamw.h"

using namespace lrnn::ops;

TEST(AdamW, FiniteCheckCatchesWhatWouldBreakTheModel) {
  const size_t N = 1000;
  std::vector<float> p(N, 0.5f), g(N, 0.01f), m(N, 0.f), v(N, 0.f);
  std::vector<uint8_t> mask(N, 1);
  const AdamWParams ap{1e-3, 0.9, 0.999, 1e-8, 0.1, 1};
  EXPECT_TRUE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N, ap));
  // A negative second moment (a corrupt state): sqrt(v) is NaN.
  v[17] = -1.f;
  EXPECT_FALSE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N, ap));
  v[17] = 0.f;
  // A huge but finite gradient: its square overflows the second moment to inf.
  g[3] = 1e30f;
  EXPECT_FALSE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N, ap));
  g[3] = 0.01f;
  // eps = 0 with a zero gradient and zero moments: 0 / 0 (the config refuses eps < 1e-30).
  g.assign(N, 0.f);
  EXPECT_FALSE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N,
                                      AdamWParams{1e-3, 0.9, 0.999, 0.0, 0.1, 1}));
  EXPECT_TRUE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N,
                                     AdamWParams{1e-3, 0.9, 0.999, 1e-30, 0.1, 1}));
  // The check computes what the update writes: where it passes, the update is finite.
  g.assign(N, 0.01f);
  ASSERT_TRUE(adamw_update_is_finite(p.data(), g.data(), m.data(), v.data(), mask.data(), N, ap));
  adamw_update(p.data(), g.data(), m.data(), v.data(), mask.data(), N, ap);
  for (size_t i = 0; i < N; ++i) ASSERT_TRUE(std::isfinite(p[i]) && std::isfinite(m[i]) && std::isfinite(v[i]));
}
