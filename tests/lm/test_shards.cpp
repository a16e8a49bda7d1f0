// `lrnn tokenize` on the Shakespeare corpus and the shard reader: the shards hold every document
// as BOS tokens EOS, the validation split is whole documents disjoint from training and chosen by
// the seed, the output does not depend on the thread count, JSON lines and blank-line blocks give
// the same tokens as files, and a damaged shard, index or input is a UserError / exit 2 naming
// the file and what is wrong, never a crash.
#include <gtest/gtest.h>
#include <cstring>
#include <map>
#include <set>
#include <sys/stat.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/corpus.h"
#include "data/hash.h"
#include "data/shards.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "lm_util.h"

using namespace lrnn;
using namespace lrnn::test;
using namespace lrnn::data;

namespace {

class ShardsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("lm_shards"));
    model_ = new fs::path(train_small_tokenizer(*dir_));
    files_ = new std::vector<fs::path>(corpus_files());
    files_->resize(std::min<size_t>(files_->size(), 10));
    RunResult r = run_lrnn("tokenize --tokenizer '" + model_->string() + "' --input" + join_paths(*files_) +
                           " --out '" + (*dir_ / "data").string() + "' --val-fraction 0.2 --seed 3 --shard-tokens 50000");
    EXPECT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
    delete files_;
  }
  static fs::path data() { return *dir_ / "data"; }
  static fs::path* dir_;
  static fs::path* model_;
  static std::vector<fs::path>* files_;
};
fs::path* ShardsTest::dir_ = nullptr;
fs::path* ShardsTest::model_ = nullptr;
std::vector<fs::path>* ShardsTest::files_ = nullptr;

// The documents of a stream: the texts between BOS and EOS.
std::vector<std::string> documents(const TokenStream& s, const Tokenizer& t) {
  std::vector<int32_t> all = s.read(0, s.size());
  std::vector<std::string> out;
  size_t i = 0;
  while (i < all.size()) {
    EXPECT_EQ(all[i], t.bos_id()) << "a document starts with BOS at " << i;
    size_t j = i + 1;
    while (j < all.size() && all[j] != t.eos_id()) ++j;
    EXPECT_LT(j, all.size()) << "a document ends with EOS";
    out.push_back(t.decode(std::span<const int32_t>(all.data() + i + 1, j - i - 1)));
    i = j + 1;
  }
  return out;
}

// Every shard file of a directory, by name, concatenated with their names.
std::string shard_bytes(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") files[e.path().filename().string()] = read_text(e.path());
  std::string s;
  for (const auto& [name, bytes] : files) s += name + ":" + bytes;
  return s;
}

TEST_F(ShardsTest, IndexAndHeaders) {
  nlohmann::json idx = read_index(data());
  Tokenizer t = Tokenizer::load(*model_);
  EXPECT_EQ(idx["format"], "lrnn token shards");
  EXPECT_EQ(idx["format_version"], 1);
  EXPECT_EQ(idx["tokenizer"]["sha256"], t.sha256());
  EXPECT_EQ(idx["tokenizer"]["vocab_size"], 1000);
  EXPECT_EQ(idx["token_bytes"], 2);
  EXPECT_EQ(idx["documents"], files_->size());
  EXPECT_EQ(idx["val_documents"], 2);  // round(0.2 * 10)
  EXPECT_EQ(idx["document_layout"], "BOS tokens EOS");
  EXPECT_NE(idx["command"].get<std::string>().find("tokenize --tokenizer"), std::string::npos);
  TokenStream train = TokenStream::open(data(), "train");
  EXPECT_GT(train.shards().size(), 3u) << "--shard-tokens 50000 cuts the training split into several files";
  uint64_t total = 0, docs = 0;
  for (size_t i = 0; i < train.shards().size(); ++i) {
    const ShardHeader& h = train.shards()[i].header();
    EXPECT_EQ(h.shard_index, i);
    EXPECT_EQ(h.split, SplitKind::Train);
    EXPECT_EQ(h.vocab_size, 1000u);
    EXPECT_EQ(h.token_bytes, 2u);
    EXPECT_EQ(to_hex(h.tokenizer_sha256, 32), t.sha256());
    if (i + 1 < train.shards().size()) {
      EXPECT_EQ(h.num_tokens, 50000u);
    }
    EXPECT_EQ(fs::file_size(train.shards()[i].path()), 128 + 2 * h.num_tokens);
    total += h.num_tokens;
    docs += h.num_documents;
  }
  EXPECT_EQ(total, train.size());
  EXPECT_EQ(total, idx["splits"]["train"]["tokens"].get<uint64_t>());
  EXPECT_EQ(docs, files_->size() - 2);
  // Reading across shard boundaries equals reading each shard.
  std::vector<int32_t> across = train.read(49990, 20), parts(20);
  train.shards()[0].copy(49990, 10, parts.data());
  train.shards()[1].copy(0, 10, parts.data() + 10);
  EXPECT_EQ(across, parts);
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the CRC-32 check value (zlib's)
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(ShardsTest, EveryDocumentOnceAndValidationDisjoint) {
  Tokenizer t = Tokenizer::load(*model_);
  TokenStream train = TokenStream::open(data(), "train"), val = TokenStream::open(data(), "val");
  auto tr = documents(train, t), va = documents(val, t);
  ASSERT_EQ(va.size(), 2u);
  ASSERT_EQ(tr.size() + va.size(), files_->size());
  std::multiset<std::string> got(tr.begin(), tr.end()), want;
  got.insert(va.begin(), va.end());
  for (const auto& f : *files_) want.insert(read_text(f));
  EXPECT_TRUE(got == want) << "train + val must be exactly the input documents, each once";
  for (const auto& v : va) EXPECT_EQ(std::count(tr.begin(), tr.end(), v), 0) << "a validation document is in train";
  // The validation documents are the seed's choice, in input order.
  auto chosen = validation_documents(files_->size(), 0.2, 3);
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(va[0], read_text((*files_)[chosen[0]]));
  EXPECT_EQ(va[1], read_text((*files_)[chosen[1]]));
  EXPECT_NE(validation_documents(files_->size(), 0.2, 4), chosen);
  EXPECT_EQ(validation_documents(1000, 0.01, 3).size(), 10u);
  EXPECT_EQ(validation_documents(10, 0.01, 3).size(), 1u);  // at least one
  EXPECT_TRUE(validation_documents(10, 0.0, 3).empty());
  EXPECT_THROW(validation_documents(1, 0.1, 3), UserError);
}

TEST_F(ShardsTest, OutputIndependentOfThreadsAndInputForm) {
  const fs::path a = *dir_ / "t1", b = *dir_ / "t2", c = *dir_ / "jsonl", d = *dir_ / "blocks";
  std::vector<fs::path> few(files_->begin(), files_->begin() + 6);
  const std::string base = "tokenize --tokenizer '" + model_->string() + "' --val-fraction 0.2 --seed 5 --shard-tokens 150000";
  RunResult r = run_lrnn(base + " --threads 1 --input" + join_paths(few) + " --out '" + a.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_lrnn(base + " --threads 2 --input" + join_paths(few) + " --out '" + b.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(shard_bytes(a), shard_bytes(b));
  // The same documents as JSON lines (two files) and as blank-line blocks of one file.
  std::string j1, j2, blocks;
  for (size_t i = 0; i < few.size(); ++i) {
    std::string text = read_text(few[i]);
    (i < 3 ? j1 : j2) += nlohmann::json{{"id", i}, {"text", text}}.dump() + "\n";
  }
  j1 += "\n";  // blank lines are not documents
  write_text(*dir_ / "a.jsonl", j1);
  write_text(*dir_ / "b.jsonl", j2);
  r = run_lrnn(base + " --input '" + (*dir_ / "a.jsonl").string() + "' '" + (*dir_ / "b.jsonl").string() + "' --out '" +
               c.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(shard_bytes(a), shard_bytes(c));
  // Blank-line blocks: paragraphs as documents.
  write_text(*dir_ / "blocks.txt", "first  block\nline two\n\n \t\n\nsecond block\r\n\nthird");
  r = run_lrnn("tokenize --tokenizer '" + model_->string() + "' --val-fraction 0 --text-unit blank-line --input '" +
               (*dir_ / "blocks.txt").string() + "' --out '" + d.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  Tokenizer t = Tokenizer::load(*model_);
  auto docs = documents(TokenStream::open(d, "train"), t);
  EXPECT_EQ(docs, (std::vector<std::string>{"first  block\nline two", "second block\r", "third"}));
  // A second tokenize into a directory with an index needs --force; with it, stale shards go.
  r = run_lrnn(base + " --input" + join_paths(few) + " --out '" + a.string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  r = run_lrnn("tokenize --tokenizer '" + model_->string() + "' --val-fraction 0 --shard-tokens 10000000 --force --input" +
               join_paths(few) + " --out '" + a.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(a / "train_000000.bin"));
  EXPECT_FALSE(fs::exists(a / "train_000001.bin"));
  EXPECT_FALSE(fs::exists(a / "val_000000.bin"));
  EXPECT_FALSE(read_index(a)["splits"].contains("val"));
}

// Copies the data directory so a test can damage it.
fs::path copy_data(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to);
  return to;
}

void expect_open_error(const fs::path& dir, const std::string& split, const std::string& needle, const std::string& file) {
  try {
    TokenStream::open(dir, split);
    ADD_FAILURE() << "opened a damaged " << dir;
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find(file), std::string::npos) << m;
  }
}

TEST_F(ShardsTest, DamagedShardsAreUserErrors) {
  const fs::path shard = "train_000001.bin";
  auto damage = [&](const std::string& name, auto edit) {
    fs::path d = copy_data(data(), *dir_ / name);
    std::string b = read_text(d / shard);
    edit(b);
    write_text(d / shard, b);
    return d;
  };
  auto put32 = [](std::string& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); };
  expect_open_error(damage("trunc", [](std::string& b) { b.resize(b.size() - 7); }), "train", "truncated", shard.string());
  expect_open_error(damage("trunc_header", [](std::string& b) { b.resize(50); }), "train", "shorter than the 128-byte header",
                    shard.string());
  expect_open_error(damage("magic", [](std::string& b) { b[0] = 'X'; }), "train", "magic", shard.string());
  expect_open_error(damage("version", [&](std::string& b) { put32(b, 8, 2); }), "train", "format version 2", shard.string());
  expect_open_error(damage("width", [&](std::string& b) { put32(b, 32, 3); }), "train", "token width", shard.string());
  expect_open_error(damage("reserved", [](std::string& b) { b[100] = 1; }), "train", "reserved header byte", shard.string());
  expect_open_error(damage("count", [](std::string& b) { b[16] ^= 1; }), "train", "tokens of 2 bytes", shard.string());
  expect_open_error(damage("flip", [](std::string& b) { b[5000] ^= 0x40; }), "train", "CRC-32", shard.string());
  // A token outside the vocabulary with a matching CRC (a crafted file): refused too.
  auto crafted = [&](std::string& b) {
    b[128 + 2 * 10] = char(0xff);
    b[128 + 2 * 10 + 1] = char(0xff);
    put32(b, 40, crc32(b.data() + 128, b.size() - 128));
  };
  fs::path d = damage("crafted", crafted);
  try {
    TokenStream::open(d, "train");
    ADD_FAILURE() << "opened a shard with token 65535 of a vocabulary of 1000";
  } catch (const UserError& e) {
    std::string m = e.what();
    // The CRC in the index no longer matches: either check names the file.
    EXPECT_NE(m.find(shard.string()), std::string::npos) << m;
  }
  // Opened with header checks only, the sampler's reads still refuse that token.
  Shard s = Shard::open(d / shard, Verify::Header);
  std::vector<int32_t> out(20);
  EXPECT_THROW(s.copy(0, 20, out.data()), UserError);
  EXPECT_THROW(Shard::open(d / shard, Verify::Full), UserError);
}

TEST_F(ShardsTest, DamagedIndexAndDirectoriesAreUserErrors) {
  auto with_index = [&](const std::string& name, const std::string& text) {
    fs::path d = copy_data(data(), *dir_ / name);
    write_text(d / "index.json", text);
    return d;
  };
  expect_open_error(*dir_ / "nowhere", "train", "no such tokenized data directory", "nowhere");
  fs::path noidx = copy_data(data(), *dir_ / "noidx");
  fs::remove(noidx / "index.json");
  expect_open_error(noidx, "train", "no index.json", "noidx");
  expect_open_error(with_index("notjson", "{not json"), "train", "not valid JSON", "index.json");
  expect_open_error(with_index("deep", std::string(100, '[') + std::string(100, ']')), "train", "deeper", "index.json");
  nlohmann::json idx = read_index(data());
  nlohmann::json v2 = idx;
  v2["format_version"] = 2;
  expect_open_error(with_index("v2", v2.dump()), "train", "format_version 2", "index.json");
  nlohmann::json escape = idx;
  escape["splits"]["train"]["shards"][0]["file"] = "../data/train_000000.bin";
  expect_open_error(with_index("escape", escape.dump()), "train", "not a plain file name", "index.json");
  nlohmann::json count = idx;
  count["splits"]["train"]["shards"][0]["tokens"] = 5;
  expect_open_error(with_index("count", count.dump()), "train", "replaced after the index", "train_000000.bin");
  nlohmann::json swapped = idx;
  std::swap(swapped["splits"]["train"]["shards"][0], swapped["splits"]["train"]["shards"][1]);
  expect_open_error(with_index("swapped", swapped.dump()), "train", "listed as number 0", "train_000001.bin");
  nlohmann::json noval = idx;
  noval["splits"].erase("val");
  expect_open_error(with_index("noval", noval.dump()), "val", "no val split", "index.json");
  // A shard that is a directory, or missing.
  fs::path dirshard = copy_data(data(), *dir_ / "dirshard");
  fs::remove(dirshard / "train_000002.bin");
  expect_open_error(dirshard, "train", "cannot open token shard", "train_000002.bin");
  fs::create_directory(dirshard / "train_000002.bin");
  expect_open_error(dirshard, "train", "not a regular file", "train_000002.bin");
}

TEST_F(ShardsTest, BadInputsExitTwoNamingTheFile) {
  const fs::path d = *dir_ / "inputs";
  fs::create_directories(d);
  const std::string base = "tokenize --tokenizer '" + model_->string() + "' --val-fraction 0 --out '" + (d / "o").string() + "' --input ";
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    RunResult r = run_lrnn(base + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
  };
  expect_error("'" + (d / "missing.txt").string() + "'", "missing.txt: no such input file");
  expect_error("'" + d.string() + "'", "not a regular file");
  write_text(d / "bad.txt", "fine\nstill fine\nnot \xc3\x28 fine\n");
  expect_error("'" + (d / "bad.txt").string() + "'", "bad.txt: not valid UTF-8 at byte 20");
  write_text(d / "bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no text field\"}\n");
  expect_error("'" + (d / "bad.jsonl").string() + "'", "bad.jsonl:2: no string field \"text\"");
  write_text(d / "broken.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  expect_error("'" + (d / "broken.jsonl").string() + "'", "broken.jsonl:3: not valid JSON");
  write_text(d / "packed.txt", std::string("\x1f\x8b\x08\x00", 4) + "rest");
  expect_error("'" + (d / "packed.txt").string() + "'", "packed.txt: a gzip file, not text");
  write_text(d / "one.txt", "only one document");
  RunResult r = run_lrnn("tokenize --tokenizer '" + model_->string() + "' --val-fraction 0.1 --out '" + (d / "o").string() +
                         "' --input '" + (d / "one.txt").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("leaves no document to train on"), std::string::npos) << r.out;
  r = run_lrnn("tokenize --tokenizer '" + (d / "nope.model").string() + "' --out '" + (d / "o").string() +
               "' --input '" + (d / "one.txt").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("nope.model"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "o" / "index.json"));
  // Document limits: a line longer than the limit of a document (library: a small limit).
  CorpusOptions small;
  small.max_document_bytes = 10;
  write_text(d / "long.jsonl", "{\"text\": \"this line is longer than ten bytes\"}\n");
  DocumentReader rd({d / "long.jsonl"}, small);
  std::string doc;
  EXPECT_THROW(rd.next(doc), UserError);
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);  // a surrogate
  EXPECT_EQ(find_invalid_utf8("ok\xc0\xaf"), 2u);      // an overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("Größe 東京 🙂"), std::string_view::npos);
}


// A shard made by hand (the format of docs/DATA.md): header, then the tokens little-endian.
std::string make_shard(uint32_t vocab, SplitKind split, uint64_t index, const std::vector<uint32_t>& toks,
                       uint64_t docs, uint8_t sha_byte = 0xab) {
  ShardHeader h;
  h.vocab_size = vocab;
  h.token_bytes = token_bytes_for(vocab);
  h.split = split;
  h.shard_index = index;
  h.num_tokens = toks.size();
  h.num_documents = docs;
  std::memset(h.tokenizer_sha256, sha_byte, 32);
  std::string payload;
  for (uint32_t t : toks)
    for (uint32_t k = 0; k < h.token_bytes; ++k) payload.push_back(char(t >> (8 * k)));
  h.payload_crc32 = crc32(payload.data(), payload.size());
  return h.encode() + payload;
}

// Vocabularies over 65536 take 4 bytes a token (no tokenizer that large is trained in a test: the
// shards are made by hand). Tokens cross the shard boundary, the sampler reads them, and a token
// at or above the vocabulary is refused even with a matching CRC.
TEST(HandMadeShards, FourByteTokens) {
  const fs::path d = temp_dir("lm_wide");
  const uint32_t vocab = 70000;
  std::vector<uint32_t> a, b;
  for (uint32_t i = 0; i < 300; ++i) a.push_back((i * 7919u) % vocab);
  for (uint32_t i = 0; i < 200; ++i) b.push_back(vocab - 1 - i);
  const std::string sa = make_shard(vocab, SplitKind::Train, 0, a, 1), sb = make_shard(vocab, SplitKind::Train, 1, b, 0);
  EXPECT_EQ(sa.size(), 128u + 4 * 300);
  write_text(d / "train_000000.bin", sa);
  write_text(d / "train_000001.bin", sb);
  nlohmann::json shards = nlohmann::json::array();
  shards.push_back({{"file", "train_000000.bin"}, {"tokens", 300}, {"crc32", Shard::open(d / "train_000000.bin").header().payload_crc32}});
  shards.push_back({{"file", "train_000001.bin"}, {"tokens", 200}, {"crc32", Shard::open(d / "train_000001.bin").header().payload_crc32}});
  nlohmann::json idx = {{"format", "lrnn token shards"},
                        {"format_version", 1},
                        {"tokenizer", {{"sha256", to_hex(std::vector<uint8_t>(32, 0xab).data(), 32)},
                                       {"vocab_size", vocab}}},
                        {"splits", {{"train", {{"shards", shards}}}}}};
  write_text(d / "index.json", idx.dump());
  TokenStream s = TokenStream::open(d, "train");
  ASSERT_EQ(s.size(), 500u);
  EXPECT_EQ(s.vocab_size(), vocab);
  std::vector<int32_t> got = s.read(295, 10);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(uint32_t(got[size_t(i)]), a[size_t(295 + i)]);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(uint32_t(got[size_t(5 + i)]), b[size_t(i)]);
  PackedSampler p(s, 16, 1);
  Batch bt = p.batch(0, 4);
  EXPECT_EQ(bt.tokens.size(), 64u);
  // Token 70000 with a CRC that matches: the full check refuses the shard, the header-only one
  // opens it and the read refuses the token.
  std::vector<uint32_t> bad = a;
  bad[17] = vocab;
  write_text(d / "bad.bin", make_shard(vocab, SplitKind::Train, 0, bad, 1));
  try {
    Shard::open(d / "bad.bin");
    ADD_FAILURE() << "a token outside the vocabulary was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token 70000 at position 17"), std::string::npos) << e.what();
  }
  Shard h = Shard::open(d / "bad.bin", Verify::Header);
  std::vector<int32_t> out(20);
  EXPECT_NO_THROW(h.copy(0, 17, out.data()));
  EXPECT_THROW(h.copy(10, 10, out.data()), UserError);
  // The wrong width for the vocabulary: 2-byte tokens claimed for 70000.
  std::string narrow = sa;
  uint32_t two = 2;
  std::memcpy(narrow.data() + 32, &two, 4);
  write_text(d / "narrow.bin", narrow);
  EXPECT_THROW(Shard::open(d / "narrow.bin"), UserError);
  fs::remove_all(d);
}

// index.json values of the wrong type or shape are UserErrors, never a JSON library exception.
TEST_F(ShardsTest, HostileIndexValues) {
  nlohmann::json idx = read_index(data());
  auto expect_refused = [&](const std::string& name, const nlohmann::json& j, const std::string& needle) {
    fs::path d = copy_data(data(), *dir_ / name);
    write_text(d / "index.json", j.dump());
    expect_open_error(d, "train", needle, "index.json");
  };
  nlohmann::json j = idx;
  j["format"] = 5;
  expect_refused("fmt_number", j, "\"format\" is not");
  j = idx;
  j["format_version"] = "1";
  expect_refused("ver_string", j, "format_version");
  j = idx;
  j["format_version"] = -1;
  expect_refused("ver_negative", j, "format_version");
  j = idx;
  j["splits"] = nlohmann::json::array();
  expect_refused("splits_array", j, "splits");
  j = idx;
  j["splits"]["train"]["shards"][0]["file"] = std::string("train_000000.bin\0x", 18);
  expect_refused("nul_name", j, "not a plain file name");
  j = idx;
  j["splits"]["train"]["shards"][0]["tokens"] = -5;
  expect_refused("neg_tokens", j, "a shard entry needs");
  j = idx;
  j["splits"]["train"]["shards"][0]["crc32"] = 1.5;
  expect_refused("float_crc", j, "a shard entry needs");
  j = idx;
  j["splits"]["train"]["shards"] = nlohmann::json::array();
  expect_refused("no_shards", j, "has no shards");
  j = idx;
  j["tokenizer"]["sha256"] = std::string(64, '0');
  expect_refused("other_tokenizer", j, "written with tokenizer sha256");
  j = idx;
  j["tokenizer"]["vocab_size"] = 999;
  expect_refused("other_vocab", j, "vocabulary 1000");
  expect_refused("not_object", nlohmann::json::array({1, 2}), "not a JSON object");
}

// `lrnn shards --dir`: both splits read back with the full check; a damaged shard is exit 2.
TEST_F(ShardsTest, ShardsCommandChecksADirectory) {
  RunResult r = run_lrnn("shards --dir '" + data().string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  nlohmann::json idx = read_index(data());
  EXPECT_EQ(j["train"]["tokens"], idx["splits"]["train"]["tokens"]);
  EXPECT_EQ(j["train"]["shards"], idx["splits"]["train"]["shards"].size());
  EXPECT_EQ(j["val"]["documents"], 2);
  EXPECT_EQ(j["train"]["documents"], files_->size() - 2);
  fs::path d = copy_data(data(), *dir_ / "cmd_damaged");
  std::string b = read_text(d / "val_000000.bin");
  b[200] ^= 1;
  write_text(d / "val_000000.bin", b);
  r = run_lrnn("shards --dir '" + d.string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("val_000000.bin: not a valid lrnn token shard: the tokens' CRC-32"), std::string::npos) << r.out;
  r = run_lrnn("shards --dir '" + (*dir_ / "nowhere").string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
}

TEST_F(ShardsTest, TokenizeLimitsExitTwo) {
  const fs::path d = *dir_ / "limits";
  fs::create_directories(d);
  write_text(d / "a.txt", "some text");
  const std::string base = "tokenize --tokenizer '" + model_->string() + "' --val-fraction 0 --input '" + (d / "a.txt").string() +
                           "' --out '" + (d / "o").string() + "'";
  for (const char* bad : {" --shard-tokens 0", " --shard-tokens 2000000000", " --val-fraction 0.7", " --threads -1",
                          " --text-unit lines"}) {
    RunResult r = run_lrnn(base + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
  }
  RunResult r = run_lrnn("tokenizer encode --tokenizer '" + model_->string() + "' --text \"$(printf 'caf\\351')\"");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("not valid UTF-8 at byte 3"), std::string::npos) << r.out;
  r = run_lrnn(base);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"train_tokens\""), std::string::npos) << r.out;
}

}  // namespace
