// SentencePiece tokenizers (Debian's libsentencepiece): any `.model` file loads, e.g. the
// Llama / Mistral tokenizers the papers' language models used, or one trained by
// `lrnn tokenizer train` (train_tokenizer below). SentencePiece stays inside tokenizer.cpp.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpus.h"

namespace lrnn::data {

// The largest tokenizer file read (Llama's is 0.5 MB, Gemma's 4 MB).
inline constexpr uint64_t kMaxTokenizerBytes = uint64_t(256) << 20;

class Tokenizer {
 public:
  // Loads a SentencePiece model file. UserError (exit 2) naming the file when it is missing, not
  // a regular file, larger than kMaxTokenizerBytes, or not a SentencePiece model.
  static Tokenizer load(const std::filesystem::path& model);
  // The same from the bytes of a model; `source` names it in messages.
  static Tokenizer from_bytes(std::string bytes, std::string source);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of `text`, without BOS or EOS. UserError if SentencePiece refuses the text.
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `out` (the streaming form).
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  // Text of `ids` (BOS, EOS and pad decode to nothing). UserError for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 when the model defines none
  int eos_id() const;
  int pad_id() const;
  int unk_id() const;
  std::string piece(int id) const;  // UserError outside [0, vocab_size)
  bool is_control(int id) const;    // <s>, </s>, <pad>
  bool is_byte(int id) const;       // <0x0A> and the other byte-fallback pieces

  const std::string& source() const;  // the path it was loaded from
  const std::string& sha256() const;  // of the model file's bytes (lower-case hex)
  const std::string& bytes() const;   // the model file's bytes

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// `lrnn tokenizer train`. The model is a deterministic function of the input documents and these
// options (no sampling randomness inside SentencePiece; its work split over `threads` is fixed),
// so the same inputs give a byte-identical model file.
struct TokenizerTrainOptions {
  int vocab_size = 0;
  std::string model_type = "bpe";          // bpe | unigram
  double character_coverage = 0.9995;      // characters outside fall back to bytes
  uint64_t seed = 0;                       // picks the lines when there are more than max_sentences
  uint64_t max_sentences = 2000000;        // lines SentencePiece trains on (0 = all)
  int max_sentence_bytes = 16384;          // longer lines are skipped by SentencePiece
  int threads = 1;                         // SentencePiece's threads (recorded in the model file;
                                           // unigram's scores depend on it)
  CorpusOptions corpus;
};

struct TokenizerTrainResult {
  std::string model;               // the serialized model (the .model file's bytes)
  uint64_t documents = 0, lines = 0, lines_used = 0;
};

// Trains on the lines of the documents of `inputs` (corpus.h); UserError for a bad input or
// options SentencePiece refuses (e.g. a vocabulary larger than the text supports), naming them.
TokenizerTrainResult train_tokenizer(const std::vector<std::filesystem::path>& inputs,
                                     const TokenizerTrainOptions& opt);

// The SentencePiece options train_tokenizer passes (for docs, tests and index files).
std::vector<std::pair<std::string, std::string>> tokenizer_trainer_args(const TokenizerTrainOptions& opt);

}  // namespace lrnn::data
