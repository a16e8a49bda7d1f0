// What a run directory tells the peer library (config.json + code): a checkpoint must never load
// silently as another model. Mamba with eigenvalues in [-1,1] has no peer class (stock
// transformers' MambaForCausalLM computes the [0,1] model), so its config.json is a custom
// architecture (own model_type, auto_map) with src/models/hf/modeling_lrnn_mamba.py beside it;
// Mamba [0,1] keeps loading with MambaForCausalLM. tests/python/test_hf_export.py loads both runs
// in transformers where torch is installed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "../e2e/cli_util.h"
#include "io/atomic_file.h"
#include "models/hf/hf_files.h"
#include "models/model.h"
#include "train/checkpoint.h"

using namespace lrnn;
using namespace lrnn::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kModeling = "modeling_lrnn_mamba.py";

std::unique_ptr<Model<float>> mamba(bool neg) {
  YAML::Node b;
  b["model_type"] = "mamba";
  b["vocab_size"] = 5;
  b["hidden_size"] = 16;
  b["state_size"] = 4;
  b["num_hidden_layers"] = 2;
  b["allow_neg_eigval"] = neg;
  return create_model<float>(b, "test", 1);
}

std::string repo_file(const std::string& rel) { return io::read_file(fs::path(LRNN_SOURCE_DIR) / rel); }

// A tiny parity run (CPU, a few steps) of Mamba into `out`.
RunResult train_mamba(const fs::path& dir, const fs::path& out, bool neg, bool force) {
  write_text(dir / "c.yaml", R"(training:
  num_steps: 4
  batch_size: 4
  checkpoint_every: 2
  num_threads: 1
model:
  model_type: mamba
  hidden_size: 16
  state_size: 4
  num_hidden_layers: 1
task:
  name: parity
  train_len: [3, 8]
  eval_len: [8, 10]
  eval_samples: 8
logging:
  progress: none
)");
  return run_lrnn("train --config " + (dir / "c.yaml").string() + " --out " + out.string() +
                  " --set model.allow_neg_eigval=" + (neg ? "true" : "false") + (force ? " --force" : ""));
}

}  // namespace

TEST(HfExport, SignedMambaIsACustomArchitecture) {
  auto hf = mamba(true)->hf_config();
  // Nothing a stock transformers class would pick up and run as the [0,1] model.
  EXPECT_EQ(hf["model_type"], "lrnn_mamba");
  ASSERT_TRUE(hf["architectures"].is_array());
  EXPECT_EQ(hf["architectures"], nlohmann::json::array({"LrnnMambaForCausalLM"}));
  for (const auto& a : hf["architectures"]) EXPECT_NE(a, "MambaForCausalLM");
  EXPECT_NE(hf["model_type"], "mamba");
  ASSERT_TRUE(hf.contains("auto_map"));
  EXPECT_EQ(hf["auto_map"]["AutoConfig"], "modeling_lrnn_mamba.LrnnMambaConfig");
  EXPECT_EQ(hf["auto_map"]["AutoModelForCausalLM"], "modeling_lrnn_mamba.LrnnMambaForCausalLM");
  EXPECT_EQ(hf["allow_neg_eigval"], true);
}

TEST(HfExport, UnitMambaStaysMambaForCausalLM) {
  auto pos = mamba(false);
  auto hf = pos->hf_config();
  EXPECT_EQ(hf["model_type"], "mamba");
  EXPECT_EQ(hf["architectures"], nlohmann::json::array({"MambaForCausalLM"}));
  EXPECT_FALSE(hf.contains("auto_map"));
  EXPECT_EQ(hf["allow_neg_eigval"], false);
  EXPECT_TRUE(pos->hf_files().empty());
  // The [-1,1] config holds every MambaConfig key of the [0,1] one, with the same values.
  auto neg = mamba(true)->hf_config();
  for (const auto& [k, v] : hf.items()) {
    if (k == "model_type" || k == "architectures" || k == "allow_neg_eigval") continue;
    ASSERT_TRUE(neg.contains(k)) << k;
    EXPECT_EQ(neg[k], v) << k;
  }
  EXPECT_EQ(neg.size(), hf.size() + 1);  // + auto_map
}

TEST(HfExport, TheCodeIsTheRepositoryFileByteForByte) {
  auto m = mamba(true);
  auto files = m->hf_files();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].first, kModeling);
  // auto_map's module is the file written.
  const std::string module = m->hf_config()["auto_map"]["AutoModelForCausalLM"];
  EXPECT_EQ(module.substr(0, module.find('.')) + ".py", files[0].first);
  const std::string src = repo_file(std::string("src/models/hf/") + kModeling);
  EXPECT_EQ(files[0].second.size(), src.size());
  EXPECT_TRUE(files[0].second == src) << "the embedded modeling file differs from src/models/hf/" << kModeling;
  for (const char* s : {"class LrnnMambaConfig(", "class LrnnMambaForCausalLM(", "model_type = \"lrnn_mamba\"",
                        "2 * dA - 1"})
    EXPECT_NE(src.find(s), std::string::npos) << s;
  // Every embedded file is one of src/models/hf/.
  for (const auto& [name, text] : hf::embedded_files())
    EXPECT_TRUE(text == repo_file("src/models/hf/" + name)) << name;
}

TEST(HfExport, ModelsWriteExactlyTheCodeTheirAutoMapNames) {
  // Today only Mamba [-1,1] needs code; every other model (defaults) loads with a peer class.
  for (const auto& type : model_types()) {
    YAML::Node b;
    b["model_type"] = type;
    b["vocab_size"] = 5;
    auto m = create_model<float>(b, "test", 1);
    auto hf = m->hf_config();
    EXPECT_EQ(hf.contains("auto_map"), !m->hf_files().empty()) << type;
    if (type != "mamba") {
      EXPECT_TRUE(m->hf_files().empty()) << type;
    }
  }
  EXPECT_TRUE(hf::files_for(nlohmann::json::object()).empty());
  EXPECT_ANY_THROW(hf::files_for({{"auto_map", {{"AutoConfig", "no_such_module.Config"}}}}));
}

TEST(HfExport, SaveModelWritesTheCodeForSignedMambaOnly) {
  auto dir = temp_dir("hf_export_save");
  save_model(dir, *mamba(true));
  ASSERT_TRUE(fs::exists(dir / kModeling));
  EXPECT_TRUE(read_text(dir / kModeling) == repo_file(std::string("src/models/hf/") + kModeling));
  auto cfg = nlohmann::json::parse(read_text(dir / "config.json"));
  EXPECT_EQ(cfg["model_type"], "lrnn_mamba");
  EXPECT_TRUE(cfg.contains("auto_map"));
  // The same directory re-saved as [0,1]: no code left that contradicts config.json.
  save_model(dir, *mamba(false));
  EXPECT_FALSE(fs::exists(dir / kModeling));
  cfg = nlohmann::json::parse(read_text(dir / "config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"MambaForCausalLM"}));
  EXPECT_FALSE(cfg.contains("auto_map"));
  for (const auto& e : fs::directory_iterator(dir))  // atomic writes leave no temporaries
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  fs::remove_all(dir);
}

TEST(HfExport, TrainWritesTheCodeAndForceOverAnotherRangeRemovesIt) {
  auto dir = temp_dir("hf_export_cli");
  auto run = dir / "run";
  auto r = train_mamba(dir, run, true, false);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(run / kModeling));
  EXPECT_TRUE(read_text(run / kModeling) == repo_file(std::string("src/models/hf/") + kModeling));
  auto cfg = nlohmann::json::parse(read_text(run / "config.json"));
  EXPECT_EQ(cfg["model_type"], "lrnn_mamba");
  EXPECT_EQ(cfg["auto_map"]["AutoModelForCausalLM"], "modeling_lrnn_mamba.LrnnMambaForCausalLM");
  auto p = run_lrnn("predict --run " + run.string() + " --tokens \"1 2 1\"");
  ASSERT_EQ(p.code, 0) << p.out;

  // Starting over in the same directory with [0,1]: the [-1,1] code must not stay behind.
  r = train_mamba(dir, run, false, true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(run / kModeling));
  cfg = nlohmann::json::parse(read_text(run / "config.json"));
  EXPECT_EQ(cfg["model_type"], "mamba");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"MambaForCausalLM"}));
  EXPECT_FALSE(cfg.contains("auto_map"));
  fs::remove_all(dir);
}
