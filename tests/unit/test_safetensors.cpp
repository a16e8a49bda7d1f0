#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <sys/stat.h>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/safetensors.h"

using namespace lrnn;
using namespace lrnn::io;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          fmt::format("lrnn_st_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

// A file as PyTorch's safetensors would write it: u64 length, header padded to 8, data.
std::string make_file(std::string header, std::string_view data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data);
}

std::string le_u64(uint64_t n) { std::string s(8, '\0'); std::memcpy(s.data(), &n, 8); return s; }

void expect_user_error(std::string_view bytes, const std::string& needle = "") {
  try {
    parse_safetensors(bytes, "test.st");
    ADD_FAILURE() << "accepted hostile input (expected: " << needle << ")";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[safetensors] test.st: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
  }
}

SafeTensors sample() {
  SafeTensors st;
  st.metadata["step"] = "42";
  st.add_values<float>("w", {2, 3}, {1, 2, 3, 4, 5, -6.5f});
  st.add_values<double>("d", {3}, {0.1, -1e300, 3.0});
  std::vector<bf16> h = {bf16::from_float(1.5f), bf16::from_float(-0.25f)};
  st.add("h", DType::BF16, {2}, h.data());
  st.add_values<int64_t>("step", {}, {int64_t(1) << 40});  // scalar
  st.add_values<int32_t>("ids", {2, 2}, {-1, 0, 7, 2147483647});
  st.add_values<float>("empty", {0, 4}, {});  // zero-size
  return st;
}

}  // namespace

TEST(SafeTensors, RoundTripAllDtypes) {
  const std::string bytes = serialize_safetensors(sample());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');

  const SafeTensors st = parse_safetensors(bytes, "mem");
  EXPECT_EQ(st.metadata.at("format"), "pt");
  EXPECT_EQ(st.metadata.at("step"), "42");
  ASSERT_EQ(st.tensors.size(), 6u);
  const char* order[] = {"w", "d", "h", "step", "ids", "empty"};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(st.tensors[i].name, order[i]);

  EXPECT_EQ(st.at("w").dtype, DType::F32);
  EXPECT_EQ(st.at("w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(st.at("w").to_f32(), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  EXPECT_EQ(st.at("d").to_f64(), (std::vector<double>{0.1, -1e300, 3.0}));
  EXPECT_EQ(st.at("h").dtype, DType::BF16);
  EXPECT_EQ(st.at("h").to_f32(), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_TRUE(st.at("step").shape.empty());
  EXPECT_EQ(st.at("step").to_i64(), (std::vector<int64_t>{int64_t(1) << 40}));
  EXPECT_EQ(st.at("ids").to_i64(), (std::vector<int64_t>{-1, 0, 7, 2147483647}));
  EXPECT_EQ(st.at("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(st.at("empty").data.empty());
  EXPECT_EQ(serialize_safetensors(st), bytes);  // stable under re-serialization
}

TEST(SafeTensors, AccessorsRejectWrongDtypes) {
  const SafeTensors st = parse_safetensors(serialize_safetensors(sample()), "mem");
  EXPECT_THROW(st.at("ids").to_f32(), UserError);
  EXPECT_THROW(st.at("w").to_i64(), UserError);
  EXPECT_THROW(st.at("nope"), UserError);
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_EQ(st.at("d").to_f32()[2], 3.0f);  // F64 narrows to f32
}

TEST(SafeTensors, F16Conversion) {
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), +inf
  std::vector<uint16_t> h = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
  SafeTensors st;
  st.add("h", DType::F16, {5}, h.data());
  auto v = parse_safetensors(serialize_safetensors(st), "mem").at("h").to_f64();
  EXPECT_EQ(v, (std::vector<double>{1.0, -2.0, 65504.0, std::ldexp(1.0, -24), INFINITY}));
}

TEST(SafeTensors, WriterRejectsDuplicateAndReservedNames) {
  SafeTensors st;
  st.add_values<float>("a", {1}, {1});
  st.add_values<float>("a", {1}, {2});
  EXPECT_THROW(serialize_safetensors(st), UserError);
  SafeTensors r;
  r.add_values<float>("__metadata__", {1}, {1});
  EXPECT_THROW(serialize_safetensors(r), UserError);
}

// Bytes exactly as `safetensors.torch.save({"x": torch.tensor([1.0, -2.0])}, metadata=...)`
// writes them (checked against safetensors 0.8.0).
TEST(SafeTensors, GoldenBytesMatchPyTorch) {
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);  // 1.0f, -2.0f
  const std::string plain = std::string("\x38\0\0\0\0\0\0\0", 8) +
                            R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + "  " + data;
  ASSERT_EQ(plain.size(), 72u);
  SafeTensors st = parse_safetensors(plain, "golden");
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(st.tensors[0].name, "x");
  EXPECT_EQ(st.tensors[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(st.tensors[0].to_f32(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_TRUE(st.metadata.empty());

  // Our writer (always format=pt) is byte-identical to PyTorch with metadata={"format": "pt"}.
  const std::string with_meta =
      std::string("\x58\0\0\0\0\0\0\0", 8) +
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + "   " + data;
  EXPECT_EQ(serialize_safetensors(st), with_meta);
}

TEST(SafeTensors, HostileInputsAreUserErrors) {
  const std::string f4("\0\0\0\0", 4);
  expect_user_error("", "fewer than the 8-byte");
  expect_user_error(std::string(7, '\0'), "fewer than the 8-byte");
  expect_user_error(le_u64(100) + "{}", "exceeds the 2 bytes");
  expect_user_error(le_u64(uint64_t(1) << 63) + "{}", "limit");
  expect_user_error(le_u64(~uint64_t(0)), "limit");
  expect_user_error(le_u64(200'000'000) + std::string(16, ' '), "limit");
  expect_user_error(make_file("{\"x\":", ""), "not valid JSON");
  expect_user_error(make_file("", ""), "not valid JSON");
  expect_user_error(make_file("[1,2]", ""), "not a JSON object");
  expect_user_error(make_file("\"str\"", ""), "not a JSON object");
  expect_user_error(make_file(R"({"x":3})", ""), "not a JSON object");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1]}})", f4), "no \"data_offsets\"");
  expect_user_error(make_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", f4), "no \"dtype\"");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", f4), "no \"shape\"");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", f4),
                    "unknown field");
  expect_user_error(make_file(R"({"x":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", f4), "unknown dtype");
  expect_user_error(make_file(R"({"x":{"dtype":3,"shape":[1],"data_offsets":[0,4]}})", f4), "unknown dtype");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", f4), "shape must be");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f4), "non-negative");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", f4), "non-negative");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", f4), "[begin, end]");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", f4), "non-negative");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f4), "needs 8");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", f4), "begin 4 > end 0");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", std::string(6, '\0')),
                    "overlaps");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", std::string(12, '\0')),
                    "gap of 4 bytes");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f4 + "junk"),
                    "4 trailing bytes");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f4),
                    "need 8 data bytes but only 4");
  expect_user_error(make_file(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", ""),
                    "overflows");
  expect_user_error(make_file(R"({"x":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,8]}})", ""),
                    "too large");
  expect_user_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f4 + f4),
                    "duplicate key 'x'");
  expect_user_error(make_file(R"({"__metadata__":{"a":1}})", ""), "not a string");
  expect_user_error(make_file(R"({"__metadata__":["a"]})", ""), "__metadata__ is not a JSON object");
  expect_user_error(make_file("{\"\xff\":1}", ""), "not valid JSON");  // invalid UTF-8
}

TEST(SafeTensors, EdgeCasesThatAreValid) {
  // An empty header object, zero-size tensors sharing an offset, and a scalar.
  EXPECT_TRUE(parse_safetensors(make_file("{}", ""), "x").tensors.empty());
  const std::string f4("\0\0\0\0", 4);
  SafeTensors st = parse_safetensors(
      make_file(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                R"("z":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]}})", f4), "x");
  ASSERT_EQ(st.tensors.size(), 2u);
  EXPECT_EQ(st.at("s").to_f32(), std::vector<float>{0.f});
  EXPECT_TRUE(st.at("z").to_i64().empty());
}

// Random flips, truncations and byte insertions of a valid file: the parser must either
// succeed with self-consistent tensors or throw UserError, never crash or throw anything else.
TEST(SafeTensors, MutationFuzz) {
  const std::string good = serialize_safetensors(sample());
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  std::mt19937_64 rng(12345);
  int accepted = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string b = good;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      // Mostly hit the length field and header, where the parsing logic lives.
      const size_t span = rng() % 4 ? std::min<size_t>(b.size(), 8 + n) : b.size();
      if (span == 0) break;
      const size_t pos = rng() % span;
      switch (rng() % 5) {
        case 0: b[pos] ^= char(1u << (rng() % 8)); break;
        case 1: b[pos] = "0123456789[]{}\",:-. e"[rng() % 21]; break;
        case 2: b.resize(pos); break;
        case 3: b.insert(pos, 1, char(rng())); break;
        default: b.erase(pos, 1); break;
      }
    }
    try {
      SafeTensors st = parse_safetensors(b, "fuzz");
      for (const StTensor& t : st.tensors) ASSERT_EQ(t.data.size(), t.numel() * dtype_size(t.dtype));
      ++accepted;
    } catch (const UserError&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-UserError exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);  // the mutations do reach the checks
  EXPECT_GT(accepted, 0);     // data-only mutations still parse
}

TEST(AtomicFile, ReplacesExistingFileAndLeavesNoTemporaries) {
  TempDir tmp;
  const fs::path p = tmp.dir / "model.safetensors";
  write_file_atomic(p, "old contents");
  EXPECT_EQ(read_file(p), "old contents");
  write_safetensors(p, sample());
  EXPECT_EQ(read_file(p), serialize_safetensors(sample()));
  EXPECT_EQ(read_safetensors(p).at("w").to_f32()[5], -6.5f);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 1);
}

TEST(AtomicFile, MissingDirectoryIsUserErrorAndLeavesNothing) {
  TempDir tmp;
  const fs::path p = tmp.dir / "no_such_dir" / "out.bin";
  try {
    write_file_atomic(p, "data");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp.dir / "no_such_dir"));
  EXPECT_TRUE(fs::is_empty(tmp.dir));
}

TEST(AtomicFile, FailedRenameRemovesTemporaryAndKeepsTarget) {
  // Renaming a file over a non-empty directory fails after the temporary was written.
  TempDir tmp;
  const fs::path p = tmp.dir / "target";
  fs::create_directories(p / "child");
  EXPECT_THROW(write_file_atomic(p, "data"), UserError);
  EXPECT_TRUE(fs::is_directory(p / "child"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.dir)) ++entries, (void)e;
  EXPECT_EQ(entries, 1);  // only "target": the temporary is gone
}

TEST(AtomicFile, ReadMissingFileNamesPath) {
  TempDir tmp;
  const fs::path p = tmp.dir / "absent.safetensors";
  try {
    read_file(p);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_safetensors(p), UserError);
  EXPECT_THROW(read_file(tmp.dir), UserError);  // a directory is not readable as a file
}

// Findings of a mutation fuzzer against the reader, each a regression test.
TEST(SafeTensors, HeaderLimits) {
  const std::string good = make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  // A NUL inside the header ended the JSON parser's input early: the garbage after it was never read.
  std::string nul = make_file(std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + '\0' + "garbage!",
                              std::string(4, '\0'));
  expect_user_error(nul, "NUL byte");
  // Deep nesting is refused as soon as it passes the limit, not after building it (10^7 levels took
  // 9 s and 2.5 GB before).
  for (std::string open : {"[", "{\"a\":"}) {
    std::string deep;
    while (deep.size() < 10'000'000) deep += open;
    auto t0 = std::chrono::steady_clock::now();
    expect_user_error(make_file(deep, ""), "nests deeper than 4 levels");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  }
  EXPECT_NO_THROW(parse_safetensors(good, "good"));
}

TEST(AtomicFile, ReadRefusesWhatIsNotARegularFile) {
  TempDir t;
  // A device (reading /dev/zero never ends), a FIFO (opening it waits for a writer), a directory.
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    fs::create_symlink(dev, t.dir / "link");
    try {
      read_file(t.dir / "link");
      ADD_FAILURE() << dev;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file (a device)"), std::string::npos) << e.what();
    }
    fs::remove(t.dir / "link");
  }
  ASSERT_EQ(mkfifo((t.dir / "fifo").c_str(), 0644), 0);
  EXPECT_THROW(read_file(t.dir / "fifo"), UserError);
  EXPECT_THROW(read_file(t.dir), UserError);
  // A symlink to a regular file is read; a file over the limit is refused before reading.
  write_file_atomic(t.dir / "f", "12345");
  fs::create_symlink(t.dir / "f", t.dir / "lf");
  EXPECT_EQ(read_file(t.dir / "lf"), "12345");
  EXPECT_THROW(read_file(t.dir / "f", 4), UserError);
}
