// Data parallelism over CPU cores: one model replica per worker, each running its rows of the
// batch single-threaded (OpenBLAS included), then gradients reduced into replica 0. On two
// cores this beats splitting every GEMM across both (measured: two single-threaded sgemms reach
// ~190 GFLOP/s together, one two-threaded sgemm ~130 on these shapes), and it is the same shape
// as multi-GPU data parallelism. With the same worker count, results are bit-reproducible.
#pragma once
#include <memory>
#include <vector>
#include "models/model.h"
#include "tasks/task.h"

namespace lrnn {

class DataParallel {
 public:
  // workers = 0: one per OpenMP thread.
  DataParallel(const YAML::Node& model_block, const std::string& where, uint64_t seed, int workers);
  Model<float>& main() { return *replicas_[0]; }
  int workers() const { return int(replicas_.size()); }
  // Mean loss over the batch's labels; main().grads receives the batch gradient (overwritten).
  double forward_backward(const Batch& b);
  // Logits [B,T,V] of the whole batch.
  const std::vector<float>& forward_logits(const Batch& b);
  // After changing main().params (optimizer step, checkpoint load): copy them to the replicas.
  void sync_params();
  void set_dense_labels(bool d) {  // Model::set_dense_labels on every replica
    for (auto& r : replicas_) r->set_dense_labels(d);
  }

 private:
  std::vector<std::unique_ptr<Model<float>>> replicas_;
  std::vector<float> logits_;
};

}  // namespace lrnn
