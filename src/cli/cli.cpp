// The `lrnn` command line: train, eval, data, predict, sweep.
#include "cli/cli.h"
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <CLI/CLI.hpp>
#include "core/check.h"
#include "io/atomic_file.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/sweep.h"
#include "train/trainer.h"

namespace lrnn::cli {

namespace fs = std::filesystem;

namespace {

// A saved run: its resolved config and an engine (CPU or CUDA, training.device or --device)
// holding the trained weights.
struct LoadedRun {
  ExperimentConfig cfg;
  std::unique_ptr<Engine> engine;
  Model<float>& model() { return engine->host_model(); }
};

LoadedRun load_run(const fs::path& dir, std::vector<std::string> overrides, const std::string& device) {
  if (!fs::is_directory(dir)) LRNN_USER_ERROR("{}: no such run directory", dir.string());
  if (!device.empty()) overrides.push_back("training.device=" + device);
  LoadedRun r;
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

void print_eval_table(const nlohmann::json& e) {
  std::fprintf(stderr, "%-14s %-10s %-10s %s\n", "lengths", "accuracy", "scaled", "samples");
  auto row = [](const nlohmann::json& x) {
    std::string lens = fmt::format("{}-{}", int(x["lengths"][0]), int(x["lengths"][1]));
    std::fprintf(stderr, "%-14s %-10.4f %-10.4f %lld\n", lens.c_str(), double(x["accuracy"]),
                 double(x["scaled_accuracy"]), (long long)x["samples"]);
  };
  if (e.contains("train_range")) row(e["train_range"]);
  row(e);
}

int cmd_train(const std::string& config, std::vector<std::string> sets, std::string out, const std::string& resume,
              bool force, const std::string& device) {
  if (!device.empty()) sets.push_back("training.device=" + device);
  TrainOptions opt;
  ExperimentConfig cfg;
  if (!resume.empty()) {
    if (!config.empty()) LRNN_USER_ERROR("train: give either --config or --resume, not both");
    opt.out_dir = resume;
    opt.resume = true;
    if (!fs::exists(fs::path(resume) / "config.yaml")) LRNN_USER_ERROR("{}: not a run directory (no config.yaml)", resume);
    cfg = ExperimentConfig::load((fs::path(resume) / "config.yaml").string(), sets);
  } else {
    if (config.empty()) LRNN_USER_ERROR("train: --config FILE.yaml is required (or --resume DIR)");
    cfg = ExperimentConfig::load(config, sets);
    if (out.empty()) out = (fs::path("runs") / fs::path(config).stem()).string();
    opt.out_dir = out;
    if (fs::exists(opt.out_dir / "train_state.safetensors") && !force)
      LRNN_USER_ERROR("{}: holds a run already; continue it with --resume {}, or pass --force to start over", out, out);
  }
  std::fprintf(stderr, "lrnn train: %s -> %s\n", cfg.source.c_str(), opt.out_dir.string().c_str());
  TrainSummary s = train(cfg, opt);
  std::fprintf(stderr, "done: %lld steps (%lld skipped) in %.1f s, final loss %.4f\n", (long long)s.steps,
               (long long)s.skipped, s.seconds, s.final_loss);
  print_eval_table(s.eval);
  std::printf("%s\n", nlohmann::json{{"run", opt.out_dir.string()}, {"steps", s.steps}, {"seconds", s.seconds},
                                     {"accuracy", s.eval["accuracy"]}, {"scaled_accuracy", s.eval["scaled_accuracy"]}}
                          .dump().c_str());
  return 0;
}

int cmd_eval(const std::string& run, const std::vector<std::string>& sets, const std::string& device) {
  LoadedRun r = load_run(run, sets, device);
  nlohmann::json e = evaluate_run(r.engine->logits_fn(), r.model().vocab_size(), r.cfg);
  print_eval_table(e);
  std::printf("%s\n", e.dump().c_str());
  return 0;
}

int cmd_data(const std::string& task_name, int n, int64_t seed, const std::vector<std::string>& sets,
             const std::string& split, int length) {
  YAML::Node root(YAML::NodeType::Map);
  root["task"]["name"] = task_name;
  for (auto& s : sets) io::apply_override(root, s);
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it->first.as<std::string>() != "task") LRNN_USER_ERROR("data: --set {}.*: only task.* keys apply here", it->first.as<std::string>());
  TaskConfig tc;
  io::Schema s("--set", "task");
  tc.describe(s);
  s.parse(root["task"]);
  auto task = create_task(tc);
  Split sp = split == "eval" ? Split::Eval : Split::Data;
  auto range = split == "eval" ? tc.eval_len : tc.train_len;
  if (length > 0) range = {length, length};
  if (range[0] < 2) LRNN_USER_ERROR("data: --length must be at least 2");
  for (int i = 0; i < n; ++i) {
    int len = task->draw_length(uint64_t(seed), sp, uint64_t(i), range);
    Sample smp = task->sample(uint64_t(seed), sp, uint64_t(i), len);
    std::printf("%s\n", nlohmann::json{{"input", smp.input}, {"target", smp.target}, {"text", task->render(smp)}}.dump().c_str());
  }
  return 0;
}

int cmd_predict(const std::string& run, const std::string& tokens_text, bool full_logits, const std::string& device) {
  LoadedRun r = load_run(run, {}, device);
  std::vector<int32_t> tok;
  std::istringstream in(tokens_text);
  std::string w;
  const int V = r.model().vocab_size();
  while (in >> w) {
    char* end = nullptr;
    long x = std::strtol(w.c_str(), &end, 10);
    if (*end != '\0' || x < 0 || x >= V)
      LRNN_USER_ERROR("predict: --tokens: '{}' is not a token id in [0, {})", w, V);
    tok.push_back(int32_t(x));
  }
  if (tok.empty()) LRNN_USER_ERROR("predict: --tokens: give at least one token id, e.g. --tokens \"1 2 2 1\"");
  auto task = create_task(r.cfg.task);
  Batch b;
  b.B = 1;
  b.T = int(tok.size());
  b.tokens = tok;
  b.labels.assign(tok.size(), -1);
  b.lengths = {b.T};
  const float* lg = r.engine->logits_fn()(b);
  nlohmann::json pos = nlohmann::json::array();
  for (size_t t = 0; t < tok.size(); ++t) {
    const float* row = lg + t * V;
    int best = int(std::max_element(row, row + V) - row);
    nlohmann::json p = {{"position", t}, {"token", tok[t]}, {"predicted", best},
                        {"predicted_text", task->token_name(best)}};
    if (full_logits || V <= 64) p["logits"] = std::vector<float>(row, row + V);
    pos.push_back(p);
  }
  std::printf("%s\n", nlohmann::json{{"run", run}, {"positions", pos}}.dump().c_str());
  return 0;
}

int cmd_sweep(const std::string& grid_file, int jobs, std::string out, bool dry_run, bool report, bool force) {
  sweep::Grid grid = sweep::Grid::load(grid_file);
  if (out.empty()) out = (fs::path("runs") / grid.name).string();
  if (report) {
    if (dry_run || force) LRNN_USER_ERROR("sweep: --report only aggregates finished runs; drop --dry-run and --force");
    std::printf("%s", sweep::write_report(grid, out).c_str());
    std::fprintf(stderr, "wrote %s and %s\n", (fs::path(out) / "results.md").c_str(), (fs::path(out) / "results.csv").c_str());
    return 0;
  }
  sweep::SweepOutcome res = sweep::run_sweep(grid, {out, jobs, dry_run, force});
  if (dry_run) return 0;
  std::printf("%s", sweep::write_report(grid, out).c_str());
  std::fprintf(stderr, "wrote %s and %s\n", (fs::path(out) / "results.md").c_str(), (fs::path(out) / "results.csv").c_str());
  if (res.interrupted) return 130;
  return res.failed > 0 ? 1 : 0;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"lrnn: linear RNNs that track state (DeltaNet, eigenvalues in [0,1] or [-1,1])", "lrnn"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lrnn 0.1.0");

  std::string config, out, resume, run_dir, task = "parity", split = "train", tokens, device;
  const auto devices = CLI::IsMember({"cpu", "cuda"});
  std::vector<std::string> sets;
  bool force = false, full_logits = false;
  int n = 5, length = 0;
  int64_t seed = 0;

  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train->add_option("--config", config, "experiment YAML (blocks training, model, task, logging)");
  train->add_option("--set", sets, "override a key, e.g. --set training.lr=3e-4 (repeatable)");
  train->add_option("--out", out, "run directory (default runs/<config name>)");
  train->add_option("--resume", resume, "continue the run in this directory from its last checkpoint");
  train->add_flag("--force", force, "start over in a directory that holds a run");
  train->add_option("--device", device, "cpu or cuda (same as --set training.device=...)")->check(devices);

  auto* eval = app.add_subcommand("eval", "re-evaluate a saved run (e.g. --set task.eval_len=[40,512])");
  eval->add_option("--run", run_dir, "run directory")->required();
  eval->add_option("--set", sets, "override task.* keys");
  eval->add_option("--device", device, "cpu or cuda (default: the run's training.device)")->check(devices);

  auto* data = app.add_subcommand("data", "print task samples as JSON lines");
  data->add_option("--task", task, "task name")->capture_default_str();
  data->add_option("--n", n, "number of samples")->capture_default_str()->check(CLI::Range(1, 1000000));
  data->add_option("--seed", seed, "seed")->capture_default_str();
  data->add_option("--split", split, "train lengths or eval lengths")->check(CLI::IsMember({"train", "eval"}))->capture_default_str();
  data->add_option("--length", length, "fix the sequence length")->check(CLI::Range(2, 1 << 24));
  data->add_option("--set", sets, "override task.* keys");

  auto* predict = app.add_subcommand("predict", "run a trained model on tokens; print logits and predictions as JSON");
  predict->add_option("--run", run_dir, "run directory")->required();
  predict->add_option("--tokens", tokens, "space-separated token ids, e.g. \"1 2 2 1\"")->required();
  predict->add_flag("--logits", full_logits, "print logits even for large vocabularies");
  predict->add_option("--device", device, "cpu or cuda (default: the run's training.device)")->check(devices);

  std::string grid;
  int jobs = 1;
  bool dry_run = false, report = false;
  auto* sweep = app.add_subcommand("sweep", "run a grid of configs x learning rates x seeds and aggregate (median, MAD, best)");
  sweep->add_option("--grid", grid, "grid YAML (name, configs, lr, seeds, set; see docs/EXPERIMENTS.md)")->required();
  sweep->add_option("--jobs", jobs, "runs trained at once (each with max(1, cores/jobs) threads)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  sweep->add_option("--out", out, "sweep directory (default runs/<grid name>)");
  sweep->add_flag("--dry-run", dry_run, "print what would run, with the commands; write nothing");
  sweep->add_flag("--report", report, "only aggregate finished runs into results.md and results.csv");
  sweep->add_flag("--force", force, "retrain runs whose saved config differs from the grid");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (*train) return cmd_train(config, sets, out, resume, force, device);
    if (*eval) return cmd_eval(run_dir, sets, device);
    if (*data) return cmd_data(task, n, seed, sets, split, length);
    if (*predict) return cmd_predict(run_dir, tokens, full_logits, device);
    if (*sweep) return cmd_sweep(grid, jobs, out, dry_run, report, force);
  } catch (const UserError& e) {
    std::fprintf(stderr, "lrnn: error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "lrnn: internal error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lrnn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace lrnn::cli
