#include "models/device_model.h"
#include <atomic>
#include "core/check.h"
#include "models/delta_lm.h"
#include "models/llama.h"
#include "models/lstm.h"
#include "models/mamba.h"
#include "models/xlstm.h"

namespace lrnn {

namespace {

// A host model's network core (DeltaLMCore, MambaCore, LstmCore, LlamaCore) on CudaOps: one core for training, one
// for inference, over the device copy of the host's flat parameters.
template <class Layout, template <class, class> class Core, bool kPiecewise = false>
class CoreDevice final : public DeviceModel {
 public:
  template <class Host>
  CoreDevice(const Host& host, bool with_grads) : net_(host.net()), vocab_(host.vocab_size()) {
    params.upload(host.params);
    if (with_grads) {
      grads.resize(host.params.size());
      grads.zero();
    }
  }
  void forward(const int32_t* tokens, const int32_t* labels, int B, int T_) override {
    train_.forward(params.data(), tokens, labels, B, T_);
  }
  void backward() override { train_.backward(params.data(), grads.data()); }
  void set_loss_weight(double w) override { train_.set_loss_weight(w); }
  void set_dense_labels(bool d) override { train_.set_dense_labels(d); }
  void infer(const int32_t* tokens, int B, int T_) override { infer_.forward(params.data(), tokens, nullptr, B, T_); }
  const float* logits() const override { return train_.logits(); }
  const float* infer_logits() const override { return infer_.logits(); }
  const float* loss() const override { return train_.loss(); }
  void reserve(int B, int T_) override { train_.reserve(B, T_, true); }
  int generation() const override { return train_.generation(); }
  int infer_generation() const override { return infer_.generation(); }
  std::unique_ptr<DecodeState> new_decode_state(int B) override {
    if constexpr (kPiecewise) {
      static std::atomic<uint64_t> serials{0};
      auto host = infer_.new_state(B);
      auto st = std::make_unique<DeviceDecodeState>();
      st->B = B;
      st->serial = ++serials;
      for (const auto& b : dynamic_cast<const CoreDecodeState<float>&>(*host).buffers) {
        st->buffers.emplace_back(b.size());
        st->buffers.back().zero();
      }
      return st;
    } else {
      return nullptr;
    }
  }
  void forward_continue(const int32_t* tokens, int B, int T_, DecodeState& st) override {
    auto& s = dynamic_cast<DeviceDecodeState&>(st);
    LRNN_CHECK(kPiecewise, "forward_continue: this model has no decode state on the GPU");
    LRNN_CHECK(s.B == B, "forward_continue: a state for {} sequences given {}", s.B, B);
    std::vector<float*> bufs;
    for (auto& b : s.buffers) bufs.push_back(b.size() ? b.data() : nullptr);
    infer_.forward_carried(params.data(), tokens, B, T_, std::move(bufs));
    s.position += T_;
  }
  int vocab_size() const override { return vocab_; }

 private:
  Layout net_;
  int vocab_;
  Core<float, CudaOps> train_{net_}, infer_{net_};
};

}  // namespace

void DeviceModel::pad_buffers(size_t n) {
  if (n <= params.size()) return;
  cuda::Buffer<float> p(n);
  LRNN_CUDA_CHECK(cudaMemsetAsync(p.data(), 0, n * sizeof(float), cuda::stream()));
  LRNN_CUDA_CHECK(cudaMemcpyAsync(p.data(), params.data(), params.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                                  cuda::stream()));
  cuda::synchronize();
  params = std::move(p);
  grads.resize(n);
  grads.zero();
}

std::unique_ptr<DeviceModel> to_device(const Model<float>& host, const std::string& model_type, bool with_grads) {
  // DeltaNet, Gated DeltaNet, (Gated) DeltaProduct; Mamba ([0,1] and [-1,1]).
  if (auto* m = dynamic_cast<const DeltaLM<float>*>(&host))
    return std::make_unique<CoreDevice<DeltaLMLayout, DeltaLMCore, true>>(*m, with_grads);
  if (auto* m = dynamic_cast<const Mamba<float>*>(&host))
    return std::make_unique<CoreDevice<MambaLayout, MambaCore, true>>(*m, with_grads);
  // xLSTM: mLSTM or sLSTM blocks.
  if (auto* m = dynamic_cast<const XLSTM<float>*>(&host))
    return std::make_unique<CoreDevice<XLSTMLayout, XLSTMCore>>(*m, with_grads);
  // The baselines: LSTM, Transformer (Llama).
  if (auto* m = dynamic_cast<const Lstm<float>*>(&host))
    return std::make_unique<CoreDevice<LstmLayout, LstmCore>>(*m, with_grads);
  if (auto* m = dynamic_cast<const Llama<float>*>(&host))
    return std::make_unique<CoreDevice<LlamaLayout, LlamaCore>>(*m, with_grads);
  LRNN_USER_ERROR("model.model_type: '{}' has no CUDA path (CUDA: delta_net, gated_deltanet, gated_deltaproduct, "
                  "mamba, mlstm, slstm, lstm, llama); train it with training.device: cpu",
                  model_type);
}

}  // namespace lrnn
