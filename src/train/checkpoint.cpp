#include "train/checkpoint.h"
#include <algorithm>
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace lrnn {

namespace fs = std::filesystem;

static io::SafeTensors params_to_st(const ParamLayout& layout, const float* data, const std::string& prefix) {
  io::SafeTensors st;
  for (auto& e : layout.entries()) st.add(prefix + e.name, DType::F32, e.shape, data + e.offset);
  return st;
}

void save_model(const fs::path& dir, const Model<float>& model) {
  io::SafeTensors st = params_to_st(model.layout(), model.params.data(), "");
  io::write_safetensors(dir / "model.safetensors", st);
  // The code a custom architecture's config.json names (auto_map) goes first, so config.json never
  // names a missing file; after config.json, code this model does not use (left in the directory
  // by an earlier run of another model) goes, so no stale file contradicts config.json.
  const auto files = model.hf_files();
  auto needed = [&](const std::string& name) {
    return std::any_of(files.begin(), files.end(), [&](const auto& f) { return f.first == name; });
  };
  for (const auto& [name, text] : files) {
    LRNN_CHECK(!name.empty() && fs::path(name).filename() == name && name != "config.json" &&
                   name != "model.safetensors",
               "hf_files: '{}' is not a plain file name of its own", name);
    io::write_file_atomic(dir / name, text);
  }
  io::write_file_atomic(dir / "config.json", model.hf_config().dump(2) + "\n");
  for (const auto& f : hf::embedded_files()) {
    std::error_code ec;
    if (!needed(f.first)) fs::remove(dir / f.first, ec);
  }
}

template <class T>
static void fill_from(const io::SafeTensors& st, const std::string& file, const ParamLayout& layout,
                      const std::string& prefix, T* out) {
  for (auto& e : layout.entries()) {
    const io::StTensor* t = st.find(prefix + e.name);
    if (!t) LRNN_USER_ERROR("{}: missing tensor '{}'", file, prefix + e.name);
    if (t->shape != e.shape)
      LRNN_USER_ERROR("{}: tensor '{}' has shape [{}], the model expects [{}]", file, prefix + e.name,
                      fmt::join(t->shape, ", "), fmt::join(e.shape, ", "));
    auto v = t->to_f64();
    for (size_t i = 0; i < e.numel; ++i) out[e.offset + i] = T(v[i]);
  }
}

template <class T>
void load_params(const fs::path& file, Model<T>& model) {
  io::SafeTensors st = io::read_safetensors(file);
  fill_from(st, file.string(), model.layout(), "", model.params.data());
}
template void load_params<float>(const fs::path&, Model<float>&);
template void load_params<double>(const fs::path&, Model<double>&);

void save_train_state(const fs::path& dir, const Model<float>& model, const TrainState& s) {
  io::SafeTensors st = params_to_st(model.layout(), s.m.data(), "adam_m.");
  io::SafeTensors sv = params_to_st(model.layout(), s.v.data(), "adam_v.");
  for (auto& t : sv.tensors) st.tensors.push_back(std::move(t));
  st.metadata["step"] = std::to_string(s.step);
  st.metadata["adam_step"] = std::to_string(s.adam_step);
  st.metadata["skipped"] = std::to_string(s.skipped);
  if (!s.schedule.empty()) st.metadata["schedule"] = s.schedule;
  // The parameters at this step travel in the same file, so state and weights can never disagree.
  io::SafeTensors sp = params_to_st(model.layout(), model.params.data(), "param.");
  for (auto& t : sp.tensors) st.tensors.push_back(std::move(t));
  io::write_safetensors(dir / "train_state.safetensors", st);
}

TrainState load_train_state(const fs::path& dir, Model<float>& model) {
  fs::path file = dir / "train_state.safetensors";
  io::SafeTensors st = io::read_safetensors(file);
  TrainState s;
  auto num = [&](const char* k) -> int64_t {
    auto it = st.metadata.find(k);
    if (it == st.metadata.end()) LRNN_USER_ERROR("{}: metadata '{}' missing; not a training state?", file.string(), k);
    try { return std::stoll(it->second); } catch (...) {
      LRNN_USER_ERROR("{}: metadata '{}' is not an integer: '{}'", file.string(), k, it->second);
    }
  };
  s.step = num("step");
  s.adam_step = num("adam_step");
  s.skipped = num("skipped");
  if (auto it = st.metadata.find("schedule"); it != st.metadata.end()) s.schedule = it->second;
  s.m.assign(model.layout().total(), 0.f);
  s.v.assign(model.layout().total(), 0.f);
  fill_from(st, file.string(), model.layout(), "adam_m.", s.m.data());
  fill_from(st, file.string(), model.layout(), "adam_v.", s.v.data());
  fill_from(st, file.string(), model.layout(), "param.", model.params.data());
  return s;
}

}  // namespace lrnn
