#include "models/hf/hf_files.h"
#include <algorithm>
#include "core/check.h"
#include "lrnn_hf_embedded.h"  // generated at build time from src/models/hf/*.py

namespace lrnn::hf {

const Files& embedded_files() {
  static const Files files = [] {
    Files f;
    for (const auto& e : embedded::kFiles)
      if (e.name[0] != '\0') f.emplace_back(e.name, std::string(reinterpret_cast<const char*>(e.data), e.size));
    std::sort(f.begin(), f.end());
    return f;
  }();
  return files;
}

Files files_for(const nlohmann::json& hf_config) {
  Files out;
  if (!hf_config.is_object() || !hf_config.contains("auto_map")) return out;
  auto add = [&](const nlohmann::json& ref) {
    if (!ref.is_string()) return;  // e.g. a tokenizer entry [slow, null]
    const std::string s = ref.get<std::string>();
    const size_t dot = s.rfind('.');
    LRNN_CHECK(dot != std::string::npos && dot > 0, "auto_map entry '{}' is not module.Class", s);
    const std::string name = s.substr(0, dot) + ".py";
    for (const auto& f : out)
      if (f.first == name) return;
    for (const auto& f : embedded_files())
      if (f.first == name) {
        out.push_back(f);
        return;
      }
    LRNN_CHECK(false, "auto_map names {}, which src/models/hf/ does not hold", name);
  };
  for (const auto& [key, ref] : hf_config.at("auto_map").items()) {
    if (ref.is_array())
      for (const auto& r : ref) add(r);
    else
      add(ref);
  }
  return out;
}

}  // namespace lrnn::hf
