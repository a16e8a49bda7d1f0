#include "train/checkpoint.h"
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
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

// What a model file must hold: exactly the tensors of `layout` (under the given name prefixes),
// each with its shape and finite values; anything else is refused with the file and tensor named.
// A tensor of another model, or a NaN left by a broken run, must never load as if it belonged.
struct Expected {
  std::string prefix;
  bool nonnegative = false;  // AdamW's second moment
};

static void check_tensor_set(const io::SafeTensors& st, const std::string& file, const ParamLayout& layout,
                             const std::vector<Expected>& parts) {
  std::unordered_set<std::string> known;
  for (auto& p : parts)
    for (auto& e : layout.entries()) known.insert(p.prefix + e.name);
  for (auto& t : st.tensors)
    if (!known.count(t.name))
      LRNN_USER_ERROR("{}: unexpected tensor '{}': not a parameter of this model ({} tensors expected); "
                      "is the file from another model or config?", file, t.name, known.size());
}

template <class T>
static void fill_from(const io::SafeTensors& st, const std::string& file, const ParamLayout& layout,
                      const Expected& part, T* out) {
  std::unordered_map<std::string, const io::StTensor*> index;
  for (auto& t : st.tensors) index.emplace(t.name, &t);
  for (auto& e : layout.entries()) {
    const std::string name = part.prefix + e.name;
    auto it = index.find(name);
    if (it == index.end()) LRNN_USER_ERROR("{}: missing tensor '{}'", file, name);
    const io::StTensor* t = it->second;
    if (t->shape != e.shape)
      LRNN_USER_ERROR("{}: tensor '{}' has shape [{}], the model expects [{}]", file, name,
                      fmt::join(t->shape, ", "), fmt::join(e.shape, ", "));
    auto v = t->to_f64();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < e.numel; ++i) {
      const bool ok = std::isfinite(v[i]) && !(part.nonnegative && v[i] < 0);
      if (!ok && bad++ == 0) first = i;
      out[e.offset + i] = T(v[i]);
    }
    if (bad)
      LRNN_USER_ERROR("{}: tensor '{}' has {} {} values (the first at index {}: {}); refusing to load a broken "
                      "state", file, name, bad, part.nonnegative ? "non-finite or negative" : "non-finite", first,
                      v[first]);
  }
}

template <class T>
void load_params(const fs::path& file, Model<T>& model) {
  io::SafeTensors st = io::read_safetensors(file);
  check_tensor_set(st, file.string(), model.layout(), {{""}});
  fill_from(st, file.string(), model.layout(), {""}, model.params.data());
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
  if (!s.curriculum.empty()) st.metadata["curriculum"] = s.curriculum;
  // The parameters at this step travel in the same file, so state and weights can never disagree.
  io::SafeTensors sp = params_to_st(model.layout(), model.params.data(), "param.");
  for (auto& t : sp.tensors) st.tensors.push_back(std::move(t));
  io::write_safetensors(dir / "train_state.safetensors", st);
}

// A counter from the training state's metadata: decimal digits only ("5abc", "1e3", "0x10", "-5"
// and "+5" are refused), within [lo, hi].
static int64_t parse_counter(const io::SafeTensors& st, const std::string& file, const char* key, int64_t lo,
                             int64_t hi) {
  auto it = st.metadata.find(key);
  if (it == st.metadata.end()) LRNN_USER_ERROR("{}: metadata '{}' missing; not a training state?", file, key);
  const std::string& s = it->second;
  int64_t v = 0;
  bool ok = !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (ok) v = std::stoll(s);
  if (!ok || v < lo || v > hi)
    LRNN_USER_ERROR("{}: metadata '{}' is '{}'; expected a whole number in [{}, {}]", file, key, s.substr(0, 40), lo, hi);
  return v;
}

TrainState load_train_state(const fs::path& dir, Model<float>& model, int64_t num_steps) {
  fs::path file = dir / "train_state.safetensors";
  io::SafeTensors st = io::read_safetensors(file);
  const std::string f = file.string();
  TrainState s;
  // Every step is either applied (adam_step) or skipped, and a run never passes its num_steps.
  s.step = parse_counter(st, f, "step", 0, num_steps);
  s.skipped = parse_counter(st, f, "skipped", 0, s.step);
  s.adam_step = parse_counter(st, f, "adam_step", 0, s.step);
  if (s.adam_step + s.skipped != s.step)
    LRNN_USER_ERROR("{}: metadata disagrees with itself: adam_step {} + skipped {} != step {}", f, s.adam_step,
                    s.skipped, s.step);
  if (auto it = st.metadata.find("schedule"); it != st.metadata.end()) s.schedule = it->second;
  if (auto it = st.metadata.find("curriculum"); it != st.metadata.end()) s.curriculum = it->second;
  const std::vector<Expected> parts = {{"adam_m."}, {"adam_v.", true}, {"param."}};
  check_tensor_set(st, f, model.layout(), parts);
  s.m.assign(model.layout().total(), 0.f);
  s.v.assign(model.layout().total(), 0.f);
  fill_from(st, f, model.layout(), parts[0], s.m.data());
  fill_from(st, f, model.layout(), parts[1], s.v.data());
  fill_from(st, f, model.layout(), parts[2], model.params.data());
  return s;
}

}  // namespace lrnn
