// The one place that maps `model.model_type` to a model class. To add a model: write its config
// (with describe/validate) and class, then add one row to kModels below.
#include <fmt/format.h>
#include "core/check.h"
#include "io/schema.h"
#include "models/deltanet.h"
#include "models/gated_deltaproduct.h"
#include "models/mamba.h"
#include "models/llama.h"
#include "models/lstm.h"
#include "models/xlstm.h"

namespace lrnn {

namespace {

// Parses and validates the block with the model's own schema, then builds it.
template <class Config, template <class> class M, class T>
std::unique_ptr<Model<T>> build(const YAML::Node& block, const std::string& where, uint64_t seed) {
  io::Schema s(where, "model");
  Config c;
  c.describe(s);
  s.parse(block);
  c.validate(s);
  return std::make_unique<M<T>>(c, seed);
}

// The same without building: the resolved block (every key), for validating configs of any size.
template <class Config>
YAML::Node resolve(const YAML::Node& block, const std::string& where) {
  io::Schema s(where, "model");
  Config c;
  c.describe(s);
  s.parse(block);
  c.validate(s);
  return resolved_block(c);
}

struct ModelEntry {
  const char* type;
  std::unique_ptr<Model<float>> (*f32)(const YAML::Node&, const std::string&, uint64_t);
  std::unique_ptr<Model<double>> (*f64)(const YAML::Node&, const std::string&, uint64_t);
  YAML::Node (*resolve)(const YAML::Node&, const std::string&);
};

#define LRNN_MODEL(TYPE, CONFIG, CLASS) \
  ModelEntry { TYPE, &build<CONFIG, CLASS, float>, &build<CONFIG, CLASS, double>, &resolve<CONFIG> }

const ModelEntry kModels[] = {
    LRNN_MODEL("delta_net", DeltaNetConfig, DeltaNet),
    LRNN_MODEL("gated_deltaproduct", GatedDeltaProductConfig, GatedDeltaProduct),
    LRNN_MODEL("gated_deltanet", GatedDeltaNetConfig, GatedDeltaNet),
    LRNN_MODEL("mamba", MambaConfig, Mamba),
    LRNN_MODEL("llama", LlamaConfig, Llama),
    LRNN_MODEL("lstm", LstmConfig, Lstm),
    LRNN_MODEL("mlstm", XLSTMConfig, XLSTM),
    LRNN_MODEL("slstm", XLSTMConfig, XLSTM),
};

}  // namespace

std::vector<std::string> model_types() {
  std::vector<std::string> v;
  for (auto& e : kModels) v.push_back(e.type);
  return v;
}

// The registry row of the block's model_type; `f` runs with it, and errors from below the schema
// (sizes) get the source too.
template <class F>
auto with_entry(const YAML::Node& block, const std::string& where, F&& f) {
  if (!block || !block.IsMap()) LRNN_USER_ERROR("{}: model: expected a mapping with at least model_type", where);
  if (!block["model_type"]) LRNN_USER_ERROR("{}: model.model_type: missing; one of [{}]", where, fmt::join(model_types(), ", "));
  if (!block["model_type"].IsScalar())
    LRNN_USER_ERROR("{}: model.model_type: expected one of [{}], got a list or mapping", where, fmt::join(model_types(), ", "));
  std::string type = block["model_type"].Scalar();
  for (auto& e : kModels) {
    if (type != e.type) continue;
    try {
      return f(e);
    } catch (const UserError& err) {
      const std::string m = err.what();
      if (m.rfind(where, 0) == 0) throw;
      LRNN_USER_ERROR("{}: {}", where, m);
    }
  }
  LRNN_USER_ERROR("{}: model.model_type: expected one of [{}], got '{}'", where, fmt::join(model_types(), ", "), type);
}

template <class T>
std::unique_ptr<Model<T>> create_model(const YAML::Node& block, const std::string& where, uint64_t seed) {
  return with_entry(block, where, [&](const ModelEntry& e) {
    if constexpr (std::is_same_v<T, float>) return e.f32(block, where, seed);
    else return e.f64(block, where, seed);
  });
}

YAML::Node resolve_model_block(const YAML::Node& block, const std::string& where) {
  return with_entry(block, where, [&](const ModelEntry& e) { return e.resolve(block, where); });
}

template std::unique_ptr<Model<float>> create_model<float>(const YAML::Node&, const std::string&, uint64_t);
template std::unique_ptr<Model<double>> create_model<double>(const YAML::Node&, const std::string&, uint64_t);

}  // namespace lrnn
