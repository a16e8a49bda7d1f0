#include "data/tokenize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <queue>
#include <omp.h>
#include <fmt/format.h>

#include "core/check.h"
#include "core/rng.h"
#include "core/version.h"
#include "data/hash.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace lrnn::data {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kValStream = 0x76616c73;  // "vals"

// Tokens of one split, cut into shards of shard_tokens and written as each fills.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, SplitKind kind, uint64_t shard_tokens, const Tokenizer& tok, bool quiet)
      : dir_(std::move(dir)), kind_(kind), shard_tokens_(shard_tokens), quiet_(quiet) {
    base_.vocab_size = uint32_t(tok.vocab_size());
    base_.token_bytes = token_bytes_for(base_.vocab_size);
    base_.split = kind;
    const std::string& hex = tok.sha256();
    for (int i = 0; i < 32; ++i) base_.tokenizer_sha256[i] = uint8_t(std::stoul(hex.substr(2 * size_t(i), 2), nullptr, 16));
    reset();
  }

  void add_document(const std::vector<int32_t>& toks) {
    ++documents_;
    size_t i = 0;
    bool first = true;
    while (i < toks.size()) {
      if (in_buf_ == shard_tokens_) flush();
      const size_t take = size_t(std::min<uint64_t>(toks.size() - i, shard_tokens_ - in_buf_));
      if (first) ++docs_in_buf_;
      first = false;
      for (size_t k = i; k < i + take; ++k) {
        const uint32_t t = uint32_t(toks[k]);
        buf_.push_back(char(t));
        buf_.push_back(char(t >> 8));
        if (base_.token_bytes == 4) {
          buf_.push_back(char(t >> 16));
          buf_.push_back(char(t >> 24));
        }
      }
      in_buf_ += take;
      i += take;
    }
  }

  void finish() {
    if (in_buf_ > 0) flush();
  }

  nlohmann::json summary() const {
    return {{"shards", shards_}, {"tokens", tokens_}, {"documents", documents_}};
  }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void reset() {
    buf_.assign(kShardHeaderBytes, '\0');
    // A shard is assembled in memory; the reservation is capped (64 MiB) and the buffer grows past it.
    buf_.reserve(kShardHeaderBytes + size_t(std::min<uint64_t>(shard_tokens_, uint64_t(1) << 24)) * base_.token_bytes);
    in_buf_ = 0;
    docs_in_buf_ = 0;
  }
  void flush() {
    if (index_ >= kMaxShardsPerSplit)
      LRNN_USER_ERROR("tokenize: the {} split needs more than {} shards of {} tokens; give a larger --shard-tokens",
                      split_name(kind_), kMaxShardsPerSplit, shard_tokens_);
    ShardHeader h = base_;
    h.num_tokens = in_buf_;
    h.num_documents = docs_in_buf_;
    h.payload_crc32 = crc32(buf_.data() + kShardHeaderBytes, buf_.size() - kShardHeaderBytes);
    h.shard_index = index_;
    const std::string head = h.encode();
    std::copy(head.begin(), head.end(), buf_.begin());
    const std::string name = shard_file_name(kind_, index_);
    io::write_file_atomic(dir_ / name, buf_);
    if (!quiet_) std::fprintf(stderr, "tokenize: wrote %s (%llu tokens)\n", (dir_ / name).c_str(), (unsigned long long)in_buf_);
    shards_.push_back({{"file", name}, {"tokens", in_buf_}, {"documents", docs_in_buf_}, {"crc32", h.payload_crc32}});
    files_.push_back(name);
    tokens_ += in_buf_;
    ++index_;
    reset();
  }

  fs::path dir_;
  SplitKind kind_;
  uint64_t shard_tokens_;
  bool quiet_;
  ShardHeader base_;
  std::string buf_;
  uint64_t in_buf_ = 0, docs_in_buf_ = 0, index_ = 0, tokens_ = 0, documents_ = 0;
  nlohmann::json shards_ = nlohmann::json::array();
  std::vector<std::string> files_;
};

bool is_shard_name(const std::string& n) {
  auto match = [&](const std::string& prefix) {
    if (n.size() != prefix.size() + 10 || n.rfind(prefix, 0) != 0 || n.substr(n.size() - 4) != ".bin") return false;
    for (size_t i = prefix.size(); i < n.size() - 4; ++i)
      if (n[i] < '0' || n[i] > '9') return false;
    return true;
  };
  return match("train_") || match("val_");
}

}  // namespace

std::vector<uint64_t> validation_documents(uint64_t n, double fraction, uint64_t seed) {
  if (!(fraction >= 0.0 && fraction <= 0.5)) LRNN_USER_ERROR("--val-fraction {}: expected 0..0.5", fraction);
  if (fraction == 0.0) return {};
  const uint64_t k = std::max<uint64_t>(1, uint64_t(std::llround(fraction * double(n))));
  if (k >= n)
    LRNN_USER_ERROR("{} document{}: a validation split of {} leaves no document to train on (it takes whole "
                    "documents; give more documents or --val-fraction 0)", n, n == 1 ? "" : "s", k);
  const Rng rng{seed, kValStream};
  using Key = std::pair<uint64_t, uint64_t>;  // (key, index)
  std::priority_queue<Key> heap;               // the largest of the k smallest on top
  for (uint64_t i = 0; i < n; ++i) {
    const U32x4 b = rng.block(i);
    const Key key{(uint64_t(b.v[1]) << 32) | b.v[0], i};
    if (heap.size() < k) heap.push(key);
    else if (key < heap.top()) { heap.pop(); heap.push(key); }
  }
  std::vector<uint64_t> out;
  out.reserve(k);
  while (!heap.empty()) { out.push_back(heap.top().second); heap.pop(); }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json tokenize_corpus(const TokenizeOptions& opt) {
  if (opt.inputs.empty()) LRNN_USER_ERROR("tokenize: give at least one --input file");
  if (opt.shard_tokens < 1 || opt.shard_tokens > kMaxShardTokens)
    LRNN_USER_ERROR("tokenize: --shard-tokens {}: expected 1..{} (a shard is assembled in memory)", opt.shard_tokens,
                    kMaxShardTokens);
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction <= 0.5))
    LRNN_USER_ERROR("tokenize: --val-fraction {}: expected 0..0.5", opt.val_fraction);
  Tokenizer tok = Tokenizer::load(opt.tokenizer);
  const int bos = tok.bos_id(), eos = tok.eos_id();
  if (eos < 0)
    LRNN_USER_ERROR("{}: the tokenizer defines no EOS token; lrnn tokenize ends every document with EOS",
                    opt.tokenizer.string());
  for (const auto& in : opt.inputs)
    if (!fs::exists(in)) LRNN_USER_ERROR("{}: no such input file", in.string());

  const fs::path& dir = opt.out;
  if (fs::exists(dir) && !fs::is_directory(dir)) LRNN_USER_ERROR("{}: exists and is not a directory (--out DIR)", dir.string());
  const fs::path index_file = dir / "index.json";
  if (fs::exists(index_file) && !opt.force)
    LRNN_USER_ERROR("{}: holds a tokenized corpus already (index.json); pass --force to replace it", dir.string());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) LRNN_USER_ERROR("cannot create {}: {}", dir.string(), ec.message());
  // The index goes first and comes back last: a directory without one is never read as data.
  fs::remove(index_file, ec);

  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t n_docs = count_documents(opt.inputs, opt.corpus);
  if (n_docs == 0) LRNN_USER_ERROR("tokenize: the inputs hold no document");
  const std::vector<uint64_t> val = validation_documents(n_docs, opt.val_fraction, opt.seed);

  SplitWriter train(dir, SplitKind::Train, opt.shard_tokens, tok, opt.quiet);
  SplitWriter valw(dir, SplitKind::Val, opt.shard_tokens, tok, opt.quiet);
  DocumentReader reader(opt.inputs, opt.corpus);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  std::vector<uint64_t> per_file(opt.inputs.size(), 0);
  uint64_t doc_index = 0, empty = 0, text_bytes = 0;
  size_t val_pos = 0;
  auto last_report = t0;

  // Documents are read in batches, encoded in parallel, and written in order.
  std::vector<std::string> docs;
  std::vector<std::string> where;
  std::vector<std::vector<int32_t>> ids;
  bool more = true;
  while (more) {
    docs.clear();
    where.clear();
    size_t bytes = 0;
    std::string d;
    while (docs.size() < 4096 && bytes < (size_t(64) << 20)) {
      if (!reader.next(d)) { more = false; break; }
      bytes += d.size();
      where.push_back(reader.where());
      ++per_file[reader.file_index()];
      docs.push_back(std::move(d));
    }
    ids.assign(docs.size(), {});
    std::exception_ptr err;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < docs.size(); ++i) {
      try {
        std::vector<int32_t>& v = ids[i];
        if (bos >= 0) v.push_back(bos);
        tok.encode_into(docs[i], v);
        v.push_back(eos);
      } catch (...) {
#pragma omp critical(lrnn_tokenize_error)
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
    for (size_t i = 0; i < docs.size(); ++i, ++doc_index) {
      if (doc_index >= n_docs)
        LRNN_USER_ERROR("{}: the inputs hold more documents than when they were counted (changed while being read?)",
                        where[i]);
      const bool is_val = val_pos < val.size() && val[val_pos] == doc_index;
      if (is_val) ++val_pos;
      text_bytes += docs[i].size();
      if (docs[i].empty()) {
        ++empty;
        continue;
      }
      (is_val ? valw : train).add_document(ids[i]);
    }
    const auto now = std::chrono::steady_clock::now();
    if (!opt.quiet && now - last_report > std::chrono::seconds(10)) {
      last_report = now;
      std::fprintf(stderr, "tokenize: %llu of %llu documents, %.1f s\n", (unsigned long long)doc_index,
                   (unsigned long long)n_docs, std::chrono::duration<double>(now - t0).count());
    }
  }
  if (doc_index != n_docs)
    LRNN_USER_ERROR("{}: the inputs hold {} documents, {} when they were counted (changed while being read?)",
                    opt.inputs.back().string(), doc_index, n_docs);
  train.finish();
  valw.finish();
  if (train.files().empty()) LRNN_USER_ERROR("tokenize: the training split has no tokens (every training document is empty)");

  // Shards of an earlier tokenization that this one did not rewrite.
  std::vector<std::string> keep = train.files();
  keep.insert(keep.end(), valw.files().begin(), valw.files().end());
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (is_shard_name(name) && std::find(keep.begin(), keep.end(), name) == keep.end()) fs::remove(e.path(), ec);
  }

  nlohmann::json inputs = nlohmann::json::array();
  for (size_t i = 0; i < opt.inputs.size(); ++i)
    inputs.push_back({{"path", opt.inputs[i].string()}, {"documents", per_file[i]}});
  nlohmann::json splits = {{"train", train.summary()}};
  if (!valw.files().empty()) splits["val"] = valw.summary();
  nlohmann::json index = {
      {"format", "lrnn token shards"},
      {"format_version", kShardVersion},
      {"created_by", version_line()},
      {"command", opt.command},
      {"tokenizer",
       {{"path", opt.tokenizer.string()}, {"sha256", tok.sha256()}, {"vocab_size", tok.vocab_size()},
        {"bos_id", bos}, {"eos_id", eos}, {"pad_id", tok.pad_id()}, {"unk_id", tok.unk_id()}}},
      {"token_bytes", token_bytes_for(uint64_t(tok.vocab_size()))},
      {"document_layout", bos >= 0 ? "BOS tokens EOS" : "tokens EOS"},
      {"text_unit", opt.corpus.text_unit == TextUnit::File ? "file" : "blank-line"},
      {"jsonl_field", opt.corpus.jsonl_field},
      {"inputs", inputs},
      {"documents", n_docs},
      {"empty_documents", empty},
      {"text_bytes", text_bytes},
      {"val_fraction", opt.val_fraction},
      {"val_documents", val.size()},
      {"seed", opt.seed},
      {"shard_tokens", opt.shard_tokens},
      {"splits", splits},
  };
  io::write_file_atomic(index_file, index.dump(2) + "\n");
  if (!opt.quiet) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "tokenize: %llu documents (%zu validation, %llu empty), %llu + %llu tokens in %.1f s -> %s\n",
                 (unsigned long long)n_docs, val.size(), (unsigned long long)empty,
                 (unsigned long long)train.summary()["tokens"].get<uint64_t>(),
                 (unsigned long long)valw.summary()["tokens"].get<uint64_t>(), secs, index_file.c_str());
  }
  return index;
}

std::filesystem::path index_tokenizer(const std::filesystem::path& data_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (data_dir.empty() || !fs::exists(data_dir / "index.json", ec)) return {};
  const nlohmann::json idx = read_index(data_dir);
  const nlohmann::json& tj = idx["tokenizer"];  // (read_index checked it is an object with a sha256)
  if (!tj.contains("path") || !tj["path"].is_string() || !tj["sha256"].is_string()) return {};
  fs::path p = tj["path"].get<std::string>();
  if (p.is_relative() && !fs::is_regular_file(p, ec)) p = data_dir / p;
  if (!fs::is_regular_file(p, ec)) return {};
  try {
    if (Tokenizer::load(p).sha256() != tj["sha256"].get<std::string>()) return {};
  } catch (const UserError&) {
    return {};
  }
  return p;
}

}  // namespace lrnn::data
