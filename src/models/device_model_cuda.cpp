#include "models/device_model.h"
#include "core/check.h"
#include "models/delta_lm.h"
#include "models/mamba.h"

namespace lrnn {

namespace {

// DeltaNet, Gated DeltaNet, (Gated) DeltaProduct: DeltaLMCore on CudaOps.
class DeltaLMDevice final : public DeviceModel {
 public:
  explicit DeltaLMDevice(const DeltaLM<float>& host) : net_(host.net()) {
    params.upload(host.params);
    grads.resize(host.params.size());
    grads.zero();
  }
  void forward(const int32_t* tokens, const int32_t* labels, int B, int T_) override {
    train_.forward(params.data(), tokens, labels, B, T_);
  }
  void backward() override { train_.backward(params.data(), grads.data()); }
  void infer(const int32_t* tokens, int B, int T_) override { infer_.forward(params.data(), tokens, nullptr, B, T_); }
  const float* logits() const override { return train_.logits(); }
  const float* infer_logits() const override { return infer_.logits(); }
  const float* loss() const override { return train_.loss(); }
  void reserve(int B, int T_) override { train_.reserve(B, T_, true); }
  int generation() const override { return train_.generation(); }
  int vocab_size() const override { return net_.spec.vocab_size; }

 private:
  DeltaLMLayout net_;
  DeltaLMCore<float, CudaOps> train_{net_}, infer_{net_};
};

// Mamba ([0,1] and [-1,1]): MambaCore on CudaOps.
class MambaDevice final : public DeviceModel {
 public:
  explicit MambaDevice(const Mamba<float>& host) : net_(host.net()) {
    params.upload(host.params);
    grads.resize(host.params.size());
    grads.zero();
  }
  void forward(const int32_t* tokens, const int32_t* labels, int B, int T_) override {
    train_.forward(params.data(), tokens, labels, B, T_);
  }
  void backward() override { train_.backward(params.data(), grads.data()); }
  void infer(const int32_t* tokens, int B, int T_) override { infer_.forward(params.data(), tokens, nullptr, B, T_); }
  const float* logits() const override { return train_.logits(); }
  const float* infer_logits() const override { return infer_.logits(); }
  const float* loss() const override { return train_.loss(); }
  void reserve(int B, int T_) override { train_.reserve(B, T_, true); }
  int generation() const override { return train_.generation(); }
  int vocab_size() const override { return net_.cfg.vocab_size; }

 private:
  MambaLayout net_;
  MambaCore<float, CudaOps> train_{net_}, infer_{net_};
};

}  // namespace

std::unique_ptr<DeviceModel> to_device(const Model<float>& host, const std::string& model_type) {
  if (auto* m = dynamic_cast<const DeltaLM<float>*>(&host)) return std::make_unique<DeltaLMDevice>(*m);
  if (auto* m = dynamic_cast<const Mamba<float>*>(&host)) return std::make_unique<MambaDevice>(*m);
  LRNN_USER_ERROR("model.model_type: '{}' has no CUDA path yet (CUDA: delta_net, gated_deltanet, "
                  "gated_deltaproduct, mamba); train it with training.device: cpu",
                  model_type);
}

}  // namespace lrnn
