#include "infer/run.h"
#include <fmt/format.h>
#include "core/check.h"
#include "data/tokenize.h"
#include "io/schema.h"
#include "train/checkpoint.h"

namespace lrnn {

namespace fs = std::filesystem;

LoadedRun load_run(const fs::path& dir, std::vector<std::string> overrides, const std::string& device,
                   bool open_task) {
  if (!fs::is_directory(dir)) LRNN_USER_ERROR("{}: no such run directory", dir.string());
  if (!device.empty()) overrides.push_back("training.device=" + device);
  LoadedRun r;
  r.dir = dir;
  r.cfg = ExperimentConfig::load((dir / "config.yaml").string(), overrides, open_task);
  fs::path weights = dir / "model.safetensors";
  if (!fs::exists(weights)) LRNN_USER_ERROR("{}: no model.safetensors (did the run finish a checkpoint?)", dir.string());
  if (!open_task) {
    r.alone = create_model<float>(r.cfg.model, r.cfg.source, uint64_t(r.cfg.training.seed));
    load_params(weights, r.model());
    return r;
  }
  r.engine = make_engine(r.cfg);
  load_params(weights, r.model());
  TrainState st;
  st.m.assign(r.model().params.size(), 0.f);
  st.v.assign(r.model().params.size(), 0.f);
  r.engine->start(st);
  return r;
}

std::string run_training_device(const fs::path& dir) {
  const fs::path cfg = dir / "config.yaml";
  if (!fs::exists(cfg)) LRNN_USER_ERROR("{}: no config.yaml (is it a run directory?)", dir.string());
  const YAML::Node root = io::load_yaml_file(cfg.string());
  const YAML::Node d = root["training"] ? root["training"]["device"] : YAML::Node();
  return d && d.IsScalar() ? d.as<std::string>() : std::string("cpu");
}

std::unique_ptr<PieceReader> run_reader(LoadedRun& run, const std::string& device) {
  if (device == "cpu") return host_reader(run.model());
  if (device != "cuda") LRNN_USER_ERROR("--device {}: cpu or cuda", device);
#ifdef LRNN_WITH_CUDA
  return device_reader(run.model(), run.cfg.model["model_type"].as<std::string>());
#else
  LRNN_USER_ERROR("{}: --device cuda, but this build of lrnn has no CUDA backend (build with -DLRNN_CUDA=ON, or use "
                  "--device cpu)", run.dir.string());
#endif
}

data::Tokenizer run_tokenizer(const LoadedRun& run, const fs::path& path) {
  const TaskConfig& t = run.cfg.task;
  if (t.name != "lm")
    LRNN_USER_ERROR("{}: a run of task {}, not a language model (task.name lm): its tokens are the task's own "
                    "symbols, there is no text tokenizer", run.dir.string(), t.name);
  // --tokenizer; else the copy the run keeps (the trainer writes it); else the data's own.
  fs::path file = path;
  if (file.empty() && fs::exists(run.dir / "tokenizer.model")) file = run.dir / "tokenizer.model";
  if (file.empty()) file = data::index_tokenizer(t.data);
  if (file.empty())
    LRNN_USER_ERROR("{}: no tokenizer.model in the run and its data ({}) names none that is there: give "
                    "--tokenizer FILE.model", run.dir.string(), t.data.empty() ? std::string("task.data unset") : t.data);
  data::Tokenizer tok = data::Tokenizer::load(file);
  const int V = run.model().vocab_size();
  if (tok.vocab_size() > V)
    LRNN_USER_ERROR("{}: {} pieces, more than the model's vocabulary of {}: not this run's tokenizer", file.string(),
                    tok.vocab_size(), V);
  return tok;
}

}  // namespace lrnn
