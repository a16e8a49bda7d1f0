#include "dist/world.h"
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include "core/check.h"

namespace lrnn::dist {

namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

const std::string* find(const Env& env, const char* name) {
  for (auto& [k, v] : env)
    if (k == name) return &v;
  return nullptr;
}

int to_int(const Env& env, const char* name, int lo, int hi) {
  const std::string* v = find(env, name);
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end || errno || x < lo || x > hi)
    LRNN_USER_ERROR("environment: {}='{}': expected an integer in [{}, {}]", name, *v, lo, hi);
  return int(x);
}

Env process_env() {
  Env env;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                           "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK"})
    if (const char* v = std::getenv(name)) env.emplace_back(name, v);
  return env;
}

// A socket that closes itself.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

double left(Clock::time_point deadline) { return std::chrono::duration<double>(deadline - Clock::now()).count(); }

// Reads or writes exactly n bytes before the deadline; false on timeout, EOF or error.
bool io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pf{fd, short(write ? POLLOUT : POLLIN), 0};
    const double l = left(deadline);
    if (l <= 0 || ::poll(&pf, 1, int(l * 1000) + 1) <= 0) return false;
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    p += k;
    n -= size_t(k);
  }
  return true;
}

constexpr uint32_t kMagic = 0x4c524e31;  // "LRN1": the protocol's version is in the magic

struct Hello {
  uint32_t magic, rank, size;
};

// A socket listening on `port` of every address: IPv6 with IPv4 mapped in where the host has
// IPv6, IPv4 alone otherwise.
Fd listen_on(int port) {
  const int on = 1, off = 0;
  Fd s6(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s6.fd >= 0) {
    ::setsockopt(s6.fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    ::setsockopt(s6.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    if (::bind(s6.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(s6.fd, 128) == 0) return s6;
  }
  Fd s4(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s4.fd < 0) LRNN_USER_ERROR("rendezvous: socket: {}", std::strerror(errno));
  ::setsockopt(s4.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  if (::bind(s4.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s4.fd, 128) != 0)
    LRNN_USER_ERROR("rendezvous: rank 0 cannot listen on port {} (MASTER_PORT): {}; pick a free port", port,
                    std::strerror(errno));
  return s4;
}

}  // namespace

World world_from(const Env& env) {
  World w;
  auto take = [&](const char* r, const char* s, const char* l, const char* src) {
    if (!find(env, r) || !find(env, s)) return false;
    w.size = to_int(env, s, 1, 1 << 20);
    w.rank = to_int(env, r, 0, w.size - 1);
    w.local_rank = find(env, l) ? to_int(env, l, 0, 1 << 20) : 0;
    w.source = src;
    return true;
  };
  if (!take("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE/LOCAL_RANK") &&
      !take("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID") &&
      !take("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_*"))
    return World{};
  if (w.size == 1) return w;
  const std::string* addr = find(env, "MASTER_ADDR");
  if (!addr || addr->empty() || !find(env, "MASTER_PORT"))
    LRNN_USER_ERROR("environment: {} says rank {} of {}, but MASTER_ADDR and MASTER_PORT (rank 0's host and a free "
                    "port there) are not both set; every rank needs them to find the others",
                    w.source, w.rank, w.size);
  w.master_addr = *addr;
  w.master_port = to_int(env, "MASTER_PORT", 1, 65535);
  return w;
}

const World& world() {
  static const World w = world_from(process_env());
  return w;
}

double timeout_seconds() {
  const char* v = std::getenv("LRNN_DIST_TIMEOUT");
  if (!v) return 1800;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  if (*end || !(t > 0)) LRNN_USER_ERROR("environment: LRNN_DIST_TIMEOUT='{}': expected seconds > 0", v);
  return t;
}

std::string exchange(const World& w, const std::string& payload, double timeout_s) {
  if (!w.distributed()) return payload;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  const std::string where = fmt::format("{}:{}", w.master_addr, w.master_port);
  if (w.leader()) {
    Fd s = listen_on(w.master_port);
    std::vector<char> seen(size_t(w.size), 0);
    seen[0] = 1;
    bool said = false;
    const auto start = Clock::now();
    for (int got = 1; got < w.size;) {
      const double since = std::chrono::duration<double>(Clock::now() - start).count();
      if (!said && since >= 10.0 && left(deadline) > 0) {
        // A slow start, or a job that never started its other ranks: say so long before the timeout.
        std::fprintf(stderr, "lrnn: rank 0 of %d (%s) is waiting at %s for the other ranks (%d of %d so far)\n",
                     w.size, w.source.c_str(), where.c_str(), got, w.size);
        said = true;
      }
      if (left(deadline) <= 0) {
        std::string missing;
        for (int r = 0; r < w.size; ++r)
          if (!seen[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        LRNN_USER_ERROR("rendezvous: rank 0 waited {:.0f} s at {} for ranks {} (of {}), which never came "
                        "(LRNN_DIST_TIMEOUT sets the wait)", timeout_s, where, missing, w.size);
      }
      const double wait = said ? left(deadline) : std::min(left(deadline), 10.0 - since);
      pollfd pf{s.fd, POLLIN, 0};
      if (::poll(&pf, 1, int(std::max(wait, 0.0) * 1000) + 1) <= 0) continue;
      Fd c(::accept4(s.fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (c.fd < 0) continue;
      Hello h{};
      if (!io_all(c.fd, &h, sizeof h, false, deadline) || h.magic != kMagic) continue;  // not one of ours
      if (int(h.size) != w.size || int(h.rank) <= 0 || int(h.rank) >= w.size || seen[h.rank])
        LRNN_USER_ERROR("rendezvous: a process at {} says it is rank {} of {}; this job is {} ranks{}", where, h.rank,
                        h.size, w.size, int(h.rank) < w.size && int(h.rank) > 0 && seen[h.rank] ? " and that rank already came" : "");
      const uint32_t n = uint32_t(payload.size());
      if (!io_all(c.fd, const_cast<uint32_t*>(&n), sizeof n, true, deadline) ||
          !io_all(c.fd, const_cast<char*>(payload.data()), n, true, deadline))
        continue;  // it went away; it may come again
      seen[h.rank] = 1;
      ++got;
    }
    return payload;
  }
  // The other ranks: connect (rank 0 may not be listening yet), say who we are, read.
  std::string last_error = "no answer";
  bool said = false;
  const auto start = Clock::now();
  while (left(deadline) > 0) {
    if (!said && std::chrono::duration<double>(Clock::now() - start).count() >= 10.0) {
      std::fprintf(stderr, "lrnn: rank %d of %d (%s) is still trying to reach rank 0 at %s: %s\n", w.rank, w.size,
                   w.source.c_str(), where.c_str(), last_error.c_str());
      said = true;
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(w.master_port);
    const int gai = ::getaddrinfo(w.master_addr.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        Fd c(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (c.fd < 0) continue;
        if (::connect(c.fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          last_error = std::strerror(errno);
          continue;
        }
        Hello h{kMagic, uint32_t(w.rank), uint32_t(w.size)};
        uint32_t n = 0;
        if (!io_all(c.fd, &h, sizeof h, true, deadline) || !io_all(c.fd, &n, sizeof n, false, deadline)) {
          last_error = "rank 0 closed the connection";
          continue;
        }
        std::string out(n, '\0');
        if (!io_all(c.fd, out.data(), n, false, deadline)) {
          last_error = "rank 0 closed the connection";
          continue;
        }
        ::freeaddrinfo(res);
        return out;
      }
      ::freeaddrinfo(res);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  LRNN_USER_ERROR("rendezvous: rank {} could not reach rank 0 at {} (MASTER_ADDR:MASTER_PORT) within {:.0f} s: {} "
                  "(LRNN_DIST_TIMEOUT sets the wait)", w.rank, where, timeout_s, last_error);
}

namespace {

volatile std::sig_atomic_t g_forward = 0;
extern "C" void on_launcher_signal(int sig) { g_forward = sig; }

// A port on the loopback interface that nobody listens on now (the kernel's pick; the ranks
// start within a second, so the window for another program to take it is small).
int free_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s.fd < 0 || ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    LRNN_USER_ERROR("--gpus: cannot find a free loopback port: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "an unknown status";
}

}  // namespace

int launch_local(int n, const std::string& program, const std::vector<std::string>& args) {
  if (n < 1) LRNN_USER_ERROR("--gpus {}: expected at least 1", n);
  const int port = free_port();
  std::vector<pid_t> pids(size_t(n), 0);
  pid_t group = 0;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) LRNN_USER_ERROR("--gpus: fork: {}", std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, group);  // the ranks' own group: a terminal's Ctrl-C reaches the launcher only
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher that is killed takes its ranks with it
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off unless the user asks
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(program.c_str(), argv.data());
      std::fprintf(stderr, "lrnn --gpus: cannot start rank %d: %s\n", r, std::strerror(errno));
      std::_Exit(127);
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // (both sides set it: whichever runs first)
    pids[size_t(r)] = pid;
  }
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int result = 0, alive = n;
  bool forwarded = false;
  while (alive > 0) {
    if (g_forward && !forwarded) {
      ::kill(-group, g_forward);  // once: a second signal to a rank would abort it without a checkpoint
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-group, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int r = 0;
    while (r < n && pids[size_t(r)] != pid) ++r;
    if (r == n) continue;
    --alive;
    pids[size_t(r)] = 0;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (alive > 0) {
        std::fprintf(stderr, "lrnn --gpus: rank %d ended with %s; stopping the other %d rank%s (they cannot go on "
                     "without it)\n", r, describe_status(status).c_str(), alive, alive == 1 ? "" : "s");
        ::kill(-group, SIGKILL);
      }
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace lrnn::dist
