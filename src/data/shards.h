// Token shards of a tokenized corpus (`lrnn tokenize`, tools/parquet_to_shards.py) and the packed
// contexts a language model trains on. The file format, the directory's index.json and the
// sampler's rules are specified in docs/DATA.md (the one description; the Python writer follows
// it too); the constants here are that specification's.
//
// Reading: Shard maps one file (mmap, read-only) after checking its header against its size;
// TokenStream is a split's shards concatenated in index order; PackedSampler cuts that stream
// into contexts of T+1 tokens and serves batches as a pure function of (seed, step), so a run
// resumed at step s sees exactly the batches of an uninterrupted one, and rank r of R ranks gets
// rows [r·B/R, (r+1)·B/R) of the same global batch whatever R is. Every rejection is a UserError
// naming the file and what is wrong (exit 2).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "tasks/task.h"

namespace lrnn::data {

class Tokenizer;

inline constexpr char kShardMagic[8] = {'L', 'R', 'N', 'N', 'T', 'O', 'K', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardHeaderBytes = 128;
// Largest shard file mapped (1 TiB) and largest index.json read.
inline constexpr uint64_t kMaxShardBytes = uint64_t(1) << 40;
inline constexpr uint64_t kMaxIndexBytes = uint64_t(16) << 20;
inline constexpr uint64_t kMaxShardsPerSplit = 1000000;

enum class SplitKind : uint32_t { Train = 1, Val = 2 };
const char* split_name(SplitKind s);  // "train" / "val"

// The 128-byte header (docs/DATA.md, "Shard files"), little-endian on disk.
struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t header_bytes = kShardHeaderBytes;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;   // documents whose first token (BOS) lies in this shard
  uint32_t token_bytes = 2;     // 2 when vocab_size <= 65536, else 4
  uint32_t vocab_size = 0;
  uint32_t payload_crc32 = 0;   // CRC-32 (zlib's) of the token bytes
  SplitKind split = SplitKind::Train;
  uint8_t tokenizer_sha256[32] = {};
  uint64_t shard_index = 0;     // position in its split (file train_000003.bin holds 3)

  std::string encode() const;                    // the 128 bytes
};

inline uint32_t token_bytes_for(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }
std::string shard_file_name(SplitKind split, uint64_t index);  // "train_000003.bin"

// How much of a shard to check when it is opened. Header: magic, version, every field and the
// file size against them (cheap). Full: also the payload's CRC-32 and every token < vocab_size
// (reads the whole file once).
enum class Verify { Header, Full };

class Shard {
 public:
  static Shard open(const std::filesystem::path& file, Verify verify = Verify::Full);
  ~Shard();
  Shard(Shard&&) noexcept;
  Shard& operator=(Shard&&) noexcept;
  const ShardHeader& header() const { return h_; }
  uint64_t size() const { return h_.num_tokens; }
  const std::filesystem::path& path() const { return path_; }
  uint32_t token(uint64_t i) const;
  // Tokens [begin, begin + n) as int32; checks each against vocab_size (UserError naming the file).
  void copy(uint64_t begin, uint64_t n, int32_t* out) const;
  void verify_payload() const;  // Verify::Full's part

 private:
  Shard() = default;
  std::filesystem::path path_;
  ShardHeader h_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// A split of a tokenized directory: its shards concatenated in index order.
class TokenStream {
 public:
  // The split ("train" or "val") of DIR, as DIR/index.json lists it; every shard is opened and
  // checked against the index (tokens, CRC, tokenizer, vocabulary). UserError naming the file.
  static TokenStream open(const std::filesystem::path& dir, const std::string& split, Verify verify = Verify::Full);
  // Shards given directly (all of one split, tokenizer and vocabulary).
  static TokenStream from_shards(const std::vector<std::filesystem::path>& files, Verify verify = Verify::Full);

  uint64_t size() const { return total_; }
  uint32_t vocab_size() const { return vocab_; }
  const std::vector<Shard>& shards() const { return shards_; }
  // Tokens [pos, pos + n) of the concatenation, across shard boundaries.
  void read(uint64_t pos, uint64_t n, int32_t* out) const;
  std::vector<int32_t> read(uint64_t pos, uint64_t n) const;

 private:
  std::vector<Shard> shards_;
  std::vector<uint64_t> starts_;  // first stream position of each shard
  uint64_t total_ = 0;
  uint32_t vocab_ = 0;
};

// DIR/index.json, read and checked (size, JSON, format and version, the fields used).
nlohmann::json read_index(const std::filesystem::path& dir);

// Contexts of T+1 tokens (input = the first T, labels = the last T) cut from a TokenStream.
//
// Training order (docs/DATA.md, "Packed contexts"): the stream holds M = floor(N / T) - 1 windows
// per epoch. Epoch e starts its windows at an offset o_e in [0, T) drawn from (seed, e), so the
// cuts move from epoch to epoch; window j of epoch e starts at o_e + j·T. The epoch visits its
// windows in the order of a pseudo-random permutation of [0, M) keyed by (seed, e) (a Feistel
// network with cycle walking: O(1) per index, no state). Global sample g = step·B + b is sample
// g mod M of epoch g div M. Everything is a pure function of (seed, step, B): the batches do
// not depend on what ran before, on the number of ranks, or on where a run was resumed.
//
// Evaluation order: windows at 0, T, 2T, ... (floor((N - 1) / T) of them), in order, once.
class PackedSampler {
 public:
  PackedSampler(const TokenStream& stream, int context, uint64_t seed);

  int context() const { return T_; }
  uint64_t windows_per_epoch() const { return M_; }
  // Start of training sample g in the stream (the window of T+1 tokens begins there).
  uint64_t sample_start(uint64_t g) const;
  // Rank `rank` of `world`: rows [rank·B/world, (rank+1)·B/world) of global batch `step` (B rows).
  // B must be a multiple of world. lengths are all T; every label is the next token.
  Batch batch(int64_t step, int global_batch, int rank = 0, int world = 1) const;

  uint64_t eval_windows() const { return eval_M_; }
  // Evaluation batch `index`: windows [index·B, min((index+1)·B, eval_windows())), split over
  // ranks as above (the last batch may be short; a rank's part may then be empty, B = 0).
  Batch eval_batch(uint64_t index, int batch, int rank = 0, int world = 1) const;
  uint64_t eval_batches(int batch) const { return (eval_M_ + uint64_t(batch) - 1) / uint64_t(batch); }

 private:
  void fill(Batch& b, int row, uint64_t start) const;
  // A batch of `rows` windows, row r starting at stream position start_of(r).
  template <class StartOf>
  Batch windows(int rows, StartOf start_of) const;
  const TokenStream& s_;
  int T_;
  uint64_t seed_, M_, eval_M_;
};

}  // namespace lrnn::data
