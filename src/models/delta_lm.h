// The language model shared by the delta-rule family in fla: DeltaNet, Gated DeltaNet and
// (Gated) DeltaProduct (`DeltaNetForCausalLM`, `GatedDeltaNetForCausalLM`,
// `GatedDeltaProductForCausalLM`). The three differ only in which parts of one mixer they switch
// on, so they share this class; each adds its own config (fla's keys) and config.json.
//
// Pre-norm blocks:  h += o_proj(o_norm(mixer(attn_norm(h))));  h += down(silu(gate(x)) * up(x))
// with x = mlp_norm(h); then model.norm and lm_head (untied, or tied: the embedding matrix). The mixer, per head:
//   q = SiLU(ShortConv(q_proj x))                        [Dk]        read once, after the last sub-step
//   k_j, v_j = SiLU(ShortConv(k_proj x)), ... j < n_h    [n_h,Dk], [n_h,Dv]   ("t (n h d)": sub-step major)
//   beta_j = s * sigmoid(b_proj x)_j, s = 2 when allow_neg_eigval (eigenvalues in [-1,1])
//   log alpha = -exp(A_log) * softplus(a_proj x + dt_bias)   (use_forget_gate; once per token, first)
//   S <- alpha S, then n_h Householder sub-steps S <- S + beta_j k_j (v_j - S^T k_j)^T   (ops/delta_rule)
//   o = Dk^-1/2 S^T q, q and k L2-normalised per head
//   o_norm: RMSNorm per head, times SiLU(g_proj x) when use_output_gate (fla FusedRMSNormGated)
// Without short conv, q/k/v are SiLU(W x). DeltaNet is n_h = 1, no gates, Dk = Dv = d / H.
//
// The projections q|k|v|b|a|g are consecutive parameters (fla's names and shapes), multiplied by
// one GEMM into one row per token that the ops read in place through token strides; the three
// short convs are one depthwise conv over the q|k|v part likewise.
#pragma once
#include "core/dtype.h"  // bf16 storage (the CUDA backend's mixed precision)
#include "models/core_frame.h"
#include "ops/delta_rule/delta_rule.h"

namespace lrnn {

// The architecture, as resolved from any of the family's configs.
struct DeltaLMSpec {
  int vocab_size = 3, hidden_size = 128, num_hidden_layers = 1, num_heads = 4;
  int head_k_dim = 32, head_v_dim = 32;
  int num_householder = 1;
  bool init_per_step = false;  // k/v/b projections: xavier per sub-step block (else over all n_h blocks)
  bool allow_neg_eigval = false;
  bool use_short_conv = true;
  int conv_size = 4;
  bool use_forget_gate = false, use_output_gate = false;
  double norm_eps = 1e-6;
  int intermediate_size = 512;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;  // lm_head is the embedding matrix (one tensor, both gradients)
};

// fla's MLP width: intermediate_size when set (> 0), else 256 * ceil(floor(d * ratio * 2/3) / 256).
int fla_mlp_size(int hidden_size, int hidden_ratio, int intermediate_size);

// Where the network's pieces sit: parameter offsets in the flat buffer (fla's names, see the
// constructor of DeltaLM) and the columns of the fused projection row. Backend-independent.
struct DeltaLMLayout {
  // Offsets of the mixer's parts inside one token's fused projection row.
  struct Cols {
    int Kd, Vd, q, k, v, b, a, g, W;  // W: the row width
    int Wc() const { return b; }      // q|k|v: what the short conv covers
    int Wqk() const { return v; }     // q|k: what is L2-normalised
  };
  struct LayerParams {
    size_t attn_norm, q_proj, k_proj, v_proj, b_proj, a_proj, g_proj, A_log, dt_bias;
    size_t q_conv, k_conv, v_conv, o_norm, o_proj;
    size_t mlp_norm, gate_proj, up_proj, down_proj;
  };
  DeltaLMSpec spec;
  Cols cols{};
  std::vector<LayerParams> layers;
  size_t emb = 0, norm = 0, head = 0;  // head == emb when tied
  ops::DeltaRuleDims dims(int B, int T_) const;
};

// The network's forward and backward on one backend (Ops: CpuOps<T> or CudaOps), over flat
// parameter and gradient buffers in that backend's memory (the frame: models/core_frame.h).
template <class T, class Ops>
class DeltaLMCore : public CoreFrame<DeltaLMCore<T, Ops>, T, Ops> {
 public:
  explicit DeltaLMCore(const DeltaLMLayout& net) : net_(net) {}
  // As CoreFrame describes: forward(P, tokens, labels, B, T) -> mean loss, backward(P, G).
  double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
  void backward(const T* P, T* G);
  // Piecewise reading (Model::new_decode_state; on the GPU DeviceDecodeState, laid out alike): per
  // layer the short conv's last K-1 inputs [B,K-1,Wc] (q|k|v before the conv) and the delta-rule
  // state [B,H,Dk,Dv].
  std::unique_ptr<DecodeState> new_state(int B) const;

 private:
  using Frame = CoreFrame<DeltaLMCore, T, Ops>;
  friend Frame;
  using Frame::head_, Frame::tokens_, Frame::labels_, Frame::Bc_, Frame::Tc_, Frame::carried;
  struct LayerActs {
    T *h, *rstd1, *x1;
    T* proj;  // [N, W]    q|k|v pre-conv, beta logits, forget-gate logits, output gate
    T* qkvc;  // [N, Wc]   q|k|v after short conv + SiLU
    T* qkn;   // [N, Wqk]  q|k L2-normalised per head
    T* rqk;   // [N, (1+n_h)H]
    T* lg;    // [N, H]    log forget gate (use_forget_gate)
    T *o, *ro, *on;  // [N, Vd], [N*H], [N, Vd]
    T *hmid, *rstd2, *x2;
    T* gu;    // [N, 2I]   gate|up
    T* act;   // [N, I]
    T* ckpt;  // delta-rule states at chunk starts (training only)
    // Mixed precision (Ops::bf16_gemms(), device only): every projection's GEMM takes bf16 inputs.
    // The MLP's x2, gu, act and the mixer's x1 are stored in bf16 instead (the fp32 ones are then
    // null), on (o_proj's input) gets a bf16 copy, and the layer's four weights (q|k|v|b|a|g,
    // o_proj, gate|up, down) bf16 copies made at each forward.
    bf16 *x2h, *guh, *acth, *wguh, *wdh;
    bf16 *x1h, *onh, *wph, *woh;
  };
  struct Grads {
    T *dh, *dx, *d1, *d2, *dproj, *dqkvc, *dqkn, *dlg, *dgu, *dact, *dlogits;
    bf16 *dhh, *dguh, *dacth;  // mixed precision: dh's bf16 copy, and dgu, dact in bf16 instead
    bf16 *dhoh, *dprojh;       // mixed precision: bf16 copies of dh as o_proj's output gradient, of dproj
  };
  // (Every activation carve decides the step's precision: mixed_ = Ops::bf16_gemms().)
  template <class Alloc> void carve(Alloc& a, int B, int T_, bool train);
  template <class Alloc> void carve_grads(Alloc& a, int B, int T_);
  // The MLP of layer li: x2 = mlp_norm(hmid); next = hmid + down(swiglu(gate|up(x2))); and its
  // backward from dh (the gradient of next) into dx (the gradient of x2, overwritten) and G.
  void mlp_forward(const T* P, size_t li, T* next, int N, int C, int I, double eps);
  // The mixer's projections of layer li: proj = q|k|v|b|a|g(attn_norm(h)); hmid = h +
  // o_proj(o_norm(o)); and the backward of such a projection (its weight gradient as side work).
  void attn_in_forward(const T* P, size_t li, int N, int C, double eps);
  void attn_out_forward(const T* P, size_t li, int N, int C, int H, int Dv, double eps);
  int projection_backward(T* dinp, T* dW, const T* dout, bf16* douth, const T* inp, const bf16* inh, const T* W,
                          const bf16* Wh, int N, int IC, int OC);
  void mlp_backward(const T* P, T* G, size_t li, int N, int C, int I);

  const DeltaLMLayout& net_;
  std::vector<LayerActs> layers_;
  Grads g_{};
  bool mixed_ = false;  // the projections and the head run in bf16 (Ops::bf16_gemms() when carved)
};

template <class T>
class DeltaLM : public CoreModel<T, DeltaLMLayout, DeltaLMCore> {
 public:
  int vocab_size() const override { return net_.spec.vocab_size; }
  const DeltaLMSpec& spec() const { return net_.spec; }

 protected:
  DeltaLM(const DeltaLMSpec& spec, uint64_t seed);

 private:
  using CoreModel<T, DeltaLMLayout, DeltaLMCore>::net_;
};

}  // namespace lrnn
