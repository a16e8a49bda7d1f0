// Whole-file I/O. Writes are atomic so a crash mid-save never leaves a half-written checkpoint.
#pragma once
#include <filesystem>
#include <cstdint>
#include <string>
#include <string_view>

namespace lrnn::io {

// The largest file read_file accepts unless told otherwise: 64 GiB (a 16B-parameter fp32 checkpoint).
inline constexpr uint64_t kMaxReadBytes = uint64_t(64) << 30;

// Writes `bytes` to `path` atomically: write to `path + ".tmp.<pid>"` in the same directory,
// fsync it, rename it over `path`, fsync the directory. On failure before the rename the
// temporary is removed and the old file (if any) is untouched. Throws lrnn::UserError naming
// the path and the errno text.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

// Reads the whole file. UserError naming the path if it is missing, unreadable, not a regular
// file (a FIFO, a device such as /dev/zero, a directory: refused before anything is read) or larger
// than `max_bytes`.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = kMaxReadBytes);

}  // namespace lrnn::io
