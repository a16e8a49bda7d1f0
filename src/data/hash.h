// Checksums of the language-model data: CRC-32 (IEEE 802.3, the polynomial of zlib.crc32 and
// Python's binascii.crc32) over a shard's tokens, and SHA-256 (FIPS 180-4) of a tokenizer file.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lrnn::data {

// CRC-32 continued from `crc` (0 to start): crc32(b, crc32(a)) == crc32(a + b), as zlib.crc32.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // ends the hash; the object is spent afterwards
 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t bytes_ = 0;
};

// Lower-case hex of SHA-256(bytes).
std::string sha256_hex(std::string_view bytes);
std::string to_hex(const uint8_t* p, size_t n);

}  // namespace lrnn::data
