// What the exact-tracker tests share (test_tracker.cpp: DeltaNet parity, test_tracker_mamba.cpp:
// Mamba parity, test_tracker_deltaproduct.cpp: DeltaProduct group words): setting hand-made
// weights through the model's public parameter names, reading the logits of a 10^4-token
// forward, writing the model as a run directory the way `lrnn train` does and reading the
// answers of `lrnn predict` on it. Also the parity trackers' common ends: the bit embeddings, the
// lm_head that reads the parity direction, and the check that the prefix parity is tracked.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>
#include <unistd.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>
#include "io/atomic_file.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace lrnn::tracker {

namespace fs = std::filesystem;

constexpr int kSteps = 10000;  // tokens per sequence

// A tensor of the model by its public name, checked against the shape the construction assumes.
inline float* param(Model<float>& m, const std::string& name, std::vector<int64_t> shape) {
  const ParamEntry& e = m.layout().at(name);
  EXPECT_EQ(e.shape, shape) << name;
  return m.params.data() + e.offset;
}

inline int argmax(const float* row, int V) { return int(std::max_element(row, row + V) - row); }

// logit of the target minus the best other logit (> 0: argmax is the target).
inline double gap(const float* row, int V, int target) {
  double best_other = -INFINITY;
  for (int j = 0; j < V; ++j)
    if (j != target) best_other = std::max(best_other, double(row[j]));
  return double(row[target]) - best_other;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One forward over equally long rows (no labels); the logits [rows, T, V].
inline const float* forward_rows(Model<float>& m, const std::vector<std::vector<int32_t>>& rows) {
  std::vector<int32_t> tok;
  for (auto& r : rows) tok.insert(tok.end(), r.begin(), r.end());
  m.forward(tok.data(), nullptr, int(rows.size()), int(rows[0].size()));
  return m.logits();
}

// A fresh directory under the system's temp directory, removed with everything in it at the end
// of the scope.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / fmt::format("{}_{}_{}", name, ::getpid(),
                                                     std::chrono::steady_clock::now().time_since_epoch().count())) {
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A run directory as `lrnn train` writes it: config.yaml (the task and model blocks, resolved;
// `where` names them in errors) and the model's files (model.safetensors, config.json, ...).
inline void write_run(const fs::path& dir, const YAML::Node& task, const YAML::Node& model_block,
                      const Model<float>& m, const std::string& where) {
  YAML::Node root;
  root["task"] = task;
  root["model"] = model_block;
  ExperimentConfig cfg = ExperimentConfig::from_yaml(root, where);
  io::write_file_atomic(dir / "config.yaml", YAML::Dump(cfg.to_yaml()) + "\n");
  save_model(dir, m);
}

// What `lrnn predict` answered on a run: its positions (JSON), the number of wrong predictions
// (the first one's position) and the smallest margin of the wanted token's logit.
struct Predictions {
  nlohmann::json positions;
  int wrong = 0, first_wrong = -1;
  double min_margin = INFINITY;
};

// Runs `lrnn predict --run dir <flags> --tokens ...` and checks that it answers every position
// with its token and V logits; scores its predictions against `want`.
inline void predict(const fs::path& dir, const std::vector<int32_t>& tokens, const std::vector<int32_t>& want, int V,
                    const std::string& flags, Predictions* r) {
  std::string ids;
  for (auto x : tokens) ids += (ids.empty() ? "" : " ") + std::to_string(x);
  std::string cmd = fmt::format("'{}' predict --run '{}'{} --tokens '{}' 2>'{}'", LRNN_BINARY, dir.string(), flags,
                                ids, (dir / "stderr.txt").string());
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  int status = ::pclose(f);
  std::string err = fs::exists(dir / "stderr.txt") ? io::read_file(dir / "stderr.txt") : "";
  ASSERT_EQ(status, 0) << "lrnn predict failed: " << err;

  r->positions = nlohmann::json::parse(out).at("positions");
  ASSERT_EQ(r->positions.size(), tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto& p = r->positions[t];
    ASSERT_EQ(p.at("token").get<int>(), tokens[t]);
    if (p.at("predicted").get<int>() != want[t] && r->wrong++ == 0) r->first_wrong = int(t);
    auto l = p.at("logits").get<std::vector<float>>();
    ASSERT_EQ(l.size(), size_t(V));
    r->min_margin = std::min(r->min_margin, gap(l.data(), V, want[t]));
  }
}

// ---- the parity trackers (vocab 3: 0 = pad, 1 = bit 0, 2 = bit 1) ----
namespace parity {

constexpr int kV = 3;
constexpr int kA = 0, kB = 1, kC = 2;           // residual directions e_A (constant), e_B (the bit), e_C (parity)
constexpr double kc = 1.0, ka = 1.0, km = 1.0;  // embedding scales and the parity write size
constexpr double kHeadGain = 4.0;               // g in lm_head

// Embeddings [kV, d]: bit 0 = c e_A - a e_B, bit 1 = c e_A + a e_B, pad = c e_A. Both bits have
// the same norm, so the first RMSNorm scales them by the same factor.
inline void set_embeddings(float* emb, int d) {
  emb[0 * d + kA] = float(kc);                                // pad
  emb[1 * d + kA] = float(kc), emb[1 * d + kB] = float(-ka);  // bit 0
  emb[2 * d + kA] = float(kc), emb[2 * d + kB] = float(ka);   // bit 1
}

// lm_head [kV, d] on h = c e_A ± a e_B + [odd] m e_C (after the final norm's positive factor
// r_f): logit_0 = -g x_A, logit_1 = g x_A / c, logit_2 = 2 g x_C / m. Even: logit_1 = g r_f wins;
// odd: logit_2 = 2 g r_f wins by g r_f; pad never wins.
inline void set_head(float* head, int d) {
  head[0 * d + kA] = float(-kHeadGain);
  head[1 * d + kA] = float(kHeadGain / kc);
  head[2 * d + kC] = float(2 * kHeadGain / km);
}

// The ideal margin g * r_f at even (h = (c, ±a, 0)) and odd (h = (c, ±a, m)) prefixes, for
// width d and the final norm's eps.
inline double even_ideal(int d, double eps) { return kHeadGain / std::sqrt((kc * kc + ka * ka) / d + eps); }
inline double odd_ideal(int d, double eps) { return kHeadGain / std::sqrt((kc * kc + ka * ka + km * km) / d + eps); }

// Random bits as tokens 1 (bit 0) / 2 (bit 1), P(bit 1) = p1.
inline std::vector<int32_t> random_bits(uint32_t seed, int n, double p1) {
  std::mt19937 g(seed);
  std::bernoulli_distribution one(p1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = one(g) ? 2 : 1;
  return t;
}

// The answer token after each prefix: (#ones up to and including t) mod 2 + 1.
inline std::vector<int32_t> prefix_parity(const std::vector<int32_t>& tok) {
  std::vector<int32_t> out(tok.size());
  int ones = 0;
  for (size_t t = 0; t < tok.size(); ++t) out[t] = ((ones += tok[t] == 2) % 2) + 1;
  return out;
}

// Two rows: fair random bits, and bits that are ones 90% of the time (long runs of reflections).
inline std::vector<std::vector<int32_t>> test_rows() {
  return {random_bits(12345, kSteps, 0.5), random_bits(777, kSteps, 0.9)};
}

// The tracker answers the prefix parity at every position of the test rows (logits of one
// forward over them), with margins bounded away from 0 (above half the ideal in the first 1000
// steps), without drift (the smallest margin in the last 1000 steps above `drift` times the
// one in the first 1000, per parity class) and within `dev` * odd_ideal of the ideal everywhere.
inline void check_tracks_parity(const float* lg, const std::vector<std::vector<int32_t>>& rows, double even_ideal,
                                double odd_ideal, double drift, double dev, const std::string& label) {
  const int T = kSteps;
  for (int b = 0; b < int(rows.size()); ++b) {
    auto want = prefix_parity(rows[b]);
    int wrong = 0, first_wrong = -1;
    // Smallest margin per parity class in the first and the last 1000 steps, and overall.
    double lo_start[2] = {INFINITY, INFINITY}, lo_end[2] = {INFINITY, INFINITY};
    double lo_all = INFINITY, max_dev = 0;
    for (int t = 0; t < T; ++t) {
      const float* row = lg + (size_t(b) * T + t) * kV;
      if (argmax(row, kV) != want[t] && wrong++ == 0) first_wrong = t;
      const double g = gap(row, kV, want[t]);
      const int odd = want[t] == 2;
      if (t < 1000) lo_start[odd] = std::min(lo_start[odd], g);
      if (t >= T - 1000) lo_end[odd] = std::min(lo_end[odd], g);
      lo_all = std::min(lo_all, g);
      max_dev = std::max(max_dev, std::abs(g - (odd ? odd_ideal : even_ideal)));
    }
    EXPECT_EQ(wrong, 0) << "row " << b << ": first wrong prediction at position " << first_wrong;
    for (int odd = 0; odd < 2; ++odd) {
      SCOPED_TRACE(fmt::format("row {} {} positions", b, odd ? "odd" : "even"));
      ASSERT_TRUE(std::isfinite(lo_start[odd]) && std::isfinite(lo_end[odd]));  // both classes occur
      EXPECT_GT(lo_start[odd], 0.5 * (odd ? odd_ideal : even_ideal));
      EXPECT_GT(lo_end[odd], drift * lo_start[odd]);
    }
    EXPECT_LT(max_dev, dev * odd_ideal) << "row " << b;
    std::printf("[%s] row %d: min margin even %.6f -> %.6f, odd %.6f -> %.6f (first/last 1000 steps; ideal "
                "%.6f / %.6f), min overall %.6f, max |margin - ideal| %.2e\n",
                label.c_str(), b, lo_start[0], lo_end[0], lo_start[1], lo_end[1], even_ideal, odd_ideal, lo_all,
                max_dev);
  }
}

// The same weights with eigenvalues in [0,1]: the state forgets at every one, so the model is
// right only about half of the time (below 75% on every test row).
inline void check_fails(Model<float>& m, const std::string& label) {
  auto rows = test_rows();
  const float* lg = forward_rows(m, rows);
  for (int b = 0; b < int(rows.size()); ++b) {
    auto want = prefix_parity(rows[b]);
    int right = 0;
    for (int t = 0; t < kSteps; ++t) right += argmax(lg + (size_t(b) * kSteps + t) * kV, kV) == want[t];
    const double acc = double(right) / kSteps;
    std::printf("[%s] [0,1] row %d: accuracy %.4f\n", label.c_str(), b, acc);
    EXPECT_LT(acc, 0.75) << "row " << b;
  }
}

// `lrnn predict` on a run directory holding the tracker answers the prefix parity of 10,000
// random bits everywhere, each answer by a margin above 1. Returns its answers.
inline void check_cli_tracks_parity(const fs::path& dir, const std::string& label, Predictions* r) {
  auto t0 = std::chrono::steady_clock::now();
  auto tok = random_bits(4242, kSteps, 0.5);
  ASSERT_NO_FATAL_FAILURE(predict(dir, tok, prefix_parity(tok), kV, "", r));
  EXPECT_EQ(r->wrong, 0) << "first wrong prediction at position " << r->first_wrong;
  EXPECT_GT(r->min_margin, 1.0);
  std::printf("[%s] cli: %d positions, min margin %.6f, %.3f s\n", label.c_str(), kSteps, r->min_margin,
              seconds_since(t0));
}

}  // namespace parity

}  // namespace lrnn::tracker
