// NCCL, the collectives of data-parallel training on GPUs (CUDA builds only). The library is
// loaded at run time (dlopen of libnccl.so.2), so that lrnn builds without NCCL's headers and a
// single-GPU or CPU user never needs it. It is looked for in LRNN_NCCL_LIBRARY, then where the
// dynamic loader looks, then in Python's site-packages (the `nvidia-nccl-cu12` / `nvidia-nccl-cu13`
// wheels that PyTorch installs). Every collective is queued on cuda::stream() (so it can sit in a
// captured CUDA graph); host waits go through wait(), which gives up after dist::timeout_seconds()
// and takes the process down with a message instead of hanging on a rank that died.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <cuda_runtime.h>
#include "dist/world.h"

namespace lrnn::dist {

enum class DType { F32, F64, I32 };
enum class Op { Sum, Max, Avg };

class Nccl {
 public:
  // Rendezvous (rank 0's unique id to everyone) and the communicator on the current device.
  explicit Nccl(const World& w);
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  const World& world() const { return w_; }
  std::string version() const;  // "2.27.3"

  void all_reduce(void* buf, size_t n, DType t, Op op);            // in place
  // buf holds size·shard elements; afterwards buf + rank·shard holds this rank's reduced shard.
  void reduce_scatter(float* buf, size_t shard, Op op);
  // buf + rank·shard holds this rank's shard; afterwards buf holds every rank's, in rank order.
  void all_gather(float* buf, size_t shard);
  // Blocks until `event` completes. When it does not within the timeout, or NCCL reports an
  // error, prints which rank waited for what, aborts the communicator and exits (status 3).
  void wait(cudaEvent_t event, const char* what);

 private:
  World w_;
  void* comm_ = nullptr;
};

}  // namespace lrnn::dist
