// Learning tests, end to end on the CPU: a recipe is trained with several seeds and the verdict
// is a count over seeds, set from a measured success rate with a stated margin.
//
// Why counts: a training trajectory is deterministic on one machine but not across machines.
// Another CPU (AVX2 or AVX-512, Intel or AMD) makes OpenBLAS pick other kernels and the compiler
// other instructions; the sums round differently and the trajectories part after a few hundred
// steps. So whether seed 3 succeeds is a coin we cannot fix; what holds on every machine is the
// rate. Each recipe's rate was measured over >= 20 (seed, summation order) pairs from up to three
// orders: OpenBLAS's own kernels for an AMD Zen 4 CPU and two data-parallel workers,
// OPENBLAS_CORETYPE=Haswell (AVX2 kernels) and one worker, and an Intel Xeon running an x86-64-v3
// build with one worker (docs/RESULTS.md, "Learning tests").
// Treating each run as an independent draw with that rate, `false_failure` is the chance that a
// correct build fails the assertion; every test prints it and states it next to its assertion.
#pragma once
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>
#include "cli_util.h"
#include "train/trainer.h"

namespace lrnn::test {

struct SeedRun {
  int seed = 0;
  double test = 0;   // the metric on the evaluation lengths
  double train = 0;  // the metric on the training lengths
  double loss = 0, seconds = 0;
};

// P(fewer than k successes in n independent runs that each succeed with probability p).
inline double false_failure(double p, int k, int n) {
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    double c = std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0));
    sum += c * std::pow(p, i) * std::pow(1 - p, n - i);
  }
  return sum;
}

// Trains `yaml` (an experiment config) with training.seed = seed on two data-parallel workers;
// `metric` is the eval.json key the task reports ("scaled_accuracy", or "accuracy": sequence
// accuracy for word problems).
inline SeedRun train_seed(const std::string& yaml, int seed, const std::string& tag,
                          const std::string& metric = "scaled_accuracy") {
  YAML::Node root = YAML::Load(yaml);
  root["training"]["seed"] = seed;
  root["training"]["num_threads"] = 2;  // two workers on any machine: the summation order is the recipe's
  root["training"]["checkpoint_every"] = 0;
  root["logging"]["progress"] = "none";
  TrainOptions opt;
  opt.out_dir = temp_dir(tag + "_seed" + std::to_string(seed));
  opt.quiet = true;
  TrainSummary s = train(ExperimentConfig::from_yaml(root, tag), opt);
  SeedRun r{seed, double(s.eval[metric]), double(s.eval["train_range"][metric]), s.final_loss, s.seconds};
  std::printf("%s seed %d: %s %.4f on the evaluation lengths, %.4f on the training lengths, final loss %.4f (%.0f s)\n",
              tag.c_str(), seed, metric.c_str(), r.test, r.train, r.loss, r.seconds);
  std::fflush(stdout);
  std::filesystem::remove_all(opt.out_dir);
  return r;
}

// "At least `need` of `n` seeds (0, 1, ...) succeed": runs seeds until that is decided either way.
// `rate` is the measured success rate (printed with the chance of a false failure).
inline int successes_among_seeds(const std::string& yaml, const std::string& tag, int need, int n, double rate,
                                 const std::function<bool(const SeedRun&)>& success,
                                 const std::string& metric = "scaled_accuracy") {
  std::printf("%s: needs %d of %d seeds; measured success rate %.2f -> chance of a false failure %.1e\n", tag.c_str(),
              need, n, rate, false_failure(rate, need, n));
  int ok = 0;
  for (int seed = 0; seed < n && ok < need && ok + (n - seed) >= need; ++seed) ok += success(train_seed(yaml, seed, tag, metric));
  return ok;
}

// The seeds that do succeed among the first `n` (a negative claim: none or few of them may).
inline std::vector<SeedRun> all_seeds(const std::string& yaml, const std::string& tag, int n,
                                      const std::string& metric = "scaled_accuracy") {
  std::vector<SeedRun> v;
  for (int seed = 0; seed < n; ++seed) v.push_back(train_seed(yaml, seed, tag, metric));
  return v;
}

}  // namespace lrnn::test
