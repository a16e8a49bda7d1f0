// libFuzzer target: a run's train_state.safetensors from arbitrary bytes, loaded for a small
// DeltaNet as `lrnn train --resume` does: counters (strict integers, ranges, consistency), the
// tensor set, shapes and values.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include "fuzz_util.h"
#include "models/model.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lrnn::fuzz::quiet_limits();
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("lrnn_fuzz_state_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  // The model of the seed corpus (fuzz/corpus/train_state: `lrnn train` with this model block).
  static auto model = lrnn::create_model<float>(
      YAML::Load("{model_type: delta_net, vocab_size: 3, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, "
                 "intermediate_size: 32, use_short_conv: false}"),
      "fuzz", 0);
  {
    std::ofstream f(dir / "train_state.safetensors", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    (void)lrnn::load_train_state(dir, *model, 1000);
  } catch (const lrnn::UserError&) {
  }
  return 0;
}
