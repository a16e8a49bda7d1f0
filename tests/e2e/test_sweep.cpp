// `lrnn sweep` and tools/plot.py as a user meets them: a grid runs in parallel workers and its
// tables hold exactly the median, MAD and best recomputed from the runs' eval.json; a second
// invocation touches nothing; a cut-off run is resumed (not restarted) and ends equal to an
// uninterrupted one; a grid that disagrees with saved runs is refused; bad grids exit 2; SIGINT
// stops the workers; the aggregation itself on hand-made numbers (even counts, ties, missing
// runs); and the plots are valid PNGs.
#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "cli_util.h"
#include "train/sweep.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = tiny_config({"training.seed=0", "task.eval_samples=64"});

// Two configs in `dir`: a.yaml (DeltaNet [-1,1]) and b.yaml (DeltaNet [0,1]).
void write_configs(const fs::path& dir) {
  std::string b = kTiny;
  b.replace(b.find("allow_neg_eigval: true"), 22, "allow_neg_eigval: false");
  write_text(dir / "a.yaml", kTiny);
  write_text(dir / "b.yaml", b);
}

// g.yaml: a, and b renamed b_pos (config paths relative to the grid file) x 2 lrs x 2 seeds = 8
// runs of 16 steps.
void write_tiny_grid(const fs::path& dir) {
  write_text(dir / "g.yaml", "name: tiny\nconfigs: [a.yaml, {file: b.yaml, name: b_pos}]\n"
                             "lr: [3.0e-3, 1.0e-2]\nseeds: [0, 1]\nset: [\"training.num_steps=16\"]\n");
}

RunResult run_cmd(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// RFC 4180 enough for results.csv: quoted fields may hold commas.
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& file) {
  std::istringstream in(read_text(file));
  std::string line;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> f(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      char c = line[i];
      if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') { f.back() += '"'; ++i; }
      else if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) f.emplace_back();
      else f.back() += c;
    }
    rows.push_back(f);
  }
  std::vector<std::map<std::string, std::string>> out;
  for (size_t r = 1; r < rows.size(); ++r) {
    EXPECT_EQ(rows[r].size(), rows[0].size()) << "row " << r;
    std::map<std::string, std::string> m;
    for (size_t i = 0; i < rows[0].size() && i < rows[r].size(); ++i) m[rows[0][i]] = rows[r][i];
    out.push_back(m);
  }
  return out;
}

// Written independently of sweep.cpp: the statistics P1 reports.
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}
double mad_of(const std::vector<double>& v) {
  double m = median_of(v);
  std::vector<double> d;
  for (double x : v) d.push_back(std::abs(x - m));
  return median_of(d);
}

std::vector<nlohmann::json> metrics_of_type(const fs::path& run, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_text(run / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line))
    if (auto j = nlohmann::json::parse(line); j["type"] == type) v.push_back(j);
  return v;
}

// Every file under `dir` (but the sweep's own results) with its modification time.
std::map<std::string, fs::file_time_type> run_files(const fs::path& dir) {
  std::map<std::string, fs::file_time_type> m;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().parent_path() != dir) m[e.path().string()] = e.last_write_time();
  return m;
}

std::string sweep_cmd(const fs::path& grid, const fs::path& out, const std::string& extra = "") {
  return "sweep --grid " + grid.string() + " --out " + out.string() + (extra.empty() ? "" : " " + extra);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Aggregation on hand-made numbers

TEST(SweepAggregate, MedianMadBestWithEvenCountsAndTies) {
  auto s = sweep::summarize({0.25, 0.875, 0.5});  // odd: the middle value
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.median, 0.5);
  EXPECT_EQ(s.mad, 0.25);  // |dev| = .25, .375, 0 -> .25
  EXPECT_EQ(s.best, 0.875);
  EXPECT_EQ(s.best_index, 1);

  s = sweep::summarize({1.0, 4.0, 2.0, 3.0});  // even: mean of the two middle values
  EXPECT_EQ(s.median, 2.5);
  EXPECT_EQ(s.mad, 1.0);  // |dev| = 1.5, 1.5, .5, .5 -> (.5 + 1.5) / 2
  EXPECT_EQ(s.best, 4.0);
  EXPECT_EQ(s.best_index, 1);

  s = sweep::summarize({0.75, 0.125, 0.75, 0.75});  // tied best: the first one
  EXPECT_EQ(s.median, 0.75);
  EXPECT_EQ(s.mad, 0.0);
  EXPECT_EQ(s.best_index, 0);

  s = sweep::summarize({-0.5});
  EXPECT_EQ(s.median, -0.5);
  EXPECT_EQ(s.mad, 0.0);
  EXPECT_EQ(s.best_index, 0);

  s = sweep::summarize({});
  EXPECT_EQ(s.n, 0);
  EXPECT_TRUE(std::isnan(s.median) && std::isnan(s.mad) && std::isnan(s.best));
  EXPECT_EQ(s.best_index, -1);
}

TEST(SweepAggregate, BestLrByMedianThenBestThenFirst) {
  auto S = [](std::vector<double> v) { return sweep::summarize(v); };
  // Highest median wins even against a higher best.
  EXPECT_EQ(sweep::select_lr({S({0.5, 0.5, 1.0}), S({0.75, 0.75, 0.0}), S({0.25})}), 1);
  // Equal medians: the higher best decides.
  EXPECT_EQ(sweep::select_lr({S({0.5, 0.5, 0.5}), S({0.25, 0.5, 0.875}), S({0.5, 0.75, 0.0})}), 1);
  // Equal medians and bests: the first listed.
  EXPECT_EQ(sweep::select_lr({S({0.5, 0.5}), S({0.5, 0.5})}), 0);
  // Lrs without a finished run never win; none at all: -1.
  EXPECT_EQ(sweep::select_lr({S({}), S({0.0}), S({})}), 1);
  EXPECT_EQ(sweep::select_lr({S({}), S({})}), -1);
}

TEST(SweepAggregate, LearningRateNames) {
  EXPECT_EQ(sweep::format_lr(1e-3), "1e-3");
  EXPECT_EQ(sweep::format_lr(5e-4), "5e-4");
  EXPECT_EQ(sweep::format_lr(1.0e-2), "1e-2");
  EXPECT_EQ(sweep::format_lr(2.5e-4), "2.5e-4");
  EXPECT_EQ(sweep::format_lr(0.1), "1e-1");
  EXPECT_EQ(sweep::format_lr(1.0), "1e0");
  EXPECT_EQ(sweep::format_lr(3.14159e-3), "3.14159e-3");
}

// collect() over hand-written run directories: 4 seeds (even), a median tie between two lrs
// broken by the best, an unfinished run and one made with another config left out.
TEST(SweepAggregate, ReportFromHandMadeRuns) {
  auto dir = temp_dir("sweep_hand");
  write_configs(dir);
  write_text(dir / "g.yaml", "name: hand\nconfigs: [a.yaml, b.yaml]\nlr: [1.0e-2, 1.0e-3, 1.0e-4]\nseeds: [0, 1, 2, 3]\n");
  auto grid = sweep::Grid::load(dir / "g.yaml");
  const fs::path out = dir / "out";
  const double kUnfinished = -10, kConflict = -20;
  std::map<std::string, std::vector<double>> scores = {
      {"a/1e-2", {0.5, 0.875, 0.125, 0.625}},  // median .5625, MAD .1875, best .875 (seed 1)
      {"a/1e-3", {0.5625, 0.25, 1.0, 0.5625}}, // median .5625 too, MAD .15625, best 1.0 -> chosen
      {"a/1e-4", {0.25, kUnfinished, kConflict, 0.25}},  // 2 of 4: median .25, best seed 0
      {"b/1e-2", {0.5, 0.5, 0.5, 0.5}},        // all tied: the first lr is chosen
      {"b/1e-3", {0.5, 0.5, 0.5, 0.5}},
      {"b/1e-4", {kUnfinished, kUnfinished, kUnfinished, kUnfinished}},
  };
  for (auto& run : sweep::plan(grid, out, 0)) {
    double x = scores[grid.configs[run.config].name + "/" + sweep::format_lr(run.lr)][run.seed_index];
    fs::create_directories(run.dir);
    ExperimentConfig cfg = run.expected;
    if (x == kConflict) cfg.training.num_steps += 1;
    write_text(run.dir / "config.yaml", YAML::Dump(cfg.to_yaml()) + "\n");
    if (x == kUnfinished || x == kConflict) write_text(run.dir / "train_state.safetensors", "");
    if (x != kUnfinished)
      write_text(run.dir / "eval.json", nlohmann::json{{"scaled_accuracy", x}, {"train_range", {{"scaled_accuracy", x / 2}}}}.dump());
  }

  sweep::Report r = sweep::collect(grid, out);
  EXPECT_EQ(r.total, 24);
  EXPECT_EQ(r.finished, 18);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_TRUE(contains(r.notes[0], "a/lr1e-4_seed2")) << r.notes[0];
  EXPECT_TRUE(contains(r.notes[0], "training.num_steps: 25 vs 24")) << r.notes[0];
  ASSERT_EQ(r.configs.size(), 2u);
  const auto& a = r.configs[0];
  EXPECT_EQ(a.model, "delta_net [-1,1]");
  EXPECT_EQ(r.configs[1].model, "delta_net [0,1]");
  EXPECT_EQ(a.lrs[0].test.median, 0.5625);
  EXPECT_EQ(a.lrs[0].test.mad, 0.1875);
  EXPECT_EQ(a.lrs[0].test.best, 0.875);
  EXPECT_EQ(a.lrs[1].test.median, 0.5625);
  EXPECT_EQ(a.lrs[1].test.mad, 0.15625);
  EXPECT_EQ(a.lrs[1].train.median, 0.28125);
  EXPECT_EQ(a.lrs[2].test.n, 2);
  EXPECT_EQ(a.lrs[2].test.median, 0.25);
  EXPECT_EQ(a.best_lr, 1);
  EXPECT_EQ(r.configs[1].best_lr, 0);

  std::string md = sweep::write_report(grid, out);
  EXPECT_EQ(md, read_text(out / "results.md"));
  EXPECT_TRUE(contains(md, "| a | delta_net [-1,1] | 1e-3 | 4/4 | 12-16 | 0.562 ± 0.156 | 1.000 | 3-12 | 0.281 |")) << md;
  EXPECT_TRUE(contains(md, "| b | delta_net [0,1] | 1e-2 | 4/4 | 12-16 | 0.500 ± 0.000 | 0.500 | 3-12 | 0.250 |")) << md;
  EXPECT_TRUE(contains(md, "| a | 1e-4 | 2/4 | 0.250 ± 0.000 | 0.250 (0) | 0.250, –, –, 0.250 |")) << md;
  EXPECT_TRUE(contains(md, "| b | 1e-4 | 0/4 | – | – | –, –, –, – |")) << md;
  EXPECT_TRUE(contains(md, "a/lr1e-4_seed2: left out")) << md;
  auto rows = read_csv(out / "results.csv");
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[1]["config"], "a");
  EXPECT_EQ(rows[1]["model"], "delta_net [-1,1]");
  EXPECT_EQ(rows[1]["lr"], "1e-3");
  EXPECT_EQ(rows[1]["selected"], "1");
  EXPECT_EQ(rows[1]["median"], "0.5625");
  EXPECT_EQ(rows[1]["mad"], "0.15625");
  EXPECT_EQ(rows[1]["best_seed"], "2");
  EXPECT_EQ(rows[1]["best_run"], "a/lr1e-3_seed2");
  EXPECT_EQ(rows[1]["seed3"], "0.5625");
  EXPECT_EQ(rows[0]["selected"], "0");
  EXPECT_EQ(rows[2]["finished"], "2");
  EXPECT_EQ(rows[2]["seed1"], "");
  EXPECT_EQ(rows[5]["median"], "");
  EXPECT_EQ(rows[1]["reach_median"], "") << "parity has no sequence-accuracy curve";
  EXPECT_FALSE(contains(md, "falls below")) << md;
  fs::remove_all(dir);
}

// Word problems: where each seed's sequence accuracy first falls below 0.9, summarised like the
// scaled accuracy (P2 reports length generalisation this way).
TEST(SweepAggregate, WordProblemsReportWhereSequenceAccuracyFallsBelowPointNine) {
  auto curve = [](std::vector<double> acc) {
    nlohmann::json per = nlohmann::json::object();
    for (size_t t = 0; t < acc.size(); ++t) per[std::to_string(t + 1)] = {{"accuracy", acc[t]}, {"n", 8}};
    return nlohmann::json{{"metric", "sequence_accuracy_up_to_length"}, {"per_length", per}, {"scaled_accuracy", acc.back()}};
  };
  EXPECT_EQ(sweep::sequence_reach(curve({1.0, 0.95, 0.9, 0.89, 0.95})), 3.0);  // the first fall ends it
  EXPECT_EQ(sweep::sequence_reach(curve({0.5, 1.0})), 0.0);
  EXPECT_EQ(sweep::sequence_reach(curve({1.0, 1.0, 0.99})), 3.0);  // never falls: the longest length
  EXPECT_TRUE(std::isnan(sweep::sequence_reach(nlohmann::json{{"metric", "answer_accuracy"}, {"scaled_accuracy", 1}})));
  // Lengths are ordered as numbers, not as the JSON object's string keys ("10" < "9").
  std::vector<double> long_curve(12, 1.0);
  long_curve[9] = 0.5;  // length 10
  EXPECT_EQ(sweep::sequence_reach(curve(long_curve)), 9.0);

  auto dir = temp_dir("sweep_reach");
  write_configs(dir);
  write_text(dir / "g.yaml", "name: reach\nconfigs: [a.yaml]\nlr: [1.0e-3]\nseeds: [0, 1, 2]\n");
  auto grid = sweep::Grid::load(dir / "g.yaml");
  const fs::path out = dir / "out";
  const std::vector<std::vector<double>> seeds = {{1, 1, 1, 0.5}, {1, 0.2, 0.1, 0}, {1, 1, 0.95, 0.9}};
  for (auto& run : sweep::plan(grid, out, 0)) {
    fs::create_directories(run.dir);
    write_text(run.dir / "config.yaml", YAML::Dump(run.expected.to_yaml()) + "\n");
    write_text(run.dir / "eval.json", curve(seeds[size_t(run.seed_index)]).dump());
  }
  std::string md = sweep::write_report(grid, out);
  EXPECT_TRUE(contains(md, "| a | delta_net [-1,1] | 1e-3 | 3/3 | 3 ± 1 | 4 | 3, 1, 4 |")) << md;
  auto rows = read_csv(out / "results.csv");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["reach_median"], "3");
  EXPECT_EQ(rows[0]["reach_best"], "4");
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// The real binary

TEST(Sweep, RunsInParallelAggregatesAndSkipsFinishedRuns) {
  auto dir = temp_dir("sweep_run");
  write_configs(dir);
  write_tiny_grid(dir);
  const fs::path out = dir / "out";

  auto dry = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--jobs 2 --dry-run"));
  ASSERT_EQ(dry.code, 0) << dry.out;
  EXPECT_TRUE(contains(dry.out, "0 finished (skipped), 0 to resume, 8 to start")) << dry.out;
  EXPECT_TRUE(contains(dry.out, "--set training.lr=1e-2 --set training.seed=1 --set training.num_threads=")) << dry.out;
  EXPECT_FALSE(fs::exists(out)) << "--dry-run must write nothing";

  auto r = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--jobs 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::pair<std::string, std::string>> configs = {{"a", "delta_net [-1,1]"}, {"b_pos", "delta_net [0,1]"}};
  const std::vector<std::string> lrs = {"3e-3", "1e-2"};
  auto rows = read_csv(out / "results.csv");
  ASSERT_EQ(rows.size(), 4u);
  std::string md = read_text(out / "results.md");
  EXPECT_TRUE(contains(r.out, md)) << "the table is printed";
  size_t row = 0;
  for (auto& [name, model] : configs) {
    double best_median = -1e9, best_best = -1e9;
    std::string chosen;
    std::vector<double> chosen_train;
    for (auto& lr : lrs) {
      std::vector<double> test, train;
      for (int seed : {0, 1}) {
        fs::path run = out / name / ("lr" + lr + "_seed" + std::to_string(seed));
        auto e = nlohmann::json::parse(read_text(run / "eval.json"));
        test.push_back(e["scaled_accuracy"]);
        train.push_back(e["train_range"]["scaled_accuracy"]);
        auto cfg = YAML::LoadFile((run / "config.yaml").string());
        EXPECT_EQ(cfg["training"]["seed"].as<int>(), seed);
        EXPECT_EQ(cfg["training"]["lr"].as<double>(), std::stod(lr));
        EXPECT_EQ(cfg["training"]["num_steps"].as<int>(), 16);
        EXPECT_EQ(cfg["training"]["num_threads"].as<int>(), std::max(1, sweep::available_cores() / 2));
      }
      auto& csv = rows[row++];
      EXPECT_EQ(csv["config"], name);
      EXPECT_EQ(csv["model"], model);
      EXPECT_EQ(csv["lr"], lr);
      EXPECT_EQ(csv["finished"], "2");
      EXPECT_DOUBLE_EQ(std::stod(csv["median"]), median_of(test)) << name << " " << lr;
      EXPECT_DOUBLE_EQ(std::stod(csv["mad"]), mad_of(test)) << name << " " << lr;
      double best = *std::max_element(test.begin(), test.end());
      EXPECT_DOUBLE_EQ(std::stod(csv["best"]), best);
      EXPECT_EQ(csv["best_seed"], test[0] >= test[1] ? "0" : "1");
      EXPECT_EQ(std::stod(csv["seed0"]), test[0]);
      EXPECT_EQ(std::stod(csv["seed1"]), test[1]);
      EXPECT_DOUBLE_EQ(std::stod(csv["train_median"]), median_of(train));
      double m = median_of(test);
      if (m > best_median || (m == best_median && best > best_best)) {
        best_median = m;
        best_best = best;
        chosen = lr;
        chosen_train = train;
      }
    }
    for (size_t k = row - 2; k < row; ++k) EXPECT_EQ(rows[k]["selected"], rows[k]["lr"] == chosen ? "1" : "0") << name;
    std::string line = fmt::format("| {} | {} | {} | 2/2 | 12-16 | {:.3f} ± ", name, model, chosen, best_median);
    EXPECT_TRUE(contains(md, line)) << line << "\n" << md;
    EXPECT_TRUE(contains(md, fmt::format("| 3-12 | {:.3f} |", median_of(chosen_train)))) << md;
  }

  // Again, with another --jobs (which only changes threads per run): nothing is touched.
  auto before = run_files(out);
  auto again = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--jobs 1"));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "8 finished (skipped), 0 to resume, 0 to start")) << again.out;
  EXPECT_FALSE(contains(again.out, "] start")) << again.out;
  EXPECT_EQ(run_files(out), before) << "a finished run was rewritten";
  EXPECT_EQ(read_text(out / "results.md"), md);

  // --report only aggregates, from scratch.
  fs::remove(out / "results.csv");
  auto rep = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--report"));
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_EQ(read_csv(out / "results.csv"), rows);
  EXPECT_EQ(run_files(out), before);
  fs::remove_all(dir);
}

TEST(Sweep, CutOffRunsAreResumedAndEndEqualToUninterruptedRuns) {
  auto dir = temp_dir("sweep_resume");
  write_configs(dir);
  write_text(dir / "g.yaml", "configs: [a.yaml]\nlr: [3.0e-3]\nseeds: [0, 1]\n");
  const fs::path ref = dir / "ref", cut = dir / "cut";
  ASSERT_EQ(run_lrnn(sweep_cmd(dir / "g.yaml", ref, "--jobs 2")).code, 0);

  // Every worker SIGKILLs itself after step 10; the last checkpoint is from step 8.
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "10", 1);
  auto k = run_lrnn(sweep_cmd(dir / "g.yaml", cut, "--jobs 2"));
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  EXPECT_EQ(k.code, 1) << k.out;
  EXPECT_TRUE(contains(k.out, "killed by signal 9")) << k.out;
  EXPECT_TRUE(contains(read_text(cut / "results.md"), "0 of 2 runs finished"));
  std::map<std::string, std::string> head;  // metrics of steps 1-8, written before the kill
  for (auto seed : {"0", "1"}) {
    fs::path run = cut / "a" / (std::string("lr3e-3_seed") + seed);
    ASSERT_FALSE(fs::exists(run / "eval.json"));
    ASSERT_TRUE(fs::exists(run / "train_state.safetensors"));
    ASSERT_EQ(metrics_of_type(run, "train").size(), 10u);
    std::istringstream in(read_text(run / "metrics.jsonl"));
    std::string line;
    for (int i = 0; i < 8 && std::getline(in, line); ++i) head[seed] += line + "\n";
  }
  auto plan = run_lrnn(sweep_cmd(dir / "g.yaml", cut, "--jobs 2 --dry-run"));
  EXPECT_TRUE(contains(plan.out, "0 finished (skipped), 2 to resume, 0 to start")) << plan.out;
  EXPECT_TRUE(contains(plan.out, "lrnn train --resume " + (cut / "a" / "lr3e-3_seed1").string())) << plan.out;

  auto r = run_lrnn(sweep_cmd(dir / "g.yaml", cut, "--jobs 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "] resume  a/lr3e-3_seed0")) << r.out;
  for (auto seed : {"0", "1"}) {
    fs::path a = ref / "a" / (std::string("lr3e-3_seed") + seed), b = cut / "a" / (std::string("lr3e-3_seed") + seed);
    // Resumed, not restarted: the lines of steps 1-8 (with their timings) are the ones written
    // before the kill; a fresh start would have rewritten them.
    EXPECT_EQ(read_text(b / "metrics.jsonl").substr(0, head[seed].size()), head[seed]);
    EXPECT_TRUE(contains(read_text(b / "train.log"), "lrnn train --resume")) << seed;
    auto la = metrics_of_type(a, "train"), lb = metrics_of_type(b, "train");
    ASSERT_EQ(lb.size(), 24u);
    for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(double(la[i]["loss"]), double(lb[i]["loss"])) << "step " << i + 1;
    EXPECT_EQ(read_text(a / "model.safetensors"), read_text(b / "model.safetensors")) << seed;
    EXPECT_EQ(read_text(a / "eval.json"), read_text(b / "eval.json")) << seed;
  }
  EXPECT_EQ(read_text(ref / "results.csv"), read_text(cut / "results.csv"));
  fs::remove_all(dir);
}

TEST(Sweep, RunsOfAnotherConfigAreNotOverwrittenWithoutForce) {
  auto dir = temp_dir("sweep_conflict");
  write_configs(dir);
  write_text(dir / "g.yaml", "configs: [a.yaml]\nlr: [3.0e-3]\nseeds: [0]\nset: [training.num_steps=8]\n");
  write_text(dir / "g2.yaml", "configs: [a.yaml]\nlr: [3.0e-3]\nseeds: [0]\nset: [training.num_steps=6]\n");
  const fs::path out = dir / "out", run = out / "a" / "lr3e-3_seed0";
  ASSERT_EQ(run_lrnn(sweep_cmd(dir / "g.yaml", out)).code, 0);
  auto before = run_files(out);
  auto r = run_lrnn(sweep_cmd(dir / "g2.yaml", out));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "a/lr3e-3_seed0: run vs grid: training.num_steps: 8 vs 6")) << r.out;
  EXPECT_TRUE(contains(r.out, "--force")) << r.out;
  EXPECT_EQ(run_files(out), before);
  auto f = run_lrnn(sweep_cmd(dir / "g2.yaml", out, "--force"));
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_TRUE(contains(f.out, "] retrain a/lr3e-3_seed0")) << f.out;
  EXPECT_EQ(metrics_of_type(run, "train").size(), 6u);
  EXPECT_EQ(YAML::LoadFile((run / "config.yaml").string())["training"]["num_steps"].as<int>(), 6);
  fs::remove_all(dir);
}

TEST(Sweep, BadGridsExitTwoWithAClearMessage) {
  auto dir = temp_dir("sweep_bad");
  write_configs(dir);
  const std::string ok_tail = "lr: [1.0e-3]\nseeds: [0]\n";
  struct Case { std::string name, grid, expect; };
  std::vector<Case> cases = {
      {"yaml", "configs: [a.yaml\n", "not valid YAML"},
      {"not_map", "- a.yaml\n", "expected a mapping with keys name, configs, lr, seeds, set"},
      {"unknown", "configs: [a.yaml]\nlrs: [1.0e-3]\nseeds: [0]\n", "lrs: unknown key; valid keys are name, configs, lr, seeds, set"},
      {"no_configs", ok_tail, "configs: missing"},
      {"empty_configs", "configs: []\n" + ok_tail, "configs: expected a non-empty list"},
      {"missing_file", "configs: [nope.yaml]\n" + ok_tail, "nope.yaml: no such config file"},
      {"same_name", "configs: [a.yaml, a.yaml]\n" + ok_tail, "configs[1]: the name 'a' is taken by a.yaml"},
      {"entry_key", "configs: [{path: a.yaml}]\n" + ok_tail, "configs[0].path: unknown key; valid keys are file, name, set"},
      {"entry_name", "configs: [{file: a.yaml, name: ../x}]\n" + ok_tail, "configs[0].name: expected a name"},
      {"name", "name: a/b\nconfigs: [a.yaml]\n" + ok_tail, "name: expected a name of letters"},
      {"lr_scalar", "configs: [a.yaml]\nlr: 1.0e-3\nseeds: [0]\n", "lr: expected a non-empty list of learning rates"},
      {"lr_missing", "configs: [a.yaml]\nseeds: [0]\n", "lr: missing"},
      {"lr_text", "configs: [a.yaml]\nlr: [fast]\nseeds: [0]\n", "lr[0]: expected a number, got 'fast'"},
      {"lr_negative", "configs: [a.yaml]\nlr: [1.0e-3, -1.0e-3]\nseeds: [0]\n", "lr[1]: expected a positive number"},
      {"lr_twice", "configs: [a.yaml]\nlr: [1.0e-3, 0.001]\nseeds: [0]\n", "lr[1]: 0.001 is listed twice"},
      {"lr_range", "configs: [a.yaml]\nlr: [20]\nseeds: [0]\n", "configs[0] (a.yaml) with lr 2e1: "},
      {"seed_float", "configs: [a.yaml]\nlr: [1.0e-3]\nseeds: [0, 1.5]\n", "seeds[1]: expected an integer, got '1.5'"},
      {"seed_negative", "configs: [a.yaml]\nlr: [1.0e-3]\nseeds: [-1]\n", "seeds[0]: expected a seed >= 0"},
      {"seed_twice", "configs: [a.yaml]\nlr: [1.0e-3]\nseeds: [2, 2]\n", "seeds[1]: 2 is listed twice"},
      {"set_lr", "configs: [a.yaml]\n" + ok_tail + "set: [training.lr=1]\n", "set[0]: training.lr is set by the grid's lr list"},
      {"set_seed", "configs: [{file: a.yaml, set: [training.seed=1]}]\n" + ok_tail, "configs[0].set[0]: training.seed is set by the grid's seeds"},
      {"set_form", "configs: [a.yaml]\n" + ok_tail + "set: [num_steps]\n", "set[0]: expected \"block.key=value\""},
      {"set_key", "configs: [a.yaml]\n" + ok_tail + "set: [training.num_stepz=3]\n", "training.num_stepz: unknown key"},
      {"set_value", "configs: [a.yaml]\n" + ok_tail + "set: [training.batch_size=0]\n", "training.batch_size: expected an integer in"},
  };
  for (auto& c : cases) {
    fs::path grid = dir / (c.name + ".yaml"), out = dir / ("out_" + c.name);
    write_text(grid, c.grid);
    auto r = run_lrnn(sweep_cmd(grid, out));
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.out;
    EXPECT_TRUE(contains(r.out, c.expect)) << c.name << ": " << r.out;
    EXPECT_TRUE(contains(r.out, grid.string())) << c.name << " must name the grid file: " << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.name << ": nothing may be written";
  }
  write_text(dir / "ok.yaml", "configs: [a.yaml]\n" + ok_tail);
  auto missing = run_lrnn("sweep --grid " + (dir / "nope.yaml").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.out, "no such grid file")) << missing.out;
  EXPECT_EQ(run_lrnn(sweep_cmd(dir / "ok.yaml", dir / "o", "--jobs 0")).code, 2);
  EXPECT_EQ(run_lrnn("sweep --out " + (dir / "o").string()).code, 2);  // --grid is required
  auto rep = run_lrnn(sweep_cmd(dir / "ok.yaml", dir / "o", "--report --force"));
  EXPECT_EQ(rep.code, 2);
  EXPECT_TRUE(contains(rep.out, "--report only aggregates")) << rep.out;
  auto none = run_lrnn(sweep_cmd(dir / "ok.yaml", dir / "o", "--report"));
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(contains(none.out, "no such sweep directory")) << none.out;
  EXPECT_FALSE(fs::exists(dir / "o"));
  fs::remove_all(dir);
}

// SIGINT to the sweep (as from `kill -INT`, which, unlike a terminal's Ctrl-C, does not reach
// the workers): the workers are stopped, the sweep exits 130 and says how to go on. On the way:
// each worker runs with OMP_NUM_THREADS = its share of the cores.
TEST(SweepGpus, VisibleDevicesOrTheDriversCount) {
  EXPECT_EQ(sweep::sweep_gpus(nullptr, 3), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_TRUE(sweep::sweep_gpus(nullptr, 0).empty());
  // The variable wins over the count, entries as written (indices or UUIDs), blanks dropped.
  EXPECT_EQ(sweep::sweep_gpus("5, 7", 8), (std::vector<std::string>{"5", "7"}));
  EXPECT_EQ(sweep::sweep_gpus("GPU-1a2b,,3", 0), (std::vector<std::string>{"GPU-1a2b", "3"}));
  EXPECT_TRUE(sweep::sweep_gpus("", 4).empty());  // set but empty: no GPU is visible
}

// A sweep of CUDA runs names the GPUs it spreads them over (one CUDA_VISIBLE_DEVICES per worker);
// CPU runs and a single GPU get no such line. (That a worker really lands on its GPU needs a
// multi-GPU host: docs/EXPERIMENTS.md.)
TEST(Sweep, CudaRunsAreSpreadOverTheVisibleGpus) {
  auto dir = temp_dir("sweep_gpus");
  write_configs(dir);
  write_text(dir / "cuda.yaml", "configs: [a.yaml]\nlr: [1.0e-3]\nseeds: [0, 1]\nset: [training.device=cuda]\n");
  write_text(dir / "cpu.yaml", "configs: [a.yaml]\nlr: [1.0e-3]\nseeds: [0, 1]\n");
  const std::string line = "CUDA runs spread over GPUs 5, 7 (the least busy first)";
  auto dry = [&](const char* grid, const char* out) { return run_lrnn(sweep_cmd(dir / grid, dir / out, "--jobs 2 --dry-run")); };
  auto cpu = dry("cpu.yaml", "o2");
  ASSERT_EQ(setenv("CUDA_VISIBLE_DEVICES", "5,7", 1), 0);
  auto cuda2 = dry("cuda.yaml", "o1");
  auto cpu2 = dry("cpu.yaml", "o2");
  ASSERT_EQ(setenv("CUDA_VISIBLE_DEVICES", "3", 1), 0);
  auto one = dry("cuda.yaml", "o1");
  unsetenv("CUDA_VISIBLE_DEVICES");
  for (auto* r : {&cpu, &cuda2, &cpu2, &one}) ASSERT_EQ(r->code, 0) << r->out;
  EXPECT_TRUE(contains(cuda2.out, line)) << cuda2.out;
  EXPECT_FALSE(contains(cpu2.out, "spread over")) << cpu2.out;
  EXPECT_FALSE(contains(one.out, "spread over")) << one.out;
  EXPECT_FALSE(contains(cpu.out, "spread over")) << cpu.out;
  fs::remove_all(dir);
}

// --only picks runs by their ids (shell patterns); a pattern that matches nothing is a user error
// that shows what the ids look like.
TEST(Sweep, OnlyRunsTheRunsItsPatternsMatch) {
  auto dir = temp_dir("sweep_only");
  write_configs(dir);
  write_tiny_grid(dir);
  const fs::path out = dir / "out";
  auto dry = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--dry-run --only 'b_pos/*seed1' 'a/lr1e-2_seed0'"));
  ASSERT_EQ(dry.code, 0) << dry.out;
  EXPECT_TRUE(contains(dry.out, "= 8 runs in")) << dry.out;
  EXPECT_TRUE(contains(dry.out, "--only b_pos/*seed1 a/lr1e-2_seed0: 3 of them")) << dry.out;
  EXPECT_TRUE(contains(dry.out, "0 finished (skipped), 0 to resume, 3 to start")) << dry.out;
  for (const char* id : {"b_pos/lr3e-3_seed1", "b_pos/lr1e-2_seed1", "a/lr1e-2_seed0"})
    EXPECT_TRUE(contains(dry.out, std::string("start    ") + id)) << id << "\n" << dry.out;
  for (const char* id : {"a/lr3e-3_seed0", "b_pos/lr3e-3_seed0", "a/lr1e-2_seed1"})
    EXPECT_FALSE(contains(dry.out, std::string("start    ") + id)) << id << "\n" << dry.out;
  // A real run of one selected run: only its directory is made; the report covers the grid.
  auto r = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--only a/lr1e-2_seed0"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "a" / "lr1e-2_seed0" / "eval.json")) << r.out;
  EXPECT_FALSE(fs::exists(out / "a" / "lr3e-3_seed0")) << r.out;
  EXPECT_TRUE(contains(read_text(out / "results.md"), "1 of 8 runs finished")) << read_text(out / "results.md");
  auto none = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--only 'c/*'"));
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_TRUE(contains(none.out, "--only c/* matches none of its 8 runs (their ids look like a/lr3e-3_seed0")) << none.out;
  auto rep = run_lrnn(sweep_cmd(dir / "g.yaml", out, "--report --only 'a/*'"));
  EXPECT_EQ(rep.code, 2) << rep.out;
  fs::remove_all(dir);
}

TEST(Sweep, InterruptStopsTheWorkers) {
  auto dir = temp_dir("sweep_int");
  write_configs(dir);
  write_text(dir / "g.yaml", "configs: [a.yaml]\nlr: [3.0e-3]\nseeds: [0, 1]\n"
                             "set: [training.num_steps=10000000, training.checkpoint_every=0, logging.log_every=1000]\n");
  fs::path log = dir / "sweep.log";
  pid_t sweep = fork();
  if (sweep == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(LRNN_BINARY, "lrnn", "sweep", "--grid", (dir / "g.yaml").c_str(), "--out", (dir / "out").c_str(), "--jobs", "2",
          (char*)nullptr);
    _exit(127);
  }
  ASSERT_GT(sweep, 0);
  auto children = [&] {
    std::vector<pid_t> v;
    for (auto& e : fs::directory_iterator("/proc")) {
      std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string stat = read_text(e.path() / "stat");
      auto close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream in(stat.substr(close + 2));
      char state;
      pid_t ppid;
      in >> state >> ppid;
      if (ppid == sweep) v.push_back(pid_t(std::stol(name)));
    }
    return v;
  };
  std::vector<pid_t> workers;
  for (int i = 0; i < 200 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers = children();
  }
  ASSERT_EQ(workers.size(), 2u) << read_text(log);
  // Each worker's OpenMP pool is sized for its share of the cores from the start.
  const std::string omp = "OMP_NUM_THREADS=" + std::to_string(std::max(1, sweep::available_cores() / 2));
  for (pid_t w : workers) {
    std::string env;
    for (int i = 0; i < 100 && !contains(env, "OMP_NUM_THREADS="); ++i) {  // until the worker has exec'd
      env = read_text("/proc/" + std::to_string(w) + "/environ");
      std::replace(env.begin(), env.end(), '\0', '\n');
      if (!contains(env, "OMP_NUM_THREADS=")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(contains(env, "\n" + omp + "\n") || env.rfind(omp + "\n", 0) == 0) << env;
  }
  kill(sweep, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = waitpid(sweep, &status, WNOHANG);
  }
  if (done == 0) {
    kill(sweep, SIGKILL);
    waitpid(sweep, &status, 0);
    FAIL() << "the sweep did not stop within 10 s of SIGINT\n" << read_text(log);
  }
  ASSERT_TRUE(WIFEXITED(status)) << read_text(log);
  EXPECT_EQ(WEXITSTATUS(status), 130) << read_text(log);
  for (pid_t w : workers) {
    std::string stat = read_text("/proc/" + std::to_string(w) + "/stat");
    char state = stat.empty() ? 'X' : stat[stat.rfind(')') + 2];
    EXPECT_TRUE(state == 'X' || state == 'Z') << "worker " << w << " still runs (state " << state << ")";
  }
  std::string out = read_text(log);
  EXPECT_TRUE(contains(out, "interrupted")) << out;
  EXPECT_TRUE(contains(out, "Run the same command again to resume")) << out;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// tools/plot.py

namespace {

uint32_t crc32(const unsigned char* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A PNG file: signature, then chunks with correct CRCs, IHDR first (with a non-empty image),
// at least one IDAT, IEND last. Returns "" when valid, else what is wrong.
std::string png_problem(const fs::path& file, int* width = nullptr) {
  std::string s = read_text(file);
  auto u = [&](size_t i) { return (const unsigned char*)s.data() + i; };
  auto be32 = [&](size_t i) { return uint32_t(*u(i)) << 24 | uint32_t(*u(i + 1)) << 16 | uint32_t(*u(i + 2)) << 8 | *u(i + 3); };
  if (s.size() < 8 || s.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return "no PNG signature";
  size_t at = 8;
  int idat = 0;
  std::string first, last;
  while (at + 12 <= s.size()) {
    uint32_t len = be32(at);
    if (at + 12 + len > s.size()) return "truncated chunk";
    std::string type = s.substr(at + 4, 4);
    if (crc32(u(at + 4), 4 + len) != be32(at + 8 + len)) return "bad CRC in " + type;
    if (first.empty()) {
      first = type;
      if (type != "IHDR" || len != 13) return "IHDR is not first";
      if (be32(at + 8) == 0 || be32(at + 12) == 0) return "empty image";
      if (width) *width = int(be32(at + 8));
    }
    idat += type == "IDAT";
    last = type;
    at += 12 + len;
  }
  if (at != s.size()) return "trailing bytes";
  if (!idat) return "no image data";
  if (last != "IEND") return "IEND is not last";
  return "";
}

}  // namespace

TEST(Plot, RunAndSweepPlotsAreValidPngs) {
  auto dir = temp_dir("sweep_plot");
  write_configs(dir);
  const std::string plot = std::string(LRNN_SOURCE_DIR) + "/tools/plot.py";
  ASSERT_EQ(run_lrnn("train --config " + (dir / "a.yaml").string() + " --out " + (dir / "run").string() +
                     " --set training.val_every=8").code, 0);
  auto r = run_cmd(plot + " " + (dir / "run").string() + " --out " + (dir / "figs").string());
  ASSERT_EQ(r.code, 0) << r.out;
  int width = 0;
  for (auto f : {"parity_training.png", "parity_scaled_accuracy_by_length.png"}) {
    EXPECT_EQ(png_problem(dir / "figs" / f, &width), "") << f;
    EXPECT_GE(width, 600) << f;
  }

  write_text(dir / "g.yaml", "configs: [a.yaml, b.yaml]\nlr: [3.0e-3]\nseeds: [0]\nset: [training.num_steps=8]\n");
  ASSERT_EQ(run_lrnn(sweep_cmd(dir / "g.yaml", dir / "sweep", "--jobs 2")).code, 0);
  r = run_cmd(plot + " " + (dir / "sweep").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, (dir / "sweep" / "parity_scaled_accuracy_by_length.png").string())) << r.out;
  for (auto f : {"parity_training.png", "parity_scaled_accuracy_by_length.png"})
    EXPECT_EQ(png_problem(dir / "sweep" / f), "") << f;

  fs::create_directories(dir / "empty");
  auto bad = run_cmd(plot + " " + (dir / "empty").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(contains(bad.out, "neither a run directory")) << bad.out;
  write_text(dir / "figs" / "broken.png", "\x89PNG\r\n\x1a\nnot really");
  EXPECT_NE(png_problem(dir / "figs" / "broken.png"), "") << "the PNG check must be able to fail";
  fs::remove_all(dir);
}
