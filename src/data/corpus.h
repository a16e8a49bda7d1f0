// Text corpora as documents, read as a stream (a file at a time, a buffer of 1 MiB): what
// `lrnn tokenizer train` and `lrnn tokenize` read. docs/DATA.md describes the inputs.
//
//   *.jsonl   one JSON object per line with a string field (`text` unless told otherwise): one
//             document per line; blank lines are skipped.
//   any other plain UTF-8 text:
//             TextUnit::File       the whole file is one document, byte for byte (the default);
//             TextUnit::BlankLine  blocks of lines separated by one or more blank lines (lines of
//                                  only spaces, tabs or '\r') are documents; a block is its lines
//                                  joined by '\n' (no trailing newline).
//
// Every input is a regular file (FIFOs, devices and directories are refused), valid UTF-8 (the
// first bad byte's offset is named), and no document is larger than max_document_bytes. Each
// rejection is a UserError naming the file (and line), so exit 2.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lrnn::data {

enum class TextUnit { File, BlankLine };

struct CorpusOptions {
  TextUnit text_unit = TextUnit::File;
  std::string jsonl_field = "text";
  uint64_t max_document_bytes = uint64_t(64) << 20;  // 64 MiB: SentencePiece's encoder needs ~10x that
};

// Byte offset of the first byte that is not part of valid UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos when all of `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// TextUnit from "file" / "blank-line"; UserError otherwise.
TextUnit parse_text_unit(const std::string& s);

// The documents of `inputs`, in order (the files in the order given, the documents of a file in
// file order). Document i (from 0) is the i-th that next() returns; empty documents count.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::filesystem::path> inputs, CorpusOptions opt);
  ~DocumentReader();
  DocumentReader(DocumentReader&&) noexcept;
  // The next document into `doc`; false at the end. UserError for a bad input.
  bool next(std::string& doc);
  // "FILE" or "FILE:LINE" of the document next() returned last (for messages).
  std::string where() const;
  // Index in `inputs` of the file the last document came from.
  size_t file_index() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// How many documents `inputs` hold, reading only their structure (lines, blank lines): the first
// pass of `lrnn tokenize`, which decides the validation split before anything is encoded. Checks
// that every input can be opened and is a regular file.
uint64_t count_documents(const std::vector<std::filesystem::path>& inputs, const CorpusOptions& opt);

}  // namespace lrnn::data
