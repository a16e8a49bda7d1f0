#include "data/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <unordered_map>
#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "core/check.h"
#include "core/rng.h"
#include "data/hash.h"
#include "io/atomic_file.h"

namespace lrnn::data {

namespace fs = std::filesystem;
namespace spm = sentencepiece;

namespace {

// A reader of protobuf's wire format, enough to walk a SentencePiece ModelProto before the
// library sees it. SentencePiece trusts parts of a model file that it cannot check for itself
// (found by fuzz/fuzz_tokenizer.cpp): a piece that starts with or holds a NUL byte reaches the
// double-array trie builder (Darts, which takes keys as C strings) and its exception terminates
// the process from inside the library; a normalisation rule's precompiled trie is indexed
// without bounds checks. check_model_proto refuses such files; it is no stricter than protobuf
// for the files SentencePiece writes.
struct WireReader {
  std::string_view in;
  size_t pos = 0;

  bool done() const { return pos >= in.size(); }
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= in.size()) return false;
      const uint8_t b = uint8_t(in[pos++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // The next field: its number, wire type and, for length-delimited fields, the bytes.
  bool field(uint32_t& number, int& type, std::string_view& bytes) {
    uint64_t key;
    if (!varint(key)) return false;
    number = uint32_t(key >> 3);
    type = int(key & 7);
    if (number == 0) return false;
    uint64_t v;
    switch (type) {
      case 0: return varint(v);
      case 1: if (in.size() - pos < 8) return false; pos += 8; return true;
      case 5: if (in.size() - pos < 4) return false; pos += 4; return true;
      case 2:
        if (!varint(v) || v > in.size() - pos) return false;
        bytes = in.substr(pos, size_t(v));
        pos += size_t(v);
        return true;
      default: return false;  // groups (3, 4) are not in sentencepiece_model.proto; 6, 7 do not exist
    }
  }
};

uint32_t unit_at(std::string_view trie, size_t i) {
  uint32_t u;
  std::memcpy(&u, trie.data() + 4 * i, 4);  // little-endian hosts, as SentencePiece itself
  return u;
}

// A normalisation rule's precompiled_charsmap: a 4-byte trie size, a Darts double array, then
// NUL-terminated replacement strings. SentencePiece walks it with commonPrefixSearch: from unit p
// it reads unit p ^ offset(p) ^ c for an input byte c, follows units whose label is c, and at a
// leaf reads the value of unit p ^ offset(p) as an offset into the strings. Every such index must
// lie in the array and every value in the strings, and the strings must end with NUL.
std::string check_charsmap(std::string_view blob) {
  if (blob.empty()) return {};  // no rule: no trie
  if (blob.size() <= 4) return "a normalisation rule of " + std::to_string(blob.size()) + " bytes";
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes == 0 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4)
    return fmt::format("a normalisation rule whose trie claims {} of its {} bytes", trie_bytes, blob.size());
  const std::string_view trie = blob.substr(4, trie_bytes), strings = blob.substr(4 + size_t(trie_bytes));
  if (strings.empty() || strings.back() != '\0') return "a normalisation rule whose strings do not end with NUL";
  const size_t n = trie.size() / 4;
  auto offset = [](uint32_t u) -> uint64_t { return uint64_t(u >> 10) << ((u & (1u << 9)) >> 6); };
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = unit_at(trie, i);
    if (i != 0 && (u >> 31)) continue;  // a value unit: never followed (its label is never a byte)
    const uint64_t base = uint64_t(i) ^ offset(u);
    if ((base | 0xFF) >= n) return fmt::format("a normalisation rule whose trie unit {} points outside it", i);
    if ((u >> 8) & 1) {  // has a leaf: the value at base indexes the strings
      const uint32_t value = unit_at(trie, size_t(base)) & 0x7FFFFFFFu;
      if (value >= strings.size()) return fmt::format("a normalisation rule whose trie unit {} points outside its strings", i);
    }
  }
  return {};
}

std::string check_normalizer(std::string_view msg) {
  WireReader r{msg};
  while (!r.done()) {
    uint32_t num;
    int type;
    std::string_view bytes;
    if (!r.field(num, type, bytes)) return "a broken normalizer spec";
    if (num == 2 && type == 2)
      if (std::string e = check_charsmap(bytes); !e.empty()) return e;
  }
  return {};
}

std::string check_piece(std::string_view msg, size_t index) {
  WireReader r{msg};
  bool any = false;
  while (!r.done()) {
    uint32_t num;
    int type;
    std::string_view bytes;
    if (!r.field(num, type, bytes)) return fmt::format("piece {} is broken", index);
    if (num != 1 || type != 2) continue;
    any = true;
    if (bytes.empty()) return fmt::format("piece {} is empty", index);
    if (bytes.find('\0') != std::string_view::npos) return fmt::format("piece {} holds a NUL byte", index);
    if (find_invalid_utf8(bytes) != std::string_view::npos) return fmt::format("piece {} is not valid UTF-8", index);
  }
  if (!any) return fmt::format("piece {} is empty", index);
  return {};
}

// Empty when SentencePiece may be given `bytes`, else what is wrong with them.
std::string check_model_proto(std::string_view bytes) {
  WireReader r{bytes};
  size_t pieces = 0;
  while (!r.done()) {
    uint32_t num;
    int type;
    std::string_view sub;
    const size_t at = r.pos;
    if (!r.field(num, type, sub)) return fmt::format("broken protobuf data at byte {}", at);
    if (type != 2) continue;
    if (num == 1) {
      if (std::string e = check_piece(sub, pieces++); !e.empty()) return e;
    } else if (num == 3 || num == 5) {  // normalizer_spec, denormalizer_spec
      if (std::string e = check_normalizer(sub); !e.empty()) return e;
    }
  }
  return {};
}

}  // namespace

struct Tokenizer::Impl {
  spm::SentencePieceProcessor sp;
  std::string source, sha, bytes;
  int vocab = 0;
};

Tokenizer::Tokenizer() : p_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const fs::path& model) {
  if (!fs::exists(model)) LRNN_USER_ERROR("{}: no such tokenizer file (a SentencePiece .model)", model.string());
  return from_bytes(io::read_file(model, kMaxTokenizerBytes), model.string());
}

Tokenizer Tokenizer::from_bytes(std::string bytes, std::string source) {
  Tokenizer t;
  if (bytes.size() > kMaxTokenizerBytes)
    LRNN_USER_ERROR("{}: {} bytes, more than the {} a tokenizer may have", source, bytes.size(), kMaxTokenizerBytes);
  if (bytes.empty()) LRNN_USER_ERROR("{}: empty file, not a SentencePiece model", source);
  if (std::string e = check_model_proto(bytes); !e.empty())
    LRNN_USER_ERROR("{}: not a SentencePiece model lrnn can load: {}", source, e);
  auto st = t.p_->sp.LoadFromSerializedProto(bytes);
  if (!st.ok())
    LRNN_USER_ERROR("{}: not a SentencePiece model (SentencePiece says: {})", source, st.ToString());
  t.p_->vocab = t.p_->sp.GetPieceSize();
  if (t.p_->vocab <= 0) LRNN_USER_ERROR("{}: a SentencePiece model without pieces", source);
  // Special ids must name pieces of the vocabulary (a damaged model could say otherwise).
  for (int id : {t.p_->sp.bos_id(), t.p_->sp.eos_id(), t.p_->sp.pad_id(), t.p_->sp.unk_id()})
    if (id < -1 || id >= t.p_->vocab)
      LRNN_USER_ERROR("{}: a special token id {} outside the vocabulary of {} pieces", source, id, t.p_->vocab);
  t.p_->source = std::move(source);
  t.p_->sha = sha256_hex(bytes);
  t.p_->bytes = std::move(bytes);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  auto st = p_->sp.Encode(text, &ids);
  if (!st.ok()) LRNN_USER_ERROR("{}: cannot encode the text: {}", p_->source, st.ToString());
  for (int id : ids) {
    if (id < 0 || id >= p_->vocab)
      LRNN_USER_ERROR("{}: the tokenizer produced id {} outside its vocabulary of {}", p_->source, id, p_->vocab);
    out.push_back(int32_t(id));
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v;
  v.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= p_->vocab)
      LRNN_USER_ERROR("{}: cannot decode token id {}: the vocabulary has ids 0..{}", p_->source, id, p_->vocab - 1);
    v.push_back(id);
  }
  std::string out;
  auto st = p_->sp.Decode(v, &out);
  if (!st.ok()) LRNN_USER_ERROR("{}: cannot decode: {}", p_->source, st.ToString());
  return out;
}

int Tokenizer::vocab_size() const { return p_->vocab; }
int Tokenizer::bos_id() const { return p_->sp.bos_id(); }
int Tokenizer::eos_id() const { return p_->sp.eos_id(); }
int Tokenizer::pad_id() const { return p_->sp.pad_id(); }
int Tokenizer::unk_id() const { return p_->sp.unk_id(); }
std::string Tokenizer::piece(int id) const {
  if (id < 0 || id >= p_->vocab)
    LRNN_USER_ERROR("{}: no piece {}: the vocabulary has ids 0..{}", p_->source, id, p_->vocab - 1);
  return p_->sp.IdToPiece(id);
}
bool Tokenizer::is_control(int id) const { return id >= 0 && id < p_->vocab && p_->sp.IsControl(id); }
bool Tokenizer::is_byte(int id) const { return id >= 0 && id < p_->vocab && p_->sp.IsByte(id); }
const std::string& Tokenizer::source() const { return p_->source; }
const std::string& Tokenizer::sha256() const { return p_->sha; }
const std::string& Tokenizer::bytes() const { return p_->bytes; }

std::vector<std::pair<std::string, std::string>> tokenizer_trainer_args(const TokenizerTrainOptions& o) {
  // Llama-style: no normalisation (text round-trips byte for byte), bytes for what the pieces do
  // not cover, digits split, a space before the first word; ids 0-3 are <unk> <s> </s> <pad>.
  return {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "3"},
      {"num_threads", std::to_string(o.threads)},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes)},
      // lrnn picks the lines itself (seeded, below) and hands SentencePiece all of them in order.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"hard_vocab_limit", "true"},
  };
}

namespace {

// SentencePiece reads the training lines from this.
class VectorIterator : public spm::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  spm::util::Status status() const override { return spm::util::Status(); }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

struct Kept {
  uint64_t key, index;
  std::string line;
  bool operator<(const Kept& o) const { return key != o.key ? key < o.key : index < o.index; }
};

}  // namespace

TokenizerTrainResult train_tokenizer(const std::vector<fs::path>& inputs, const TokenizerTrainOptions& opt) {
  if (opt.model_type != "bpe" && opt.model_type != "unigram")
    LRNN_USER_ERROR("tokenizer train: --model-type {}: expected bpe or unigram", opt.model_type);
  if (opt.vocab_size < 261 || opt.vocab_size > (1 << 24))
    LRNN_USER_ERROR("tokenizer train: --vocab-size {}: expected 261..{} (4 special pieces and 256 byte pieces come "
                    "first)", opt.vocab_size, 1 << 24);
  // SentencePiece's own range (its trainer refuses anything else).
  if (!(opt.character_coverage >= 0.98 && opt.character_coverage <= 1.0))
    LRNN_USER_ERROR("tokenizer train: --character-coverage {}: expected a value in [0.98, 1]", opt.character_coverage);
  if (opt.threads < 1 || opt.threads > 128) LRNN_USER_ERROR("tokenizer train: --threads {}: expected 1..128", opt.threads);
  if (inputs.empty()) LRNN_USER_ERROR("tokenizer train: give at least one --input file");

  // The lines of every document; past max_sentences, the ones with the smallest Philox keys at
  // (seed, line index) (a uniform sample without replacement that depends only on the seed).
  TokenizerTrainResult res;
  const Rng rng{opt.seed, 0x73706d6cull /* "spml" */};
  std::priority_queue<Kept> heap;  // largest key on top
  std::vector<std::string> all;
  uint64_t too_long = 0;
  DocumentReader reader(inputs, opt.corpus);
  std::string doc;
  while (reader.next(doc)) {
    ++res.documents;
    size_t start = 0;
    while (start <= doc.size()) {
      size_t nl = doc.find('\n', start);
      size_t end = nl == std::string::npos ? doc.size() : nl;
      std::string_view line(doc.data() + start, end - start);
      start = end + 1;
      if (line.empty()) continue;
      if (line.size() > size_t(opt.max_sentence_bytes)) {
        ++too_long;
        continue;
      }
      const uint64_t index = res.lines++;
      if (opt.max_sentences == 0) {
        all.emplace_back(line);
        continue;
      }
      U32x4 b = rng.block(index);
      Kept k{(uint64_t(b.v[1]) << 32) | b.v[0], index, {}};
      if (heap.size() < opt.max_sentences) {
        k.line = line;
        heap.push(std::move(k));
      } else if (k < heap.top()) {
        k.line = line;
        heap.pop();
        heap.push(std::move(k));
      }
    }
  }
  if (opt.max_sentences != 0) {
    std::vector<Kept> kept;
    kept.reserve(heap.size());
    while (!heap.empty()) {
      kept.push_back(std::move(const_cast<Kept&>(heap.top())));
      heap.pop();
    }
    std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.index < b.index; });
    all.reserve(kept.size());
    for (auto& k : kept) all.push_back(std::move(k.line));
  }
  res.lines_used = all.size();
  if (all.empty())
    LRNN_USER_ERROR("tokenizer train: the inputs hold no line to train on ({} documents{})", res.documents,
                    too_long ? fmt::format(", {} lines longer than {} bytes skipped", too_long, opt.max_sentence_bytes)
                             : std::string());

  std::unordered_map<std::string, std::string> kwargs;
  for (auto& [k, v] : tokenizer_trainer_args(opt)) kwargs[k] = v;
  kwargs["minloglevel"] = "1";  // SentencePiece's warnings, not its progress log
  VectorIterator it(all);
  auto st = spm::SentencePieceTrainer::Train(kwargs, &it, &res.model);
  if (!st.ok())
    LRNN_USER_ERROR("tokenizer train: SentencePiece refused to train on {} lines of {} documents from {}{}: {}",
                    res.lines_used, res.documents, inputs.front().string(),
                    inputs.size() > 1 ? fmt::format(" and {} more files", inputs.size() - 1) : std::string(),
                    st.ToString());
  return res;
}

}  // namespace lrnn::data
