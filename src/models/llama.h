// Transformer baseline: a Llama-style decoder with HF `LlamaForCausalLM` names and semantics
// so exported checkpoints load with transformers:
//   h = embed_tokens(x)
//   per layer: h += o_proj(Attn(RoPE(q_proj x1), RoPE(k_proj x1), v_proj x1)), x1 = input_layernorm(h)
//              h += down_proj(silu(gate_proj x2) * up_proj x2),              x2 = post_attention_layernorm(h)
//   logits = lm_head(norm(h))
// Causal softmax attention with rotary embeddings (HF rotate_half convention, rope_theta),
// RMSNorm everywhere, no biases, lm_head untied or tied (tie_word_embeddings), num_key_value_heads = num_attention_heads.
// Init as HF: every Linear and the embedding normal(0, initializer_range), norms 1.
//
// The network is written once (LlamaCore, over models/backend.h's ops): Llama<T> runs it on the
// CPU reference ops, the device model (models/device_model_cuda.cpp) on the CUDA ops.
#pragma once
#include "io/schema.h"
#include "models/core_frame.h"

namespace lrnn {

struct LlamaConfig {
  std::string model_type = "llama";
  int vocab_size = 3;
  int hidden_size = 128;
  int intermediate_size = 0;        // 0: 256*ceil(floor(d*4*2/3)/256), the MLP width of our DeltaNet (d=128 -> 512)
  int num_hidden_layers = 2;
  int num_attention_heads = 4;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int max_position_embeddings = 2048;  // written to config.json only: RoPE itself has no length limit
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;  // lm_head = the embedding matrix

  void describe(io::Schema& s);
  int head_dim() const { return hidden_size / num_attention_heads; }
  int mlp_size() const;
  void validate(const io::Schema& s) const;
};

// Parameter offsets in the flat buffer (HF's names, see the constructor of Llama).
struct LlamaLayout {
  struct LayerParams {
    size_t input_norm, q_proj, k_proj, v_proj, o_proj, post_norm, gate_proj, up_proj, down_proj;
  };
  LlamaConfig cfg;
  std::vector<LayerParams> layers;
  size_t emb = 0, norm = 0, head = 0;
};

// The network's forward and backward on one backend (Ops: CpuOps<T> or CudaOps), over flat
// parameter and gradient buffers in that backend's memory (the frame: models/core_frame.h).
template <class T, class Ops>
class LlamaCore : public CoreFrame<LlamaCore<T, Ops>, T, Ops> {
 public:
  explicit LlamaCore(const LlamaLayout& net) : net_(net) {}
  // As CoreFrame describes: forward(P, tokens, labels, B, T) -> mean loss, backward(P, G).
  double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
  void backward(const T* P, T* G);
  // Piecewise reading (Model::new_decode_state; CPU): the KV cache, per layer the keys (after
  // RoPE) and the values of every token read, [position][B][C] each; it grows with the length.
  std::unique_ptr<DecodeState> new_state(int B) const;

 private:
  using Frame = CoreFrame<LlamaCore, T, Ops>;
  friend Frame;
  using Frame::head_, Frame::tokens_, Frame::labels_, Frame::Bc_, Frame::Tc_, Frame::carried, Frame::carry_;
  struct LayerActs {
    T *h, *rstd1, *x1;
    T* qkv;   // [N, 3C]  q|k|v, one GEMM
    T* qk;    // [N, 2C]  q|k after RoPE
    T* lse;   // [B, H, T] attention log-sum-exp (for the backward)
    T* att;   // [N, C]
    T *hmid, *rstd2, *x2;
    T* gu;    // [N, 2I]  gate|up, one GEMM
    T* act;   // [N, I]
  };
  struct Grads { T *dh, *dx, *datt, *dqkv, *dqk, *dgu, *dact, *dlogits; };
  template <class Alloc> void carve(Alloc& a, int B, int T_, bool train);
  template <class Alloc> void carve_grads(Alloc& a, int B, int T_);

  const LlamaLayout& net_;
  std::vector<LayerActs> layers_;
  Grads g_{};
};

template <class T>
class Llama final : public CoreModel<T, LlamaLayout, LlamaCore> {
 public:
  Llama(const LlamaConfig& cfg, uint64_t seed);
  int vocab_size() const override { return net_.cfg.vocab_size; }
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override { return resolved_block(net_.cfg); }
  const LlamaConfig& config() const { return net_.cfg; }

 private:
  using CoreModel<T, LlamaLayout, LlamaCore>::net_;
};

}  // namespace lrnn
