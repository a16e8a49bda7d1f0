// libFuzzer target: the safetensors reader on arbitrary bytes (header JSON, offsets, dtypes,
// shapes). Anything but a UserError (a crash, a sanitizer report, another exception, a hang, an
// allocation over the limit) is a finding.
#include <cstdint>
#include <string_view>
#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto st = lrnn::io::parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    for (auto& t : st.tensors) {  // the accessors too: they must refuse, not misread
      try { (void)t.to_f64(); } catch (const lrnn::UserError&) {}
      try { (void)t.to_i64(); } catch (const lrnn::UserError&) {}
    }
  } catch (const lrnn::UserError&) {
  }
  return 0;
}
