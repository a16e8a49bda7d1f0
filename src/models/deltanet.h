// DeltaNet language model, fla `DeltaNetForCausalLM`: pre-norm blocks of
//   h += o_proj(o_norm(DeltaRule(q, k, v, beta)))   with attn_norm before it,
//   h += down(silu(gate(x)) * up(x))                with mlp_norm before it,
// q, k, v = SiLU(ShortConv(W x)), q and k L2-normalised per head, beta = s * sigmoid(b_proj x),
// s = 2 when allow_neg_eigval (eigenvalues of the transition in [-1, 1]). The block is the delta
// family's (models/delta_lm.h) with one sub-step and no gates; this file adds DeltaNet's config.
#pragma once
#include "io/schema.h"
#include "models/delta_lm.h"

namespace lrnn {

struct DeltaNetConfig {
  std::string model_type = "delta_net";
  int vocab_size = 3;
  int hidden_size = 128;
  int num_hidden_layers = 2;
  int num_heads = 4;
  bool allow_neg_eigval = false;   // false: [0,1]; true: [-1,1]
  bool use_short_conv = true;
  int conv_size = 4;
  double norm_eps = 1e-6;
  int hidden_ratio = 4;
  int intermediate_size = 0;       // 0: fla's rule 256*ceil(floor(d*ratio*2/3)/256)
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;  // lm_head = the embedding matrix

  void describe(io::Schema& s);
  int head_dim() const { return hidden_size / num_heads; }
  int mlp_size() const;
  void validate(const io::Schema& s) const;
  DeltaLMSpec spec() const;  // n_h = 1, no gates, Dk = Dv = hidden_size / num_heads
};

template <class T>
class DeltaNet final : public DeltaLM<T> {
 public:
  DeltaNet(const DeltaNetConfig& cfg, uint64_t seed) : DeltaLM<T>(cfg.spec(), seed), cfg_(cfg) {}
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override;
  const DeltaNetConfig& config() const { return cfg_; }

 private:
  DeltaNetConfig cfg_;
};

}  // namespace lrnn
