#include "data/shards.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>
#include <fmt/format.h>

#include "core/check.h"
#include "core/rng.h"
#include "data/hash.h"
#include "io/atomic_file.h"

namespace lrnn::data {

namespace fs = std::filesystem;

namespace {

void put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + size_t(i)] = char(v >> (8 * i));
}
void put64(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + size_t(i)] = char(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t get64(const uint8_t* p) { return uint64_t(get32(p)) | uint64_t(get32(p + 4)) << 32; }

// Stream identifiers of the sampler's Philox draws.
constexpr uint64_t kPermStream = 0x6c6d7065;    // "lmpe": the epoch's permutation
constexpr uint64_t kOffsetStream = 0x6c6d6f66;  // "lmof": the epoch's offset

}  // namespace

const char* split_name(SplitKind s) { return s == SplitKind::Val ? "val" : "train"; }

std::string shard_file_name(SplitKind split, uint64_t index) {
  return fmt::format("{}_{:06}.bin", split_name(split), index);
}

std::string ShardHeader::encode() const {
  std::string s(kShardHeaderBytes, '\0');
  std::memcpy(s.data(), kShardMagic, 8);
  put32(s, 8, version);
  put32(s, 12, header_bytes);
  put64(s, 16, num_tokens);
  put64(s, 24, num_documents);
  put32(s, 32, token_bytes);
  put32(s, 36, vocab_size);
  put32(s, 40, payload_crc32);
  put32(s, 44, uint32_t(split));
  std::memcpy(s.data() + 48, tokenizer_sha256, 32);
  put64(s, 80, shard_index);
  return s;  // bytes 88..127 stay zero (reserved)
}

// ---------------------------------------------------------------------------------------------
// Shard

Shard::~Shard() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}
Shard::Shard(Shard&& o) noexcept : path_(std::move(o.path_)), h_(o.h_), map_(o.map_), map_bytes_(o.map_bytes_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}
Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    path_ = std::move(o.path_);
    h_ = o.h_;
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

Shard Shard::open(const fs::path& file, Verify verify) {
  const std::string f = file.string();
  auto bad = [&](const std::string& what) -> void {
    LRNN_USER_ERROR("{}: not a valid lrnn token shard: {}", f, what);
  };
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) LRNN_USER_ERROR("cannot open token shard {}: {}", f, std::generic_category().message(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    LRNN_USER_ERROR("cannot stat {}: {}", f, std::generic_category().message(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    LRNN_USER_ERROR("{}: not a regular file ({}); lrnn reads its inputs only from regular files", f,
                    S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    bad(fmt::format("{} bytes, shorter than the {}-byte header (truncated?)", size, kShardHeaderBytes));
  }
  if (size > kMaxShardBytes) {
    ::close(fd);
    bad(fmt::format("{} bytes, more than the {} bytes lrnn maps", size, kMaxShardBytes));
  }
  void* m = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  int merr = errno;
  ::close(fd);
  if (m == MAP_FAILED) LRNN_USER_ERROR("cannot map {}: {}", f, std::generic_category().message(merr));
  Shard s;
  s.path_ = file;
  s.map_ = static_cast<const uint8_t*>(m);
  s.map_bytes_ = size_t(size);
  const uint8_t* p = s.map_;
  if (std::memcmp(p, kShardMagic, 8) != 0) bad("wrong magic bytes (expected \"LRNNTOKS\")");
  ShardHeader& h = s.h_;
  h.version = get32(p + 8);
  if (h.version != kShardVersion)
    bad(fmt::format("format version {}; this lrnn reads version {}{}", h.version, kShardVersion,
                    h.version > kShardVersion ? " (written by a newer lrnn)" : ""));
  h.header_bytes = get32(p + 12);
  if (h.header_bytes != kShardHeaderBytes)
    bad(fmt::format("header size {} (version 1 has {})", h.header_bytes, kShardHeaderBytes));
  h.num_tokens = get64(p + 16);
  h.num_documents = get64(p + 24);
  h.token_bytes = get32(p + 32);
  h.vocab_size = get32(p + 36);
  h.payload_crc32 = get32(p + 40);
  const uint32_t split = get32(p + 44);
  std::memcpy(h.tokenizer_sha256, p + 48, 32);
  h.shard_index = get64(p + 80);
  for (size_t i = 88; i < kShardHeaderBytes; ++i)
    if (p[i] != 0) bad(fmt::format("reserved header byte {} is not zero", i));
  if (h.token_bytes != 2 && h.token_bytes != 4) bad(fmt::format("token width {} bytes (2 or 4)", h.token_bytes));
  if (h.vocab_size < 1 || h.vocab_size > uint32_t(INT32_MAX)) bad(fmt::format("vocabulary size {}", h.vocab_size));
  if (h.token_bytes != token_bytes_for(h.vocab_size))
    bad(fmt::format("token width {} bytes for a vocabulary of {} (expected {})", h.token_bytes, h.vocab_size,
                    token_bytes_for(h.vocab_size)));
  if (split != uint32_t(SplitKind::Train) && split != uint32_t(SplitKind::Val))
    bad(fmt::format("split {} (1 = train, 2 = val)", split));
  h.split = SplitKind(split);
  const uint64_t payload = size - kShardHeaderBytes;
  if (h.num_tokens > payload / h.token_bytes)
    bad(fmt::format("the header says {} tokens of {} bytes but the file has room for {} (truncated?)", h.num_tokens,
                    h.token_bytes, payload / h.token_bytes));
  if (h.num_tokens * h.token_bytes != payload)
    bad(fmt::format("the header says {} tokens of {} bytes but {} bytes follow the header", h.num_tokens,
                    h.token_bytes, payload));
  if (h.num_documents > h.num_tokens) bad(fmt::format("{} documents in {} tokens", h.num_documents, h.num_tokens));
  if (verify == Verify::Full) s.verify_payload();
  return s;
}

void Shard::verify_payload() const {
  const uint8_t* payload = map_ + kShardHeaderBytes;
  const uint64_t bytes = h_.num_tokens * h_.token_bytes;
  uint32_t crc = 0, worst = 0;
  uint64_t worst_at = 0;
  constexpr uint64_t kBlock = uint64_t(1) << 22;
  for (uint64_t off = 0; off < bytes; off += kBlock) {
    const uint64_t n = std::min(kBlock, bytes - off);
    crc = crc32(payload + off, size_t(n), crc);
    for (uint64_t i = 0; i < n; i += h_.token_bytes) {
      uint32_t t = h_.token_bytes == 2 ? uint32_t(payload[off + i]) | uint32_t(payload[off + i + 1]) << 8
                                       : get32(payload + off + i);
      if (t > worst) { worst = t; worst_at = (off + i) / h_.token_bytes; }
    }
  }
  if (crc != h_.payload_crc32)
    LRNN_USER_ERROR("{}: not a valid lrnn token shard: the tokens' CRC-32 is {:08x}, the header says {:08x} "
                    "(corrupt or changed after it was written)", path_.string(), crc, h_.payload_crc32);
  if (h_.num_tokens > 0 && worst >= h_.vocab_size)
    LRNN_USER_ERROR("{}: not a valid lrnn token shard: token {} at position {} is outside the vocabulary of {}",
                    path_.string(), worst, worst_at, h_.vocab_size);
}

uint32_t Shard::token(uint64_t i) const {
  LRNN_CHECK(i < h_.num_tokens, "token {} of a shard of {}", i, h_.num_tokens);
  const uint8_t* p = map_ + kShardHeaderBytes + i * h_.token_bytes;
  return h_.token_bytes == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : get32(p);
}

void Shard::copy(uint64_t begin, uint64_t n, int32_t* out) const {
  LRNN_CHECK(begin <= h_.num_tokens && n <= h_.num_tokens - begin, "tokens [{}, +{}) of a shard of {}", begin, n,
             h_.num_tokens);
  const uint8_t* p = map_ + kShardHeaderBytes + begin * h_.token_bytes;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t t = h_.token_bytes == 2 ? uint32_t(p[2 * i]) | uint32_t(p[2 * i + 1]) << 8 : get32(p + 4 * i);
    if (t >= h_.vocab_size)
      LRNN_USER_ERROR("{}: token {} at position {} is outside the vocabulary of {} (a corrupt shard)", path_.string(),
                      t, begin + i, h_.vocab_size);
    out[i] = int32_t(t);
  }
}

// ---------------------------------------------------------------------------------------------
// index.json and TokenStream

nlohmann::json read_index(const fs::path& dir) {
  const fs::path file = dir / "index.json";
  if (!fs::exists(dir)) LRNN_USER_ERROR("{}: no such tokenized data directory", dir.string());
  if (!fs::is_directory(dir)) LRNN_USER_ERROR("{}: not a directory (expected the --out DIR of lrnn tokenize)", dir.string());
  if (!fs::exists(file))
    LRNN_USER_ERROR("{}: no index.json (not a directory written by lrnn tokenize, or one it did not finish)", dir.string());
  std::string text = io::read_file(file, kMaxIndexBytes);
  nlohmann::json j;
  int depth = 0;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json&) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start || ev == E::array_start) {
      if (++depth > 8) LRNN_USER_ERROR("{}: JSON nests deeper than 8 levels", file.string());
    } else if (ev == E::object_end || ev == E::array_end) {
      --depth;
    }
    return true;
  };
  try {
    j = nlohmann::json::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    LRNN_USER_ERROR("{}: not valid JSON: {}", file.string(), e.what());
  }
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) LRNN_USER_ERROR("{}: {}", file.string(), what);
  };
  need(j.is_object(), "not a JSON object");
  // (json::value() would throw a type_error for a "format" that is not a string.)
  need(j.contains("format") && j["format"].is_string() && j["format"].get<std::string>() == "lrnn token shards",
       "\"format\" is not \"lrnn token shards\"");
  need(j.contains("format_version") && j["format_version"].is_number_unsigned(), "no \"format_version\"");
  need(j["format_version"].get<uint64_t>() == kShardVersion,
       fmt::format("format_version {}; this lrnn reads version {}", j["format_version"].dump(), kShardVersion));
  need(j.contains("splits") && j["splits"].is_object(), "no \"splits\" object");
  need(j.contains("tokenizer") && j["tokenizer"].is_object() && j["tokenizer"].contains("sha256") &&
           j["tokenizer"]["sha256"].is_string() && j["tokenizer"].contains("vocab_size") &&
           j["tokenizer"]["vocab_size"].is_number_unsigned(),
       "no \"tokenizer\" with \"sha256\" and \"vocab_size\"");
  return j;
}

TokenStream TokenStream::open(const fs::path& dir, const std::string& split, Verify verify) {
  if (split != "train" && split != "val") LRNN_USER_ERROR("split {}: expected train or val", split);
  nlohmann::json idx = read_index(dir);
  const std::string file = (dir / "index.json").string();
  if (!idx["splits"].contains(split))
    LRNN_USER_ERROR("{}: no {} split{}", file, split, split == "val" ? " (tokenized with --val-fraction 0?)" : "");
  const auto& sp = idx["splits"][split];
  if (!sp.is_object() || !sp.contains("shards") || !sp["shards"].is_array())
    LRNN_USER_ERROR("{}: split {} has no \"shards\" list", file, split);
  if (sp["shards"].empty()) LRNN_USER_ERROR("{}: split {} has no shards", file, split);
  if (sp["shards"].size() > kMaxShardsPerSplit)
    LRNN_USER_ERROR("{}: split {} lists more than {} shards", file, split, kMaxShardsPerSplit);
  std::vector<fs::path> files;
  std::vector<std::pair<uint64_t, uint64_t>> expect;  // tokens, crc32
  for (const auto& s : sp["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("tokens") ||
        !s["tokens"].is_number_unsigned() || !s.contains("crc32") || !s["crc32"].is_number_unsigned())
      LRNN_USER_ERROR("{}: split {}: a shard entry needs \"file\", \"tokens\" and \"crc32\": {}", file, split,
                      s.dump().substr(0, 200));
    const std::string name = s["file"].get<std::string>();
    // Shards live in DIR itself: a name is a plain file name, never a path elsewhere.
    if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
        std::any_of(name.begin(), name.end(), [](char c) { return c == '/' || c == '\0'; }))
      LRNN_USER_ERROR("{}: split {}: shard file {} is not a plain file name in the directory", file, split,
                      s["file"].dump());
    files.push_back(dir / name);
    expect.emplace_back(s["tokens"].get<uint64_t>(), s["crc32"].get<uint64_t>());
  }
  TokenStream ts = from_shards(files, verify);
  const std::string sha = idx["tokenizer"]["sha256"].get<std::string>();
  const uint64_t vocab = idx["tokenizer"]["vocab_size"].get<uint64_t>();
  for (size_t i = 0; i < ts.shards_.size(); ++i) {
    const ShardHeader& h = ts.shards_[i].header();
    const std::string f = ts.shards_[i].path().string();
    if (h.split != (split == "val" ? SplitKind::Val : SplitKind::Train))
      LRNN_USER_ERROR("{}: a {} shard, listed under {} in {}", f, split_name(h.split), split, file);
    if (h.shard_index != i) LRNN_USER_ERROR("{}: shard number {}, listed as number {} in {}", f, h.shard_index, i, file);
    if (h.num_tokens != expect[i].first || h.payload_crc32 != expect[i].second)
      LRNN_USER_ERROR("{}: {} tokens with CRC-32 {:08x}; {} lists {} tokens with CRC-32 {:08x} (replaced after the "
                      "index was written?)", f, h.num_tokens, h.payload_crc32, file, expect[i].first, expect[i].second);
    if (to_hex(h.tokenizer_sha256, 32) != sha)
      LRNN_USER_ERROR("{}: written with tokenizer sha256 {}, {} names {}", f, to_hex(h.tokenizer_sha256, 32), file, sha);
    if (h.vocab_size != vocab)
      LRNN_USER_ERROR("{}: vocabulary {}, {} says {}", f, h.vocab_size, file, vocab);
  }
  return ts;
}

TokenStream TokenStream::from_shards(const std::vector<fs::path>& files, Verify verify) {
  if (files.empty()) LRNN_USER_ERROR("no token shards given");
  TokenStream ts;
  for (const auto& f : files) {
    Shard s = Shard::open(f, verify);
    if (!ts.shards_.empty()) {
      const ShardHeader& a = ts.shards_.front().header();
      const ShardHeader& b = s.header();
      if (b.vocab_size != a.vocab_size || std::memcmp(a.tokenizer_sha256, b.tokenizer_sha256, 32) != 0)
        LRNN_USER_ERROR("{}: tokenizer or vocabulary differs from {}'s (one stream, one tokenizer)", f.string(),
                        ts.shards_.front().path().string());
      if (b.split != a.split)
        LRNN_USER_ERROR("{}: a {} shard next to {} shards", f.string(), split_name(b.split), split_name(a.split));
    }
    ts.starts_.push_back(ts.total_);
    ts.total_ += s.size();
    ts.vocab_ = s.header().vocab_size;
    ts.shards_.push_back(std::move(s));
  }
  return ts;
}

void TokenStream::read(uint64_t pos, uint64_t n, int32_t* out) const {
  LRNN_CHECK(pos <= total_ && n <= total_ - pos, "tokens [{}, +{}) of a stream of {}", pos, n, total_);
  size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  while (n > 0) {
    const Shard& s = shards_[k];
    const uint64_t off = pos - starts_[k];
    const uint64_t take = std::min(n, s.size() - off);
    s.copy(off, take, out);
    out += take;
    pos += take;
    n -= take;
    ++k;
  }
}

std::vector<int32_t> TokenStream::read(uint64_t pos, uint64_t n) const {
  std::vector<int32_t> v(n);
  read(pos, n, v.data());
  return v;
}

// ---------------------------------------------------------------------------------------------
// PackedSampler

namespace {

// A permutation of [0, n) keyed by `rng`: a balanced Feistel network on 2h bits (2^2h >= n), with
// cycle walking back into [0, n).
uint64_t permute(uint64_t x, uint64_t n, const Rng& rng) {
  int bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
  const int h = (bits + 1) / 2;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  do {
    uint64_t L = x >> h, R = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const uint64_t F = rng.block((R << 3) | round).v[0] & mask;
      const uint64_t t = L ^ F;
      L = R;
      R = t;
    }
    x = (L << h) | R;
  } while (x >= n);
  return x;
}

}  // namespace

PackedSampler::PackedSampler(const TokenStream& stream, int context, uint64_t seed)
    : s_(stream), T_(context), seed_(seed) {
  if (context < 1 || context > kMaxSequenceLength)
    LRNN_USER_ERROR("context length {}: expected 1..{}", context, kMaxSequenceLength);
  const uint64_t N = s_.size(), T = uint64_t(context);
  M_ = N / T >= 1 ? N / T - 1 : 0;
  eval_M_ = N >= 1 ? (N - 1) / T : 0;
  const std::string where = s_.shards().empty() ? std::string("the stream") : s_.shards().front().path().string();
  if (eval_M_ == 0)
    LRNN_USER_ERROR("{}: {} tokens, too few for one context of {} + 1", where, N, context);
}

uint64_t PackedSampler::sample_start(uint64_t g) const {
  LRNN_CHECK(M_ > 0, "training order needs at least 2 contexts' worth of tokens");
  const uint64_t epoch = g / M_, j = g % M_;
  const uint64_t offset = Rng{seed_, kOffsetStream}.below(epoch, uint32_t(T_));
  const Rng perm = Rng{seed_, kPermStream}.sub(epoch);
  return offset + permute(j, M_, perm) * uint64_t(T_);
}

void PackedSampler::fill(Batch& b, int row, uint64_t start) const {
  std::vector<int32_t> w(size_t(T_) + 1);
  s_.read(start, uint64_t(T_) + 1, w.data());
  std::copy(w.begin(), w.end() - 1, b.tokens.begin() + ptrdiff_t(row) * T_);
  std::copy(w.begin() + 1, w.end(), b.labels.begin() + ptrdiff_t(row) * T_);
}

namespace {
void check_ranks(int B, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) LRNN_USER_ERROR("rank {} of {}: expected 0 <= rank < world", rank, world);
  if (B < 1) LRNN_USER_ERROR("batch size {}: expected at least 1", B);
  if (B % world != 0)
    LRNN_USER_ERROR("batch size {} is not a multiple of the {} ranks (each rank takes B / ranks rows)", B, world);
}
}  // namespace

Batch PackedSampler::batch(int64_t step, int global_batch, int rank, int world) const {
  check_ranks(global_batch, rank, world);
  if (step < 0) LRNN_USER_ERROR("step {}: expected >= 0", step);
  // Global sample numbers are 64-bit: step · B must not wrap (2^63 samples are never reached).
  if (uint64_t(step) > (uint64_t(1) << 62) / uint64_t(global_batch))
    LRNN_USER_ERROR("step {} with batch {}: past 2^62 samples", step, global_batch);
  if (M_ == 0)
    LRNN_USER_ERROR("{}: {} tokens, too few for training contexts of {} + 1 (need at least {})",
                    s_.shards().front().path().string(), s_.size(), T_, 2 * uint64_t(T_));
  const int rows = global_batch / world;
  const uint64_t g0 = uint64_t(step) * uint64_t(global_batch) + uint64_t(rank) * uint64_t(rows);
  return windows(rows, [&](int r) { return sample_start(g0 + uint64_t(r)); });
}

template <class StartOf>
Batch PackedSampler::windows(int rows, StartOf start_of) const {
  Batch b;
  b.B = rows;
  b.T = T_;
  b.tokens.resize(size_t(rows) * size_t(T_));
  b.labels.resize(size_t(rows) * size_t(T_));
  b.lengths.assign(size_t(rows), T_);
  for (int r = 0; r < rows; ++r) fill(b, r, start_of(r));
  return b;
}

Batch PackedSampler::eval_batch(uint64_t index, int batch, int rank, int world) const {
  check_ranks(batch, rank, world);
  if (index >= eval_batches(batch))
    LRNN_USER_ERROR("evaluation batch {}: there are {} of {} contexts", index, eval_batches(batch), batch);
  const uint64_t first = index * uint64_t(batch), end = std::min(first + uint64_t(batch), eval_M_);
  const uint64_t per = uint64_t(batch / world);
  const uint64_t lo = std::min(end, first + uint64_t(rank) * per), hi = std::min(end, lo + per);
  return windows(int(hi - lo), [&](int r) { return (lo + uint64_t(r)) * uint64_t(T_); });
}

}  // namespace lrnn::data
