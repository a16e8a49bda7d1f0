// LSTM baseline (the nonlinear RNN that does solve parity): `torch.nn.LSTM` wrapped as a
// language model. Names are those of this PyTorch module's state_dict, so an exported checkpoint
// loads with `load_state_dict` (tools/golden_baselines.py builds it and checks the keys):
//   class LSTMLM(nn.Module):
//     embedding = nn.Embedding(vocab_size, embedding_dim)        # embedding.weight [V, E]
//     lstm = nn.LSTM(embedding_dim, hidden_size, num_layers)     # lstm.{weight_ih,weight_hh,bias_ih,bias_hh}_l{k}
//     head = nn.Linear(hidden_size, vocab_size)                  # head.weight [V, H], head.bias [V]
//     forward(x [B,T]) = head(lstm(embedding(x).transpose(0, 1))[0]).transpose(0, 1)
// Gate order i, f, g, o (weights [4H, in]); h_0 = c_0 = 0; no dropout, unidirectional.
// Init as PyTorch's defaults: embedding normal(0, 1); every LSTM tensor and the head
// uniform(-1/sqrt(H), 1/sqrt(H)). Weight decay on the weight matrices and the embedding, not on biases.
// Activations are time-major inside (as nn.LSTM); logits() is [B,T,V] like every model.
//
// The network is written once (LstmCore, over models/backend.h's ops): Lstm<T> runs it on the
// CPU reference ops, the device model (models/device_model_cuda.cpp) on the CUDA ops.
#pragma once
#include "io/schema.h"
#include "models/core_frame.h"

namespace lrnn {

struct LstmConfig {
  std::string model_type = "lstm";
  int vocab_size = 3;
  int embedding_dim = 0;   // 0: hidden_size
  int hidden_size = 128;
  int num_layers = 2;

  void describe(io::Schema& s);
  int input_size() const { return embedding_dim > 0 ? embedding_dim : hidden_size; }
  void validate(const io::Schema&) const {}
};

// Parameter offsets in the flat buffer (the state_dict names, see the constructor of Lstm).
struct LstmLayout {
  struct LayerParams { size_t w_ih, w_hh, b_ih, b_hh; };
  LstmConfig cfg;
  std::vector<LayerParams> layers;
  size_t emb = 0, head_w = 0, head_b = 0;
};

// The network's forward and backward on one backend (Ops: CpuOps<T> or CudaOps), over flat
// parameter and gradient buffers in that backend's memory (the frame: models/core_frame.h; of
// its head only the logits and the loss: the LSTM's head is a biased linear map on time-major rows).
template <class T, class Ops>
class LstmCore : public CoreFrame<LstmCore<T, Ops>, T, Ops> {
 public:
  explicit LstmCore(const LstmLayout& net) : net_(net) {}
  // As CoreFrame describes: forward(P, tokens, labels, B, T) -> mean loss, backward(P, G).
  double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
  void backward(const T* P, T* G);

 private:
  using Frame = CoreFrame<LstmCore, T, Ops>;
  friend Frame;
  using Frame::head_, Frame::Bc_, Frame::Tc_;
  struct LayerActs { T *h, *c, *gates; };   // time-major [T,B,H], [T,B,H], [T,B,4H]
  struct Acts {
    int32_t *tokens_tm, *labels_tm;         // time-major [T,B]
    T* x;                                   // embeddings, time-major [T,B,E]
    std::vector<LayerActs> layers;
    T* logits_tm;                           // [T,B,V]; head_.logits: [B,T,V]
  };
  struct Grads { T *dlogits, *dh, *dx, *work; };
  template <class Alloc> void carve(Alloc& a, int B, int T_, bool train);
  template <class Alloc> void carve_grads(Alloc& a, int B, int T_);

  const LstmLayout& net_;
  Acts acts_{};
  Grads g_{};
};

template <class T>
class Lstm final : public CoreModel<T, LstmLayout, LstmCore> {
 public:
  Lstm(const LstmConfig& cfg, uint64_t seed);
  int vocab_size() const override { return net_.cfg.vocab_size; }
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override { return resolved_block(net_.cfg); }
  const LstmConfig& config() const { return net_.cfg; }

 private:
  using CoreModel<T, LstmLayout, LstmCore>::net_;
};

}  // namespace lrnn
