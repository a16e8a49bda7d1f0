// libFuzzer target: a sweep grid file from arbitrary bytes (written to a file, as `lrnn sweep
// --grid` reads it), with every config it names loaded and validated with every learning rate.
// Config paths are resolved as the sweep does (the current directory, then next to the grid);
// run it from the repository root so that the seed grids' configs are found.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include "fuzz_util.h"
#include "train/sweep.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lrnn::fuzz::quiet_limits();
  static const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("lrnn_fuzz_grid_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    (void)lrnn::sweep::Grid::load(file);
  } catch (const lrnn::UserError&) {
  }
  return 0;
}
