// What this binary is: lrnn's version, the git commit it was built from, and whether the tracked
// files differed from that commit at build time (cmake/version.cmake writes the definition).
#pragma once
#include <string>

namespace lrnn {

struct BuildInfo {
  const char* version;  // "0.1.0" (CMakeLists.txt's project version)
  const char* commit;   // full hash, or "unknown" when built outside a git checkout
  bool dirty;           // tracked files were modified against `commit`
};
const BuildInfo& build_info();

// "lrnn 0.1.0 (commit 1a2b3c4d5e6f, modified)"
inline std::string version_line() {
  const BuildInfo& b = build_info();
  std::string c = b.commit;
  return std::string("lrnn ") + b.version + " (commit " + c.substr(0, 12) + (b.dirty ? ", modified" : "") + ")";
}

}  // namespace lrnn
