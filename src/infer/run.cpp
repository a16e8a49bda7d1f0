#include "infer/run.h"
#include <fmt/format.h>
#include "core/check.h"
#include "data/shards.h"
#include "train/checkpoint.h"

namespace lrnn {

namespace fs = std::filesystem;

LoadedRun load_run(const fs::path& dir, std::vector<std::string> overrides, const std::string& device) {
  if (!fs::is_directory(dir)) LRNN_USER_ERROR("{}: no such run directory", dir.string());
  if (!device.empty()) overrides.push_back("training.device=" + device);
  LoadedRun r;
  r.dir = dir;
  r.cfg = ExperimentConfig::load((dir / "config.yaml").string(), overrides);
  r.engine = make_engine(r.cfg);
  fs::path weights = dir / "model.safetensors";
  if (!fs::exists(weights)) LRNN_USER_ERROR("{}: no model.safetensors (did the run finish a checkpoint?)", dir.string());
  load_params(weights, r.model());
  TrainState st;
  st.m.assign(r.model().params.size(), 0.f);
  st.v.assign(r.model().params.size(), 0.f);
  r.engine->start(st);
  return r;
}

data::Tokenizer run_tokenizer(const LoadedRun& run, const fs::path& path) {
  const TaskConfig& t = run.cfg.task;
  if (t.name != "lm")
    LRNN_USER_ERROR("{}: a run of task {}, not a language model (task.name lm): its tokens are the task's own "
                    "symbols, there is no text tokenizer", run.dir.string(), t.name);
  // What the data's index says about its tokenizer (when the data is still where the run left it).
  std::string index_path, index_sha;
  if (!t.data.empty() && fs::exists(fs::path(t.data) / "index.json")) {
    nlohmann::json idx = data::read_index(t.data);
    const nlohmann::json& tj = idx["tokenizer"];  // (read_index checked it is an object with a sha256)
    if (tj.contains("path") && tj["path"].is_string()) index_path = tj["path"].get<std::string>();
    if (tj["sha256"].is_string()) index_sha = tj["sha256"].get<std::string>();
  }
  fs::path file = path;
  if (file.empty()) {
    if (index_path.empty())
      LRNN_USER_ERROR("{}: the run's data ({}) is not there to name its tokenizer: give --tokenizer FILE.model",
                      run.dir.string(), t.data.empty() ? std::string("task.data unset") : t.data);
    file = index_path;
    if (file.is_relative() && !fs::exists(file)) file = fs::path(t.data) / file;
  }
  data::Tokenizer tok = data::Tokenizer::load(file);
  if (!index_sha.empty() && tok.sha256() != index_sha)
    LRNN_USER_ERROR("{}: sha256 {} differs from the tokenizer the run's data was made with ({} in {}/index.json)",
                    file.string(), tok.sha256(), index_sha, t.data);
  const int V = run.engine->host_model().vocab_size();
  if (tok.vocab_size() > V)
    LRNN_USER_ERROR("{}: {} pieces, more than the model's vocabulary of {}", file.string(), tok.vocab_size(), V);
  return tok;
}

}  // namespace lrnn
