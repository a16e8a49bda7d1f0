// Where a run came from: lrnn's version and commit, the command line, the host, its CPU and BLAS,
// the GPU and driver, the precision, and when it started and ended. A run directory keeps this in
// provenance.json as a list of sessions (the first start, then one entry per --resume), so a run
// that was interrupted and resumed on another machine says so.
#pragma once
#include <filesystem>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/config.h"

namespace lrnn {

// The process's command line, recorded once by main (the CLI) before anything else.
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

// The host's description: {"hostname", "os", "cpu": {model, logical_cores, isa}, "blas": {...},
// "openmp": {...}}.
nlohmann::json host_provenance();

// Appends one session to `dir`/provenance.json and rewrites it at the end of the session.
class ProvenanceLog {
 public:
  // `engine` describes what trains (Engine::describe()); `first_step` is where this session starts.
  ProvenanceLog(const std::filesystem::path& dir, const ExperimentConfig& cfg, const std::string& engine,
                int64_t first_step, bool resumed);
  // `outcome`: "finished", "stopped early", "interrupted by SIGINT", ...
  void end(int64_t last_step, const std::string& outcome);

 private:
  void write() const;
  std::filesystem::path file_;
  nlohmann::json doc_;  // {"sessions": [...]}
};

// "2026-11-25T12:34:56Z"
std::string utc_now();

}  // namespace lrnn
