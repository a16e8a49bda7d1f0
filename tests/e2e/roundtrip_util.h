// What the per-family CLI tests (test_cli_baselines.cpp, test_cli_xlstm.cpp) share: a model
// trained on parity by the real `lrnn train`, then its run checked as a user meets it: the
// checkpoint's tensor names and shapes, config.json, `lrnn eval` at other lengths, and
// `lrnn predict`, whose logits must equal the checkpoint run in-process.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "cli_util.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace lrnn::test {

// A parity experiment: batch 8, lr 3e-3, seed 3, 2 threads, plus the lines of `training` (steps,
// warmup, ...); the model block's lines; evaluation at lengths 12..14.
inline std::string parity_config(const std::string& training, const std::string& model, int log_every) {
  return "training:\n" + training + "  batch_size: 8\n  lr: 3.0e-3\n  seed: 3\n  num_threads: 2\nmodel:\n" + model +
         "\ntask:\n  name: parity\n  train_len: [3, 12]\n  eval_len: [12, 14]\n  eval_samples: 12\n"
         "logging:\n  log_every: " + std::to_string(log_every) + "\n  progress: none\n";
}

// Trains `config` into a fresh run directory and checks the run: config.json (by check_config);
// the checkpoint holds exactly the layout's tensors under their public names and shapes, among
// them `some_names`; `lrnn eval` at lengths 20..21; `lrnn predict` on 5 tokens gives the logits
// (and their argmax) of the checkpoint run in-process; training moved the weights.
inline void train_eval_predict(const std::string& name, const std::string& config,
                               const std::vector<std::string>& some_names,
                               const std::function<void(const nlohmann::json&)>& check_config) {
  namespace fs = std::filesystem;
  auto dir = temp_dir("cli_" + name);
  write_text(dir / "c.yaml", config);
  auto r = run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  check_config(nlohmann::json::parse(read_text(dir / "run" / "config.json")));

  // The checkpoint holds exactly the layout's tensors, under the public names and shapes.
  ExperimentConfig ec = ExperimentConfig::load((dir / "run" / "config.yaml").string(), {});
  auto m = create_model<float>(ec.model, "test", 0);
  auto st = io::read_safetensors(dir / "run" / "model.safetensors");
  std::set<std::string> names;
  for (auto& t : st.tensors) {
    names.insert(t.name);
    EXPECT_EQ(t.shape, m->layout().at(t.name).shape) << t.name;
  }
  std::set<std::string> expected;
  for (auto& e : m->layout().entries()) expected.insert(e.name);
  EXPECT_EQ(names, expected);
  for (auto& n : some_names) EXPECT_TRUE(names.count(n)) << n;

  auto e = run_lrnn("eval --run " + (dir / "run").string() + " --set task.eval_len=[20,21] --json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(nlohmann::json::parse(e.out.substr(e.out.find('{')))["lengths"], nlohmann::json({20, 21}));

  auto p = run_lrnn("predict --run " + (dir / "run").string() + " --tokens \"1 2 2 1 2\"");
  ASSERT_EQ(p.code, 0) << p.out;
  auto pj = nlohmann::json::parse(p.out);
  ASSERT_EQ(pj["positions"].size(), 5u);
  load_params(dir / "run" / "model.safetensors", *m);
  std::vector<int32_t> tok{1, 2, 2, 1, 2};
  m->forward(tok.data(), nullptr, 1, 5);
  for (int t = 0; t < 5; ++t) {
    auto lg = pj["positions"][t]["logits"];
    ASSERT_EQ(lg.size(), 3u);
    int best = 0;
    for (int v = 0; v < 3; ++v) {
      EXPECT_NEAR(double(lg[v]), m->logits()[t * 3 + v], 1e-5 * (1 + std::abs(m->logits()[t * 3 + v])));
      if (m->logits()[t * 3 + v] > m->logits()[t * 3 + best]) best = v;
    }
    EXPECT_EQ(pj["positions"][t]["predicted"], best);
  }
  // Training moved the weights away from the initialisation.
  auto fresh = create_model<float>(ec.model, "test", 3);
  double moved = 0;
  for (size_t i = 0; i < m->params.size(); ++i) moved = std::max(moved, double(std::abs(m->params[i] - fresh->params[i])));
  EXPECT_GT(moved, 1e-4);
  fs::remove_all(dir);
}

}  // namespace lrnn::test
