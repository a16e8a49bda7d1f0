// Sweeps: a grid of configs x learning rates x seeds, run as parallel `lrnn train` worker
// processes, then aggregated as the papers report it — per (config, lr) the median ± MAD and the
// best over seeds of the scaled accuracy, and per config the lr with the highest median.
//
// Grid file (YAML; every key checked, errors name the file and the key):
//   name: p1_parity                     # optional; default the file's stem; names the sweep dir
//   configs:                            # experiment configs; a path, or a mapping
//     - configs/chomsky/parity_delta_net.yaml
//     - {file: configs/chomsky/paper/parity_delta_net.yaml, name: paper_dn, set: ["training.num_steps=500"]}
//   lr: [1.0e-2, 1.0e-3, 5.0e-4, 1.0e-4]
//   seeds: [0, 1, 2]
//   set: ["training.num_steps=2000"]    # optional overrides for every run
// Relative config paths are read from the current directory, else from the grid file's directory.
//
// Layout of a sweep directory: <out>/<config name>/lr<lr>_seed<seed>/ (a run directory, plus
// train.log with the worker's output), <out>/grid.yaml (the grid as run), results.md, results.csv.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/config.h"

namespace lrnn::sweep {

namespace fs = std::filesystem;

struct GridConfig {
  std::string name;                 // run directories live under <out>/<name>/
  std::string file;                 // as written in the grid
  fs::path path;                    // where it was found
  std::vector<std::string> set;     // overrides for this config's runs (after the grid's)
};

struct Grid {
  std::string name;
  fs::path source;                  // the grid file
  std::vector<GridConfig> configs;
  std::vector<double> lrs;
  std::vector<int64_t> seeds;
  std::vector<std::string> set;     // overrides for every run

  // Reads and validates the grid, including every config with every lr and the overrides, so
  // that all mistakes surface before any run starts. Throws UserError.
  static Grid load(const fs::path& file);
  // True when the grid's or a config's `set` fixes training.num_threads.
  bool sets_num_threads(size_t config) const;
};

// "1e-3", "5e-4", "2.5e-4": the shortest mantissa that reads back as the same double.
std::string format_lr(double lr);

// One point of the grid.
struct RunSpec {
  size_t config = 0, lr_index = 0, seed_index = 0;
  double lr = 0;
  int64_t seed = 0;
  std::string id;                   // "<config name>/lr1e-3_seed0"
  fs::path dir;                     // <out>/<id>
  fs::path config_file;             // the grid's config file
  std::vector<std::string> overrides;  // --set list for `lrnn train --config`
  ExperimentConfig expected;        // the resolved config the run must have
};

// Every run of the grid in order config, lr, seed. `threads` > 0 sets training.num_threads for
// runs whose grid does not set it.
std::vector<RunSpec> plan(const Grid& grid, const fs::path& out, int threads);

enum class RunState {
  New,       // nothing (usable) there yet: start from scratch
  Resume,    // cut off: a checkpoint without eval.json -> `train --resume`
  Done,      // eval.json with a config that matches the grid: skip
  Conflict,  // a checkpoint or result made with another config: never overwritten without --force
};

struct RunStatus {
  RunState state = RunState::New;
  std::string why;                  // for Conflict (and a corrupt eval.json): what differs
};

// The config keys that do not change what a run computes, ignored when comparing configs:
// logging.*, training.num_threads, training.val_every, training.checkpoint_every.
RunStatus inspect(const RunSpec& run);

// Keys (dotted) whose values differ between two resolved configs, ignoring the keys above;
// each entry reads "training.lr: 0.001 vs 0.0005".
std::vector<std::string> config_differences(const ExperimentConfig& a, const ExperimentConfig& b);

// ---- running ----

struct SweepOptions {
  fs::path out;
  int jobs = 1;
  bool dry_run = false;             // print the plan, write nothing
  bool force = false;               // retrain conflicting runs from scratch
  std::vector<std::string> only;    // shell patterns (fnmatch) on run ids; empty: every run
};

struct SweepOutcome {
  int total = 0, skipped = 0, started = 0, resumed = 0, finished = 0, failed = 0;
  bool interrupted = false;         // SIGINT/SIGTERM: workers were stopped; rerun to resume
};

// Number of CPUs this process may run on.
int available_cores();

// The GPUs a sweep spreads its CUDA runs over, as CUDA_VISIBLE_DEVICES entries: the entries of
// `visible` (that variable's value, null when it is unset: indices or UUIDs, as written), else
// "0" .. "count - 1".
std::vector<std::string> sweep_gpus(const char* visible, int count);

// Runs every unfinished run of the grid with at most `jobs` workers (this binary, re-executed as
// `lrnn train`), each with training.num_threads = max(1, cores / jobs) unless the grid sets it.
// On a host with several GPUs (sweep_gpus), each run with training.device cuda gets the GPU with
// the fewest of the sweep's runs on it, as its own CUDA_VISIBLE_DEVICES.
// Progress goes to stderr. Throws UserError for conflicts (without force) or a busy directory.
SweepOutcome run_sweep(const Grid& grid, const SweepOptions& opt);

// ---- aggregation ----

// median (mean of the two middle values for an even count), MAD = median |x - median|, best =
// max (best_index: its first occurrence). Empty input: n = 0 and NaNs.
struct Summary {
  int n = 0;
  double median = 0, mad = 0, best = 0;
  int best_index = -1;
};
Summary summarize(const std::vector<double>& xs);

// The lr to report: the highest median; ties go to the higher best, then to the first listed.
// -1 when no lr has a finished run.
int select_lr(const std::vector<Summary>& per_lr);

struct SeedResult {
  int64_t seed = 0;
  bool finished = false;
  double scaled = 0, train_scaled = 0;
  // Word problems (sequence accuracy up to each length): the longest length t with sequence
  // accuracy >= kReachAccuracy at every length up to t (0 when the first length is below it; the
  // longest evaluated length when none is). NaN for other tasks.
  double reach = 0;
  std::string run;                  // run directory relative to the sweep directory
};

// P2's measure of length generalisation: where sequence accuracy falls below 0.9.
inline constexpr double kReachAccuracy = 0.9;
// `reach` of an eval.json (SeedResult::reach); NaN when it has no sequence-accuracy curve.
double sequence_reach(const nlohmann::json& eval);

struct LrResult {
  double lr = 0;
  std::vector<SeedResult> seeds;    // in grid order, finished or not
  Summary test, train;              // over finished seeds; train: on the training lengths
  Summary reach;                    // over finished seeds with a sequence-accuracy curve
};

struct ConfigResult {
  std::string name, model;          // model: "delta_net [-1,1]"
  std::array<int, 2> train_len{}, eval_len{};
  std::vector<LrResult> lrs;
  int best_lr = -1;                 // index into lrs (select_lr of the test summaries)
};

struct Report {
  std::string name;
  std::vector<int64_t> seeds;
  std::vector<ConfigResult> configs;
  int finished = 0, total = 0;
  std::vector<std::string> notes;   // runs left out, and why
};

// Reads eval.json of every run whose config matches the grid.
Report collect(const Grid& grid, const fs::path& out);
std::string to_markdown(const Report& r);
std::string to_csv(const Report& r);
// Writes results.md and results.csv into `out` (atomically) and returns the Markdown.
std::string write_report(const Grid& grid, const fs::path& out);

// "delta_net [-1,1]", "gated_deltaproduct n_h=2 [-1,1]": model_type, then n_h and the eigenvalue
// range where the model has them.
std::string model_label(const YAML::Node& model_block);

}  // namespace lrnn::sweep
