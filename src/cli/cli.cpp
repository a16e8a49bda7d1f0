// The `lrnn` command line: train, eval, data, predict, sweep.
#include "cli/cli.h"
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <CLI/CLI.hpp>
#include "core/check.h"
#include "core/version.h"
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

// One row per range: lengths, accuracy, the task's metric, samples.
struct EvalRow {
  std::string lengths, note;
  double accuracy, metric;
  long long samples;
};

// The result of an evaluation as a short table: the training lengths, the evaluation lengths, and
// the evaluation lengths in up to eight bins (Answer tasks: the metric over each bin's samples;
// Prefix tasks: sequence accuracy up to the bin's last length). The full numbers are in the JSON.
std::string eval_table(const nlohmann::json& e) {
  const bool prefix = e.value("metric", "") == "sequence_accuracy_up_to_length";
  const char* metric = prefix ? "seq. acc." : "scaled";
  std::vector<EvalRow> rows;
  auto whole = [&](const nlohmann::json& x, const std::string& note) {
    rows.push_back({fmt::format("{}-{}", int(x["lengths"][0]), int(x["lengths"][1])), note, double(x["accuracy"]),
                    double(x["scaled_accuracy"]), (long long)x["samples"]});
  };
  if (e.contains("train_range")) whole(e["train_range"], "training lengths");
  whole(e, "evaluation lengths");
  // Bins over the evaluation lengths.
  std::vector<std::pair<int, nlohmann::json>> per;
  for (auto& [k, v] : e["per_length"].items()) per.emplace_back(std::stoi(k), v);
  std::sort(per.begin(), per.end(), [](auto& a, auto& b) { return a.first < b.first; });
  if (per.size() > 1) {
    const size_t bins = std::min<size_t>(8, per.size());
    for (size_t b = 0; b < bins; ++b) {
      size_t lo = b * per.size() / bins, hi = (b + 1) * per.size() / bins;  // [lo, hi)
      if (lo >= hi) continue;
      EvalRow r{fmt::format("  {}-{}", per[lo].first, per[hi - 1].first), "", 0, 0, 0};
      if (prefix) {  // sequence accuracy up to the bin's last length
        r.accuracy = r.metric = double(per[hi - 1].second["accuracy"]);
        r.samples = (long long)per[hi - 1].second["n"];
      } else {  // pooled over the bin's samples
        double acc = 0, sc = 0;
        for (size_t i = lo; i < hi; ++i) {
          double n = double(per[i].second["n"]);
          acc += n * double(per[i].second["accuracy"]);
          sc += n * double(per[i].second["scaled_accuracy"]);
          r.samples += (long long)n;
        }
        r.accuracy = r.samples ? acc / double(r.samples) : 0;
        r.metric = r.samples ? sc / double(r.samples) : 0;
      }
      rows.push_back(r);
    }
  }
  std::string out = fmt::format("{:<14}{:>10}{:>11}{:>9}\n", "lengths", "accuracy", metric, "samples");
  for (auto& r : rows)
    out += fmt::format("{:<14}{:>10.4f}{:>11.4f}{:>9}{}\n", r.lengths, r.accuracy, r.metric, r.samples,
                       r.note.empty() ? "" : "  (" + r.note + ")");
  return out;
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
  if (s.interrupted) {
    std::fprintf(stderr, "lrnn: stopped by %s after step %lld of %lld; checkpoint saved in %s\n"
                 "continue with: lrnn train --resume %s\n",
                 s.interrupted == SIGINT ? "Ctrl-C (SIGINT)" : strsignal(s.interrupted), (long long)s.steps,
                 (long long)cfg.training.num_steps, opt.out_dir.c_str(), opt.out_dir.c_str());
    // Exit "by the signal", as a shell expects of a program that was interrupted (status 128 + n).
    std::fflush(nullptr);
    std::signal(s.interrupted, SIG_DFL);
    std::raise(s.interrupted);
    return 128 + s.interrupted;
  }
  std::fprintf(stderr, "done: %lld steps (%lld skipped) in %.1f s, final loss %.4f\n", (long long)s.steps,
               (long long)s.skipped, s.seconds, s.final_loss);
  std::fprintf(stderr, "%s", eval_table(s.eval).c_str());
  std::printf("%s\n", nlohmann::json{{"run", opt.out_dir.string()}, {"steps", s.steps}, {"seconds", s.seconds},
                                     {"accuracy", s.eval["accuracy"]}, {"scaled_accuracy", s.eval["scaled_accuracy"]}}
                          .dump().c_str());
  return 0;
}

int cmd_eval(const std::string& run, const std::vector<std::string>& sets, const std::string& device, bool json) {
  for (auto& a : sets)
    if (a.rfind("task.", 0) != 0)
      LRNN_USER_ERROR("eval: --set {}: only task.* keys apply when evaluating a saved run (e.g. --set "
                      "task.eval_len=[40,512]); the model and its training are what the run saved", a);
  LoadedRun r = load_run(run, sets, device);
  nlohmann::json e = evaluate_run(r.engine->logits_fn(), r.model().vocab_size(), r.cfg);
  // Next to the run's own eval.json, named after the lengths, so evaluations at other lengths
  // never overwrite each other or the training's result.
  const auto& t = r.cfg.task;
  fs::path file = fs::path(run) / fmt::format("eval_{}-{}.json", t.eval_len[0], t.eval_len[1]);
  io::write_file_atomic(file, e.dump(2) + "\n");
  if (json) {
    std::printf("%s\n", e.dump().c_str());
  } else {
    std::printf("%s", eval_table(e).c_str());
    std::printf("wrote %s\n", file.c_str());
  }
  return 0;
}

int cmd_data(const std::string& config, const std::string& task_name, int n, int64_t seed,
             const std::vector<std::string>& sets, const std::string& split, int length) {
  YAML::Node root(YAML::NodeType::Map);
  std::string where = "--set";
  if (!config.empty()) {
    // The task block of an experiment config (the data a run of it trains on); --set task.* on top.
    YAML::Node file = io::load_yaml_file(config);
    if (file["task"]) root["task"] = file["task"];
    where = config;
  } else {
    root["task"]["name"] = task_name;
  }
  for (auto& s : sets) io::apply_override(root, s);
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it->first.as<std::string>() != "task") LRNN_USER_ERROR("data: --set {}.*: only task.* keys apply here", it->first.as<std::string>());
  TaskConfig tc;
  io::Schema s(where, "task");
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
  for (int32_t x : tok)
    if (x == task->pad_token())
      LRNN_USER_ERROR("predict: --tokens: {} is the padding token of task {} ({}); the model never reads it as input",
                      x, r.cfg.task.name, task->token_name(x));
  // A model trained on samples that start with BOS sees one in front of what the user typed.
  const int bos = task->bos_token();
  const bool add_bos = bos >= 0 && tok.front() != bos;
  if (add_bos) tok.insert(tok.begin(), bos);
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
  nlohmann::json out = {{"run", run}, {"positions", pos}};
  if (add_bos) out["bos_added"] = bos;
  std::printf("%s\n", out.dump().c_str());
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
  CLI::App app{"lrnn: linear RNNs that track state (DeltaNet, Mamba, DeltaProduct, ...; eigenvalues in [0,1] or [-1,1])",
               "lrnn"};
  app.footer(fmt::format("Tasks (task.name): {}\nModel types (model.model_type): {}\n"
                         "Config keys, run directory files: README.md; experiments and sweeps: docs/EXPERIMENTS.md",
                         fmt::join(task_names(), ", "), fmt::join(model_types(), ", ")));
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line());

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
  bool eval_json = false;
  eval->add_flag("--json", eval_json, "print the whole result as JSON instead of the table");

  auto* data = app.add_subcommand("data", "print task samples as JSON lines");
  std::string data_config;
  auto* data_task = data->add_option("--task", task, "task name (" + fmt::format("{}", fmt::join(task_names(), ", ")) + ")")
                        ->capture_default_str();
  data->add_option("--config", data_config, "take the task block of this experiment YAML")->excludes(data_task);
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
    if (*eval) return cmd_eval(run_dir, sets, device, eval_json);
    if (*data) return cmd_data(data_config, task, n, seed, sets, split, length);
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
