#include "models/llama.h"
#include <cmath>
#include <cstring>
#include <vector>

namespace lrnn {

void LlamaConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"llama"})
      .add("vocab_size", &vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("hidden_size", &hidden_size, "model width d", 1, 1 << 16)
      .add("intermediate_size", &intermediate_size, "MLP width; 0 = 256*ceil(floor(8d/3)/256) (d=128: 512)", 0, 1 << 20)
      .add("num_hidden_layers", &num_hidden_layers, "number of decoder layers", 1, 1024)
      .add("num_attention_heads", &num_attention_heads, "heads; head dim = hidden_size / heads (even, for RoPE)", 1, 4096)
      .add("rms_norm_eps", &rms_norm_eps, "RMSNorm epsilon", 0.0, 1.0)
      .add("rope_theta", &rope_theta, "RoPE base", 1.0, 1e12)
      .add("max_position_embeddings", &max_position_embeddings, "written to config.json (no limit in lrnn)", 1, 1 << 30)
      .add("initializer_range", &initializer_range, "std of the normal initialisations", 0.0, 10.0)
      .add("tie_word_embeddings", &tie_word_embeddings, "lm_head shares the embedding matrix (HF tie_word_embeddings)");
}

int LlamaConfig::mlp_size() const {
  if (intermediate_size > 0) return intermediate_size;
  int raw = int(std::floor(double(hidden_size) * 4 * 2.0 / 3.0));
  return 256 * ((raw + 255) / 256);
}

void LlamaConfig::validate(const io::Schema& s) const {
  if (hidden_size % num_attention_heads != 0)
    s.fail("num_attention_heads", fmt::format("must divide hidden_size ({}), got {}", hidden_size, num_attention_heads));
  if (head_dim() % 2 != 0)
    s.fail("num_attention_heads", fmt::format("head dim hidden_size/num_attention_heads must be even for RoPE, got {}", head_dim()));
}

template <class T>
Llama<T>::Llama(const LlamaConfig& cfg, uint64_t seed) {
  net_.cfg = cfg;
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size, I = cfg.mlp_size(), L = cfg.num_hidden_layers;
  const double r = cfg.initializer_range;
  auto& lay = this->layout_;
  net_.emb = lay.add("model.embed_tokens.weight", {V, d}, Init::Normal, r, true);
  for (int l = 0; l < L; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    LlamaLayout::LayerParams x{};
    x.input_norm = lay.add(p + "input_layernorm.weight", {d}, Init::Ones, 0, false);
    // q|k|v consecutive: one [3d, d] matrix for one GEMM (names and shapes stay HF's).
    x.q_proj = lay.add(p + "self_attn.q_proj.weight", {d, d}, Init::Normal, r, true, false);
    x.k_proj = lay.add(p + "self_attn.k_proj.weight", {d, d}, Init::Normal, r, true, false);
    x.v_proj = lay.add(p + "self_attn.v_proj.weight", {d, d}, Init::Normal, r, true);
    x.o_proj = lay.add(p + "self_attn.o_proj.weight", {d, d}, Init::Normal, r, true);
    x.post_norm = lay.add(p + "post_attention_layernorm.weight", {d}, Init::Ones, 0, false);
    x.gate_proj = lay.add(p + "mlp.gate_proj.weight", {I, d}, Init::Normal, r, true, false);  // gate|up: one GEMM
    x.up_proj = lay.add(p + "mlp.up_proj.weight", {I, d}, Init::Normal, r, true);
    x.down_proj = lay.add(p + "mlp.down_proj.weight", {d, I}, Init::Normal, r, true);
    LRNN_CHECK(x.k_proj == x.q_proj + size_t(d * d) && x.v_proj == x.k_proj + size_t(d * d) &&
                   x.up_proj == x.gate_proj + size_t(I * d),
               "fused projection layout broken");
    net_.layers.push_back(x);
  }
  net_.norm = lay.add("model.norm.weight", {d}, Init::Ones, 0, false);
  net_.head = cfg.tie_word_embeddings ? net_.emb : lay.add("lm_head.weight", {V, d}, Init::Normal, r, true);
  this->allocate();
  init_params(lay, this->params.data(), seed);
}

namespace {
// q|k inside the fused [N, 3C] projection as 2H heads, written to the packed [N, 2C] buffer.
ops::RopeDims rope_dims(const LlamaConfig& c, int B, int T_) {
  ops::RopeDims d;
  d.B = B; d.T = T_; d.H = 2 * c.num_attention_heads; d.D = c.head_dim(); d.theta = c.rope_theta;
  d.ldx = 3 * c.hidden_size;
  d.ldo = 2 * c.hidden_size;
  return d;
}
// q, k from the roped [N, 2C] buffer, v from the projection [N, 3C], output packed [N, C].
ops::AttentionDims attn_dims(const LlamaConfig& c, int B, int T_) {
  ops::AttentionDims d;
  d.B = B; d.T = T_; d.H = c.num_attention_heads; d.D = c.head_dim();
  d.ldq = d.ldk = 2 * c.hidden_size;
  d.ldv = 3 * c.hidden_size;
  return d;
}
}  // namespace

template <class T, class Ops>
template <class Alloc>
void LlamaCore<T, Ops>::carve(Alloc& a, int B, int T_, bool train) {  // (every activation is kept either way)
  const LlamaConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, C = cfg.hidden_size, H = cfg.num_attention_heads, I = cfg.mlp_size();
  const size_t V = cfg.vocab_size;
  auto get = [&](size_t n) { return take<T>(a, n); };
  layers_.resize(cfg.num_hidden_layers);
  for (auto& l : layers_) {
    l.h = get(N * C); l.rstd1 = get(N); l.x1 = get(N * C);
    l.qkv = get(N * 3 * C); l.qk = get(N * 2 * C); l.lse = get(N * H); l.att = get(N * C);
    l.hmid = get(N * C); l.rstd2 = get(N); l.x2 = get(N * C);
    l.gu = get(N * 2 * I); l.act = get(N * I);
  }
  head_.carve(a, N, C, V, /*layer_norm=*/false, train);
}

template <class T, class Ops>
template <class Alloc>
void LlamaCore<T, Ops>::carve_grads(Alloc& a, int B, int T_) {
  const LlamaConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, NC = N * cfg.hidden_size, I = cfg.mlp_size();
  auto get = [&](size_t n) { return take<T>(a, n); };
  g_.dh = get(NC); g_.dx = get(NC); g_.datt = get(NC); g_.dqkv = get(NC * 3); g_.dqk = get(NC * 2);
  g_.dgu = get(N * 2 * I); g_.dact = get(N * I); g_.dlogits = get(this->logit_rows(N, cfg.vocab_size) * cfg.vocab_size);
}

template <class T, class Ops>
std::unique_ptr<DecodeState> LlamaCore<T, Ops>::new_state(int B) const {
  auto st = std::make_unique<CoreDecodeState<T>>();
  st->B = B;
  st->buffers.resize(2 * net_.layers.size());  // keys, values per layer; empty until the first token
  return st;
}

namespace {

// Attention of T new tokens over the KV cache (the P tokens before them and themselves): for
// sequence b, head h and new token i, o = softmax_j(scale q_i . k_j) v_j over j <= P + i. The
// cache holds [P + T][B][C] keys and values; q [B,T] rows of stride ldq; o [B,T,C]. The plain
// loop (inference reads a token or a prompt chunk at a time; the training attention op has no
// cache).
template <class T>
void cached_attention(T* o, const T* q, int ldq, const T* keys, const T* values, int B, int T_, int P, int H, int D,
                      double scale) {
  const int C = H * D;
#pragma omp parallel
  {
    std::vector<double> p(static_cast<size_t>(P + T_)), acc(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T_; ++i)
        for (int h = 0; h < H; ++h) {
          const T* qi = q + (size_t(b) * T_ + i) * ldq + size_t(h) * D;
          const int n = P + i + 1;
          double m = -INFINITY;
          for (int j = 0; j < n; ++j) {
            const T* kj = keys + (size_t(j) * B + b) * C + size_t(h) * D;
            double s = 0;
            for (int d = 0; d < D; ++d) s += double(qi[d]) * double(kj[d]);
            p[size_t(j)] = s * scale;
            m = std::max(m, p[size_t(j)]);
          }
          double z = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int j = 0; j < n; ++j) {
            const double e = std::exp(p[size_t(j)] - m);
            z += e;
            const T* vj = values + (size_t(j) * B + b) * C + size_t(h) * D;
            for (int d = 0; d < D; ++d) acc[size_t(d)] += e * double(vj[d]);
          }
          T* oi = o + (size_t(b) * T_ + i) * C + size_t(h) * D;
          for (int d = 0; d < D; ++d) oi[d] = T(acc[size_t(d)] / z);
        }
  }
}

}  // namespace

template <class T, class Ops>
double LlamaCore<T, Ops>::forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_) {
  this->begin_forward(tokens, labels, B, T_);
  const LlamaConfig& cfg = net_.cfg;
  const int N = B * T_, C = cfg.hidden_size, I = cfg.mlp_size(), V = cfg.vocab_size;
  const double eps = cfg.rms_norm_eps;
  auto rd = rope_dims(cfg, B, T_);
  const auto ad = attn_dims(cfg, B, T_);
  const int cached = carry_ ? int(carry_->position) : 0;  // tokens already in the KV cache
  rd.offset = cached;

  Ops::embedding_forward(layers_[0].h, tokens, P + net_.emb, N, C, V);
  for (size_t li = 0; li < net_.layers.size(); ++li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    Ops::rmsnorm_forward(a.x1, a.rstd1, a.h, P + w.input_norm, N, C, eps);
    Ops::linear_forward(a.qkv, a.x1, P + w.q_proj, nullptr, N, C, 3 * C);  // q|k|v
    Ops::rope_forward(a.qk, a.qkv, rd);                                     // q and k together
    if constexpr (!Ops::kDevice) {
      if (carry_) {  // piecewise reading: append this piece's keys and values, attend over the cache
        auto& keys = carry_->buffers[2 * li];
        auto& values = carry_->buffers[2 * li + 1];
        for (int t = 0; t < T_; ++t)
          for (int b = 0; b < B; ++b) {
            const size_t n = size_t(b) * T_ + t;
            keys.insert(keys.end(), a.qk + n * 2 * C + C, a.qk + n * 2 * C + 2 * C);
            values.insert(values.end(), a.qkv + n * 3 * C + 2 * C, a.qkv + n * 3 * C + 3 * C);
          }
        cached_attention(a.att, a.qk, 2 * C, keys.data(), values.data(), B, T_, cached, cfg.num_attention_heads,
                         cfg.head_dim(), ad.softmax_scale());
      }
    }
    if (!carry_) Ops::attention_forward(a.att, a.lse, a.qk, a.qk + C, a.qkv + 2 * C, ad);
    Ops::linear_forward_residual(a.hmid, a.att, P + w.o_proj, a.h, N, C, C);  // hmid = h + o_proj(att)
    Ops::rmsnorm_forward(a.x2, a.rstd2, a.hmid, P + w.post_norm, N, C, eps);
    Ops::linear_forward(a.gu, a.x2, P + w.gate_proj, nullptr, N, C, 2 * I);  // gate|up
    Ops::swiglu_forward(a.act, a.gu, a.gu + I, N, I, 2 * I);
    T* next = li + 1 < net_.layers.size() ? layers_[li + 1].h : head_.hout;
    Ops::linear_forward_residual(next, a.act, P + w.down_proj, a.hmid, N, I, C);
  }
  return head_.forward(P, net_.norm, net_.head, labels, N, C, V, eps);
}

template <class T, class Ops>
void LlamaCore<T, Ops>::backward(const T* P, T* G) {
  this->begin_backward();
  const LlamaConfig& cfg = net_.cfg;
  const int B = Bc_, T_ = Tc_, N = B * T_, C = cfg.hidden_size, I = cfg.mlp_size(), V = cfg.vocab_size;
  const auto rd = rope_dims(cfg, B, T_);
  const auto ad = attn_dims(cfg, B, T_);
  const size_t NC = size_t(N) * C;
  Grads& g = g_;
  head_.backward(P, G, net_.norm, net_.head, labels_, g.dlogits, g.dx, g.dh, N, C, V, /*side_dW=*/false);

  for (int li = int(net_.layers.size()) - 1; li >= 0; --li) {
    auto& a = layers_[li];
    auto& w = net_.layers[li];
    // MLP: next = hmid + down(swiglu(gate(x2), up(x2)))
    // dact, dgu (both halves) and dx are overwritten whole by their one writer: no zeroing.
    Ops::linear_backward(g.dact, G + w.down_proj, nullptr, g.dh, a.act, P + w.down_proj, N, I, C, false);
    Ops::swiglu_backward(g.dgu, g.dgu + I, g.dact, a.gu, a.gu + I, N, I, 2 * I, false);
    Ops::linear_backward(g.dx, G + w.gate_proj, nullptr, g.dgu, a.x2, P + w.gate_proj, N, C, 2 * I, false);
    Ops::rmsnorm_backward(g.dh, G + w.post_norm, g.dx, a.hmid, P + w.post_norm, a.rstd2, N, C);
    // Attention: hmid = h + o_proj(attn(rope(q), rope(k), v))
    Ops::zero(g.dqk, 2 * NC);
    Ops::zero(g.dqkv, 3 * NC);
    // datt [N, C] is overwritten whole by o_proj's backward: no zeroing.
    Ops::linear_backward(g.datt, G + w.o_proj, nullptr, g.dh, a.att, P + w.o_proj, N, C, C, false);
    Ops::attention_backward(g.dqk, g.dqk + C, g.dqkv + 2 * C, g.datt, a.qk, a.qk + C, a.qkv + 2 * C, a.att, a.lse,
                            ad);
    Ops::rope_backward(g.dqkv, g.dqk, rd);
    // dx is overwritten whole by the qkv projection's backward: no zeroing.
    Ops::linear_backward(g.dx, G + w.q_proj, nullptr, g.dqkv, a.x1, P + w.q_proj, N, C, 3 * C, false);
    Ops::rmsnorm_backward(g.dh, G + w.input_norm, g.dx, a.h, P + w.input_norm, a.rstd1, N, C);
  }
  Ops::embedding_backward(G + net_.emb, g.dh, tokens_, N, C, V);
}

template <class T>
nlohmann::json Llama<T>::hf_config() const {
  // transformers' LlamaConfig keys: the checkpoint loads with LlamaForCausalLM.
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", net_.cfg.vocab_size},
          {"hidden_size", net_.cfg.hidden_size},
          {"intermediate_size", net_.cfg.mlp_size()},
          {"num_hidden_layers", net_.cfg.num_hidden_layers},
          {"num_attention_heads", net_.cfg.num_attention_heads},
          {"num_key_value_heads", net_.cfg.num_attention_heads},
          {"head_dim", net_.cfg.head_dim()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", net_.cfg.max_position_embeddings},
          {"initializer_range", net_.cfg.initializer_range},
          {"rms_norm_eps", net_.cfg.rms_norm_eps},
          {"rope_theta", net_.cfg.rope_theta},  // transformers < 5; 5.x reads rope_parameters
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", net_.cfg.rope_theta}}},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", net_.cfg.tie_word_embeddings},
          {"use_cache", true},
          {"pad_token_id", nullptr},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"torch_dtype", "float32"}};  // checkpoints are written in fp32
}

template class Llama<float>;
template class Llama<double>;
LRNN_INSTANTIATE_CORE(LlamaCore)

}  // namespace lrnn
