// Piecewise reading on a CUDA device (decoder.h device_reader): the model's device twin reads
// host tokens through a decode state in device memory and hands back host logits.
//
// A generated token's forward (B sequences, 1 token each) is a few hundred small launches for an
// LM of 24 layers; after the first such call for a (state, B) it is captured as a CUDA graph and
// replayed, so each later token costs one graph launch, the token's upload and the logits'
// download (one graph is kept: the latest state's). A graph holds the addresses of the state's
// buffers, of the token buffer and of the inference activations: it is dropped when any of them
// moves (a new state has its own serial; a longer piece may grow the activations, which bumps the
// model's infer_generation()).
// LRNN_CUDA_GRAPHS=0 runs every forward op by op (what the graphs are measured against).
#include <algorithm>
#include <utility>
#include "core/check.h"
#include "cuda/runtime.h"
#include "infer/decoder.h"
#include "models/device_model.h"

namespace lrnn {

namespace {

class DeviceReader final : public PieceReader {
 public:
  DeviceReader(const Model<float>& host, std::string model_type) : type_(std::move(model_type)) {
    if (!cuda::available()) LRNN_USER_ERROR("--device cuda, but no CUDA device is available here (use --device cpu)");
    // fp32 weights in the GEMMs (see device_reader in decoder.h).
    if (cuda::gemm_precision() == cuda::GemmPrecision::BF16) cuda::set_gemm_precision(cuda::GemmPrecision::TF32);
    free0_ = free_bytes();
    dev_ = to_device(host, type_, /*with_grads=*/false);
    use_graphs_ = !cuda::env_off("LRNN_CUDA_GRAPHS") && !cuda::profiling();
  }
  ~DeviceReader() override { drop_graphs(); }

  std::unique_ptr<DecodeState> new_state(int B) override { return dev_->new_decode_state(B); }

  const float* read(const int32_t* tokens, int B, int T_, DecodeState& st) override {
    LRNN_CHECK(B > 0 && T_ > 0, "empty batch {}x{}", B, T_);
    const size_t n = size_t(B) * size_t(T_), V = size_t(dev_->vocab_size());
    if (n > tok_.size()) {  // the graphs read the old buffer
      drop_graphs();
      tok_.resize(n);
    }
    host_tok_.resize(n);
    std::copy_n(tokens, n, host_tok_.p);
    LRNN_CUDA_CHECK(cudaMemcpyAsync(tok_.data(), host_tok_.p, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    cuda::stream()));
    if (use_graphs_ && T_ == 1) {
      step_graph(B, st);
    } else {
      dev_->forward_continue(tok_.data(), B, T_, st);
    }
    logits_.resize(n * V);
    LRNN_CUDA_CHECK(cudaMemcpyAsync(logits_.p, dev_->infer_logits(), n * V * sizeof(float), cudaMemcpyDeviceToHost,
                                    cuda::stream()));
    cuda::synchronize();
    return logits_.p;
  }

  int vocab_size() const override { return dev_->vocab_size(); }
  std::string model_type() const override { return type_; }
  size_t device_bytes() const override {
    const size_t f = free_bytes();
    return free0_ > f ? free0_ - f : 0;
  }
  std::string describe() const override {
    return "cuda: " + cuda::device_name() + (use_graphs_ ? ", CUDA graphs" : "");
  }

 private:
  // One token per sequence: replay the graph of (state, B), capturing it on its second use (the
  // first runs op by op, sizing every buffer outside any capture). One graph is kept: a new
  // state (a new generation or request) replaces it.
  void step_graph(int B, DecodeState& st) {
    auto& ds = dynamic_cast<DeviceDecodeState&>(st);
    if (dev_->infer_generation() != generation_) drop_graphs();
    const std::pair<uint64_t, int> key{ds.serial, B};
    if (graph_ && key == graph_key_) {
      LRNN_CUDA_CHECK(cudaGraphLaunch(graph_, cuda::stream()));
      st.position += 1;  // what forward_continue counts on the host
      return;
    }
    if (key != seen_key_) {  // the first call at this key: op by op
      dev_->forward_continue(tok_.data(), B, 1, st);
      seen_key_ = key;
      generation_ = dev_->infer_generation();
      return;
    }
    drop_graphs();
    // Capture (forward_continue counts the token once; the launch below runs it once).
    cudaGraph_t g = nullptr;
    LRNN_CUDA_CHECK(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal));
    try {
      dev_->forward_continue(tok_.data(), B, 1, st);
    } catch (...) {
      cudaStreamEndCapture(cuda::stream(), &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    LRNN_CUDA_CHECK(cudaStreamEndCapture(cuda::stream(), &g));
    LRNN_CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
    cudaGraphDestroy(g);
    LRNN_CHECK(dev_->infer_generation() == generation_, "a decode step moved its buffers while being captured");
    graph_key_ = key;
    LRNN_CUDA_CHECK(cudaGraphLaunch(graph_, cuda::stream()));
  }

  static size_t free_bytes() {
    size_t free = 0, total = 0;
    LRNN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

  void drop_graphs() {
    generation_ = dev_->infer_generation();
    seen_key_ = {};
    if (!graph_) return;
    cuda::synchronize();
    cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
  }

  std::string type_;
  std::unique_ptr<DeviceModel> dev_;
  cuda::Buffer<int32_t> tok_;
  cuda::Pinned<int32_t> host_tok_;
  cuda::Pinned<float> logits_;
  bool use_graphs_ = true;
  int generation_ = -1;
  size_t free0_ = 0;  // free device memory before the weights went up
  cudaGraphExec_t graph_ = nullptr;
  std::pair<uint64_t, int> graph_key_{}, seen_key_{};  // serials start at 1: {} is no key
};

}  // namespace

std::unique_ptr<PieceReader> device_reader(const Model<float>& host, const std::string& model_type) {
  return std::make_unique<DeviceReader>(host, model_type);
}

}  // namespace lrnn
