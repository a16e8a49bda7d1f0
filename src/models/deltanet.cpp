#include "models/deltanet.h"
#include <fmt/format.h>

namespace lrnn {

void DeltaNetConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"delta_net"})
      .add("vocab_size", &vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("hidden_size", &hidden_size, "model width d", 1, 1 << 16)
      .add("num_hidden_layers", &num_hidden_layers, "number of blocks", 1, 1024)
      .add("num_heads", &num_heads, "heads; head dim = hidden_size / num_heads", 1, 4096)
      .add("allow_neg_eigval", &allow_neg_eigval, "beta = 2*sigmoid: eigenvalues in [-1,1] instead of [0,1]")
      .add("use_short_conv", &use_short_conv, "causal depthwise conv + SiLU on q, k, v")
      .add("conv_size", &conv_size, "short convolution width", 1, 64)
      .add("norm_eps", &norm_eps, "RMSNorm epsilon", 0.0, 1.0)
      .add("hidden_ratio", &hidden_ratio, "MLP expansion ratio (used when intermediate_size is 0)", 1, 64)
      .add("intermediate_size", &intermediate_size, "MLP width; 0 = fla's rule from hidden_ratio", 0, 1 << 20)
      .add("initializer_range", &initializer_range, "std of normal initialisations", 0.0, 10.0)
      .add("tie_word_embeddings", &tie_word_embeddings, "lm_head shares the embedding matrix (fla/HF tie_word_embeddings)");
}

int DeltaNetConfig::mlp_size() const { return fla_mlp_size(hidden_size, hidden_ratio, intermediate_size); }

void DeltaNetConfig::validate(const io::Schema& s) const {
  if (hidden_size % num_heads != 0)
    s.fail("num_heads", fmt::format("must divide hidden_size ({}), got {}", hidden_size, num_heads));
}

DeltaLMSpec DeltaNetConfig::spec() const {
  DeltaLMSpec s;
  s.vocab_size = vocab_size;
  s.hidden_size = hidden_size;
  s.num_hidden_layers = num_hidden_layers;
  s.num_heads = num_heads;
  s.head_k_dim = s.head_v_dim = head_dim();
  s.num_householder = 1;
  s.allow_neg_eigval = allow_neg_eigval;
  s.use_short_conv = use_short_conv;
  s.conv_size = conv_size;
  s.use_forget_gate = s.use_output_gate = false;
  s.norm_eps = norm_eps;
  s.intermediate_size = mlp_size();
  s.initializer_range = initializer_range;
  s.tie_word_embeddings = tie_word_embeddings;
  return s;
}

template <class T>
nlohmann::json DeltaNet<T>::hf_config() const {
  // fla's DeltaNetConfig keys, so the checkpoint loads with DeltaNetForCausalLM.
  return {{"model_type", "delta_net"},
          {"architectures", {"DeltaNetForCausalLM"}},
          {"attn_mode", "chunk"},
          {"hidden_size", cfg_.hidden_size},
          {"expand_k", 1},
          {"expand_v", 1},
          {"use_gate", false},
          {"use_short_conv", cfg_.use_short_conv},
          {"conv_size", cfg_.conv_size},
          {"use_beta", true},
          {"use_output_norm", true},
          {"num_heads", cfg_.num_heads},
          {"head_dim", cfg_.head_dim()},
          {"qk_norm", "l2"},
          {"qk_activation", "silu"},
          {"hidden_ratio", cfg_.hidden_ratio},
          {"intermediate_size", cfg_.mlp_size()},
          {"hidden_act", "swish"},
          {"num_hidden_layers", cfg_.num_hidden_layers},
          {"norm_eps", cfg_.norm_eps},
          {"attn", nullptr},
          {"use_cache", true},
          {"pad_token_id", nullptr},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"tie_word_embeddings", cfg_.tie_word_embeddings},
          {"initializer_range", cfg_.initializer_range},
          {"fuse_norm", false},
          {"fuse_swiglu", false},
          {"fuse_cross_entropy", false},
          {"vocab_size", cfg_.vocab_size},
          {"allow_neg_eigval", cfg_.allow_neg_eigval}};
}

template <class T>
YAML::Node DeltaNet<T>::resolved_config() const { return resolved_block(cfg_); }

template class DeltaNet<float>;
template class DeltaNet<double>;

}  // namespace lrnn
