// libFuzzer target: an experiment config (the YAML of config.yaml and of `lrnn train --config`)
// from arbitrary text, through the same path `lrnn train` takes: YAML parse, the tree checks,
// the typed schema of every block, the task and the model (built, so sizes are checked too).
#include <cstdint>
#include <string>
#include <yaml-cpp/yaml.h>
#include "fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lrnn::fuzz::quiet_limits();
  const std::string text(reinterpret_cast<const char*>(data), size);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception&) {
    return 0;  // not YAML: what load_yaml_file reports as "not valid YAML"
  }
  try {
    if (!root.IsNull() && !root.IsMap()) return 0;
    lrnn::io::check_yaml_tree(root, "fuzz", "");
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    (void)lrnn::ExperimentConfig::from_yaml(root, "fuzz");
  } catch (const lrnn::UserError&) {
  }
  return 0;
}
