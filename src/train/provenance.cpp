#include "train/provenance.h"
#include <cblas.h>
#include <ctime>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <omp.h>
#include <sys/utsname.h>
#include <fmt/format.h>
#include <unistd.h>
#include "core/version.h"
#include "io/atomic_file.h"
#ifdef LRNN_WITH_CUDA
#include "cuda/runtime.h"
#endif


namespace lrnn {

namespace fs = std::filesystem;

namespace {
std::vector<std::string>& argv_store() {
  static std::vector<std::string> v;
  return v;
}

// The CPU's model name and the ISA extensions that change what the compiler and BLAS kernels do
// (and so the rounding of every sum): the reason two machines' trajectories differ.
nlohmann::json cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown", flags;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && model == "unknown") model = val;
    if (key == "flags" && flags.empty()) flags = val;
  }
  static const char* kIsa[] = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw",
                               "avx512vl", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile"};
  std::vector<std::string> isa;
  std::istringstream fs_(flags);
  std::vector<std::string> all{std::istream_iterator<std::string>(fs_), std::istream_iterator<std::string>()};
  for (const char* f : kIsa)
    if (std::find(all.begin(), all.end(), f) != all.end()) isa.push_back(f);
  return {{"model", model}, {"logical_cores", std::thread::hardware_concurrency()}, {"isa", isa}};
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
}  // namespace

void set_command_line(int argc, char** argv) { argv_store().assign(argv, argv + argc); }
const std::vector<std::string>& command_line() { return argv_store(); }

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

nlohmann::json host_provenance() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  struct utsname u {};
  uname(&u);
  return {{"hostname", host},
          {"os", fmt::format("{} {} {}", u.sysname, u.release, u.machine)},
          {"cpu", cpu_info()},
          {"blas", {{"library", "OpenBLAS"},
                    {"config", openblas_get_config()},
                    {"core", openblas_get_corename()},
                    {"OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE", "")}}},
          {"openmp", {{"max_threads", omp_get_max_threads()}, {"OMP_WAIT_POLICY", env_or("OMP_WAIT_POLICY", "")}}}};
}

ProvenanceLog::ProvenanceLog(const fs::path& dir, const ExperimentConfig& cfg, const std::string& engine,
                             int64_t first_step, bool resumed)
    : file_(dir / "provenance.json") {
  doc_ = {{"sessions", nlohmann::json::array()}};
  if (resumed && fs::is_regular_file(file_)) {
    // Earlier sessions are kept; a file that is not ours is set aside, not trusted.
    auto old = nlohmann::json::parse(io::read_file(file_), nullptr, false);
    if (old.is_object() && old.contains("sessions") && old["sessions"].is_array()) doc_ = old;
  }
  const BuildInfo& b = build_info();
  char cwd[4096] = {0};
  if (!getcwd(cwd, sizeof cwd - 1)) cwd[0] = 0;
  nlohmann::json s = {
      {"lrnn", {{"version", b.version}, {"commit", b.commit}, {"modified", b.dirty}}},
      {"command", command_line()},
      {"cwd", cwd},
      {"config", cfg.source},
      {"resumed", resumed},
      {"host", host_provenance()},
      {"device", cfg.training.device},
      {"engine", engine},
      {"precision", cfg.training.device == "cuda" ? cfg.training.precision : std::string("fp32")},
      {"start", utc_now()},
      {"first_step", first_step},
  };
#ifdef LRNN_WITH_CUDA
  if (cfg.training.device == "cuda")
    s["gpu"] = {{"name", cuda::device_name()},
                {"driver", cuda::driver_version()},
                {"runtime", cuda::runtime_version()}};
#endif
  doc_["sessions"].push_back(std::move(s));
  write();
}

void ProvenanceLog::end(int64_t last_step, const std::string& outcome) {
  auto& s = doc_["sessions"].back();
  s["end"] = utc_now();
  s["last_step"] = last_step;
  s["outcome"] = outcome;
  write();
}

void ProvenanceLog::write() const { io::write_file_atomic(file_, doc_.dump(2) + "\n"); }

}  // namespace lrnn
