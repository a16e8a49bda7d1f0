// (Gated) DeltaProduct and Gated DeltaNet language models, fla `GatedDeltaProductForCausalLM`
// (model_type "gated_deltaproduct") and `GatedDeltaNetForCausalLM` ("gated_deltanet"), on the
// delta family's block (models/delta_lm.h):
// - DeltaProduct: n_h = num_householder Householder sub-steps per token, each with its own k, v
//   and beta (k_proj [n_h*H*Dk, d], "t (n h d)" layout), q read after the last one;
//   optional forget gate (use_forget_gate: a_proj, A_log, dt_bias; log alpha =
//   -exp(A_log)*softplus(a_proj x + dt_bias), applied once per token before the first
//   sub-step) and output gate (use_output_gate: o_norm(o) * SiLU(g_proj x)).
// - Gated DeltaNet: n_h = 1, the forget gate always on, the output gate named use_gate.
// Heads have their own width (head_dim, not hidden_size / num_heads); values are head_dim *
// expand_v wide. allow_neg_eigval: beta = 2*sigmoid, eigenvalues of every factor in [-1, 1].
// The P2 state-tracking model is gated_deltaproduct with hidden_size 128, 1 layer, 8 heads of
// 32, use_short_conv/use_forget_gate/use_output_gate false. Defaults: sizes of that model (with
// expand_v 1), switches as fla's configs.
#pragma once
#include "io/schema.h"
#include "models/delta_lm.h"

namespace lrnn {

struct GatedDeltaProductConfig {
  std::string model_type = "gated_deltaproduct";
  int vocab_size = 3;
  int hidden_size = 128;
  int num_hidden_layers = 1;
  int num_heads = 8;
  int head_dim = 32;
  double expand_v = 1.0;          // value head dim = head_dim * expand_v
  int num_householder = 1;        // n_h
  // How k_proj, v_proj and b_proj (n_h blocks each) start: "fused" as fla's layer (xavier over
  // the whole [n_h rows, d] matrix, so the bound shrinks as n_h grows), "per_step" as the
  // DeltaProduct authors' fork of it (each sub-step's projection its own matrix, xavier over its
  // own shape). The default is fla's: the shipped n_h = 2 results were measured with it.
  std::string householder_init = "fused";
  bool allow_neg_eigval = false;  // false: [0,1]; true: [-1,1]
  bool use_forget_gate = false;
  bool use_output_gate = true;
  bool use_short_conv = true;
  int conv_size = 4;
  double norm_eps = 1e-6;
  int hidden_ratio = 4;
  int intermediate_size = 0;      // 0: fla's rule 256*ceil(floor(d*ratio*2/3)/256)
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;

  void describe(io::Schema& s);
  void validate(const io::Schema& s) const;
  int head_v_dim() const { return int(std::lround(head_dim * expand_v)); }
  DeltaLMSpec spec() const;
};

struct GatedDeltaNetConfig {
  std::string model_type = "gated_deltanet";
  int vocab_size = 3;
  int hidden_size = 128;
  int num_hidden_layers = 1;
  int num_heads = 8;
  int head_dim = 32;
  double expand_v = 1.0;
  bool allow_neg_eigval = false;
  bool use_gate = true;           // output gate
  bool use_short_conv = true;
  int conv_size = 4;
  double norm_eps = 1e-6;
  int hidden_ratio = 4;
  int intermediate_size = 0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;

  void describe(io::Schema& s);
  void validate(const io::Schema& s) const;
  int head_v_dim() const { return int(std::lround(head_dim * expand_v)); }
  DeltaLMSpec spec() const;  // n_h = 1 with the forget gate
};

template <class T>
class GatedDeltaProduct final : public DeltaLM<T> {
 public:
  GatedDeltaProduct(const GatedDeltaProductConfig& cfg, uint64_t seed) : DeltaLM<T>(cfg.spec(), seed), cfg_(cfg) {}
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override;
  const GatedDeltaProductConfig& config() const { return cfg_; }

 private:
  GatedDeltaProductConfig cfg_;
};

template <class T>
class GatedDeltaNet final : public DeltaLM<T> {
 public:
  GatedDeltaNet(const GatedDeltaNetConfig& cfg, uint64_t seed) : DeltaLM<T>(cfg.spec(), seed), cfg_(cfg) {}
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override;
  const GatedDeltaNetConfig& config() const { return cfg_; }

 private:
  GatedDeltaNetConfig cfg_;
};

}  // namespace lrnn
