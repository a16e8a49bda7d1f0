// `lrnn tokenize`: text documents (corpus.h) -> token shards (shards.h) in a directory, with a
// validation split of whole documents and DIR/index.json (docs/DATA.md).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "data/corpus.h"

namespace lrnn::data {

// The largest --shard-tokens: a shard is assembled in memory before it is written (2 or 4 bytes a
// token, so at most 4 or 8 GiB per split).
inline constexpr uint64_t kMaxShardTokens = uint64_t(1) << 30;

struct TokenizeOptions {
  std::filesystem::path tokenizer;
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out;
  double val_fraction = 0.01;
  uint64_t seed = 0;
  uint64_t shard_tokens = 100000000;
  CorpusOptions corpus;
  bool force = false;     // replace a tokenized directory
  int threads = 0;        // documents encoded at once (0 = all cores); the output does not depend on it
  std::string command;    // the command line, recorded in index.json
  bool quiet = false;
};

// The validation documents: of n documents, the k = (f > 0 ? max(1, round(f·n)) : 0) whose keys
// Philox(seed, "vals", i) are smallest (ties: smaller index), sorted. UserError if that leaves no
// training document.
std::vector<uint64_t> validation_documents(uint64_t n, double fraction, uint64_t seed);

// Runs it; returns index.json's contents. UserError for bad inputs (named), exit 2.
nlohmann::json tokenize_corpus(const TokenizeOptions& opt);

// The tokenizer file a tokenized directory was made with: the path its index.json records
// (relative paths tried from the working directory, then from data_dir), when that file is there
// and its sha256 is the recorded one; empty otherwise (or when data_dir has no index).
std::filesystem::path index_tokenizer(const std::filesystem::path& data_dir);

}  // namespace lrnn::data
