#include "models/mamba.h"
#include <cmath>
#include <cstring>
#include "core/rng.h"

namespace lrnn {

void MambaConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"mamba"})
      .add("vocab_size", &vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("hidden_size", &hidden_size, "model width d", 1, 1 << 16)
      .add("state_size", &state_size, "SSM state size per channel (d_state)", 1, 1024)
      .add("num_hidden_layers", &num_hidden_layers, "number of blocks", 1, 1024)
      .add("expand", &expand, "d_inner = expand * hidden_size", 1, 64)
      .add("conv_kernel", &conv_kernel, "causal depthwise conv width", 1, 64)
      .add("time_step_rank", &time_step_rank, "dt_rank; 0 = HF's auto, ceil(hidden_size / 16)", 0, 1 << 16)
      .add("use_bias", &use_bias, "biases in in_proj and out_proj")
      .add("use_conv_bias", &use_conv_bias, "bias in conv1d")
      .add("allow_neg_eigval", &allow_neg_eigval, "abar = 2*exp(delta*A) - 1: eigenvalues in [-1,1] instead of [0,1]")
      .add("layer_norm_epsilon", &layer_norm_epsilon, "RMSNorm epsilon", 0.0, 1.0)
      .add("initializer_range", &initializer_range, "std of the normal initialisations", 0.0, 10.0)
      .add("time_step_scale", &time_step_scale, "scale of the dt_proj.weight initialisation", 0.0, 1e6)
      .add("time_step_min", &time_step_min, "smallest initial delta (dt_proj.bias init)", 1e-12, 1e6)
      .add("time_step_max", &time_step_max, "largest initial delta (dt_proj.bias init)", 1e-12, 1e6)
      .add("time_step_floor", &time_step_floor, "initial delta is clamped below at this value", 0.0, 1e6)
      .add("time_step_init_scheme", &time_step_init_scheme, "dt_proj.weight init", {"random", "constant"})
      .add("rescale_prenorm_residual", &rescale_prenorm_residual, "divide the out_proj init by sqrt(num_hidden_layers)")
      .add("tie_word_embeddings", &tie_word_embeddings, "lm_head shares the embedding matrix (HF tie_word_embeddings)");
}

void MambaConfig::validate(const io::Schema& s) const {
  if (time_step_min > time_step_max)
    s.fail("time_step_min", fmt::format("must not exceed time_step_max ({}), got {}", time_step_max, time_step_min));
}

namespace {
template <class T>
T* fill(T* p, size_t n, T v) {
  std::fill_n(p, n, v);
  return p;
}
}  // namespace

template <class T>
Mamba<T>::Mamba(const MambaConfig& cfg, uint64_t seed) {
  net_.cfg = cfg;
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size, Di = cfg.d_inner(), R = cfg.dt_rank();
  const int64_t S = cfg.state_size, K = cfg.conv_kernel, L = cfg.num_hidden_layers;
  const double r = cfg.initializer_range;
  const double dt_std = std::pow(double(R), -0.5) * cfg.time_step_scale;
  const double out_bound = 1.0 / std::sqrt(double(Di)) / (cfg.rescale_prenorm_residual ? std::sqrt(double(L)) : 1.0);
  auto& lay = this->layout_;
  net_.emb = lay.add("backbone.embeddings.weight", {V, d}, Init::Normal, r, true);
  for (int l = 0; l < L; ++l) {
    const std::string p = fmt::format("backbone.layers.{}.", l), m = p + "mixer.";
    MambaLayout::LayerParams x{};
    x.norm = lay.add(p + "norm.weight", {d}, Init::Ones, 0, false);
    x.in_proj = lay.add(m + "in_proj.weight", {2 * Di, d}, Init::Normal, r, true);
    x.in_bias = cfg.use_bias ? lay.add(m + "in_proj.bias", {2 * Di}, Init::Zeros, 0, false) : MambaLayout::kNone;
    x.conv = lay.add(m + "conv1d.weight", {Di, 1, K}, Init::Uniform, 1.0 / std::sqrt(double(K)), true);
    x.conv_bias = cfg.use_conv_bias ? lay.add(m + "conv1d.bias", {Di}, Init::Zeros, 0, false) : MambaLayout::kNone;
    x.x_proj = lay.add(m + "x_proj.weight", {R + 2 * S, Di}, Init::Normal, r, true);
    const bool random_dt = cfg.time_step_init_scheme == "random";
    x.dt_proj = lay.add(m + "dt_proj.weight", {Di, R}, random_dt ? Init::Uniform : Init::Ones, dt_std, true);
    x.dt_bias = lay.add(m + "dt_proj.bias", {Di}, Init::Zeros, 0, false);  // set below
    x.A_log = lay.add(m + "A_log", {Di, S}, Init::Zeros, 0, false);         // set below
    x.D = lay.add(m + "D", {Di}, Init::Ones, 0, false);
    x.out_proj = lay.add(m + "out_proj.weight", {d, Di}, Init::Uniform, out_bound, true);
    x.out_bias = cfg.use_bias ? lay.add(m + "out_proj.bias", {d}, Init::Zeros, 0, false) : MambaLayout::kNone;
    net_.layers.push_back(x);
  }
  net_.norm = lay.add("backbone.norm_f.weight", {d}, Init::Ones, 0, false);
  net_.head = cfg.tie_word_embeddings ? net_.emb : lay.add("lm_head.weight", {V, d}, Init::Normal, r, true);
  this->allocate();
  T* P = this->params.data();
  init_params(lay, P, seed);
  // The inits the generic table does not express (see the header).
  for (int l = 0; l < L; ++l) {
    const MambaLayout::LayerParams& x = net_.layers[l];
    if (cfg.time_step_init_scheme == "constant") fill(P + x.dt_proj, size_t(Di * R), T(dt_std));
    for (int64_t c = 0; c < Di; ++c)
      for (int64_t n = 0; n < S; ++n) P[x.A_log + c * S + n] = T(std::log(double(n + 1)));
    const Rng rng{seed, uint64_t(50000 + l)};
    const double lo = std::log(cfg.time_step_min), hi = std::log(cfg.time_step_max);
    for (int64_t c = 0; c < Di; ++c) {
      const double dt = std::max(std::exp(lo + double(rng.uniform(c)) * (hi - lo)), cfg.time_step_floor);
      P[x.dt_bias + c] = T(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt)
    }
  }
}

ops::SelectiveScanDims MambaLayout::dims(int B, int T_) const {
  ops::SelectiveScanDims d;
  d.B = B; d.T = T_; d.Di = cfg.d_inner(); d.N = cfg.state_size;
  d.range = cfg.allow_neg_eigval ? ops::EigenRange::Signed : ops::EigenRange::Unit;
  d.ldx = d.lddt = d.Di;                                // xc, dtr packed
  d.ldz = 2 * d.Di;                                     // z: second half of the in_proj output
  d.ldbc = cfg.dt_rank() + 2 * cfg.state_size;          // B, C inside the x_proj output
  return d;
}

template <class T, class Ops>
template <class Alloc>
void MambaCore<T, Ops>::carve(Alloc& a, int B, int T_, bool train) {
  const MambaConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, C = cfg.hidden_size, Di = cfg.d_inner(), V = cfg.vocab_size;
  const size_t W = cfg.dt_rank() + 2 * size_t(cfg.state_size);
  auto get = [&](size_t n) { return take<T>(a, n); };
  layers_.resize(cfg.num_hidden_layers);
  for (auto& l : layers_) {
    l.h = get(N * C); l.rstd = get(N); l.x1 = get(N * C);
    l.xz = get(N * 2 * Di); l.xc = get(N * Di); l.dbc = get(N * W); l.dtr = get(N * Di); l.y = get(N * Di);
    l.ckpt = train ? get(ops::selective_scan_ckpt_size(net_.dims(B, T_))) : nullptr;
  }
  head_.carve(a, N, C, V, /*layer_norm=*/false, train);
}

template <class T, class Ops>
template <class Alloc>
void MambaCore<T, Ops>::carve_grads(Alloc& a, int B, int T_) {
  const MambaConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, NC = N * cfg.hidden_size, ND = N * cfg.d_inner();
  const size_t W = cfg.dt_rank() + 2 * size_t(cfg.state_size);
  auto get = [&](size_t n) { return take<T>(a, n); };
  g_.dh = get(NC); g_.dx1 = get(NC); g_.dy = get(ND); g_.dxz = get(2 * ND); g_.dxc = get(ND);
  g_.ddbc = get(N * W); g_.ddtr = get(ND); g_.dlogits = get(this->logit_rows(N, cfg.vocab_size) * cfg.vocab_size);
}

template <class T, class Ops>
ops::SelectiveScanInputs<T> MambaCore<T, Ops>::scan_inputs(const LayerActs& a, const T* P,
                                                           const MambaLayout::LayerParams& w) const {
  const int R = net_.cfg.dt_rank(), S = net_.cfg.state_size, Di = net_.cfg.d_inner();
  return {a.xc, a.dtr, P + w.dt_bias, P + w.A_log, a.dbc + R, a.dbc + R + S, P + w.D, a.xz + Di};
}

template <class T, class Ops>
std::unique_ptr<DecodeState> MambaCore<T, Ops>::new_state(int B) const {
  const MambaConfig& cfg = net_.cfg;
  const size_t Di = size_t(cfg.d_inner()), K = size_t(cfg.conv_kernel);
  auto st = std::make_unique<CoreDecodeState<T>>();
  st->B = B;
  for (size_t l = 0; l < net_.layers.size(); ++l) {
    st->buffers.emplace_back(size_t(B) * (K > 1 ? K - 1 : 0) * Di, T(0));
    st->buffers.emplace_back(size_t(B) * cfg.state_size * Di, T(0));
  }
  return st;
}

template <class T, class Ops>
double MambaCore<T, Ops>::forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_) {
  this->begin_forward(tokens, labels, B, T_);
  const MambaConfig& cfg = net_.cfg;
  const int N = B * T_, C = cfg.hidden_size, Di = cfg.d_inner(), V = cfg.vocab_size;
  const int R = cfg.dt_rank(), W = R + 2 * cfg.state_size, K = cfg.conv_kernel;
  const ops::SelectiveScanDims sd = net_.dims(B, T_);
  auto opt = [&](size_t off) { return MambaLayout::opt(P, off); };

  Ops::embedding_forward(layers_[0].h, tokens, P + net_.emb, N, C, V);
  for (size_t li = 0; li < net_.layers.size(); ++li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    Ops::rmsnorm_forward(a.x1, a.rstd, a.h, P + w.norm, N, C, cfg.layer_norm_epsilon);
    Ops::linear_forward(a.xz, a.x1, P + w.in_proj, opt(w.in_bias), N, C, 2 * Di);   // x | z
    T* tail = carried(2 * li);  // piecewise reading (forward_continue): the conv's and the scan's state
    T* state = carried(2 * li + 1);
    Ops::short_conv_forward(a.xc, a.xz, P + w.conv, B, T_, Di, K, 2 * Di, Di, opt(w.conv_bias), tail);
    if (tail) Ops::short_conv_advance_tail(tail, a.xz, B, T_, Di, K, 2 * Di);
    Ops::linear_forward(a.dbc, a.xc, P + w.x_proj, nullptr, N, Di, W);              // dt | B | C
    Ops::gemm(false, true, N, Di, R, T(1), a.dbc, W, P + w.dt_proj, R, T(0), a.dtr, Di);
    Ops::selective_scan_forward(a.y, scan_inputs(a, P, w), sd, a.ckpt, state);
    T* next = li + 1 < net_.layers.size() ? layers_[li + 1].h : head_.hout;
    Ops::linear_forward(next, a.y, P + w.out_proj, opt(w.out_bias), N, Di, C);
    Ops::add_inplace(next, a.h, size_t(N) * C);
  }
  return head_.forward(P, net_.norm, net_.head, labels, N, C, V, cfg.layer_norm_epsilon);
}

template <class T, class Ops>
void MambaCore<T, Ops>::backward(const T* P, T* G) {
  this->begin_backward();
  const MambaConfig& cfg = net_.cfg;
  const int B = Bc_, T_ = Tc_, N = B * T_, C = cfg.hidden_size, Di = cfg.d_inner(), V = cfg.vocab_size;
  const int R = cfg.dt_rank(), S = cfg.state_size, W = R + 2 * S, K = cfg.conv_kernel;
  const ops::SelectiveScanDims sd = net_.dims(B, T_);
  const size_t ND = size_t(N) * Di;
  Grads& g = g_;
  auto opt = [&](size_t off) { return MambaLayout::opt(P, off); };
  auto gopt = [&](size_t off) { return MambaLayout::opt(G, off); };
  head_.backward(P, G, net_.norm, net_.head, labels_, g.dlogits, g.dx1, g.dh, N, C, V, /*side_dW=*/false);

  for (int li = int(net_.layers.size()) - 1; li >= 0; --li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    // next = h + out_proj(y): dh flows to h unchanged, and into the mixer.
    // dy [N, Di] is overwritten whole by out_proj's backward: no zeroing.
    Ops::linear_backward(g.dy, G + w.out_proj, gopt(w.out_bias), g.dh, a.y, P + w.out_proj, N, Di, C, false);
    Ops::zero(g.dxz, 2 * ND);
    Ops::zero(g.dxc, ND);
    Ops::zero(g.ddbc, size_t(N) * W);
    Ops::zero(g.ddtr, ND);
    ops::SelectiveScanGrads<T> sg{g.dxc,       g.ddtr,           G + w.dt_bias, G + w.A_log,
                                  g.ddbc + R, g.ddbc + R + S,   G + w.D,       g.dxz + Di};
    Ops::selective_scan_backward(sg, g.dy, scan_inputs(a, P, w), sd, a.ckpt);
    // dtr = dt @ dt_proj^T with dt the first R columns of dbc.
    Ops::gemm(false, false, N, R, Di, T(1), g.ddtr, Di, P + w.dt_proj, R, T(1), g.ddbc, W);
    Ops::gemm(true, false, Di, R, N, T(1), g.ddtr, Di, a.dbc, W, T(1), G + w.dt_proj, R);
    Ops::linear_backward(g.dxc, G + w.x_proj, nullptr, g.ddbc, a.xc, P + w.x_proj, N, Di, W);
    Ops::short_conv_backward(g.dxz, G + w.conv, g.dxc, a.xz, P + w.conv, B, T_, Di, K, 2 * Di, Di, opt(w.conv_bias),
                             gopt(w.conv_bias));
    // dx1 is overwritten whole by in_proj's backward: no zeroing.
    Ops::linear_backward(g.dx1, G + w.in_proj, gopt(w.in_bias), g.dxz, a.x1, P + w.in_proj, N, C, 2 * Di, false);
    Ops::rmsnorm_backward(g.dh, G + w.norm, g.dx1, a.h, P + w.norm, a.rstd, N, C);
  }
  Ops::embedding_backward(G + net_.emb, g.dh, tokens_, N, C, V);
}

template <class T>
nlohmann::json Mamba<T>::hf_config() const {
  // HF transformers' MambaConfig keys, so the [0,1] checkpoint loads with MambaForCausalLM.
  nlohmann::json j = {{"model_type", "mamba"},
                      {"architectures", {"MambaForCausalLM"}},
                      {"vocab_size", net_.cfg.vocab_size},
                      {"hidden_size", net_.cfg.hidden_size},
                      {"state_size", net_.cfg.state_size},
                      {"num_hidden_layers", net_.cfg.num_hidden_layers},
                      {"layer_norm_epsilon", net_.cfg.layer_norm_epsilon},
                      {"pad_token_id", 0},
                      {"bos_token_id", 0},
                      {"eos_token_id", 0},
                      {"expand", net_.cfg.expand},
                      {"intermediate_size", net_.cfg.d_inner()},
                      {"conv_kernel", net_.cfg.conv_kernel},
                      {"use_bias", net_.cfg.use_bias},
                      {"use_conv_bias", net_.cfg.use_conv_bias},
                      {"hidden_act", "silu"},
                      {"initializer_range", net_.cfg.initializer_range},
                      {"residual_in_fp32", true},
                      {"time_step_rank", net_.cfg.dt_rank()},
                      {"time_step_scale", net_.cfg.time_step_scale},
                      {"time_step_min", net_.cfg.time_step_min},
                      {"time_step_max", net_.cfg.time_step_max},
                      {"time_step_init_scheme", net_.cfg.time_step_init_scheme},
                      {"time_step_floor", net_.cfg.time_step_floor},
                      {"rescale_prenorm_residual", net_.cfg.rescale_prenorm_residual},
                      {"use_cache", true},
                      {"use_mambapy", false},
                      {"tie_word_embeddings", net_.cfg.tie_word_embeddings},
                      {"allow_neg_eigval", net_.cfg.allow_neg_eigval}};
  if (net_.cfg.allow_neg_eigval) {
    // Stock transformers has no [-1,1] Mamba: MambaForCausalLM would load these weights without a
    // word and compute the [0,1] model. So the [-1,1] checkpoint is a custom architecture (HF's
    // convention): its own model_type, and auto_map naming the classes of src/models/hf/
    // modeling_lrnn_mamba.py, which save_model writes beside config.json (Model::hf_files).
    // It loads only with trust_remote_code=True; without it transformers refuses.
    j["model_type"] = "lrnn_mamba";
    j["architectures"] = {"LrnnMambaForCausalLM"};
    j["auto_map"] = {{"AutoConfig", "modeling_lrnn_mamba.LrnnMambaConfig"},
                     {"AutoModelForCausalLM", "modeling_lrnn_mamba.LrnnMambaForCausalLM"}};
  }
  return j;
}

template class Mamba<float>;
template class Mamba<double>;
LRNN_INSTANTIATE_CORE(MambaCore)

}  // namespace lrnn
