#include "models/lstm.h"
#include <cmath>
#include <cstring>

namespace lrnn {

void LstmConfig::describe(io::Schema& s) {
  s.add("model_type", &model_type, "architecture", {"lstm"})
      .add("vocab_size", &vocab_size, "vocabulary size (set from the task when omitted)", 1, 1 << 24)
      .add("embedding_dim", &embedding_dim, "token embedding width = LSTM input size; 0 = hidden_size", 0, 1 << 16)
      .add("hidden_size", &hidden_size, "LSTM hidden size H", 1, 1 << 16)
      .add("num_layers", &num_layers, "stacked LSTM layers", 1, 1024);
}

template <class T>
Lstm<T>::Lstm(const LstmConfig& cfg, uint64_t seed) {
  net_.cfg = cfg;
  const int64_t V = cfg.vocab_size, E = cfg.input_size(), H = cfg.hidden_size;
  const double bound = 1.0 / std::sqrt(double(H));
  auto& lay = this->layout_;
  net_.emb = lay.add("embedding.weight", {V, E}, Init::Normal, 1.0, true);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int64_t in = l == 0 ? E : H;
    LstmLayout::LayerParams x{};
    x.w_ih = lay.add(fmt::format("lstm.weight_ih_l{}", l), {4 * H, in}, Init::Uniform, bound, true);
    x.w_hh = lay.add(fmt::format("lstm.weight_hh_l{}", l), {4 * H, H}, Init::Uniform, bound, true);
    x.b_ih = lay.add(fmt::format("lstm.bias_ih_l{}", l), {4 * H}, Init::Uniform, bound, false);
    x.b_hh = lay.add(fmt::format("lstm.bias_hh_l{}", l), {4 * H}, Init::Uniform, bound, false);
    net_.layers.push_back(x);
  }
  net_.head_w = lay.add("head.weight", {V, H}, Init::Uniform, bound, true);
  net_.head_b = lay.add("head.bias", {V}, Init::Uniform, bound, false);
  this->allocate();
  init_params(lay, this->params.data(), seed);
}

template <class T, class Ops>
template <class Alloc>
void LstmCore<T, Ops>::carve(Alloc& a, int B, int T_, bool train) {
  const LstmConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, E = cfg.input_size(), H = cfg.hidden_size, V = cfg.vocab_size;
  auto get = [&](size_t n) { return take<T>(a, n); };
  acts_.tokens_tm = take<int32_t>(a, N);
  acts_.labels_tm = train ? take<int32_t>(a, N) : nullptr;
  acts_.x = get(N * E);
  acts_.layers.resize(cfg.num_layers);
  for (auto& l : acts_.layers) {
    l.h = get(N * H); l.c = get(N * H); l.gates = get(N * 4 * H);
  }
  acts_.logits_tm = get(N * V);
  head_.logits = get(N * V);
  head_.loss = get(1);
}

template <class T, class Ops>
template <class Alloc>
void LstmCore<T, Ops>::carve_grads(Alloc& a, int B, int T_) {
  const LstmConfig& cfg = net_.cfg;
  const size_t N = size_t(B) * T_, width = std::max(cfg.input_size(), cfg.hidden_size);
  auto get = [&](size_t n) { return take<T>(a, n); };
  g_.dlogits = get(N * cfg.vocab_size);
  g_.dh = get(N * width);   // d loss / d (output of the current layer)
  g_.dx = get(N * width);   // d loss / d (its input)
  g_.work = get(ops::lstm_backward_work_size(ops::LstmDims{T_, B, int(width), cfg.hidden_size}));
}

template <class T, class Ops>
double LstmCore<T, Ops>::forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_) {
  this->begin_forward(tokens, labels, B, T_);
  const LstmConfig& cfg = net_.cfg;
  const int N = B * T_, E = cfg.input_size(), H = cfg.hidden_size, V = cfg.vocab_size;
  const bool train = labels != nullptr;
  // [B,T] -> time-major [T,B].
  Ops::lstm_time_major_ids(acts_.tokens_tm, tokens, B, T_);
  if (train) Ops::lstm_time_major_ids(acts_.labels_tm, labels, B, T_);
  Ops::embedding_forward(acts_.x, acts_.tokens_tm, P + net_.emb, N, E, V);
  const T* in = acts_.x;
  int in_size = E;
  for (size_t l = 0; l < net_.layers.size(); ++l) {
    auto& a = acts_.layers[l];
    auto& w = net_.layers[l];
    Ops::lstm_forward(a.h, a.c, a.gates, in, P + w.w_ih, P + w.w_hh, P + w.b_ih, P + w.b_hh,
                      ops::LstmDims{T_, B, in_size, H});
    in = a.h;
    in_size = H;
  }
  Ops::linear_forward(acts_.logits_tm, in, P + net_.head_w, P + net_.head_b, N, H, V);
  Ops::lstm_batch_major(head_.logits, acts_.logits_tm, B, T_, V);
  if (!train) return 0.0;
  return Ops::cross_entropy_loss(head_.loss, acts_.logits_tm, acts_.labels_tm, N, V);
}

template <class T, class Ops>
void LstmCore<T, Ops>::backward(const T* P, T* G) {
  this->begin_backward();
  const LstmConfig& cfg = net_.cfg;
  const int B = Bc_, T_ = Tc_, N = B * T_, E = cfg.input_size(), H = cfg.hidden_size, V = cfg.vocab_size;
  T* dh = g_.dh;
  T* dx = g_.dx;

  Ops::cross_entropy_backward(g_.dlogits, acts_.logits_tm, acts_.labels_tm, N, V, this->loss_weight());
  const T* top = acts_.layers.back().h;
  // dh [N, H] is overwritten whole by the head's backward (accumulate = false): no zeroing.
  Ops::linear_backward(dh, G + net_.head_w, G + net_.head_b, g_.dlogits, top, P + net_.head_w, N, H, V, false);
  for (int l = int(net_.layers.size()) - 1; l >= 0; --l) {
    auto& a = acts_.layers[l];
    auto& w = net_.layers[l];
    const int in_size = l == 0 ? E : H;
    const T* in = l == 0 ? acts_.x : acts_.layers[l - 1].h;
    Ops::zero(dx, size_t(N) * in_size);
    Ops::lstm_backward(dx, G + w.w_ih, G + w.w_hh, G + w.b_ih, G + w.b_hh, dh, in, P + w.w_ih, P + w.w_hh,
                       a.h, a.c, a.gates, ops::LstmDims{T_, B, in_size, H}, g_.work);
    std::swap(dh, dx);
  }
  Ops::embedding_backward(G + net_.emb, dh, acts_.tokens_tm, N, E, V);
}

template <class T>
nlohmann::json Lstm<T>::hf_config() const {
  // There is no HF class for this: the keys are the PyTorch constructor arguments of the
  // three modules (see lstm.h), so the state_dict loads into that module.
  return {{"model_type", "lstm"},
          {"architectures", {"LSTMLM"}},
          {"vocab_size", net_.cfg.vocab_size},
          {"embedding_dim", net_.cfg.input_size()},
          {"hidden_size", net_.cfg.hidden_size},
          {"num_layers", net_.cfg.num_layers},
          {"bias", true},
          {"batch_first", false},
          {"dropout", 0.0},
          {"bidirectional", false},
          {"proj_size", 0},
          {"modules",
           {{"embedding", "torch.nn.Embedding(vocab_size, embedding_dim)"},
            {"lstm", "torch.nn.LSTM(embedding_dim, hidden_size, num_layers)"},
            {"head", "torch.nn.Linear(hidden_size, vocab_size)"}}}};
}

template class Lstm<float>;
template class Lstm<double>;
LRNN_INSTANTIATE_CORE(LstmCore)

}  // namespace lrnn
