// Shared set-up of the fuzz targets.
#pragma once
#include <cstdlib>
#include "core/check.h"  // lrnn::UserError, what every reader throws for bad input

namespace lrnn::fuzz {

// The memory a fuzzed config may plan for (LRNN_MEMORY_LIMIT_MB, read by the size checks) stays
// under libFuzzer's -malloc_limit_mb, so that a config asking for more is refused as a user
// error, which is what must happen, rather than reported as an allocation over the limit.
inline void quiet_limits() {
  static bool once = [] {
    setenv("LRNN_MEMORY_LIMIT_MB", "256", 0);
    return true;
  }();
  (void)once;
}

}  // namespace lrnn::fuzz
