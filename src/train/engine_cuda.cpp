// The CUDA engine: the whole optimizer step on one device with no host synchronisation.
//
// Per step the host generates the batch (tasks are CPU code: Philox, cheap) into a pinned
// staging slot, queues its copy to fixed device buffers, then launches the step: zero grads,
// forward, backward, global norm + finite check + clip factor + learning rate (from a table
// indexed by a device-side step counter), AdamW. The step is captured once per (batch, length)
// shape as a CUDA graph and replayed, so a step costs one graph launch instead of ~100 kernel
// launches. The host runs ahead of the device by up to two steps (two staging slots), which hides
// the batch generation behind the device's work. Loss and gradient norm are read back only when
// the loop logs (stats()).
//
// On several GPUs (one process each, dist/world.h) the step is data-parallel with the optimizer
// state sharded (ZeRO-1): every rank runs forward and backward on its rows of the global batch,
// a reduce-scatter leaves each rank the mean gradient of its 1/N slice of the parameters, the
// gradient norm and the finite check are combined over ranks (ops::cuda::StepReduce), AdamW
// updates the slice with the slice's moments, and an all-gather gives every rank all parameters.
// The collectives are NCCL's (dist/nccl.h), queued on the same stream and captured in the same
// graph. Communication is not overlapped with the backward: it is 2·P floats per step against
// the step's ~6·P·tokens FLOPs.
//
// LRNN_CUDA_GRAPHS=0 launches the kernels one by one instead (for debugging and measurement);
// training.precision picks cuda::GemmPrecision (bf16 | tf32 | fp32); LRNN_CUDA_TF32=0 forces fp32
// (what the tests comparing against the CPU use).
#include <cstdlib>
#include <cstring>
#include <map>
#include "core/check.h"
#include "cuda/runtime.h"
#include "dist/nccl.h"
#include "dist/shards.h"
#include "models/device_model.h"
#include "ops/adamw/adamw_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "train/engine.h"
#include "train/schedule.h"

namespace lrnn {

namespace {

// The scalars of the sharded optimizer step, summed / or-ed over ranks with NCCL.
struct NcclStepReduce final : ops::cuda::StepReduce {
  dist::Nccl* comm = nullptr;
  void sum(double* x, int n) override { comm->all_reduce(x, size_t(n), dist::DType::F64, dist::Op::Sum); }
  void max(int* x, int n) override { comm->all_reduce(x, size_t(n), dist::DType::I32, dist::Op::Max); }
};

class CudaEngine final : public Engine {
 public:
  explicit CudaEngine(const ExperimentConfig& cfg) : tc_(cfg.training) {
    if (!cuda::available())
      LRNN_USER_ERROR("{}: training.device: cuda, but no CUDA device is available here (use --device cpu or training.device: cpu)", cfg.source);
    const dist::World& w = dist::world();
    if (w.distributed()) {
      rank_ = w.rank;
      ranks_ = w.size;
      const int A = tc_.gradient_accumulation_steps;
      if (tc_.batch_size % (ranks_ * A) != 0)
        LRNN_USER_ERROR("{}: training.batch_size {} is the global batch: with {} GPUs{} it must be a multiple of {}",
                        cfg.source, tc_.batch_size, ranks_,
                        A > 1 ? fmt::format(" and training.gradient_accumulation_steps {}", A) : "", ranks_ * A);
      // One GPU per process: the local rank's, or the only one this process sees (a scheduler
      // that gives each task its own GPU, e.g. srun --gpus-per-task 1).
      int count = 0;
      LRNN_CUDA_CHECK(cudaGetDeviceCount(&count));
      if (count > 1 && w.local_rank >= count)
        LRNN_USER_ERROR("rank {} is rank {} on its host ({}), but this process sees {} GPUs: start at most one "
                        "process per GPU (lrnn train --gpus {} at most here), or give each its own GPU with "
                        "CUDA_VISIBLE_DEVICES", w.rank, w.local_rank, w.source, count, count);
      cuda::select_device(w.local_rank);  // before any other CUDA work of this process
      comm_ = std::make_unique<dist::Nccl>(w);
      reduce_.comm = comm_.get();
    }
    host_ = create_model<float>(cfg.model, cfg.source, uint64_t(tc_.seed));
    model_type_ = cfg.model["model_type"].as<std::string>();
    dense_labels_ = cfg.task.name == "lm";
    use_graphs_ = !cuda::env_off("LRNN_CUDA_GRAPHS") && !cuda::profiling();
    const std::string& p = tc_.precision;
    cuda::set_gemm_precision(cuda::env_off("LRNN_CUDA_TF32") || p == "fp32" ? cuda::GemmPrecision::FP32
                             : p == "tf32"                            ? cuda::GemmPrecision::TF32
                                                                      : cuda::GemmPrecision::BF16);
    for (auto& e : events_) LRNN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    LRNN_CUDA_CHECK(cudaEventCreateWithFlags(&sync_event_, cudaEventDisableTiming));
  }
  ~CudaEngine() override {
    if (comm_) sync("the last step");
    for (auto& [shape, g] : graphs_) cudaGraphExecDestroy(g);
    for (auto& e : events_) cudaEventDestroy(e);
    cudaEventDestroy(sync_event_);
  }

  Model<float>& host_model() override { return *host_; }

  void start(const TrainState& st) override {
    dev_ = to_device(*host_, model_type_);  // uploads the (fresh or resumed) parameters
    dev_->set_dense_labels(dense_labels_);  // language modelling: the head may chunk its logits
    const size_t P = host_->params.size();
    LRNN_CHECK(st.m.size() == P && st.v.size() == P, "optimizer state has {} / {} entries for {} parameters",
               st.m.size(), st.v.size(), P);
    // This rank's slice of the parameters (dist/shards.h); one rank: all of it.
    const dist::Shards sh = dist::Shards::of(P, ranks_);
    shard_ = sh.per_rank;
    if (ranks_ > 1) dev_->pad_buffers(sh.padded());
    m_.upload(sh.slice(st.m, rank_));
    v_.upload(sh.slice(st.v, rank_));
    std::vector<uint8_t> decay(P, 0);
    for (auto& e : host_->layout().entries())
      if (e.weight_decay) std::fill(decay.begin() + e.offset, decay.begin() + e.offset + e.numel, 1);
    decay_.upload(sh.slice(decay, rank_));
    if (comm_) {
      // Each collective once before any capture: NCCL connects lazily, on a collective's first call.
      weight_.resize(2);
      ops::cuda::zero(weight_.data(), 2);
      comm_->all_reduce(weight_.data(), 1, dist::DType::F32, dist::Op::Avg);
      comm_->all_gather(dev_->params.data(), shard_);
      comm_->reduce_scatter(dev_->grads.data(), shard_, dist::Op::Avg);
      sync("the first collectives (every rank must reach them)");
      dev_->grads.zero();
    }
    lr_host_.assign(size_t(std::max<int64_t>(tc_.num_steps, 1)), 0.f);
    for (int64_t s = 0; s < int64_t(lr_host_.size()); ++s)
      lr_host_[s] = float(lr_at(s, tc_.num_steps, tc_.warmup_steps, tc_.lr, tc_.min_lr));
    lr_table_.upload(lr_host_);
    loss_acc_.resize(1);  // the step's loss while micro-batches accumulate (not allocated inside a capture)
    ops::cuda::StepStats s{};
    s.step = st.step;
    s.adam_step = st.adam_step;
    s.skipped = st.skipped;
    stats_.upload(&s, 1);
  }

  void step(const Batch& b, int64_t step, double lr, double weight = 1.0) override {
    const size_t n = size_t(b.B) * b.T;
    if (n > tokens_.size()) {  // grow the fixed input buffers (rare: graphs over the old ones go)
      cuda::synchronize();
      tokens_.resize(n);
      labels_.resize(n);
      for (auto& s : staging_) s.resize(2 * n + 2);
      drop_graphs();
    }
    // Stage the batch: wait until this slot's previous copy has left, fill it, queue the copy.
    const int slot = int(step & 1);
    if (comm_) comm_->wait(events_[slot], "the step before last");
    else LRNN_CUDA_CHECK(cudaEventSynchronize(events_[slot]));
    int32_t* pin = staging_[slot].p;
    std::memcpy(pin, b.tokens.data(), n * sizeof(int32_t));
    std::memcpy(pin + n, b.labels.data(), n * sizeof(int32_t));
    if (comm_) {  // this rank's share of the global batch's labels (times the ranks): its gradient's weight
      const float w = float(weight);
      std::memcpy(pin + 2 * n, &w, sizeof w);
      LRNN_CUDA_CHECK(cudaMemcpyAsync(weight_.data(), pin + 2 * n, sizeof w, cudaMemcpyHostToDevice, cuda::stream()));
    }
    LRNN_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), pin, n * sizeof(int32_t), cudaMemcpyHostToDevice, cuda::stream()));
    LRNN_CUDA_CHECK(
        cudaMemcpyAsync(labels_.data(), pin + n, n * sizeof(int32_t), cudaMemcpyHostToDevice, cuda::stream()));
    // The captured step reads its learning rate from the schedule's table on the device. When the
    // trainer's differs (training.curriculum_lr_factor), this step's entry is rewritten first, in
    // stream order.
    const float want = float(lr);
    LRNN_CHECK(step >= 0 && step < int64_t(lr_host_.size()), "step {} outside the schedule's {} steps", step,
               lr_host_.size());
    if (want != lr_host_[size_t(step)]) {
      std::memcpy(pin + 2 * n + 1, &want, sizeof want);
      LRNN_CUDA_CHECK(cudaMemcpyAsync(lr_table_.data() + step, pin + 2 * n + 1, sizeof want, cudaMemcpyHostToDevice,
                                      cuda::stream()));
      lr_host_[size_t(step)] = want;
    }
    LRNN_CUDA_CHECK(cudaEventRecord(events_[slot], cuda::stream()));

    const int gen = dev_->generation();
    dev_->reserve(b.B / tc_.gradient_accumulation_steps, b.T);  // outside any capture: buffers grow here, never inside a graph
    if (dev_->generation() != gen) drop_graphs();
    if (!use_graphs_) {
      run_step(b.B, b.T);
      return;
    }
    auto key = std::make_pair(b.B, b.T);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, capture(b.B, b.T)).first;
    LRNN_CUDA_CHECK(cudaGraphLaunch(it->second, cuda::stream()));
  }

  EngineStats stats() override {
    ops::cuda::StepStats s = read_stats();
    EngineStats e{s.loss, s.loss_n ? s.loss_sum / double(s.loss_n) : s.loss, s.norm, s.lr, s.skipped, s.loss_n};
    s.loss_sum = 0;
    s.loss_n = 0;
    stats_.upload(&s, 1);  // nothing is in flight (read_stats synchronised)
    return e;
  }

  void to_host(TrainState& st) override {
    ops::cuda::StepStats s = read_stats();
    const size_t P = host_->params.size();
    host_->params = dev_->params.download();
    host_->params.resize(P);  // (the padding of the slices)
    st.m = gather(m_);
    st.v = gather(v_);
    st.adam_step = s.adam_step;
    st.skipped = s.skipped;
  }

  LogitsFn logits_fn() override {
    return [this](const Batch& b) -> const float* {
      if (comm_) sync("the last step's collectives, before evaluating");
      eval_tokens_.upload(b.tokens);
      dev_->infer(eval_tokens_.data(), b.B, b.T);
      logits_.resize(size_t(b.B) * b.T * dev_->vocab_size());
      LRNN_CUDA_CHECK(cudaMemcpyAsync(logits_.data(), dev_->infer_logits(), logits_.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost, cuda::stream()));
      cuda::synchronize();
      return logits_.data();
    };
  }

  bool any_rank(bool mine) override {
    if (!comm_) return mine;
    sync("the other ranks (the step before a stop check)");
    int x = mine;
    flag_.upload(&x, 1);
    comm_->all_reduce(flag_.data(), 1, dist::DType::I32, dist::Op::Max);
    sync("the other ranks (stop request)");
    return flag_.download()[0] != 0;
  }

  std::string describe() const override {
    if (comm_)
      return fmt::format("{} x cuda ({}; data-parallel over NCCL {}, optimizer state sharded; {} GEMMs{})", ranks_,
                         cuda::device_name(), comm_->version(),
                         cuda::gemm_precision() == cuda::GemmPrecision::TF32   ? "TF32"
                         : cuda::gemm_precision() == cuda::GemmPrecision::BF16 ? "bf16 projections where the model has them, else TF32"
                                                                               : "fp32",
                         use_graphs_ ? ", CUDA graphs" : "");
    return fmt::format("cuda ({}; {} GEMMs{})", cuda::device_name(),
                       cuda::gemm_precision() == cuda::GemmPrecision::TF32   ? "TF32"
                       : cuda::gemm_precision() == cuda::GemmPrecision::BF16 ? "bf16 projections where the model has them, else TF32"
                                                                             : "fp32",
                       use_graphs_ ? ", CUDA graphs" : "");
  }

 private:
  // Everything one step launches, in order (what a graph captures).
  // With gradient accumulation, the forward and backward of each micro-batch of B / A rows; each
  // backward adds its gradient with weight 1 / A (the loss weight of the head's cross-entropy), and
  // the step's loss is the mean of theirs.
  void run_step(int B, int T_) {
    if (comm_) return run_step_ranks(B, T_);
    const size_t P = host_->params.size();
    {
      cuda::OpTimer t("zero_grads");
      dev_->grads.zero();
    }
    const int A = tc_.gradient_accumulation_steps, rows = B / A;
    if (A > 1) {
      dev_->set_loss_weight(1.0 / A);
      ops::cuda::zero(loss_acc_.data(), 1);
    }
    for (int k = 0; k < A; ++k) {
      const size_t at = size_t(k) * size_t(rows) * size_t(T_);
      dev_->forward(tokens_.data() + at, labels_.data() + at, rows, T_);
      if (A > 1) ops::cuda::add_scaled(loss_acc_.data(), dev_->loss(), 1.0f / float(A), 1);
      dev_->backward();
    }
    // (The model's loss buffer exists once a forward has carved its arena: asked for after it.)
    const float* loss = A > 1 ? loss_acc_.data() : dev_->loss();
    cuda::OpTimer t("optimizer (norm, clip, adamw)");
    ops::cuda::optimizer_prepare(stats_.data(), loss, dev_->grads.data(), P, lr_table_.data(),
                                 int64_t(lr_table_.size()), tc_.grad_clip);
    ops::cuda::adamw_update(dev_->params.data(), dev_->grads.data(), m_.data(), v_.data(), decay_.data(), P,
                            stats_.data(), tc_.beta1, tc_.beta2, tc_.adam_eps, tc_.weight_decay);
  }

  // The same on one of several ranks: the local step, then ZeRO-1 (see the file's head).
  void run_step_ranks(int B, int T_) {
    const size_t P = host_->params.size(), S = shard_, off = size_t(rank_) * S;
    {
      cuda::OpTimer t("zero_grads");
      dev_->grads.zero();
    }
    const int A = tc_.gradient_accumulation_steps, rows = B / A;
    if (A > 1) dev_->set_loss_weight(1.0 / A);
    ops::cuda::zero(loss_acc_.data(), 1);
    for (int k = 0; k < A; ++k) {
      const size_t at = size_t(k) * size_t(rows) * size_t(T_);
      dev_->forward(tokens_.data() + at, labels_.data() + at, rows, T_);
      ops::cuda::add_scaled(loss_acc_.data(), dev_->loss(), 1.0f / float(A), 1);
      dev_->backward();
    }
    cuda::OpTimer t("optimizer (reduce-scatter, norm, clip, adamw, all-gather)");
    if (!dense_labels_) {  // ranks with unequal label counts: the global mean weighs each by its share
      ops::cuda::scale_by(dev_->grads.data(), weight_.data(), P);
      ops::cuda::scale_by(loss_acc_.data(), weight_.data(), 1);
    }
    comm_->all_reduce(loss_acc_.data(), 1, dist::DType::F32, dist::Op::Avg);
    comm_->reduce_scatter(dev_->grads.data(), S, dist::Op::Avg);
    ops::cuda::optimizer_prepare(stats_.data(), loss_acc_.data(), dev_->grads.data() + off, S, lr_table_.data(),
                                 int64_t(lr_table_.size()), tc_.grad_clip, &reduce_);
    ops::cuda::adamw_update(dev_->params.data() + off, dev_->grads.data() + off, m_.data(), v_.data(), decay_.data(), S,
                            stats_.data(), tc_.beta1, tc_.beta2, tc_.adam_eps, tc_.weight_decay, &reduce_);
    comm_->all_gather(dev_->params.data(), S);
  }

  // Host waits: through the communicator's watchdog when there are several ranks.
  void sync(const char* what) {
    if (!comm_) return cuda::synchronize();
    LRNN_CUDA_CHECK(cudaEventRecord(sync_event_, cuda::stream()));
    comm_->wait(sync_event_, what);
  }

  // A sharded optimizer moment, whole (every rank's slice, then the padding cut off).
  std::vector<float> gather(const cuda::Buffer<float>& slice) {
    if (!comm_) return slice.download();
    cuda::Buffer<float> all(shard_ * size_t(ranks_));
    LRNN_CUDA_CHECK(cudaMemcpyAsync(all.data() + size_t(rank_) * shard_, slice.data(), shard_ * sizeof(float),
                                    cudaMemcpyDeviceToDevice, cuda::stream()));
    comm_->all_gather(all.data(), shard_);
    sync("the other ranks' optimizer state");
    std::vector<float> v = all.download();
    v.resize(host_->params.size());
    return v;
  }

  cudaGraphExec_t capture(int B, int T_) {
    cudaGraph_t g = nullptr;
    LRNN_CUDA_CHECK(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal));
    try {
      run_step(B, T_);
    } catch (...) {
      cudaStreamEndCapture(cuda::stream(), &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    LRNN_CUDA_CHECK(cudaStreamEndCapture(cuda::stream(), &g));
    cudaGraphExec_t exec = nullptr;
    LRNN_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    return exec;
  }

  void drop_graphs() {
    cuda::synchronize();
    for (auto& [shape, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
  }

  ops::cuda::StepStats read_stats() {
    ops::cuda::StepStats s{};
    LRNN_CUDA_CHECK(cudaMemcpyAsync(&s, stats_.data(), sizeof s, cudaMemcpyDeviceToHost, cuda::stream()));
    sync("the step's statistics");
    return s;
  }

  const TrainingConfig tc_;  // a copy: the engine may outlive the caller's config object
  std::unique_ptr<Model<float>> host_;
  std::string model_type_;
  bool dense_labels_ = false;
  std::unique_ptr<DeviceModel> dev_;
  cuda::Buffer<float> m_, v_, lr_table_, loss_acc_;
  std::vector<float> lr_host_;  // lr_table_ as on the device
  cuda::Buffer<uint8_t> decay_;
  cuda::Buffer<ops::cuda::StepStats> stats_;
  cuda::Buffer<int32_t> tokens_, labels_, eval_tokens_;
  cuda::Pinned<int32_t> staging_[2];
  cudaEvent_t events_[2]{};
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;
  bool use_graphs_ = true;
  std::vector<float> logits_;
  // Data parallelism (several ranks): the communicator, this rank's slice of the parameters.
  std::unique_ptr<dist::Nccl> comm_;
  NcclStepReduce reduce_;
  int rank_ = 0, ranks_ = 1;
  size_t shard_ = 0;
  cuda::Buffer<float> weight_;  // this rank's gradient weight (its share of the labels, times the ranks)
  cuda::Buffer<int> flag_;
  cudaEvent_t sync_event_{};
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const ExperimentConfig& cfg) { return std::make_unique<CudaEngine>(cfg); }

}  // namespace lrnn
