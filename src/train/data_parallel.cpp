#include "train/data_parallel.h"
#include <algorithm>
#include <cstring>
#include <exception>
#include <omp.h>
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/linear/linear.h"

namespace lrnn {

DataParallel::DataParallel(const YAML::Node& block, const std::string& where, uint64_t seed, int workers) {
  if (workers <= 0) workers = omp_get_max_threads();
  // Ops inside a worker run serially: their own `omp parallel` regions become single-threaded.
  omp_set_max_active_levels(1);
  for (int w = 0; w < workers; ++w) replicas_.push_back(create_model<float>(block, where, seed));
}

void DataParallel::sync_params() {
  for (size_t w = 1; w < replicas_.size(); ++w) replicas_[w]->params = replicas_[0]->params;
}

namespace {
// An exception must not leave an OpenMP region (the runtime would abort the process): each worker
// keeps the first one it meets, and the caller rethrows it after the region.
struct WorkerErrors {
  std::vector<std::exception_ptr> err;
  explicit WorkerErrors(int W) : err(size_t(W)) {}
  template <class F>
  void run(int w, F&& f) {
    if (err[size_t(w)]) return;
    try {
      f();
    } catch (...) {
      err[size_t(w)] = std::current_exception();
    }
  }
  void rethrow() const {
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  }
};

// While workers run, each BLAS call stays on its caller's core.
struct SingleThreadedBlas {
  int prev;
  explicit SingleThreadedBlas(int workers) : prev(workers > 1 ? ops::set_blas_threads(1) : 0) {}
  ~SingleThreadedBlas() {
    if (prev) ops::set_blas_threads(prev);
  }
};
struct Shard { int row0 = 0, rows = 0; };
Shard shard_of(int w, int W, int B) {
  int r0 = int(int64_t(B) * w / W), r1 = int(int64_t(B) * (w + 1) / W);
  return {r0, r1 - r0};
}
}  // namespace

double DataParallel::forward_backward(const Batch& b) {
  const int W = workers(), T = b.T;
  const size_t P = main().params.size();
  const int total = ops::count_labels(b.labels.data(), b.B * T);
  std::vector<double> loss(W, 0.0);
  std::vector<int> count(W, 0);
  SingleThreadedBlas guard(W);
  WorkerErrors errors(W);
#pragma omp parallel num_threads(W)
  {
    const int w = omp_get_thread_num();
    Shard s = shard_of(w, W, b.B);
    Model<float>& m = *replicas_[w];
    std::fill(m.grads.begin(), m.grads.end(), 0.f);
    if (s.rows > 0) {
      const int32_t* tok = b.tokens.data() + size_t(s.row0) * T;
      const int32_t* lab = b.labels.data() + size_t(s.row0) * T;
      count[w] = ops::count_labels(lab, s.rows * T);
      if (count[w] > 0) errors.run(w, [&] {
          loss[w] = m.forward(tok, lab, s.rows, T);
          m.backward();
        });
    }
#pragma omp barrier
    // Each worker's gradient is of its own mean loss: weight by its share of the labels.
    // Every thread reduces one slice of the parameters, always in replica order.
    const size_t lo = P * w / W, hi = P * (w + 1) / W;
    float* out = replicas_[0]->grads.data();
    const float f0 = total ? float(count[0]) / float(total) : 0.f;
    for (size_t i = lo; i < hi; ++i) out[i] *= f0;
    for (int r = 1; r < W; ++r) {
      const float f = total ? float(count[r]) / float(total) : 0.f;
      const float* g = replicas_[r]->grads.data();
      for (size_t i = lo; i < hi; ++i) out[i] += f * g[i];
    }
  }
  errors.rethrow();
  double l = 0;
  for (int w = 0; w < W; ++w) l += total ? loss[w] * count[w] / total : 0.0;
  return l;
}

const std::vector<float>& DataParallel::forward_logits(const Batch& b) {
  const int W = std::min(workers(), b.B), T = b.T, V = main().vocab_size();
  logits_.resize(size_t(b.B) * T * V);
  SingleThreadedBlas guard(W);
  WorkerErrors errors(W);
#pragma omp parallel num_threads(W)
  {
    const int w = omp_get_thread_num();
    Shard s = shard_of(w, W, b.B);
    Model<float>& m = *replicas_[w];
    errors.run(w, [&] {
      m.forward(b.tokens.data() + size_t(s.row0) * T, nullptr, s.rows, T);
      std::memcpy(logits_.data() + size_t(s.row0) * T * V, m.logits(), sizeof(float) * s.rows * T * V);
    });
  }
  errors.rethrow();
  return logits_;
}

}  // namespace lrnn
