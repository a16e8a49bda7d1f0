// A saved run opened for inference: `lrnn eval`, `predict`, `generate` and `serve` start here.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "train/config.h"
#include "train/engine.h"

namespace lrnn {

// A saved run: its resolved config and an engine (CPU or CUDA: training.device, or `device`
// when not empty) holding the trained weights. `overrides` are --set lines applied to the
// run's config.yaml. UserError (exit 2) naming the directory or file when something is missing.
// open_task = false: the run's task (e.g. a language model's token data) need not be there, and
// no engine is made — the model alone, on the host, for generation and serving (which read it
// through a PieceReader and need neither an optimiser nor the CPU engine's per-worker replicas).
struct LoadedRun {
  std::filesystem::path dir;
  ExperimentConfig cfg;
  std::unique_ptr<Engine> engine;       // open_task = true
  std::unique_ptr<Model<float>> alone;  // open_task = false
  Model<float>& model() { return engine ? engine->host_model() : *alone; }
  const Model<float>& model() const { return engine ? engine->host_model() : *alone; }
};

LoadedRun load_run(const std::filesystem::path& dir, std::vector<std::string> overrides = {},
                   const std::string& device = "", bool open_task = true);

// The tokenizer of a language-model run (task.name lm): `path` when not empty, else the one the
// run's tokenized data names in its index.json. Either way it must be the tokenizer the data was
// made with (same sha256) when the index is there to say so, and its vocabulary must fit the
// model's. UserError naming the file otherwise.
data::Tokenizer run_tokenizer(const LoadedRun& run, const std::filesystem::path& path = {});

// The device a run trained on (its config.yaml's training.device, before any override).
std::string run_training_device(const std::filesystem::path& dir);

// Piecewise reading of a run's model (loaded on the CPU) on `device`: "cpu" (the host model), or
// "cuda" (a device twin of its weights; CUDA builds). UserError when this build has no CUDA backend
// or the machine no device.
std::unique_ptr<PieceReader> run_reader(LoadedRun& run, const std::string& device);

}  // namespace lrnn
