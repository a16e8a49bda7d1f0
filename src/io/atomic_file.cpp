#include "io/atomic_file.h"

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

#include "core/check.h"

namespace lrnn::io {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const char* what, int err) {
  LRNN_USER_ERROR("cannot {} {}: {}", what, path.string(), std::generic_category().message(err));
}

// Closes the descriptor on scope exit (error paths); close() on the success path is checked.
struct Fd {
  int fd = -1;
  ~Fd() { if (fd >= 0) ::close(fd); }
  int release() { int f = fd; fd = -1; return f; }
};

}  // namespace

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";

  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)};
  if (f.fd < 0) fail(path, "create temporary file for", errno);
  // From here on, any failure removes the temporary before rethrowing.
  auto fail_tmp = [&](const char* what, int err) {
    if (f.fd >= 0) ::close(f.release());
    ::unlink(tmp.c_str());
    fail(path, what, err);
  };
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_tmp("write", errno);
    done += size_t(n);
  }
  if (::fsync(f.fd) != 0) fail_tmp("fsync", errno);
  if (::close(f.release()) != 0) fail_tmp("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_tmp("rename temporary file onto", errno);

  // Make the rename itself durable. Some filesystems cannot fsync a directory (EINVAL):
  // the data is already in place, so only report real I/O errors.
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0 && ::fsync(d.fd) != 0 && errno != EINVAL && errno != ENOTSUP)
    fail(path, "fsync the directory of", errno);
}

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check below refuses it.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) fail(path, "open", errno);
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) fail(path, "stat", errno);
  if (!S_ISREG(st.st_mode))
    LRNN_USER_ERROR("{}: not a regular file ({}); lrnn reads its inputs only from regular files", path.string(),
                    S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
                    S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a file");
  if (uint64_t(st.st_size) > max_bytes)
    LRNN_USER_ERROR("{}: {} bytes, more than the {} bytes lrnn accepts for this file", path.string(),
                    uint64_t(st.st_size), max_bytes);
  std::string out;
  out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "read", errno);
    if (n == 0) break;
    out.append(buf, size_t(n));
    // A file that grows while it is read (another process writing it) stops at the limit too.
    if (out.size() > max_bytes)
      LRNN_USER_ERROR("{}: grew past the {} bytes lrnn accepts for this file while being read", path.string(), max_bytes);
  }
  return out;
}

}  // namespace lrnn::io
