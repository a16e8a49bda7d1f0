// A model resident on the CUDA device (CUDA builds only): parameters, gradients and activations
// in device memory, every op launched on cuda::stream(), nothing synchronised with the host.
// It is the device twin of a CPU model: the same flat parameter layout (so checkpoints, AdamW
// and clipping are single loops over one buffer on either side) and the same network code
// (each model's core class instantiated with CudaOps, models/backend.h).
#pragma once
#include <memory>
#include "cuda/runtime.h"
#include "models/model.h"

namespace lrnn {

// A decode state in device memory: the host core's buffers (CoreDecodeState) with the same sizes
// and meaning, one per layer and kind. `serial` is unique per state (what a captured graph over
// its buffers is keyed by; an address may be reused).
struct DeviceDecodeState : DecodeState {
  int B = 0;
  uint64_t serial = 0;
  std::vector<cuda::Buffer<float>> buffers;
  size_t bytes() const override {
    size_t n = 0;
    for (const auto& b : buffers) n += b.size() * sizeof(float);
    return n;
  }
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  // tokens, labels: device [B,T] (labels may be null: no loss), valid until backward().
  virtual void forward(const int32_t* tokens, const int32_t* labels, int B, int T_) = 0;
  // Accumulates the last forward's gradients into `grads` (of loss_weight times its mean loss).
  virtual void backward() = 0;
  // 1 by default; 1 / A with A accumulated micro-batches. Set before the forward it applies to.
  virtual void set_loss_weight(double w) = 0;
  virtual void set_dense_labels(bool d) = 0;   // Model::set_dense_labels
  // Inference (no labels, no saved state), on its own activations: it does not disturb the
  // training buffers (or the CUDA graphs captured over them).
  virtual void infer(const int32_t* tokens, int B, int T_) = 0;
  virtual const float* logits() const = 0;        // device [B,T,V] of the last forward
  virtual const float* infer_logits() const = 0;  // device [B,T,V] of the last infer or forward_continue
  // Piecewise reading on the device (models/model.h DecodeState): a fresh DeviceDecodeState for B
  // sequences, or null where the model has none on the GPU (the Transformer's KV cache is on the
  // CPU only; the xLSTMs and the LSTM have no decode state at all).
  virtual std::unique_ptr<DecodeState> new_decode_state(int B) = 0;
  // The forward (no labels) of device tokens [B,T] that continue the sequences `st` has read, on
  // the inference activations: infer_logits() then holds [B,T,V].
  virtual void forward_continue(const int32_t* tokens, int B, int T_, DecodeState& st) = 0;
  // Bumped whenever an inference buffer moved (graphs captured over infer/forward_continue).
  virtual int infer_generation() const = 0;
  virtual const float* loss() const = 0;          // device scalar: the last forward's mean loss
  // Sizes the training buffers for steps up to (B, T) (none may grow inside a captured graph).
  virtual void reserve(int B, int T_) = 0;
  // Bumped whenever a training buffer moved (graphs captured before are stale).
  virtual int generation() const = 0;
  virtual int vocab_size() const = 0;

  // Grows params and grads to n elements, the new tail zero (data parallelism shards them in equal
  // slices; the model never reads past its own parameters). Call it before any step.
  void pad_buffers(size_t n);

  cuda::Buffer<float> params, grads;  // the host model's layout (then padding, if any)
};

// The device twin of `host` with its current parameters (and zero gradients, unless with_grads is
// false: inference). UserError when the model type has no CUDA path.
std::unique_ptr<DeviceModel> to_device(const Model<float>& host, const std::string& model_type,
                                       bool with_grads = true);

}  // namespace lrnn
