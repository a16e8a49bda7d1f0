#include <cstdlib>
#include <unistd.h>
#include "cli/cli.h"
#include "train/provenance.h"

int main(int argc, char** argv) {
  // OpenMP threads that wait by spinning take the cores from everything else on a busy machine
  // (a 2-core machine shared with another job: `lrnn eval` 15.9 s spinning, 1.2 s passive).
  // libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main: so lrnn sets it and
  // starts itself again. A policy the user set (e.g. OMP_WAIT_POLICY=active) is kept.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run on as we are
  }
  lrnn::set_command_line(argc, argv);
  return lrnn::cli::run(argc, argv);
}
