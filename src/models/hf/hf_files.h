// Python files a run directory carries beside config.json for architectures no peer library
// computes (HF's custom-code convention: config.json's `auto_map` names "module.Class", the module
// lies next to it, and transformers loads it with trust_remote_code=True).
//
// The files are the *.py of this folder (src/models/hf/), embedded into the binary at build time
// (CMakeLists.txt, src/models/hf/embed.cmake), byte for byte.
#pragma once
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

namespace lrnn::hf {

using Files = std::vector<std::pair<std::string, std::string>>;  // file name -> contents

// Every embedded file, sorted by name.
const Files& embedded_files();

// The files `hf_config`'s `auto_map` refers to ("module.Class" -> module.py), each once; empty
// without auto_map. An auto_map module that is not embedded is an internal error.
Files files_for(const nlohmann::json& hf_config);

}  // namespace lrnn::hf
