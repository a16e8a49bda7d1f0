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

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  // tokens, labels: device [B,T] (labels may be null: no loss), valid until backward().
  virtual void forward(const int32_t* tokens, const int32_t* labels, int B, int T_) = 0;
  // Accumulates the last forward's gradients into `grads` (of loss_weight times its mean loss).
  virtual void backward() = 0;
  virtual void set_loss_weight(double w) = 0;  // 1 by default; 1 / A with A accumulated micro-batches
  virtual void set_dense_labels(bool d) = 0;   // Model::set_dense_labels
  // Inference (no labels, no saved state), on its own activations: it does not disturb the
  // training buffers (or the CUDA graphs captured over them).
  virtual void infer(const int32_t* tokens, int B, int T_) = 0;
  virtual const float* logits() const = 0;        // device [B,T,V] of the last forward
  virtual const float* infer_logits() const = 0;  // device [B,T,V] of the last infer
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

// The device twin of `host` with its current parameters. UserError when the model type has no
// CUDA path.
std::unique_ptr<DeviceModel> to_device(const Model<float>& host, const std::string& model_type);

}  // namespace lrnn
