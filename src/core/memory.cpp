#include "core/memory.h"
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <fmt/format.h>
#include "core/check.h"

namespace lrnn {

namespace {
uint64_t env_limit() {
  const char* env = std::getenv("LRNN_MEMORY_LIMIT_MB");
  return env && std::atoll(env) > 0 ? uint64_t(std::atoll(env)) << 20 : 0;
}
}  // namespace

uint64_t memory_budget_bytes() {
  if (uint64_t limit = env_limit()) return limit;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    uint64_t kb = 0;
    if (s >> key >> kb && key == "MemAvailable:") return kb << 10;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : ~uint64_t(0);
}

std::string human_bytes(uint64_t b) {
  if (b >= (uint64_t(1) << 30)) return fmt::format("{:.1f} GiB", double(b) / double(uint64_t(1) << 30));
  return fmt::format("{:.0f} MiB", double(b) / double(1 << 20));
}

void check_memory(uint64_t bytes, const std::string& what) {
  const uint64_t budget = memory_budget_bytes();
  if (bytes > budget)
    LRNN_USER_ERROR("{} needs about {}, more than the {} this machine can give{}; make them smaller", what,
                    human_bytes(bytes), human_bytes(budget),
                    env_limit() ? " (LRNN_MEMORY_LIMIT_MB)" : "");
}

}  // namespace lrnn
