#include "models/gated_deltaproduct.h"
#include <cmath>
#include <fmt/format.h>

namespace lrnn {

namespace {

// Keys both configs share, in fla's spelling.
template <class C>
void describe_common(io::Schema& s, C& c) {
  s.add("vocab_size", &c.vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("hidden_size", &c.hidden_size, "model width d", 1, 1 << 16)
      .add("num_hidden_layers", &c.num_hidden_layers, "number of blocks", 1, 1024)
      .add("num_heads", &c.num_heads, "heads", 1, 4096)
      .add("head_dim", &c.head_dim, "key (and query) width per head", 1, 4096)
      .add("expand_v", &c.expand_v, "value width per head = head_dim * expand_v", 0.0, 64.0)
      .add("allow_neg_eigval", &c.allow_neg_eigval, "beta = 2*sigmoid: eigenvalues in [-1,1] instead of [0,1]");
}

template <class C>
void describe_tail(io::Schema& s, C& c) {
  s.add("use_short_conv", &c.use_short_conv, "causal depthwise conv + SiLU on q, k, v")
      .add("conv_size", &c.conv_size, "short convolution width", 1, 64)
      .add("norm_eps", &c.norm_eps, "RMSNorm epsilon", 0.0, 1.0)
      .add("hidden_ratio", &c.hidden_ratio, "MLP expansion ratio (used when intermediate_size is 0)", 1, 64)
      .add("intermediate_size", &c.intermediate_size, "MLP width; 0 = fla's rule from hidden_ratio", 0, 1 << 20)
      .add("initializer_range", &c.initializer_range, "std of normal initialisations", 0.0, 10.0)
      .add("tie_word_embeddings", &c.tie_word_embeddings, "lm_head shares the embedding matrix (fla/HF tie_word_embeddings)");
}

template <class C>
void validate_common(const io::Schema& s, const C& c) {
  const double v = c.head_dim * c.expand_v;
  if (!(v >= 1.0) || std::abs(v - std::round(v)) > 1e-5 * v)
    s.fail("expand_v", fmt::format("head_dim * expand_v must be a positive integer, got {} * {} = {}", c.head_dim,
                                   c.expand_v, v));
}

template <class C>
DeltaLMSpec common_spec(const C& c) {
  DeltaLMSpec s;
  s.vocab_size = c.vocab_size;
  s.hidden_size = c.hidden_size;
  s.num_hidden_layers = c.num_hidden_layers;
  s.num_heads = c.num_heads;
  s.head_k_dim = c.head_dim;
  s.head_v_dim = c.head_v_dim();
  s.allow_neg_eigval = c.allow_neg_eigval;
  s.use_short_conv = c.use_short_conv;
  s.conv_size = c.conv_size;
  s.norm_eps = c.norm_eps;
  s.intermediate_size = fla_mlp_size(c.hidden_size, c.hidden_ratio, c.intermediate_size);
  s.initializer_range = c.initializer_range;
  s.tie_word_embeddings = c.tie_word_embeddings;
  return s;
}

// config.json keys both fla configs share.
template <class C>
nlohmann::json common_hf(const C& c) {
  return {{"attn_mode", "chunk"},
          {"hidden_size", c.hidden_size},
          {"head_dim", c.head_dim},
          {"num_heads", c.num_heads},
          {"expand_v", c.expand_v},
          {"use_short_conv", c.use_short_conv},
          {"conv_size", c.conv_size},
          {"allow_neg_eigval", c.allow_neg_eigval},
          {"max_position_embeddings", 2048},
          {"hidden_ratio", c.hidden_ratio},
          {"intermediate_size", fla_mlp_size(c.hidden_size, c.hidden_ratio, c.intermediate_size)},
          {"hidden_act", "swish"},
          {"num_hidden_layers", c.num_hidden_layers},
          {"norm_eps", c.norm_eps},
          {"attn", nullptr},
          {"use_cache", true},
          {"pad_token_id", nullptr},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"initializer_range", c.initializer_range},
          {"fuse_norm", false},
          {"fuse_swiglu", false},
          {"fuse_cross_entropy", false},
          {"fuse_linear_cross_entropy", false},
          {"use_l2warp", false},
          {"vocab_size", c.vocab_size}};
}

}  // namespace

void GatedDeltaProductConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"gated_deltaproduct"});
  describe_common(s, *this);
  s.add("num_householder", &num_householder, "n_h: Householder sub-steps (own k, v, beta) per token", 1, 64)
      .add("householder_init", &householder_init,
           "fused: xavier over the n_h blocks of k/v/beta projections together (fla's layer); per_step: each "
           "sub-step's block initialised as its own matrix (the DeltaProduct paper's code)",
           {"fused", "per_step"})
      .add("use_forget_gate", &use_forget_gate, "Mamba-2 style decay exp(g) once per token (a_proj, A_log, dt_bias)")
      .add("use_output_gate", &use_output_gate, "o_norm(o) * SiLU(g_proj x)");
  describe_tail(s, *this);
}

void GatedDeltaProductConfig::validate(const io::Schema& s) const { validate_common(s, *this); }

DeltaLMSpec GatedDeltaProductConfig::spec() const {
  DeltaLMSpec s = common_spec(*this);
  s.num_householder = num_householder;
  s.init_per_step = householder_init == "per_step";
  s.use_forget_gate = use_forget_gate;
  s.use_output_gate = use_output_gate;
  return s;
}

void GatedDeltaNetConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"gated_deltanet"});
  describe_common(s, *this);
  s.add("use_gate", &use_gate, "output gate: o_norm(o) * SiLU(g_proj x)");
  describe_tail(s, *this);
}

void GatedDeltaNetConfig::validate(const io::Schema& s) const { validate_common(s, *this); }

DeltaLMSpec GatedDeltaNetConfig::spec() const {
  DeltaLMSpec s = common_spec(*this);
  s.num_householder = 1;
  s.use_forget_gate = true;
  s.use_output_gate = use_gate;
  return s;
}

template <class T>
nlohmann::json GatedDeltaProduct<T>::hf_config() const {
  // fla's GatedDeltaProductConfig keys: the checkpoint loads with GatedDeltaProductForCausalLM.
  nlohmann::json j = common_hf(cfg_);
  j["model_type"] = "gated_deltaproduct";
  j["architectures"] = {"GatedDeltaProductForCausalLM"};
  j["use_output_gate"] = cfg_.use_output_gate;
  j["use_forget_gate"] = cfg_.use_forget_gate;
  j["num_householder"] = cfg_.num_householder;
  return j;
}

template <class T>
YAML::Node GatedDeltaProduct<T>::resolved_config() const { return resolved_block(cfg_); }

template <class T>
nlohmann::json GatedDeltaNet<T>::hf_config() const {
  // fla's GatedDeltaNetConfig keys: the checkpoint loads with GatedDeltaNetForCausalLM.
  nlohmann::json j = common_hf(cfg_);
  j["model_type"] = "gated_deltanet";
  j["architectures"] = {"GatedDeltaNetForCausalLM"};
  j["use_gate"] = cfg_.use_gate;
  j["num_v_heads"] = nullptr;
  return j;
}

template <class T>
YAML::Node GatedDeltaNet<T>::resolved_config() const { return resolved_block(cfg_); }

template class GatedDeltaProduct<float>;
template class GatedDeltaProduct<double>;
template class GatedDeltaNet<float>;
template class GatedDeltaNet<double>;

}  // namespace lrnn
