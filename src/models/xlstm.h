// xLSTM language models as the xlstm package (NX-AI/xlstm) builds them: xLSTMLMModel =
// token_embedding -> xLSTMBlockStack (blocks, post_blocks_norm) -> lm_head, with every block of
// one kind (P1's Table 3 baselines: xlstm[1:0] = mLSTM only, xlstm[0:1] = sLSTM only).
//
// mLSTM block (mLSTMBlock = xLSTMBlock with an mLSTMLayer, no feed-forward):
//   x1 = LN(h); [xm | z] = proj_up(x1) (inner I = proj_factor*d rounded up to a multiple of 64)
//   xc = SiLU(CausalConv1d_k(xm) + bias)          (xc = xm when conv1d_kernel_size = 0)
//   q, k = LinearHeadwise(xc) (blocks of qkv_proj_blocksize), v = LinearHeadwise(xm)
//   igate, fgate preacts = Linear(cat[q, k, v]) (with bias, one per head)
//   hc = mLSTM cell (ops/mlstm_cell); hn = MultiHeadLayerNorm(hc)
//   h += proj_down((hn + learnable_skip * xc) * SiLU(z))
// sLSTM block (sLSTMBlock = xLSTMBlock with an sLSTMLayer and a GatedFeedForward):
//   x1 = LN(h); xc = SiLU(CausalConv1d_k(x1) + bias)   (xc = x1 when conv1d_kernel_size = 0)
//   gates: i <- fgate(xc), f <- igate(xc), z <- zgate(x1), o <- ogate(x1) (LinearHeadwise,
//          per head; the package's forward feeds the module named `fgate` into the input-gate
//          slot and `igate` into the forget-gate slot — kept, so exported weights behave the same)
//   y = sLSTM cell (ops/slstm_cell); h += MultiHeadLayerNorm(y)
//   h += proj_down(gelu(gate) * up), [gate | up] = proj_up(LN(h))   (ffn_proj_factor, rounded up to 64)
// The network is written once (XLSTMCore, over models/backend.h's ops): XLSTM<T> runs it on the
// CPU reference ops, the CUDA device model (models/device_model_cuda.cpp) on the CUDA ops.
// LayerNorms have a weight stored as an offset from 1 and no bias, eps 1e-5 (the package's LayerNorm).
#pragma once
#include "io/schema.h"
#include "models/core_frame.h"

namespace lrnn {

struct XLSTMConfig {
  std::string model_type = "mlstm";  // mlstm: every block an mLSTM block; slstm: every block an sLSTM block
  int vocab_size = 3;
  int embedding_dim = 128;
  int num_blocks = 2;
  int num_heads = 4;
  int conv1d_kernel_size = 4;
  int context_length = 256;  // written to config.json (the package's mLSTM needs it); no limit here
  bool weight_decay_on_embedding = false;
  // mLSTM layer
  double proj_factor = 2.0;
  int round_proj_up_to_multiple_of = 64;
  int qkv_proj_blocksize = 4;
  bool bias = false;
  // sLSTM layer and its feed-forward
  bool group_norm_weight = true;
  std::string bias_init = "powerlaw_blockdependent";
  std::string recurrent_weight_init = "zeros";
  double ffn_proj_factor = 1.3;

  void describe(io::Schema& s);
  void validate(const io::Schema& s) const;
  bool is_mlstm() const { return model_type == "mlstm"; }
  int inner_dim() const;  // mLSTM up-projection width
  int ffn_dim() const;    // sLSTM feed-forward width
  int head_dim() const { return (is_mlstm() ? inner_dim() : embedding_dim) / num_heads; }
};

// Where the network's pieces sit: parameter offsets in the flat buffer (the package's names, see
// the constructor of XLSTM). Backend-independent.
struct XLSTMLayout {
  struct BlockParams {
    size_t norm;
    // mLSTM
    size_t proj_up, proj_up_b, q, q_b, k, k_b, v, v_b, conv, conv_b, gates, gates_b, outnorm, skip, proj_down,
        proj_down_b;
    // sLSTM (conv, conv_b shared with mLSTM)
    size_t fgate, igate, zgate, ogate, rkernel, cbias, gnorm, ffn_norm, ffn_up, ffn_down;
  };
  XLSTMConfig cfg;
  std::vector<BlockParams> blocks;
  size_t emb = 0, post_norm = 0, head = 0;
};

// The network's forward and backward on one backend (Ops: CpuOps<T> or CudaOps), over flat
// parameter and gradient buffers in that backend's memory (the frame: models/core_frame.h).
template <class T, class Ops>
class XLSTMCore : public CoreFrame<XLSTMCore<T, Ops>, T, Ops> {
 public:
  explicit XLSTMCore(const XLSTMLayout& net) : net_(net) {}
  // As CoreFrame describes: forward(P, tokens, labels, B, T) -> mean loss, backward(P, G).
  double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
  void backward(const T* P, T* G);

 private:
  using Frame = CoreFrame<XLSTMCore, T, Ops>;
  friend Frame;
  using Frame::head_, Frame::tokens_, Frame::labels_, Frame::Bc_, Frame::Tc_;
  using BlockParams = XLSTMLayout::BlockParams;
  struct BlockActs {
    T *h, *mu1, *r1, *x1;
    // mLSTM
    T *up, *xc, *qkv, *gl, *hc, *mu2, *r2, *hn, *hs, *ckpt;
    // sLSTM (xc shared)
    T *wx, *y, *saved, *hmid, *mu3, *r3, *x2, *gu, *act;
  };
  // Gradient buffers, reused by every block.
  struct Grads {
    T *dh, *dx, *dlogits;
    T *dup, *dxc, *dqkv, *dgl, *dhc, *dhn, *dhs;  // mLSTM
    T *dwx, *dy, *dx2, *dgu, *dact;               // sLSTM (dxc shared)
  };
  template <class Alloc> void carve(Alloc& a, int B, int T_, bool train);
  template <class Alloc> void carve_grads(Alloc& a, int B, int T_);
  void mlstm_forward(const T* P, int li, int B, int T_);
  void slstm_forward(const T* P, int li, int B, int T_);
  void mlstm_backward(const T* P, T* G, int li, T* dh, int B, int T_);
  void slstm_backward(const T* P, T* G, int li, T* dh, int B, int T_);
  T* xc_of(const BlockActs& a) const;  // the conv output (or its input when there is no conv)
  int xc_ld() const;

  const XLSTMLayout& net_;
  std::vector<BlockActs> blocks_;
  Grads g_{};
};

template <class T>
class XLSTM final : public CoreModel<T, XLSTMLayout, XLSTMCore> {
 public:
  XLSTM(const XLSTMConfig& cfg, uint64_t seed);
  int vocab_size() const override { return net_.cfg.vocab_size; }
  nlohmann::json hf_config() const override;
  YAML::Node resolved_config() const override { return resolved_block(net_.cfg); }
  const XLSTMConfig& config() const { return net_.cfg; }

 private:
  using CoreModel<T, XLSTMLayout, XLSTMCore>::net_;
};

}  // namespace lrnn
