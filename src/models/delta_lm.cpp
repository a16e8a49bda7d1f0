#include "models/delta_lm.h"
#include <cmath>
#include <cstring>
#include <fmt/format.h>

namespace lrnn {

int fla_mlp_size(int hidden_size, int hidden_ratio, int intermediate_size) {
  if (intermediate_size > 0) return intermediate_size;
  int raw = int(std::floor(double(hidden_size) * hidden_ratio * 2.0 / 3.0));
  return 256 * ((raw + 255) / 256);
}

namespace {

// fla's forget-gate init (Mamba-2): A ~ U(0, 16], A_log = log A; dt = exp(U(log 1e-3, log 1e-1))
// clamped to >= 1e-4, dt_bias = softplus^-1(dt). Drawn from the entry's own counter stream,
// like every other init (core/params.h).
template <class T>
void init_forget_gate(const ParamLayout& lay, size_t a_entry, size_t dt_entry, T* P, uint64_t seed) {
  const ParamEntry& A = lay.entries()[a_entry];
  Rng ra{seed, 1000 + a_entry};
  for (size_t i = 0; i < A.numel; ++i) P[A.offset + i] = T(std::log(16.0 * (1.0 - double(ra.uniform(i)))));
  const ParamEntry& D = lay.entries()[dt_entry];
  Rng rd{seed, 1000 + dt_entry};
  for (size_t i = 0; i < D.numel; ++i) {
    double dt = std::exp(std::log(1e-3) + double(rd.uniform(i)) * (std::log(1e-1) - std::log(1e-3)));
    dt = std::max(dt, 1e-4);
    P[D.offset + i] = T(dt + std::log(-std::expm1(-dt)));
  }
}

}  // namespace

template <class T>
DeltaLM<T>::DeltaLM(const DeltaLMSpec& spec, uint64_t seed) {
  net_.spec = spec;
  const DeltaLMSpec& s = net_.spec;
  const int64_t d = s.hidden_size, V = s.vocab_size, H = s.num_heads, Dk = s.head_k_dim, Dv = s.head_v_dim;
  const int64_t n = s.num_householder, I = s.intermediate_size, K = s.conv_size, L = s.num_hidden_layers;
  LRNN_CHECK(d > 0 && V > 0 && H > 0 && Dk > 0 && Dv > 0 && n >= 1 && I > 0 && L > 0, "bad DeltaLM spec");
  const int64_t Kd = H * Dk, Vd = H * Dv;
  // Columns of the fused projection row: q | k (n_h) | v (n_h) | b (n_h) | a | g.
  DeltaLMLayout::Cols& c = net_.cols;
  c.Kd = int(Kd);
  c.Vd = int(Vd);
  c.q = 0;
  c.k = c.q + int(Kd);
  c.v = c.k + int(n * Kd);
  c.b = c.v + int(n * Vd);
  c.a = c.b + int(n * H);
  c.g = c.a + (s.use_forget_gate ? int(H) : 0);
  c.W = c.g + (s.use_output_gate ? int(Vd) : 0);

  const double r = s.initializer_range, attn_gain = std::pow(2.0, -2.5);
  auto& lay = this->layout_;
  std::vector<std::pair<size_t, size_t>> gate_entries;
  net_.emb = lay.add("model.embeddings.weight", {V, d}, Init::Normal, r, true);
  for (int l = 0; l < L; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    DeltaLMLayout::LayerParams x{};
    x.attn_norm = lay.add(p + "attn_norm.weight", {d}, Init::Ones, 0, false);
    // q|k|v|b|a|g: one [W, d] matrix for one GEMM (names and shapes stay fla's). Attention
    // projections: xavier_uniform, gain 2^-2.5 (fla's _initialize_weights).
    // With n_h blocks (k, v, b of DeltaProduct) and init_per_step, each block gets the bound of its
    // own shape, gain sqrt(6 / (d + rows / n_h)) instead of sqrt(6 / (d + rows)).
    auto proj = [&](const char* name, int64_t rows, bool last, int64_t blocks = 1) {
      const double gain = s.init_per_step && blocks > 1
                              ? attn_gain * std::sqrt(double(d + rows) / double(d + rows / blocks))
                              : attn_gain;
      return lay.add(p + "attn." + name + ".weight", {rows, d}, Init::XavierUniform, gain, true, last);
    };
    const bool fg = s.use_forget_gate, og = s.use_output_gate;
    x.q_proj = proj("q_proj", Kd, false);
    x.k_proj = proj("k_proj", n * Kd, false, n);
    x.v_proj = proj("v_proj", n * Vd, false, n);
    x.b_proj = proj("b_proj", n * H, !fg && !og, n);
    if (fg) x.a_proj = proj("a_proj", H, !og);
    if (og) x.g_proj = proj("g_proj", Vd, true);
    LRNN_CHECK(x.k_proj == x.q_proj + size_t(c.k * d) && x.v_proj == x.q_proj + size_t(c.v * d) &&
                   x.b_proj == x.q_proj + size_t(c.b * d) && (!fg || x.a_proj == x.q_proj + size_t(c.a * d)) &&
                   (!og || x.g_proj == x.q_proj + size_t(c.g * d)),
               "fused projection layout broken");
    if (fg) {
      // Set by init_forget_gate below; no weight decay (fla: _no_weight_decay).
      size_t ia = lay.entries().size();
      x.A_log = lay.add(p + "attn.A_log", {H}, Init::Zeros, 0, false);
      x.dt_bias = lay.add(p + "attn.dt_bias", {H}, Init::Zeros, 0, false);
      gate_entries.push_back({ia, ia + 1});
    }
    if (s.use_short_conv) {
      // PyTorch's Conv1d default (kaiming_uniform, a = sqrt(5)): U(-1/sqrt(K), 1/sqrt(K)); fla's
      // layer marks its modules initialised, so the model-level normal init skips the convs.
      double bound = 1.0 / std::sqrt(double(K));
      x.q_conv = lay.add(p + "attn.q_conv1d.weight", {Kd, 1, K}, Init::Uniform, bound, true, false);
      x.k_conv = lay.add(p + "attn.k_conv1d.weight", {n * Kd, 1, K}, Init::Uniform, bound, true, false);
      x.v_conv = lay.add(p + "attn.v_conv1d.weight", {n * Vd, 1, K}, Init::Uniform, bound, true);
      LRNN_CHECK(x.k_conv == x.q_conv + size_t(Kd * K) && x.v_conv == x.k_conv + size_t(n * Kd * K),
                 "fused conv layout broken");
    }
    x.o_norm = lay.add(p + "attn.o_norm.weight", {Dv}, Init::Ones, 0, false);
    x.o_proj = lay.add(p + "attn.o_proj.weight", {d, Vd}, Init::XavierUniform, attn_gain, true);
    x.mlp_norm = lay.add(p + "mlp_norm.weight", {d}, Init::Ones, 0, false);
    x.gate_proj = lay.add(p + "mlp.gate_proj.weight", {I, d}, Init::Normal, r, true, false);  // gate|up: one GEMM
    x.up_proj = lay.add(p + "mlp.up_proj.weight", {I, d}, Init::Normal, r, true);
    x.down_proj = lay.add(p + "mlp.down_proj.weight", {d, I}, Init::Normal, r / std::sqrt(2.0 * L), true);
    LRNN_CHECK(x.up_proj == x.gate_proj + size_t(I * d), "fused MLP layout broken");
    net_.layers.push_back(x);
  }
  net_.norm = lay.add("model.norm.weight", {d}, Init::Ones, 0, false);
  // Tied (fla/HF tie_word_embeddings): no lm_head tensor; the head reads the embedding matrix and
  // both gradients add into it.
  net_.head = s.tie_word_embeddings ? net_.emb : lay.add("lm_head.weight", {V, d}, Init::Normal, r, true);
  this->allocate();
  init_params(lay, this->params.data(), seed);
  for (auto [ia, idt] : gate_entries) init_forget_gate(lay, ia, idt, this->params.data(), seed);
}

ops::DeltaRuleDims DeltaLMLayout::dims(int B, int T_) const {
  ops::DeltaRuleDims d;
  d.B = B; d.T = T_; d.H = spec.num_heads; d.Dk = spec.head_k_dim; d.Dv = spec.head_v_dim;
  d.n_h = spec.num_householder;
  d.range = spec.allow_neg_eigval ? ops::EigenRange::Signed : ops::EigenRange::Unit;
  // q, k from the normalised [N, Wqk] buffer, v from the conv output [N, Wc], beta logits from
  // the fused projection [N, W].
  d.ldq = d.ldk = cols.Wqk();
  d.ldv = cols.Wc();
  d.ldb = cols.W;
  return d;
}

template <class T, class Ops>
template <class Alloc>
void DeltaLMCore<T, Ops>::carve(Alloc& a, int B, int T_, bool train) {
  mixed_ = Ops::bf16_gemms();
  const DeltaLMSpec& s = net_.spec;
  const DeltaLMLayout::Cols& c = net_.cols;
  const size_t N = size_t(B) * T_, C = s.hidden_size, H = s.num_heads, I = s.intermediate_size;
  const size_t V = s.vocab_size, n = s.num_householder, Vd = c.Vd;
  // Buffers of size 0 (the fp32 or the bf16 MLP tensors, per precision) are null.
  auto get_as = [&](auto tag, size_t m) { return m ? take<decltype(tag)>(a, m) : nullptr; };
  auto get = [&](size_t m) { return get_as(T{}, m); };
  const size_t mx = mixed_ ? 1 : 0;  // fp32 MLP tensors, or their bf16 counterparts
  layers_.resize(s.num_hidden_layers);
  for (auto& l : layers_) {
    l.h = get(N * C); l.rstd1 = get(N); l.x1 = get((1 - mx) * N * C);
    l.proj = get(N * c.W); l.qkvc = get(N * c.Wc()); l.qkn = get(N * c.Wqk()); l.rqk = get(N * (1 + n) * H);
    l.lg = s.use_forget_gate ? get(N * H) : nullptr;
    // on: fp32 unless mixed, where it is o_norm's bf16 output onh (or, gated, an fp32 step before it).
    l.o = get(N * Vd); l.ro = get(N * H); l.on = get((!mx || s.use_output_gate) ? N * Vd : 0);
    l.hmid = get(N * C); l.rstd2 = get(N); l.x2 = get((1 - mx) * N * C);
    l.gu = get((1 - mx) * N * 2 * I); l.act = get((1 - mx) * N * I);
    l.x2h = get_as(bf16{}, mx * N * C); l.guh = get_as(bf16{}, mx * N * 2 * I); l.acth = get_as(bf16{}, mx * N * I);
    l.wguh = get_as(bf16{}, mx * 3 * I * C);  // gate|up, then down: one conversion when P holds them so
    l.wdh = l.wguh ? l.wguh + 2 * I * C : nullptr;
    l.x1h = get_as(bf16{}, mx * N * C); l.onh = get_as(bf16{}, mx * N * Vd);
    l.wph = get_as(bf16{}, mx * c.W * C); l.woh = get_as(bf16{}, mx * C * Vd);
    l.ckpt = train ? get(Ops::delta_rule_ckpt_size(net_.dims(B, T_), s.use_forget_gate)) : nullptr;
  }
  head_.carve(a, N, C, V, /*layer_norm=*/false, train, mixed_);
}

template <class T, class Ops>
template <class Alloc>
void DeltaLMCore<T, Ops>::carve_grads(Alloc& a, int B, int T_) {
  const DeltaLMSpec& s = net_.spec;
  const DeltaLMLayout::Cols& c = net_.cols;
  const size_t N = size_t(B) * T_, NC = N * s.hidden_size, NV = N * c.Vd, I = s.intermediate_size;
  auto get_as = [&](auto tag, size_t m) { return m ? take<decltype(tag)>(a, m) : nullptr; };
  auto get = [&](size_t m) { return get_as(T{}, m); };
  const size_t mx = mixed_ ? 1 : 0;
  g_.dh = get(NC); g_.dx = get(NC); g_.d1 = get(NV); g_.d2 = get(NV);
  g_.dproj = get(N * c.W); g_.dqkvc = get(N * c.Wc()); g_.dqkn = get(N * c.Wqk());
  g_.dlg = get(s.use_forget_gate ? N * s.num_heads : 0);
  g_.dgu = get((1 - mx) * N * 2 * I); g_.dact = get((1 - mx) * N * I);
  g_.dlogits = get((1 - mx) * this->logit_rows(N, s.vocab_size) * s.vocab_size);  // (mixed: the head's own bf16 one)
  g_.dhh = get_as(bf16{}, mx * NC); g_.dguh = get_as(bf16{}, mx * N * 2 * I); g_.dacth = get_as(bf16{}, mx * N * I);
  g_.dhoh = get_as(bf16{}, mx * NC); g_.dprojh = get_as(bf16{}, mx * N * c.W);
}

template <class T, class Ops>
double DeltaLMCore<T, Ops>::forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_) {
  this->begin_forward(tokens, labels, B, T_);
  const DeltaLMSpec& s = net_.spec;
  const DeltaLMLayout::Cols& c = net_.cols;
  const int N = B * T_, C = s.hidden_size, H = s.num_heads, Dv = s.head_v_dim;
  const int I = s.intermediate_size, V = s.vocab_size, K = s.use_short_conv ? s.conv_size : 0;
  const int Dk = s.head_k_dim;
  const double eps = s.norm_eps;
  const ops::DeltaRuleDims dd = net_.dims(B, T_);

  Ops::embedding_forward(layers_[0].h, tokens, P + net_.emb, N, C, V);
  for (size_t li = 0; li < net_.layers.size(); ++li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    attn_in_forward(P, li, N, C, eps);  // proj = q|k|v|b|a|g (attn_norm(h))
    // q|k|v = SiLU(conv(.)), with q|k L2-normalised per head into qkn (on the GPU in one pass,
    // leaving qkvc's q|k part unwritten: nothing reads it).
    T* tail = carried(2 * li);  // piecewise reading (forward_continue): the conv's and the delta rule's state
    T* state = carried(2 * li + 1);
    Ops::short_conv_l2norm_forward(a.qkvc, a.qkn, a.rqk, a.proj, K ? P + w.q_conv : nullptr, B, T_, c.Wc(), K, c.W,
                                   c.Wc(), c.Wqk(), Dk, 1e-6, c.Wqk(), tail);
    if (tail) Ops::short_conv_advance_tail(tail, a.proj, B, T_, c.Wc(), K, c.W);
    if (s.use_forget_gate) Ops::forget_gate_forward(a.lg, a.proj + c.a, P + w.A_log, P + w.dt_bias, N, H, c.W);
    Ops::delta_rule_forward(a.o, a.qkn, a.qkn + c.k, a.qkvc + c.v, a.proj + c.b, a.lg, dd, a.ckpt, state);
    attn_out_forward(P, li, N, C, H, Dv, eps);  // hmid = h + o_proj(o_norm(o))
    T* next = li + 1 < net_.layers.size() ? layers_[li + 1].h : head_.hout;
    mlp_forward(P, li, next, N, C, I, eps);
  }
  return head_.forward(P, net_.norm, net_.head, labels, N, C, V, eps);
}

template <class T, class Ops>
std::unique_ptr<DecodeState> DeltaLMCore<T, Ops>::new_state(int B) const {
  const DeltaLMSpec& s = net_.spec;
  const size_t K = s.use_short_conv ? size_t(s.conv_size) : 0;
  auto st = std::make_unique<CoreDecodeState<T>>();
  st->B = B;
  for (int l = 0; l < s.num_hidden_layers; ++l) {
    st->buffers.emplace_back(size_t(B) * (K > 1 ? K - 1 : 0) * net_.cols.Wc(), T(0));
    st->buffers.emplace_back(size_t(B) * s.num_heads * s.head_k_dim * s.head_v_dim, T(0));
  }
  return st;
}

template <class T, class Ops>
void DeltaLMCore<T, Ops>::attn_in_forward(const T* P, size_t li, int N, int C, double eps) {
  auto& a = layers_[li];
  auto& w = net_.layers[li];
  const int W = net_.cols.W;
  if constexpr (Ops::kDevice) {
    if (mixed_) {  // x1 stored in bf16, the weight copied; proj stays fp32
      Ops::rmsnorm_forward(a.x1h, a.rstd1, a.h, P + w.attn_norm, N, C, eps);
      Ops::to_bf16(a.wph, P + w.q_proj, size_t(W) * C);
      Ops::linear_forward(a.proj, a.x1h, a.wph, N, C, W);
      return;
    }
  }
  Ops::rmsnorm_forward(a.x1, a.rstd1, a.h, P + w.attn_norm, N, C, eps);
  Ops::linear_forward(a.proj, a.x1, P + w.q_proj, nullptr, N, C, W);
}

template <class T, class Ops>
void DeltaLMCore<T, Ops>::attn_out_forward(const T* P, size_t li, int N, int C, int H, int Dv, double eps) {
  auto& a = layers_[li];
  auto& w = net_.layers[li];
  const DeltaLMLayout::Cols& c = net_.cols;
  const bool gated = net_.spec.use_output_gate;
  if constexpr (Ops::kDevice) {
    if (mixed_) {  // on in bf16 (gated: written in fp32, then rounded), the weight copied
      if (gated) {
        Ops::gated_rmsnorm_forward(a.on, a.ro, a.o, a.proj + c.g, P + w.o_norm, N, H, Dv, eps, c.W);
        Ops::to_bf16(a.onh, a.on, size_t(N) * c.Vd);
      } else {
        Ops::rmsnorm_forward(a.onh, a.ro, a.o, P + w.o_norm, N * H, Dv, eps);
      }
      Ops::to_bf16(a.woh, P + w.o_proj, size_t(C) * c.Vd);
      Ops::linear_forward_residual(a.hmid, a.onh, a.woh, a.h, N, c.Vd, C);
      return;
    }
  }
  if (gated)
    Ops::gated_rmsnorm_forward(a.on, a.ro, a.o, a.proj + c.g, P + w.o_norm, N, H, Dv, eps, c.W);
  else
    Ops::rmsnorm_forward(a.on, a.ro, a.o, P + w.o_norm, N * H, Dv, eps);
  Ops::linear_forward_residual(a.hmid, a.on, P + w.o_proj, a.h, N, c.Vd, C);
}

template <class T, class Ops>
void DeltaLMCore<T, Ops>::mlp_forward(const T* P, size_t li, T* next, int N, int C, int I, double eps) {
  auto& a = layers_[li];
  auto& w = net_.layers[li];
  if constexpr (Ops::kDevice) {
    if (mixed_) {  // the same in bf16 storage; next (the residual stream) stays fp32
      if (w.down_proj == w.gate_proj + size_t(2) * I * C) {
        Ops::to_bf16(a.wguh, P + w.gate_proj, size_t(3) * I * C);
      } else {
        Ops::to_bf16(a.wguh, P + w.gate_proj, size_t(2) * I * C);
        Ops::to_bf16(a.wdh, P + w.down_proj, size_t(C) * I);
      }
      Ops::rmsnorm_forward(a.x2h, a.rstd2, a.hmid, P + w.mlp_norm, N, C, eps);
      Ops::linear_forward(a.guh, a.x2h, a.wguh, N, C, 2 * I);
      Ops::swiglu_forward(a.acth, a.guh, a.guh + I, N, I, 2 * I);
      Ops::linear_forward_residual(next, a.acth, a.wdh, a.hmid, N, I, C);
      return;
    }
  }
  Ops::rmsnorm_forward(a.x2, a.rstd2, a.hmid, P + w.mlp_norm, N, C, eps);
  Ops::linear_forward(a.gu, a.x2, P + w.gate_proj, nullptr, N, C, 2 * I);  // gate|up
  Ops::swiglu_forward(a.act, a.gu, a.gu + I, N, I, 2 * I);
  Ops::linear_forward_residual(next, a.act, P + w.down_proj, a.hmid, N, I, C);  // next = hmid + down(act)
}

// The weight gradients of the linear layers run as side work (Ops::side: a second CUDA stream, in
// order on the CPU) next to the main stream's input gradients, and the delta rule's latency-bound
// backward above all. Whatever such work reads stays unchanged until the main stream waits for
// its ticket: dh (or its bf16 copy dhoh) until the o_proj ticket (before attn_norm's backward adds
// to dh), dgu/dact and their bf16 copies until the next layer's MLP (after that same wait), dproj
// (or dprojh) until the next layer's mixer writes it.
template <class T, class Ops>
void DeltaLMCore<T, Ops>::mlp_backward(const T* P, T* G, size_t li, int N, int C, int I) {
  auto& a = layers_[li];
  auto& w = net_.layers[li];
  Grads& g = g_;
  // dact, dgu (both halves) and dx are overwritten whole by their one writer: no zeroing.
  if constexpr (Ops::kDevice) {
    if (mixed_) {  // dh enters the bf16 GEMMs as a bf16 copy; dx and the weight gradients are fp32
      Ops::to_bf16(g.dhh, g.dh, size_t(N) * C);
      Ops::linear_backward(g.dacth, nullptr, g.dhh, a.acth, a.wdh, N, I, C, false);
      T* const no_dx = nullptr;  // (a typed null picks the overload with fp32 input gradients)
      Ops::side([&] { Ops::linear_backward(no_dx, G + w.down_proj, g.dhh, a.acth, a.wdh, N, I, C); });
      Ops::swiglu_backward(g.dguh, g.dguh + I, g.dacth, a.guh, a.guh + I, N, I, 2 * I, false);
      Ops::linear_backward(g.dx, nullptr, g.dguh, a.x2h, a.wguh, N, C, 2 * I, false);
      Ops::side([&] { Ops::linear_backward(no_dx, G + w.gate_proj, g.dguh, a.x2h, a.wguh, N, C, 2 * I); });
      return;
    }
  }
  // fp32: the down projection's dW reads dh, which mlp_norm's backward changes next: in order.
  Ops::linear_backward(g.dact, G + w.down_proj, nullptr, g.dh, a.act, P + w.down_proj, N, I, C, false);
  Ops::swiglu_backward(g.dgu, g.dgu + I, g.dact, a.gu, a.gu + I, N, I, 2 * I, false);
  Ops::linear_backward(g.dx, nullptr, nullptr, g.dgu, a.x2, P + w.gate_proj, N, C, 2 * I, false);
  Ops::side([&] { Ops::linear_backward(nullptr, G + w.gate_proj, nullptr, g.dgu, a.x2, nullptr, N, C, 2 * I); });
}

// A projection's backward from dout: dinp (overwritten) on the main stream, the weight gradient
// added into dW as side work (its ticket returned; it reads dout, or its bf16 copy douth, and the
// input until waited for). Mixed: dout is first copied to douth, and the GEMMs read the forward's
// bf16 input and weight copies inh, Wh; else inp and W.
template <class T, class Ops>
int DeltaLMCore<T, Ops>::projection_backward(T* dinp, T* dW, const T* dout, bf16* douth, const T* inp, const bf16* inh,
                                             const T* W, const bf16* Wh, int N, int IC, int OC) {
  if constexpr (Ops::kDevice) {
    if (mixed_) {
      Ops::to_bf16(douth, dout, size_t(N) * OC);
      Ops::linear_backward(dinp, nullptr, douth, inh, Wh, N, IC, OC, false);
      T* const no_dx = nullptr;  // (a typed null picks the overload with fp32 input gradients)
      return Ops::side([&] { Ops::linear_backward(no_dx, dW, douth, inh, Wh, N, IC, OC); });
    }
  }
  Ops::linear_backward(dinp, nullptr, nullptr, dout, inp, W, N, IC, OC, false);
  return Ops::side([&] { Ops::linear_backward(nullptr, dW, nullptr, dout, inp, nullptr, N, IC, OC); });
}

template <class T, class Ops>
void DeltaLMCore<T, Ops>::backward(const T* P, T* G) {
  this->begin_backward();
  const DeltaLMSpec& s = net_.spec;
  const DeltaLMLayout::Cols& c = net_.cols;
  const int B = Bc_, T_ = Tc_, N = B * T_, C = s.hidden_size, H = s.num_heads, Dk = s.head_k_dim;
  const int Dv = s.head_v_dim, n = s.num_householder, I = s.intermediate_size, V = s.vocab_size;
  const int K = s.use_short_conv ? s.conv_size : 0;
  const ops::DeltaRuleDims dd = net_.dims(B, T_);
  Grads& g = g_;
  // dh: written first here. The head's weight gradient runs as side work (see above).
  const int head_ticket =
      head_.backward(P, G, net_.norm, net_.head, labels_, g.dlogits, g.dx, g.dh, N, C, V, /*side_dW=*/true);

  int proj_ticket = -1;  // the last layer's q|k|v|b|a|g weight gradient (reads dproj)
  for (int li = int(net_.layers.size()) - 1; li >= 0; --li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    mlp_backward(P, G, size_t(li), N, C, I);
    Ops::rmsnorm_backward(g.dh, G + w.mlp_norm, g.dx, a.hmid, P + w.mlp_norm, a.rstd2, N, C);
    // Mixer: hmid = h + o_proj(o_norm(delta_rule(...)))
    // Every backward op of the mixer writes (not adds) its input gradients: d1 (o_proj), d2 (o_norm),
    // dqkn and dqkvc's v part (delta rule), dqkvc's q|k part (L2 norm), and dproj's column ranges
    // q|k|v (short conv), beta (delta rule), a (forget gate), g (output gate). No zeroing.
    const int o_ticket =  // d1; o_proj's dW as side work
        projection_backward(g.d1, G + w.o_proj, g.dh, g.dhoh, a.on, a.onh, P + w.o_proj, a.woh, N, c.Vd, C);
    if (proj_ticket >= 0) Ops::wait(proj_ticket);  // dproj is written from here on
    if (s.use_output_gate)
      Ops::gated_rmsnorm_backward(g.d2, g.dproj + c.g, G + w.o_norm, g.d1, a.o, a.proj + c.g, P + w.o_norm, a.ro, N,
                                  H, Dv, c.W, /*accumulate=*/false);
    else
      Ops::rmsnorm_backward(g.d2, G + w.o_norm, g.d1, a.o, P + w.o_norm, a.ro, N * H, Dv, /*accumulate=*/false);
    // The delta rule writes dq|dk (all of dqkn), dv, dbeta and dg; the L2 norm the q|k part of dqkvc.
    Ops::delta_rule_backward(g.dqkn, g.dqkn + c.k, g.dqkvc + c.v, g.dproj + c.b, s.use_forget_gate ? g.dlg : nullptr,
                             g.d2, a.qkn, a.qkn + c.k, a.qkvc + c.v, a.proj + c.b, a.lg, dd, a.ckpt,
                             /*accumulate=*/false);
    if (s.use_forget_gate)
      Ops::forget_gate_backward(g.dproj + c.a, G + w.A_log, G + w.dt_bias, g.dlg, a.proj + c.a, P + w.A_log,
                                P + w.dt_bias, N, H, c.W, /*accumulate=*/false);
    Ops::l2norm_backward(g.dqkvc, g.dqkn, a.qkn, a.rqk, N, Dk, (1 + n) * H, c.Wc(), c.Wqk(), /*accumulate=*/false);
    Ops::short_conv_backward(g.dproj, K ? G + w.q_conv : nullptr, g.dqkvc, a.proj, K ? P + w.q_conv : nullptr, B, T_,
                             c.Wc(), K, c.W, c.Wc(), nullptr, nullptr, /*accumulate=*/false);
    proj_ticket =  // dx; q|k|v|b|a|g's dW as side work
        projection_backward(g.dx, G + w.q_proj, g.dproj, g.dprojh, a.x1, a.x1h, P + w.q_proj, a.wph, N, C, c.W);
    Ops::wait(o_ticket);  // the side work up to o_proj's dW read dh (and this layer's MLP buffers)
    Ops::rmsnorm_backward(g.dh, G + w.attn_norm, g.dx, a.h, P + w.attn_norm, a.rstd1, N, C);
  }
  if (net_.head == net_.emb && head_ticket >= 0) Ops::wait(head_ticket);  // tied: both add into one gradient
  Ops::embedding_backward(G + net_.emb, g.dh, tokens_, N, C, V);
  Ops::join();
}

template class DeltaLM<float>;
template class DeltaLM<double>;
LRNN_INSTANTIATE_CORE(DeltaLMCore)

}  // namespace lrnn
