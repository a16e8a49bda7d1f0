// Mamba (Mamba-1) language model, HF transformers `MambaForCausalLM` names:
//   h = embeddings(tokens)
//   per layer:  h += mixer(RMSNorm(h))                         (backbone.layers.{i}.norm, .mixer)
//   logits = lm_head(RMSNorm(h))                               (backbone.norm_f; lm_head untied or tied)
// Mixer, d_inner = expand * d, dt_rank R, state size N:
//   x, z  = split(in_proj(u))                                  in_proj: d -> 2 d_inner (x | z)
//   x     = SiLU(causal depthwise conv1d(x) + conv1d.bias)     kernel conv_kernel
//   dt, B, C = split(x_proj(x))                                x_proj: d_inner -> R + 2N
//   delta = softplus(dt_proj(dt) + dt_proj.bias)
//   A     = -exp(A_log);  abar = exp(delta A)          if allow_neg_eigval is false: [0,1]
//                         abar = 2 exp(delta A) - 1    if allow_neg_eigval is true:  [-1,1]
//   h_t   = abar * h_{t-1} + delta B_t x_t ;  y = C_t . h_t + D x_t      (ops/selective_scan)
//   out   = out_proj(y * SiLU(z))
// `allow_neg_eigval` is the same key as DeltaNet's (the P1 fork calls it `positive_and_negative`).
//
// Initialisation (HF `MambaPreTrainedModel._init_weights`, as far as it matters):
//   A_log[c, n] = log(n + 1) (S4D-real), D = 1, conv1d.bias = 0, all norm weights 1;
//   dt_proj.weight ~ U(±time_step_rank^-1/2 · time_step_scale) ("random") or that constant;
//   dt_proj.bias = softplus^-1(dt), dt = exp(U(log time_step_min, log time_step_max)) clamped
//     below at time_step_floor, so that delta starts in [0.001, 0.1];
//   conv1d.weight ~ U(±1/sqrt(conv_kernel)) and out_proj.weight ~ U(±1/sqrt(d_inner))
//     (PyTorch's kaiming_uniform(a=√5)), out_proj divided by sqrt(L) if rescale_prenorm_residual;
//   embeddings, in_proj, x_proj, lm_head ~ N(0, initializer_range); in/out_proj biases 0.
// No weight decay on norm weights, biases, A_log and D (mamba_ssm's `_no_weight_decay`).
//
// The network is written once (MambaCore, over models/backend.h's ops): Mamba<T> runs it on the
// CPU reference ops, the device model (CoreDevice, models/device_model_cuda.cpp) on the CUDA ops.
#pragma once
#include "io/schema.h"
#include "models/core_frame.h"
#include "ops/selective_scan/selective_scan.h"

namespace lrnn {

struct MambaConfig {
  std::string model_type = "mamba";
  int vocab_size = 3;
  int hidden_size = 128;
  int state_size = 16;
  int num_hidden_layers = 2;
  int expand = 2;
  int conv_kernel = 4;
  int time_step_rank = 0;           // 0: HF's "auto", ceil(hidden_size / 16)
  bool use_bias = false;            // in_proj / out_proj biases (mamba_ssm and P1: none)
  bool use_conv_bias = true;
  bool allow_neg_eigval = false;    // false: abar in [0,1]; true: [-1,1]
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.1;
  double time_step_scale = 1.0;
  double time_step_min = 0.001;
  double time_step_max = 0.1;
  double time_step_floor = 1e-4;
  std::string time_step_init_scheme = "random";
  bool rescale_prenorm_residual = false;
  bool tie_word_embeddings = false;  // lm_head = the embedding matrix (HF's default; mamba_ssm's too)

  void describe(io::Schema& s);
  void validate(const io::Schema& s) const;
  int d_inner() const { return expand * hidden_size; }
  int dt_rank() const { return time_step_rank > 0 ? time_step_rank : (hidden_size + 15) / 16; }
};

// Where the network's pieces sit: parameter offsets in the flat buffer (HF's names, see the
// constructor of Mamba) and the scan's dimensions. Backend-independent.
struct MambaLayout {
  static constexpr size_t kNone = size_t(-1);  // an absent (optional) tensor
  struct LayerParams {
    size_t norm, in_proj, in_bias, conv, conv_bias, x_proj, dt_proj, dt_bias, A_log, D, out_proj, out_bias;
  };
  MambaConfig cfg;
  std::vector<LayerParams> layers;
  size_t emb = 0, norm = 0, head = 0;
  ops::SelectiveScanDims dims(int B, int T_) const;
  // The parameter (or gradient) at `off` in the flat buffer `base`, null when absent.
  template <class T> static T* opt(T* base, size_t off) { return off == kNone ? nullptr : base + off; }
};

// The network's forward and backward on one backend (Ops: CpuOps<T> or CudaOps), over flat
// parameter and gradient buffers in that backend's memory (the frame: models/core_frame.h).
template <class T, class Ops>
class MambaCore : public CoreFrame<MambaCore<T, Ops>, T, Ops> {
 public:
  explicit MambaCore(const MambaLayout& net) : net_(net) {}
  // As CoreFrame describes: forward(P, tokens, labels, B, T) -> mean loss, backward(P, G).
  double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
  void backward(const T* P, T* G);
  // Piecewise reading (Model::new_decode_state; on the GPU DeviceDecodeState, laid out alike): per
  // layer the conv's last K-1 inputs [B,K-1,Di] and the scan's state [B][N*Di].
  std::unique_ptr<DecodeState> new_state(int B) const;

 private:
  using Frame = CoreFrame<MambaCore, T, Ops>;
  friend Frame;
  using Frame::head_, Frame::tokens_, Frame::labels_, Frame::Bc_, Frame::Tc_, Frame::carried;
  struct LayerActs {
    T *h, *rstd, *x1;
    T* xz;    // [N, 2Di]   in_proj output: x | z
    T* xc;    // [N, Di]    x after conv + SiLU
    T* dbc;   // [N, R+2S]  x_proj output: dt | B | C
    T* dtr;   // [N, Di]    dt_proj(dt) without its bias
    T* y;     // [N, Di]    scan output, gated
    T* ckpt;  // scan states at chunk starts (training only)
  };
  struct Grads {
    T *dh, *dx1, *dy, *dxz, *dxc, *ddbc, *ddtr, *dlogits;
  };
  template <class Alloc> void carve(Alloc& a, int B, int T_, bool train);
  template <class Alloc> void carve_grads(Alloc& a, int B, int T_);
  ops::SelectiveScanInputs<T> scan_inputs(const LayerActs& a, const T* P, const MambaLayout::LayerParams& w) const;

  const MambaLayout& net_;
  std::vector<LayerActs> layers_;
  Grads g_{};
};

template <class T>
class Mamba final : public CoreModel<T, MambaLayout, MambaCore> {
 public:
  Mamba(const MambaConfig& cfg, uint64_t seed);
  int vocab_size() const override { return net_.cfg.vocab_size; }
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override { return resolved_block(net_.cfg); }
  const MambaConfig& config() const { return net_.cfg; }

 private:
  using CoreModel<T, MambaLayout, MambaCore>::net_;
};

}  // namespace lrnn
