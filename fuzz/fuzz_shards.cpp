// libFuzzer target: a tokenized directory (docs/DATA.md) from arbitrary bytes, read as a language
// model's data loader reads it: index.json, the shards it lists (header-only and full checks),
// the token stream across shards, and packed training and evaluation batches over ranks.
//
// Input: the bytes of index.json, one NUL byte, then up to four shard files, each a 4-byte
// little-endian length and that many bytes (a length past the end takes the rest), written as
// train_000000.bin, train_000001.bin, val_000000.bin, val_000001.bin. fuzz/corpus/shards holds
// real directories of `lrnn tokenize` and tools/parquet_to_shards.py in this form.
// Anything but a UserError (a crash, a sanitizer report, an lrnn::Error, another exception, a
// hang, an allocation over the limit) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include "data/shards.h"
#include "fuzz_util.h"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

void sample(const lrnn::data::TokenStream& ts) {
  using lrnn::data::PackedSampler;
  // The whole stream (it is small: the input is), then contexts of a few lengths.
  (void)ts.read(0, std::min<uint64_t>(ts.size(), 1 << 16));
  for (int T : {1, 2, 7, 64}) {
    try {
      PackedSampler p(ts, T, 0x5eed);
      for (int64_t step : {int64_t(0), int64_t(1), int64_t(1) << 40}) {
        try {
          (void)p.batch(step, 4);
          (void)p.batch(step, 4, 1, 2);
        } catch (const lrnn::UserError&) {
        }
      }
      const uint64_t nb = std::min<uint64_t>(p.eval_batches(3), 4);
      for (uint64_t i = 0; i < nb; ++i) {
        (void)p.eval_batch(i, 3);
        (void)p.eval_batch(i, 3, 2, 3);
      }
    } catch (const lrnn::UserError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lrnn::fuzz::quiet_limits();
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("lrnn_fuzz_shards_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  static const char* kNames[] = {"train_000000.bin", "train_000001.bin", "val_000000.bin", "val_000001.bin"};
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  write(dir / "index.json", in.substr(0, nul));
  std::string_view rest = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  for (const char* name : kNames) {
    if (rest.size() < 4) {
      fs::remove(dir / name);
      continue;
    }
    uint32_t n;
    std::memcpy(&n, rest.data(), 4);
    rest.remove_prefix(4);
    const size_t take = std::min<size_t>(n, rest.size());
    write(dir / name, rest.substr(0, take));
    rest.remove_prefix(take);
  }
  try {
    (void)lrnn::data::read_index(dir);
  } catch (const lrnn::UserError&) {
  }
  for (const char* split : {"train", "val"}) {
    for (auto verify : {lrnn::data::Verify::Header, lrnn::data::Verify::Full}) {
      try {
        sample(lrnn::data::TokenStream::open(dir, split, verify));
      } catch (const lrnn::UserError&) {
      }
    }
  }
  return 0;
}
