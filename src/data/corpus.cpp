#include "data/corpus.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace lrnn::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = size_t(1) << 20;
constexpr int kMaxJsonDepth = 64;

bool is_jsonl(const fs::path& p) { return p.extension() == ".jsonl"; }

std::string clip(std::string_view s, size_t n = 60) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

// A regular file read forwards in chunks; lines are cut at '\n'.
class LineFile {
 public:
  LineFile(const fs::path& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check refuses it.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) LRNN_USER_ERROR("cannot open {}: {}", path.string(), std::generic_category().message(errno));
    struct stat st{};
    if (::fstat(fd_, &st) != 0) {
      int e = errno;
      ::close(fd_);
      LRNN_USER_ERROR("cannot stat {}: {}", path.string(), std::generic_category().message(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      LRNN_USER_ERROR("{}: not a regular file ({}); lrnn reads its inputs only from regular files", path.string(),
                      S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
                      S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a file");
    }
    fill();
    const unsigned char* b = reinterpret_cast<const unsigned char*>(buf_.data());
    const char* packed = nullptr;
    if (buf_.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b) packed = "gzip";
    else if (buf_.size() >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) packed = "zstd";
    else if (buf_.size() >= 6 && b[0] == 0xfd && b[1] == '7' && b[2] == 'z' && b[3] == 'X' && b[4] == 'Z') packed = "xz";
    else if (buf_.size() >= 4 && b[0] == 'P' && b[1] == 'A' && b[2] == 'R' && b[3] == '1') packed = "Parquet";
    if (packed)
      LRNN_USER_ERROR("{}: a {} file, not text; {}", path.string(), packed,
                      std::string(packed) == "Parquet" ? "convert it with tools/parquet_to_shards.py"
                                                       : "decompress it first");
  }
  ~LineFile() { if (fd_ >= 0) ::close(fd_); }
  LineFile(const LineFile&) = delete;

  // The next line (without its '\n') into `line`; false at the end of the file.
  bool line(std::string& out, uint64_t max_bytes) {
    out.clear();
    line_offset_ = offset_;
    for (;;) {
      if (pos_ == buf_.size() && !fill()) {
        if (out.empty() && !partial_) return false;
        partial_ = false;
        ++line_no_;
        return true;
      }
      size_t nl = buf_.find('\n', pos_);
      size_t end = nl == std::string::npos ? buf_.size() : nl;
      if (out.size() + (end - pos_) > max_bytes)
        LRNN_USER_ERROR("{}:{}: a line longer than {} bytes (the limit of a document)", path_.string(), line_no_ + 1,
                        max_bytes);
      out.append(buf_, pos_, end - pos_);
      offset_ += end - pos_;
      pos_ = end;
      if (nl != std::string::npos) {
        ++pos_;
        ++offset_;
        ++line_no_;
        partial_ = false;
        return true;
      }
      partial_ = true;
    }
  }

  // The rest of the file into `out`.
  void rest(std::string& out, uint64_t max_bytes) {
    out.clear();
    line_offset_ = offset_;
    for (;;) {
      if (pos_ == buf_.size() && !fill()) return;
      if (out.size() + (buf_.size() - pos_) > max_bytes)
        LRNN_USER_ERROR("{}: larger than {} bytes, the limit of one document; split it into documents "
                        "(--text-unit blank-line, or JSON lines)", path_.string(), max_bytes);
      out.append(buf_, pos_, std::string::npos);
      offset_ += buf_.size() - pos_;
      pos_ = buf_.size();
    }
  }

  // Counts lines without keeping them: calls f(is_blank) per line.
  template <class F>
  void scan_lines(F&& f) {
    bool blank = true, any = false;
    for (;;) {
      if (pos_ == buf_.size() && !fill()) break;
      for (; pos_ < buf_.size(); ++pos_) {
        char c = buf_[pos_];
        if (c == '\n') {
          f(blank);
          blank = true;
          any = false;
          continue;
        }
        any = true;
        if (c != ' ' && c != '\t' && c != '\r') blank = false;
      }
    }
    if (any) f(blank);
  }

  uint64_t line_no() const { return line_no_; }        // lines returned so far
  uint64_t line_offset() const { return line_offset_; }  // file offset of the last line's first byte
  const fs::path& path() const { return path_; }

 private:
  bool fill() {
    buf_.resize(kChunk);
    pos_ = 0;
    for (;;) {
      ssize_t n = ::read(fd_, buf_.data(), kChunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) LRNN_USER_ERROR("cannot read {}: {}", path_.string(), std::generic_category().message(errno));
      buf_.resize(size_t(n));
      return n > 0;
    }
  }
  fs::path path_;
  int fd_ = -1;
  std::string buf_;
  size_t pos_ = 0;
  uint64_t offset_ = 0, line_offset_ = 0, line_no_ = 0;
  bool partial_ = false;
};

bool blank_line(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

void check_utf8(std::string_view s, const fs::path& file, uint64_t base_offset, uint64_t line) {
  size_t bad = find_invalid_utf8(s);
  if (bad == std::string_view::npos) return;
  if (line > 0)
    LRNN_USER_ERROR("{}:{}: not valid UTF-8 at byte {} of the file; lrnn reads text as UTF-8", file.string(), line,
                    base_offset + bad);
  LRNN_USER_ERROR("{}: not valid UTF-8 at byte {}; lrnn reads text as UTF-8", file.string(), base_offset + bad);
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + size_t(len) > n) return i;
    for (int k = 1; k < len; ++k) {
      unsigned d = p[i + size_t(k)];
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return i;
    i += size_t(len);
  }
  return std::string_view::npos;
}

TextUnit parse_text_unit(const std::string& s) {
  if (s == "file") return TextUnit::File;
  if (s == "blank-line") return TextUnit::BlankLine;
  LRNN_USER_ERROR("--text-unit {}: expected file or blank-line", s);
}

struct DocumentReader::Impl {
  std::vector<fs::path> inputs;
  CorpusOptions opt;
  size_t next_file = 0, cur_file = 0;
  std::unique_ptr<LineFile> f;
  bool file_done = true;
  uint64_t doc_line = 0;  // first line of the last document (0: the whole file)
  std::string line;

  bool open_next() {
    f.reset();
    if (next_file >= inputs.size()) return false;
    cur_file = next_file++;
    f = std::make_unique<LineFile>(inputs[cur_file]);
    file_done = false;
    return true;
  }

  // One document from the current file; false when the file has no more.
  bool from_file(std::string& doc) {
    const fs::path& path = inputs[cur_file];
    if (is_jsonl(path)) {
      for (;;) {
        if (!f->line(line, opt.max_document_bytes)) return false;
        if (blank_line(line)) continue;
        doc_line = f->line_no();
        check_utf8(line, path, f->line_offset(), doc_line);
        int depth = 0;
        auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json&) {
          using E = nlohmann::json::parse_event_t;
          if (ev == E::object_start || ev == E::array_start) {
            if (++depth > kMaxJsonDepth)
              LRNN_USER_ERROR("{}:{}: JSON nests deeper than {} levels", path.string(), doc_line, kMaxJsonDepth);
          } else if (ev == E::object_end || ev == E::array_end) {
            --depth;
          }
          return true;
        };
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line, cb);
        } catch (const nlohmann::json::exception& e) {
          LRNN_USER_ERROR("{}:{}: not valid JSON ({}): {}", path.string(), doc_line, e.what(), clip(line));
        }
        if (!j.is_object())
          LRNN_USER_ERROR("{}:{}: a JSON line must be an object with a string field \"{}\", got: {}", path.string(),
                          doc_line, opt.jsonl_field, clip(line));
        auto it = j.find(opt.jsonl_field);
        if (it == j.end() || !it->is_string())
          LRNN_USER_ERROR("{}:{}: no string field \"{}\" in this JSON line: {}", path.string(), doc_line,
                          opt.jsonl_field, clip(line));
        doc = it->get<std::string>();
        return true;
      }
    }
    if (opt.text_unit == TextUnit::File) {
      if (file_done) return false;
      f->rest(doc, opt.max_document_bytes);
      check_utf8(doc, path, 0, 0);
      doc_line = 0;
      file_done = true;
      return true;
    }
    // Blank-line blocks.
    doc.clear();
    bool have = false;
    for (;;) {
      if (!f->line(line, opt.max_document_bytes)) return have;
      if (blank_line(line)) {
        if (have) return true;
        continue;
      }
      check_utf8(line, path, f->line_offset(), f->line_no());
      if (!have) doc_line = f->line_no();
      if (have) doc.push_back('\n');
      if (doc.size() + line.size() > opt.max_document_bytes)
        LRNN_USER_ERROR("{}:{}: a block of lines larger than {} bytes (the limit of a document)", path.string(),
                        doc_line, opt.max_document_bytes);
      doc += line;
      have = true;
    }
  }
};

DocumentReader::DocumentReader(std::vector<fs::path> inputs, CorpusOptions opt) : p_(std::make_unique<Impl>()) {
  p_->inputs = std::move(inputs);
  p_->opt = std::move(opt);
}
DocumentReader::~DocumentReader() = default;
DocumentReader::DocumentReader(DocumentReader&&) noexcept = default;

bool DocumentReader::next(std::string& doc) {
  for (;;) {
    if (!p_->f && !p_->open_next()) return false;
    if (p_->from_file(doc)) return true;
    p_->f.reset();
  }
}

std::string DocumentReader::where() const {
  const std::string file = p_->inputs.empty() ? "" : p_->inputs[p_->cur_file].string();
  return p_->doc_line ? file + ":" + std::to_string(p_->doc_line) : file;
}

size_t DocumentReader::file_index() const { return p_->cur_file; }

uint64_t count_documents(const std::vector<fs::path>& inputs, const CorpusOptions& opt) {
  uint64_t n = 0;
  for (const auto& path : inputs) {
    LineFile f(path);
    if (is_jsonl(path)) {
      f.scan_lines([&](bool blank) { n += !blank; });
    } else if (opt.text_unit == TextUnit::File) {
      ++n;
    } else {
      bool in_block = false;
      f.scan_lines([&](bool blank) {
        if (!blank && !in_block) ++n;
        in_block = !blank;
      });
    }
  }
  return n;
}

}  // namespace lrnn::data
