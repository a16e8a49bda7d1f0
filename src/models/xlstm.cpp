#include "models/xlstm.h"
#include <cmath>
#include <cstring>
#include <omp.h>
#include "ops/common/math.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/embedding/embedding.h"
#include "ops/geglu/geglu.h"
#include "ops/headwise_linear/headwise_linear.h"
#include "ops/layernorm/layernorm.h"
#include "ops/linear/linear.h"
#include "ops/mlstm_cell/mlstm_cell.h"
#include "ops/short_conv/short_conv.h"
#include "ops/slstm_cell/slstm_cell.h"

namespace lrnn {

namespace {
constexpr double kLnEps = 1e-5;  // the package's LayerNorm / MultiHeadLayerNorm eps
constexpr double kLnOffset = 1.0;  // its norm weights are offsets from 1 (residual_weight)
const XLSTMConfig kDefaults{};

// The package's UpProjConfigMixin: proj_factor * d rounded up to a multiple.
int round_up_proj(double factor, int d, int multiple) {
  return int(std::ceil(factor * d / multiple)) * multiple;
}
}  // namespace

void XLSTMConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "mlstm: a stack of mLSTM blocks (xlstm[1:0]); slstm: of sLSTM blocks (xlstm[0:1])",
        {"mlstm", "slstm"})
      .add("vocab_size", &vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("embedding_dim", &embedding_dim, "model width d", 1, 1 << 16)
      .add("num_blocks", &num_blocks, "number of blocks", 1, 1024)
      .add("num_heads", &num_heads, "heads of the mLSTM / sLSTM cell", 1, 4096)
      .add("conv1d_kernel_size", &conv1d_kernel_size, "causal conv (with bias) + SiLU before q,k (mLSTM) / i,f (sLSTM); 0: none", 0, 64)
      .add("context_length", &context_length, "written to config.json for the xlstm package (lrnn has no limit)", 1, 1 << 24)
      .add("weight_decay_on_embedding", &weight_decay_on_embedding, "apply weight decay to token_embedding")
      .add("proj_factor", &proj_factor, "mLSTM up-projection factor", 0.0, 64.0)
      .add("round_proj_up_to_multiple_of", &round_proj_up_to_multiple_of, "mLSTM / feed-forward widths are rounded up to a multiple of this", 1, 4096)
      .add("qkv_proj_blocksize", &qkv_proj_blocksize, "mLSTM q/k/v projections: block-diagonal with blocks of this size", 1, 4096)
      .add("bias", &bias, "mLSTM: biases on proj_up, q/k/v and proj_down")
      .add("group_norm_weight", &group_norm_weight, "sLSTM: weight on the per-head norm of the cell output")
      .add("bias_init", &bias_init, "sLSTM gate bias initialisation",
           {"powerlaw_blockdependent", "small_init", "standard", "zeros"})
      .add("recurrent_weight_init", &recurrent_weight_init, "sLSTM recurrent kernel initialisation", {"zeros", "standard"})
      .add("ffn_proj_factor", &ffn_proj_factor, "sLSTM block: gated GELU feed-forward width factor", 0.0, 64.0);
}

int XLSTMConfig::inner_dim() const { return round_up_proj(proj_factor, embedding_dim, round_proj_up_to_multiple_of); }
int XLSTMConfig::ffn_dim() const { return round_up_proj(ffn_proj_factor, embedding_dim, round_proj_up_to_multiple_of); }

void XLSTMConfig::validate(const io::Schema& s) const {
  if (is_mlstm()) {
    const int I = inner_dim();
    if (I % num_heads != 0)
      s.fail("num_heads", fmt::format("must divide the mLSTM inner width {} (proj_factor * embedding_dim, rounded), got {}", I, num_heads));
    if (I % qkv_proj_blocksize != 0)
      s.fail("qkv_proj_blocksize", fmt::format("must divide the mLSTM inner width {}, got {}", I, qkv_proj_blocksize));
    // sLSTM-only keys must keep their defaults (they would silently do nothing).
    if (group_norm_weight != kDefaults.group_norm_weight) s.fail("group_norm_weight", "applies to model_type slstm only");
    if (bias_init != kDefaults.bias_init) s.fail("bias_init", "applies to model_type slstm only");
    if (recurrent_weight_init != kDefaults.recurrent_weight_init) s.fail("recurrent_weight_init", "applies to model_type slstm only");
    if (ffn_proj_factor != kDefaults.ffn_proj_factor) s.fail("ffn_proj_factor", "applies to model_type slstm only");
  } else {
    if (embedding_dim % num_heads != 0)
      s.fail("num_heads", fmt::format("must divide embedding_dim ({}), got {}", embedding_dim, num_heads));
    if (bias_init == "powerlaw_blockdependent" && embedding_dim / num_heads < 2)
      s.fail("bias_init", "powerlaw_blockdependent needs a head dim of at least 2");
    if (proj_factor != kDefaults.proj_factor) s.fail("proj_factor", "applies to model_type mlstm only");
    if (qkv_proj_blocksize != kDefaults.qkv_proj_blocksize) s.fail("qkv_proj_blocksize", "applies to model_type mlstm only");
    if (bias != kDefaults.bias) s.fail("bias", "applies to model_type mlstm only");
    if (ffn_dim() < 1) s.fail("ffn_proj_factor", "gives an empty feed-forward");
  }
}

template <class T>
XLSTM<T>::XLSTM(const XLSTMConfig& cfg, uint64_t seed) {
  net_.cfg = cfg;
  const int64_t d = cfg.embedding_dim, V = cfg.vocab_size, NH = cfg.num_heads, K = cfg.conv1d_kernel_size;
  const int L = cfg.num_blocks;
  // The package's initialisations: small_init N(0, sqrt(2/(5d))), wang_init N(0, 2/(L sqrt d)),
  // PyTorch's Conv1d default U(-1/sqrt(K), 1/sqrt(K)) for weight and bias.
  const double small = std::sqrt(2.0 / (5.0 * d)), wang = 2.0 / L / std::sqrt(double(d));
  const double conv_bound = K ? 1.0 / std::sqrt(double(K)) : 0.0;
  auto& lay = this->layout_;
  // The package's weight-decay groups: decay iff the name has "weight" and not "norm"
  // (xLSTMLMModel._create_weight_decay_optim_groups); the embedding by weight_decay_on_embedding.
  auto decays = [](const std::string& n) {
    return n.find("weight") != std::string::npos && n.find("norm") == std::string::npos;
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, Init init, double scale, bool pad = true) {
    return lay.add(name, std::move(shape), init, scale, decays(name), pad);
  };
  net_.emb = lay.add("token_embedding.weight", {V, d}, Init::Normal, small, cfg.weight_decay_on_embedding);
  for (int l = 0; l < L; ++l) {
    const std::string p = fmt::format("xlstm_block_stack.blocks.{}.", l);
    XLSTMLayout::BlockParams x{};
    x.norm = add(p + "xlstm_norm.weight", {d}, Init::Zeros, 0);
    if (cfg.is_mlstm()) {
      const int64_t I = cfg.inner_dim(), bs = cfg.qkv_proj_blocksize, nb = I / bs;
      x.proj_up = add(p + "xlstm.proj_up.weight", {2 * I, d}, Init::Normal, small);
      if (cfg.bias) x.proj_up_b = add(p + "xlstm.proj_up.bias", {2 * I}, Init::Zeros, 0);
      x.q = add(p + "xlstm.q_proj.weight", {nb, bs, bs}, Init::Normal, small);
      if (cfg.bias) x.q_b = add(p + "xlstm.q_proj.bias", {I}, Init::Zeros, 0);
      x.k = add(p + "xlstm.k_proj.weight", {nb, bs, bs}, Init::Normal, small);
      if (cfg.bias) x.k_b = add(p + "xlstm.k_proj.bias", {I}, Init::Zeros, 0);
      x.v = add(p + "xlstm.v_proj.weight", {nb, bs, bs}, Init::Normal, small);
      if (cfg.bias) x.v_b = add(p + "xlstm.v_proj.bias", {I}, Init::Zeros, 0);
      if (K) {
        x.conv = add(p + "xlstm.conv1d.conv.weight", {I, 1, K}, Init::Uniform, conv_bound);
        x.conv_b = add(p + "xlstm.conv1d.conv.bias", {I}, Init::Uniform, conv_bound);
      }
      // igate|fgate weights, then igate|fgate biases: one [2NH, 3I] GEMM with a [2NH] bias.
      x.gates = add(p + "xlstm.mlstm_cell.igate.weight", {NH, 3 * I}, Init::Zeros, 0, false);
      const size_t fw = add(p + "xlstm.mlstm_cell.fgate.weight", {NH, 3 * I}, Init::Zeros, 0);
      x.gates_b = add(p + "xlstm.mlstm_cell.igate.bias", {NH}, Init::Normal, 0.1, false);
      const size_t fb = add(p + "xlstm.mlstm_cell.fgate.bias", {NH}, Init::Zeros, 0);  // linspace(3, 6) below
      LRNN_CHECK(fw == x.gates + size_t(NH * 3 * I) && fb == x.gates_b + size_t(NH), "fused gate layout broken");
      x.outnorm = add(p + "xlstm.mlstm_cell.outnorm.weight", {I}, Init::Zeros, 0);
      x.skip = add(p + "xlstm.learnable_skip", {I}, Init::Ones, 0);
      x.proj_down = add(p + "xlstm.proj_down.weight", {d, I}, Init::Normal, wang);
      if (cfg.bias) x.proj_down_b = add(p + "xlstm.proj_down.bias", {d}, Init::Zeros, 0);
    } else {
      const int64_t DH = d / NH, U = cfg.ffn_dim();
      if (K) {
        x.conv = add(p + "xlstm.conv1d.conv.weight", {d, 1, K}, Init::Uniform, conv_bound);
        x.conv_b = add(p + "xlstm.conv1d.conv.bias", {d}, Init::Uniform, conv_bound);
      }
      x.fgate = add(p + "xlstm.fgate.weight", {NH, DH, DH}, Init::Normal, small);
      x.igate = add(p + "xlstm.igate.weight", {NH, DH, DH}, Init::Normal, small);
      x.zgate = add(p + "xlstm.zgate.weight", {NH, DH, DH}, Init::Normal, small);
      x.ogate = add(p + "xlstm.ogate.weight", {NH, DH, DH}, Init::Normal, small);
      const bool std_r = cfg.recurrent_weight_init == "standard";
      x.rkernel = add(p + "xlstm.slstm_cell._recurrent_kernel_", {NH, DH, 4 * DH}, std_r ? Init::Uniform : Init::Zeros,
                      std_r ? 1.0 / std::sqrt(double(d)) : 0.0);
      x.cbias = add(p + "xlstm.slstm_cell._bias_", {NH * 4 * DH}, Init::Zeros, 0);  // set below
      if (cfg.group_norm_weight) x.gnorm = add(p + "xlstm.group_norm.weight", {d}, Init::Zeros, 0);
      x.ffn_norm = add(p + "ffn_norm.weight", {d}, Init::Zeros, 0);
      x.ffn_up = add(p + "ffn.proj_up.weight", {2 * U, d}, Init::Normal, small);
      x.ffn_down = add(p + "ffn.proj_down.weight", {d, U}, Init::Normal, wang);
    }
    net_.blocks.push_back(x);
  }
  net_.post_norm = add("xlstm_block_stack.post_blocks_norm.weight", {d}, Init::Zeros, 0);
  net_.head = add("lm_head.weight", {V, d}, Init::Normal, small);
  this->allocate();
  init_params(lay, this->params.data(), seed);

  // Gate biases the layout's init rules cannot express.
  auto linspace = [](double a, double b, int n, int i) { return n == 1 ? a : a + (b - a) * i / (n - 1); };
  for (int l = 0; l < L; ++l) {
    T* P = this->params.data();
    if (cfg.is_mlstm()) {
      for (int h = 0; h < NH; ++h) P[net_.blocks[l].gates_b + NH + h] = T(linspace(3.0, 6.0, int(NH), h));
      continue;
    }
    const int DH = int(d / NH);
    T* b = P + net_.blocks[l].cbias;  // [NH][4 gates i,f,z,o][DH]
    const double ratio = L > 1 ? double(l) / (L - 1) : 0.0;
    Rng r{seed, 5000 + uint64_t(l)};
    for (int h = 0; h < NH; ++h)
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < DH; ++j) {
          double v = 0;
          const bool f = g == 1;
          if (cfg.bias_init == "powerlaw_blockdependent" && f)
            v = -(-5.0 + 12.0 * std::pow(double(j) / (DH - 1), 0.3 + 1.3 * ratio));
          else if (cfg.bias_init == "small_init" && f)
            v = linspace(3.0, 6.0, DH, j);
          else if (cfg.bias_init == "standard")
            v = (2.0 * r.uniform(uint64_t((h * 4 + g) * DH + j)) - 1.0) / std::sqrt(double(d));
          b[(h * 4 + g) * DH + j] = T(v);
        }
  }
}

template <class T, class Ops>
T* XLSTMCore<T, Ops>::xc_of(const BlockActs& a) const {
  if (net_.cfg.conv1d_kernel_size) return a.xc;
  return net_.cfg.is_mlstm() ? a.up : a.x1;
}

template <class T, class Ops>
int XLSTMCore<T, Ops>::xc_ld() const {
  const XLSTMConfig& cfg = net_.cfg;
  if (cfg.conv1d_kernel_size) return cfg.is_mlstm() ? cfg.inner_dim() : cfg.embedding_dim;
  return cfg.is_mlstm() ? 2 * cfg.inner_dim() : cfg.embedding_dim;
}

template <class T, class Ops>
template <class Alloc>
void XLSTMCore<T, Ops>::carve(Alloc& a, int B, int T_, bool train) {
  const XLSTMConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, d = cfg.embedding_dim, NH = cfg.num_heads, V = cfg.vocab_size;
  const bool conv = cfg.conv1d_kernel_size > 0;
  auto get = [&](size_t n) { return take<T>(a, n); };
  blocks_.assign(cfg.num_blocks, BlockActs{});
  for (auto& l : blocks_) {
    l.h = get(N * d); l.mu1 = get(N); l.r1 = get(N); l.x1 = get(N * d);
    if (cfg.is_mlstm()) {
      const size_t I = cfg.inner_dim();
      l.up = get(N * 2 * I);
      l.xc = conv ? get(N * I) : nullptr;
      l.qkv = get(N * 3 * I); l.gl = get(N * 2 * NH); l.hc = get(N * I);
      l.mu2 = get(N * NH); l.r2 = get(N * NH); l.hn = get(N * I); l.hs = get(N * I);
      ops::MLSTMDims md{B, T_, int(NH), int(I / NH)};
      l.ckpt = train ? get(ops::mlstm_ckpt_size(md)) : nullptr;
    } else {
      const size_t U = cfg.ffn_dim();
      l.xc = conv ? get(N * d) : nullptr;
      l.wx = get(N * 4 * d); l.y = get(N * d);
      ops::SLSTMDims sd{B, T_, int(NH), int(d / NH)};
      l.saved = train ? get(ops::slstm_saved_size(sd)) : nullptr;
      l.mu2 = get(N * NH); l.r2 = get(N * NH); l.hmid = get(N * d);
      l.mu3 = get(N); l.r3 = get(N); l.x2 = get(N * d); l.gu = get(N * 2 * U); l.act = get(N * U);
    }
  }
  head_.carve(a, N, d, V, /*layer_norm=*/true, train);
}

template <class T, class Ops>
template <class Alloc>
void XLSTMCore<T, Ops>::carve_grads(Alloc& a, int B, int T_) {
  const XLSTMConfig& cfg = net_.cfg;
  const size_t Nn = size_t(B) * T_, d = cfg.embedding_dim, V = cfg.vocab_size, NH = cfg.num_heads;
  auto get = [&](size_t n) { return take<T>(a, n); };
  g_ = Grads{};
  g_.dh = get(Nn * d); g_.dx = get(Nn * d); g_.dlogits = get(this->logit_rows(Nn, V) * V);
  if (cfg.is_mlstm()) {
    const size_t I = cfg.inner_dim();
    g_.dup = get(Nn * 2 * I); g_.dxc = get(Nn * I); g_.dqkv = get(Nn * 3 * I); g_.dgl = get(Nn * 2 * NH);
    g_.dhc = get(Nn * I); g_.dhn = get(Nn * I); g_.dhs = get(Nn * I);
  } else {
    const size_t U = cfg.ffn_dim();
    g_.dxc = get(Nn * d); g_.dwx = get(Nn * 4 * d); g_.dy = get(Nn * d); g_.dx2 = get(Nn * d);
    g_.dgu = get(Nn * 2 * U); g_.dact = get(Nn * U);
  }
}

template <class T, class Ops>
void XLSTMCore<T, Ops>::mlstm_forward(const T* P, int li, int B, int T_) {
  const XLSTMConfig& cfg = net_.cfg;
  auto& a = blocks_[li];
  const auto& w = net_.blocks[li];
  const int N = B * T_, d = cfg.embedding_dim, I = cfg.inner_dim(), NH = cfg.num_heads, K = cfg.conv1d_kernel_size;
  const int bs = cfg.qkv_proj_blocksize, nb = I / bs;
  auto bias = [&](size_t off) -> const T* { return cfg.bias ? P + off : nullptr; };
  T* next = li + 1 < cfg.num_blocks ? blocks_[li + 1].h : head_.hout;
  Ops::layernorm_forward(a.x1, a.mu1, a.r1, a.h, P + w.norm, N, d, 1, kLnEps, kLnOffset);
  Ops::linear_forward(a.up, a.x1, P + w.proj_up, bias(w.proj_up_b), N, d, 2 * I);  // [xm | z]
  if (K) Ops::short_conv_forward(a.xc, a.up, P + w.conv, B, T_, I, K, 2 * I, I, P + w.conv_b);
  const T* xc = xc_of(a);
  const int ldc = xc_ld();
  Ops::headwise_linear_forward(a.qkv, xc, P + w.q, bias(w.q_b), N, nb, bs, bs, ldc, 3 * I);
  Ops::headwise_linear_forward(a.qkv + I, xc, P + w.k, bias(w.k_b), N, nb, bs, bs, ldc, 3 * I);
  Ops::headwise_linear_forward(a.qkv + 2 * I, a.up, P + w.v, bias(w.v_b), N, nb, bs, bs, 2 * I, 3 * I);
  Ops::linear_forward(a.gl, a.qkv, P + w.gates, P + w.gates_b, N, 3 * I, 2 * NH);  // [igate | fgate] preacts
  ops::MLSTMDims md{B, T_, NH, I / NH, 3 * I, 3 * I, 3 * I, 2 * NH};
  Ops::mlstm_forward(a.hc, a.qkv, a.qkv + I, a.qkv + 2 * I, a.gl, a.gl + NH, md, a.ckpt);
  Ops::layernorm_forward(a.hn, a.mu2, a.r2, a.hc, P + w.outnorm, N, I, NH, kLnEps, kLnOffset);
  // hs = (hn + skip * xc) * silu(z)
  Ops::skip_gate_forward(a.hs, a.hn, xc, P + w.skip, a.up + I, N, I, ldc, 2 * I);
  Ops::linear_forward(next, a.hs, P + w.proj_down, bias(w.proj_down_b), N, I, d);
  Ops::add_inplace(next, a.h, size_t(N) * d);
}

template <class T, class Ops>
void XLSTMCore<T, Ops>::slstm_forward(const T* P, int li, int B, int T_) {
  const XLSTMConfig& cfg = net_.cfg;
  auto& a = blocks_[li];
  const auto& w = net_.blocks[li];
  const int N = B * T_, d = cfg.embedding_dim, NH = cfg.num_heads, DH = d / NH, K = cfg.conv1d_kernel_size;
  const int U = cfg.ffn_dim();
  T* next = li + 1 < cfg.num_blocks ? blocks_[li + 1].h : head_.hout;
  Ops::layernorm_forward(a.x1, a.mu1, a.r1, a.h, P + w.norm, N, d, 1, kLnEps, kLnOffset);
  if (K) Ops::short_conv_forward(a.xc, a.x1, P + w.conv, B, T_, d, K, d, d, P + w.conv_b);
  const T* xc = xc_of(a);
  // Gate slots i, f, z, o of Wx: as the package's forward, `fgate` feeds i and `igate` feeds f.
  const T* none = nullptr;
  Ops::headwise_linear_forward(a.wx, xc, P + w.fgate, none, N, NH, DH, DH, d, 4 * d);
  Ops::headwise_linear_forward(a.wx + d, xc, P + w.igate, none, N, NH, DH, DH, d, 4 * d);
  Ops::headwise_linear_forward(a.wx + 2 * d, a.x1, P + w.zgate, none, N, NH, DH, DH, d, 4 * d);
  Ops::headwise_linear_forward(a.wx + 3 * d, a.x1, P + w.ogate, none, N, NH, DH, DH, d, 4 * d);
  ops::SLSTMDims sd{B, T_, NH, DH, 4 * d};
  Ops::slstm_forward(a.y, a.wx, P + w.rkernel, P + w.cbias, sd, a.saved);
  Ops::layernorm_forward(a.hmid, a.mu2, a.r2, a.y, cfg.group_norm_weight ? P + w.gnorm : none, N, d, NH, kLnEps,
                         kLnOffset);
  Ops::add_inplace(a.hmid, a.h, size_t(N) * d);
  Ops::layernorm_forward(a.x2, a.mu3, a.r3, a.hmid, P + w.ffn_norm, N, d, 1, kLnEps, kLnOffset);
  Ops::linear_forward(a.gu, a.x2, P + w.ffn_up, none, N, d, 2 * U);  // [gate | up]
  Ops::geglu_forward(a.act, a.gu, a.gu + U, N, U, 2 * U);
  Ops::linear_forward_residual(next, a.act, P + w.ffn_down, a.hmid, N, U, d);
}

template <class T, class Ops>
double XLSTMCore<T, Ops>::forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_) {
  this->begin_forward(tokens, labels, B, T_);
  const XLSTMConfig& cfg = net_.cfg;
  const int N = B * T_, d = cfg.embedding_dim, V = cfg.vocab_size;
  Ops::embedding_forward(blocks_[0].h, tokens, P + net_.emb, N, d, V);
  for (int li = 0; li < cfg.num_blocks; ++li) {
    if (cfg.is_mlstm()) mlstm_forward(P, li, B, T_);
    else slstm_forward(P, li, B, T_);
  }
  return head_.forward(P, net_.post_norm, net_.head, labels, N, d, V, kLnEps);
}

template <class T, class Ops>
void XLSTMCore<T, Ops>::mlstm_backward(const T* P, T* G, int li, T* dh, int B, int T_) {
  const XLSTMConfig& cfg = net_.cfg;
  auto& a = blocks_[li];
  const auto& w = net_.blocks[li];
  const int N = B * T_, d = cfg.embedding_dim, I = cfg.inner_dim(), NH = cfg.num_heads, K = cfg.conv1d_kernel_size;
  const int bs = cfg.qkv_proj_blocksize, nb = I / bs;
  const size_t NI = size_t(N) * I;
  auto gbias = [&](size_t off) -> T* { return cfg.bias ? G + off : nullptr; };
  // Without a conv, xc is xm itself: its gradient is the xm slot of dup.
  T* dxc = K ? g_.dxc : g_.dup;
  const int ldc = xc_ld();
  const T* xc = xc_of(a);
  // dhs [N, I] is overwritten whole by proj_down's backward (accumulate = false): no zeroing.
  Ops::linear_backward(g_.dhs, G + w.proj_down, gbias(w.proj_down_b), dh, a.hs, P + w.proj_down, N, I, d, false);
  // hs = (hn + skip * xc) * silu(z)
  Ops::zero(g_.dup, 2 * NI);
  if (K) Ops::zero(g_.dxc, NI);
  Ops::zero(g_.dhn, NI);
  Ops::skip_gate_backward(g_.dhn, dxc, G + w.skip, g_.dup + I, g_.dhs, a.hn, xc, P + w.skip, a.up + I, N, I, ldc,
                          2 * I);
  Ops::zero(g_.dhc, NI);
  Ops::layernorm_backward(g_.dhc, G + w.outnorm, g_.dhn, a.hc, P + w.outnorm, a.mu2, a.r2, N, I, NH, kLnOffset);
  Ops::zero(g_.dqkv, 3 * NI);
  Ops::zero(g_.dgl, size_t(N) * 2 * NH);
  ops::MLSTMDims md{B, T_, NH, I / NH, 3 * I, 3 * I, 3 * I, 2 * NH};
  Ops::mlstm_backward(g_.dqkv, g_.dqkv + I, g_.dqkv + 2 * I, g_.dgl, g_.dgl + NH, g_.dhc, a.qkv, a.qkv + I,
                      a.qkv + 2 * I, a.gl, a.gl + NH, md, static_cast<const T*>(a.ckpt));
  Ops::linear_backward(g_.dqkv, G + w.gates, G + w.gates_b, g_.dgl, a.qkv, P + w.gates, N, 3 * I, 2 * NH);
  Ops::headwise_linear_backward(dxc, G + w.q, gbias(w.q_b), g_.dqkv, xc, P + w.q, N, nb, bs, bs, ldc, 3 * I);
  Ops::headwise_linear_backward(dxc, G + w.k, gbias(w.k_b), g_.dqkv + I, xc, P + w.k, N, nb, bs, bs, ldc, 3 * I);
  Ops::headwise_linear_backward(g_.dup, G + w.v, gbias(w.v_b), g_.dqkv + 2 * I, a.up, P + w.v, N, nb, bs, bs, 2 * I,
                                3 * I);
  if (K)
    Ops::short_conv_backward(g_.dup, G + w.conv, g_.dxc, a.up, P + w.conv, B, T_, I, K, 2 * I, I, P + w.conv_b,
                             G + w.conv_b);
  // dx is overwritten whole by proj_up's backward: no zeroing.
  Ops::linear_backward(g_.dx, G + w.proj_up, gbias(w.proj_up_b), g_.dup, a.x1, P + w.proj_up, N, d, 2 * I, false);
  Ops::layernorm_backward(dh, G + w.norm, g_.dx, a.h, P + w.norm, a.mu1, a.r1, N, d, 1, kLnOffset);
}

template <class T, class Ops>
void XLSTMCore<T, Ops>::slstm_backward(const T* P, T* G, int li, T* dh, int B, int T_) {
  const XLSTMConfig& cfg = net_.cfg;
  auto& a = blocks_[li];
  const auto& w = net_.blocks[li];
  const int N = B * T_, d = cfg.embedding_dim, NH = cfg.num_heads, DH = d / NH, K = cfg.conv1d_kernel_size;
  const int U = cfg.ffn_dim();
  const size_t Nd = size_t(N) * d;
  T* const gnone = nullptr;
  const T* const none = nullptr;
  // Feed-forward: next = hmid + proj_down(gelu(gate) * up), [gate | up] = proj_up(LN(hmid)).
  // dact, dgu (both halves) and dx2 are overwritten whole by their one writer (accumulate =
  // false): no zeroing.
  Ops::linear_backward(g_.dact, G + w.ffn_down, gnone, dh, a.act, P + w.ffn_down, N, U, d, false);
  Ops::geglu_backward(g_.dgu, g_.dgu + U, g_.dact, a.gu, a.gu + U, N, U, 2 * U, false);
  Ops::linear_backward(g_.dx2, G + w.ffn_up, gnone, g_.dgu, a.x2, P + w.ffn_up, N, d, 2 * U, false);
  Ops::layernorm_backward(dh, G + w.ffn_norm, g_.dx2, a.hmid, P + w.ffn_norm, a.mu3, a.r3, N, d, 1, kLnOffset);
  // sLSTM layer: hmid = h + GN(slstm(Wx)).
  const bool gw = cfg.group_norm_weight;
  Ops::zero(g_.dy, Nd);
  Ops::layernorm_backward(g_.dy, gw ? G + w.gnorm : gnone, dh, a.y, gw ? P + w.gnorm : none, a.mu2, a.r2, N, d, NH,
                          kLnOffset);
  Ops::zero(g_.dwx, 4 * Nd);
  ops::SLSTMDims sd{B, T_, NH, DH, 4 * d};
  Ops::slstm_backward(g_.dwx, G + w.rkernel, G + w.cbias, g_.dy, a.wx, P + w.rkernel, P + w.cbias, a.y, sd,
                      static_cast<const T*>(a.saved));
  Ops::zero(g_.dx, Nd);
  T* dxc = K ? g_.dxc : g_.dx;
  if (K) Ops::zero(g_.dxc, Nd);
  const T* xc = xc_of(a);
  Ops::headwise_linear_backward(dxc, G + w.fgate, gnone, g_.dwx, xc, P + w.fgate, N, NH, DH, DH, d, 4 * d);
  Ops::headwise_linear_backward(dxc, G + w.igate, gnone, g_.dwx + d, xc, P + w.igate, N, NH, DH, DH, d, 4 * d);
  Ops::headwise_linear_backward(g_.dx, G + w.zgate, gnone, g_.dwx + 2 * d, a.x1, P + w.zgate, N, NH, DH, DH, d,
                                4 * d);
  Ops::headwise_linear_backward(g_.dx, G + w.ogate, gnone, g_.dwx + 3 * d, a.x1, P + w.ogate, N, NH, DH, DH, d,
                                4 * d);
  if (K)
    Ops::short_conv_backward(g_.dx, G + w.conv, g_.dxc, a.x1, P + w.conv, B, T_, d, K, d, d, P + w.conv_b,
                             G + w.conv_b);
  Ops::layernorm_backward(dh, G + w.norm, g_.dx, a.h, P + w.norm, a.mu1, a.r1, N, d, 1, kLnOffset);
}

template <class T, class Ops>
void XLSTMCore<T, Ops>::backward(const T* P, T* G) {
  this->begin_backward();
  const XLSTMConfig& cfg = net_.cfg;
  const int B = Bc_, T_ = Tc_, N = B * T_, d = cfg.embedding_dim, V = cfg.vocab_size;
  head_.backward(P, G, net_.post_norm, net_.head, labels_, g_.dlogits, g_.dx, g_.dh, N, d, V, /*side_dW=*/false);
  for (int li = cfg.num_blocks - 1; li >= 0; --li) {
    if (cfg.is_mlstm()) mlstm_backward(P, G, li, g_.dh, B, T_);
    else slstm_backward(P, G, li, g_.dh, B, T_);
  }
  Ops::embedding_backward(G + net_.emb, g_.dh, tokens_, N, d, V);
}

template <class T>
nlohmann::json XLSTM<T>::hf_config() const {
  // The xlstm package's xLSTMLMModelConfig (loads with dacite.from_dict(xLSTMLMModelConfig, ...),
  // which ignores the extra keys), plus `lrnn` notes on the mapping.
  const XLSTMConfig& c = net_.cfg;
  nlohmann::json j = {{"model_type", c.model_type},
                      {"architectures", {"xLSTMLMModel"}},
                      {"vocab_size", c.vocab_size},
                      {"embedding_dim", c.embedding_dim},
                      {"num_blocks", c.num_blocks},
                      {"context_length", c.context_length},
                      {"add_post_blocks_norm", true},
                      {"bias", c.bias},
                      {"dropout", 0.0},
                      {"tie_weights", false},
                      {"weight_decay_on_embedding", c.weight_decay_on_embedding},
                      {"add_embedding_dropout", false}};
  if (c.is_mlstm()) {
    j["mlstm_block"] = {{"mlstm",
                         {{"conv1d_kernel_size", c.conv1d_kernel_size},
                          {"qkv_proj_blocksize", c.qkv_proj_blocksize},
                          {"num_heads", c.num_heads},
                          {"proj_factor", c.proj_factor},
                          {"round_proj_up_dim_up", true},
                          {"round_proj_up_to_multiple_of", c.round_proj_up_to_multiple_of}}}};
    j["slstm_block"] = nullptr;
    j["slstm_at"] = nlohmann::json::array();
  } else {
    j["mlstm_block"] = nullptr;
    j["slstm_block"] = {{"slstm",
                         {{"num_heads", c.num_heads},
                          {"conv1d_kernel_size", c.conv1d_kernel_size},
                          {"group_norm_weight", c.group_norm_weight},
                          {"backend", "cuda"},
                          {"function", "slstm"},
                          {"bias_init", c.bias_init},
                          {"recurrent_weight_init", c.recurrent_weight_init}}},
                        {"feedforward",
                         {{"proj_factor", c.ffn_proj_factor},
                          {"round_proj_up_dim_up", true},
                          {"round_proj_up_to_multiple_of", c.round_proj_up_to_multiple_of},
                          {"act_fn", "gelu"},
                          {"bias", false},
                          {"dropout", 0.0},
                          {"ff_type", "ffn_gated"}}}};
    j["slstm_at"] = "all";
  }
  j["lrnn"] = {
      {"model_type", c.is_mlstm() ? "mlstm: every block an mLSTMBlock (slstm_at = [])"
                                  : "slstm: every block an sLSTMBlock (slstm_at = all)"},
      {"config_keys",
       {{"embedding_dim, num_blocks, vocab_size, context_length, bias, weight_decay_on_embedding", "top level"},
        {"num_heads, conv1d_kernel_size", c.is_mlstm() ? "mlstm_block.mlstm" : "slstm_block.slstm"},
        {"proj_factor, qkv_proj_blocksize, round_proj_up_to_multiple_of", "mlstm_block.mlstm"},
        {"group_norm_weight, bias_init, recurrent_weight_init", "slstm_block.slstm"},
        {"ffn_proj_factor", "slstm_block.feedforward.proj_factor"}}},
      {"weights",
       "model.safetensors uses the state_dict names of xLSTMLMModel. sLSTM cells are stored in the "
       "layout of the package's default CUDA backend: _recurrent_kernel_ [NH, DH, 4*DH] "
       "(= external [NH, DH_in, gate i/f/z/o, DH_out]) and _bias_ [NH*4*DH] (= [NH, gate, DH]); the "
       "vanilla backend wants them permuted. Norm weights are offsets from 1 (the package's residual_weight)."}};
  return j;
}

template class XLSTM<float>;
template class XLSTM<double>;
LRNN_INSTANTIATE_CORE(XLSTMCore)

}  // namespace lrnn
