// SentencePiece tokenizers: `lrnn tokenizer train` on the Shakespeare corpus is deterministic,
// encode -> decode gives back every text of the corpus byte for byte, the special ids are where
// lrnn puts them, and a missing, non-regular, empty, garbage, truncated or mutated model file is
// a clear error (exit 2 naming the file), never a crash.
#include <gtest/gtest.h>
#include <cstring>
#include <random>
#include <sys/stat.h>

#include "core/check.h"
#include "data/tokenizer.h"
#include "lm_util.h"

using namespace lrnn;
using namespace lrnn::test;
using lrnn::data::Tokenizer;

namespace {

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("lm_tokenizer"));
    model_ = new fs::path(train_small_tokenizer(*dir_));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  static fs::path* dir_;
  static fs::path* model_;
};
fs::path* TokenizerTest::dir_ = nullptr;
fs::path* TokenizerTest::model_ = nullptr;

TEST_F(TokenizerTest, TrainingIsDeterministic) {
  auto files = corpus_files();
  ASSERT_GE(files.size(), kTokenizerFiles);
  files.resize(kTokenizerFiles);
  const fs::path again = *dir_ / "again.model";
  RunResult r = run_lrnn("tokenizer train --input" + join_paths(files) + " --vocab-size 1000 --out '" + again.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(*model_), read_text(again)) << "same inputs and options must give a byte-identical model";
  // The same through the library, and unigram twice.
  data::TokenizerTrainOptions o;
  o.vocab_size = 500;
  o.model_type = "unigram";
  std::vector<fs::path> few(files.begin(), files.begin() + 2);
  auto a = data::train_tokenizer(few, o), b = data::train_tokenizer(few, o);
  EXPECT_EQ(a.model, b.model);
  // A seeded sample of the lines: the seed decides which, and the same seed the same model.
  o.model_type = "bpe";
  o.max_sentences = 3000;
  auto s1 = data::train_tokenizer(few, o), s2 = data::train_tokenizer(few, o);
  o.seed = 1;
  auto s3 = data::train_tokenizer(few, o);
  EXPECT_EQ(s1.lines_used, 3000u);
  EXPECT_GT(s1.lines, 3000u);
  EXPECT_EQ(s1.model, s2.model);
  EXPECT_NE(s1.model, s3.model);
}

TEST_F(TokenizerTest, SpecialIdsAndPieces) {
  Tokenizer t = Tokenizer::load(*model_);
  EXPECT_EQ(t.vocab_size(), 1000);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), 3);
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(2), "</s>");
  EXPECT_EQ(t.piece(3), "<pad>");
  EXPECT_TRUE(t.is_control(1));
  EXPECT_TRUE(t.is_byte(4 + 0x0A));  // byte fallback: <0x00>..<0xFF> follow the specials
  EXPECT_EQ(t.piece(4 + 0x0A), "<0x0A>");
  EXPECT_EQ(t.sha256().size(), 64u);
  EXPECT_THROW(t.piece(1000), UserError);
  EXPECT_THROW(t.piece(-1), UserError);
  // A newline is one byte piece; BOS/EOS decode to nothing; ids outside the vocabulary are refused.
  auto ids = t.encode("a\nb");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 4 + 0x0A), ids.end());
  std::vector<int32_t> with = {1};
  with.insert(with.end(), ids.begin(), ids.end());
  with.push_back(2);
  EXPECT_EQ(t.decode(with), "a\nb");
  std::vector<int32_t> bad = {5, 1000};
  EXPECT_THROW(t.decode(bad), UserError);
}

TEST_F(TokenizerTest, RoundTripOnTheWholeCorpus) {
  Tokenizer t = Tokenizer::load(*model_);
  // Every third play of both editions (the whole corpus takes seconds; a third shows the same).
  auto all = corpus_files();
  auto folio = corpus_files("_gut_f.txt");
  all.insert(all.end(), folio.begin(), folio.end());
  ASSERT_GE(all.size(), 70u);
  std::vector<fs::path> files;
  for (size_t i = 0; i < all.size(); i += 3) files.push_back(all[i]);
  size_t bytes = 0, tokens = 0;
  for (const auto& f : files) {
    const std::string text = read_text(f);
    auto ids = t.encode(text);
    ASSERT_EQ(t.decode(ids), text) << f << ": encode -> decode must give the text back byte for byte";
    bytes += text.size();
    tokens += ids.size();
  }
  // Text the tokenizer never saw: other scripts, emoji, control characters, leading and repeated spaces.
  for (std::string s : {std::string("  two  spaces\tand a tab\r\n"), std::string("Größe, café, 東京, 🙂, \x01 end"),
                        std::string(" "), std::string("\n\n"), std::string("x")}) {
    EXPECT_EQ(t.decode(t.encode(s)), s);
  }
  EXPECT_GT(double(bytes) / double(tokens), 2.0) << "a 1000-piece BPE should do better than 2 bytes per token";
}

TEST_F(TokenizerTest, BadModelFilesAreUserErrors) {
  auto expect_user_error = [](const fs::path& p, const std::string& needle) {
    try {
      Tokenizer::load(p);
      ADD_FAILURE() << p << " loaded";
    } catch (const UserError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(p.string()), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  const fs::path d = *dir_;
  expect_user_error(d / "missing.model", "no such tokenizer file");
  fs::create_directories(d / "adir.model");
  expect_user_error(d / "adir.model", "not a regular file");
  write_text(d / "empty.model", "");
  expect_user_error(d / "empty.model", "not a SentencePiece model");
  write_text(d / "garbage.model", "this is not a protobuf \xff\xfe\x00\x01 at all");
  expect_user_error(d / "garbage.model", "not a SentencePiece model");
  const std::string good = read_text(*model_);
  write_text(d / "truncated.model", good.substr(0, good.size() / 2));
  expect_user_error(d / "truncated.model", "not a SentencePiece model");
  ASSERT_EQ(mkfifo((d / "fifo.model").c_str(), 0600), 0);
  expect_user_error(d / "fifo.model", "not a regular file");
}

// Random damage to a good model: every variant either loads (and then encodes and decodes without
// crashing) or is a UserError. Never an abort or a crash.
TEST_F(TokenizerTest, MutatedModelsNeverCrash) {
  const std::string good = read_text(*model_);
  std::mt19937_64 rng(7);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string m = good;
    const int kind = i % 3;
    if (kind == 0) {  // flip a few bytes
      for (int k = 0; k < 1 + int(rng() % 4); ++k) m[rng() % m.size()] = char(rng());
    } else if (kind == 1) {  // truncate
      m.resize(rng() % m.size());
    } else {  // splice a random block of bytes in
      std::string junk(1 + rng() % 64, '\0');
      for (auto& c : junk) c = char(rng());
      m.insert(rng() % m.size(), junk);
    }
    try {
      Tokenizer t = Tokenizer::from_bytes(m, "mutated.model");
      ++loaded;
      try {
        auto ids = t.encode("To be, or not to be: that is the question.\n");
        (void)t.decode(ids);
      } catch (const UserError&) {
      }
    } catch (const UserError&) {
      ++refused;
    }
  }
  EXPECT_EQ(loaded + refused, 300);
  EXPECT_GT(refused, 0);
}

// Protobuf wire format, enough to append fields to a serialized ModelProto (a repeated field
// gets one more element; a message field that appears again is merged, its bytes fields replaced).
std::string varint(uint64_t v) {
  std::string s;
  do {
    s.push_back(char((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v);
  return s;
}
std::string field(uint32_t number, const std::string& bytes) { return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes; }
// A normalizer_spec (ModelProto field 3) holding only a precompiled_charsmap (its field 2).
std::string with_charsmap(const std::string& model, const std::string& charsmap) {
  return model + field(3, field(2, charsmap));
}
std::string charsmap(const std::vector<uint32_t>& units, const std::string& strings) {
  std::string s(4 + 4 * units.size(), '\0');
  const uint32_t bytes = uint32_t(4 * units.size());
  std::memcpy(s.data(), &bytes, 4);
  if (!units.empty()) std::memcpy(s.data() + 4, units.data(), 4 * units.size());
  return s + strings;
}

// Found by fuzz/fuzz_tokenizer.cpp: a unigram model whose piece starts with (or holds) a NUL byte
// made SentencePiece's trie builder throw through the library, which terminated the process.
// Such files are now refused before SentencePiece sees them, as are normalisation rules whose
// precompiled trie would be read outside its bounds; a well-formed rule still loads.
TEST_F(TokenizerTest, ModelsSentencePieceWouldCrashOnAreUserErrors) {
  auto files = corpus_files();
  ASSERT_GE(files.size(), 2u);
  data::TokenizerTrainOptions o;
  o.vocab_size = 400;
  o.model_type = "unigram";
  const std::string uni = data::train_tokenizer({files[0]}, o).model;
  ASSERT_NO_THROW(Tokenizer::from_bytes(uni, "uni.model"));
  auto expect_refused = [](const std::string& bytes, const std::string& needle) {
    try {
      Tokenizer::from_bytes(bytes, "crafted.model");
      ADD_FAILURE() << "loaded a model with " << needle;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("crafted.model: not a SentencePiece model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // A normal piece ("\xe2\x96\x81" is the word boundary) with its first byte set to NUL, and one
  // with a NUL inside; a piece that is not UTF-8; an empty piece appended.
  const size_t at = uni.find("\xe2\x96\x81th");
  ASSERT_NE(at, std::string::npos);
  std::string nul_first = uni, nul_inside = uni, latin1 = uni;
  nul_first[at] = '\0';
  nul_inside[at + 3] = '\0';
  latin1[at] = char(0xff);
  expect_refused(nul_first, "holds a NUL byte");
  expect_refused(nul_inside, "holds a NUL byte");
  expect_refused(latin1, "is not valid UTF-8");
  expect_refused(uni + field(1, field(1, "")), "is empty");
  expect_refused(uni + field(1, ""), "is empty");
  expect_refused(uni + std::string("\x0a\xff", 2), "broken protobuf data");
  // Normalisation rules (the trie SentencePiece indexes without bounds checks).
  std::vector<uint32_t> zeros(256, 0);
  expect_refused(with_charsmap(uni, "abc"), "a normalisation rule of 3 bytes");
  std::string claims = charsmap(zeros, std::string(1, '\0'));
  const uint32_t too_many = 4 * 300;
  std::memcpy(claims.data(), &too_many, 4);
  expect_refused(with_charsmap(uni, claims), "whose trie claims 1200");
  expect_refused(with_charsmap(uni, charsmap(zeros, "x")), "do not end with NUL");
  std::vector<uint32_t> outside = zeros;
  outside[0] = 256u << 10;  // the root's children at 256 ^ c: past the 256 units
  expect_refused(with_charsmap(uni, charsmap(outside, std::string(1, '\0'))), "trie unit 0 points outside it");
  std::vector<uint32_t> leaf = zeros;
  leaf[5] = 5u | (1u << 8);  // label 5, a leaf, offset 0: its value is unit 5's own, 261, past the 1 string byte
  expect_refused(with_charsmap(uni, charsmap(leaf, std::string(1, '\0'))), "points outside its strings");
  // An all-zero trie of one block is a well-formed rule that changes nothing.
  Tokenizer t = Tokenizer::from_bytes(with_charsmap(uni, charsmap(zeros, std::string(1, '\0'))), "zeros.model");
  const std::string text = "To be, or not to be: that is the question.";
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.encode(text), Tokenizer::from_bytes(uni, "uni.model").encode(text));
}

TEST_F(TokenizerTest, CliErrorsExitTwoNamingTheFile) {
  const fs::path d = *dir_;
  write_text(d / "junk.model", "junk");
  RunResult r = run_lrnn("tokenizer info --tokenizer '" + (d / "junk.model").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("junk.model"), std::string::npos) << r.out;
  r = run_lrnn("tokenizer encode --tokenizer '" + (d / "nope.model").string() + "' --text hi");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("nope.model"), std::string::npos) << r.out;
  // Training inputs: missing, not text, not valid UTF-8; a vocabulary too large for the text.
  r = run_lrnn("tokenizer train --input '" + (d / "none.txt").string() + "' --vocab-size 500 --out '" +
               (d / "x.model").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("none.txt"), std::string::npos) << r.out;
  write_text(d / "latin1.txt", "caf\xe9 au lait\n");
  r = run_lrnn("tokenizer train --input '" + (d / "latin1.txt").string() + "' --vocab-size 500 --out '" +
               (d / "x.model").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("latin1.txt: not valid UTF-8 at byte 3"), std::string::npos) << r.out;
  write_text(d / "tiny.txt", "a tiny text\n");
  r = run_lrnn("tokenizer train --input '" + (d / "tiny.txt").string() + "' --vocab-size 5000 --out '" +
               (d / "x.model").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("Vocabulary size"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "x.model"));
  // info and encode on the good model.
  r = run_lrnn("tokenizer info --tokenizer '" + model_->string() + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"vocab_size\":1000"), std::string::npos) << r.out;
  r = run_lrnn("tokenizer decode --tokenizer '" + model_->string() + "' --ids '1 4000'");
  EXPECT_EQ(r.code, 2) << r.out;
}

}  // namespace
