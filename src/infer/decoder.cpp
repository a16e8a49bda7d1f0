#include "infer/decoder.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include <fmt/format.h>
#include "core/check.h"
#include "core/rng.h"

namespace lrnn {

namespace {

// out[i] = exp(x[i] - m) (x[i] <= m); returns their sum (in double, four partial sums). The
// exponentials are taken in float: the C library's exp in double was 12 ns a call, 0.4 ms per
// generated token at a vocabulary of 32,000 (cpu2c); in float, about half that.
double exp_shifted(const float* x, int V, float m, float* out) {
  for (int i = 0; i < V; ++i) out[i] = std::exp(x[i] - m);
  double s[4] = {0, 0, 0, 0};
  int i = 0;
  for (; i + 4 <= V; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += double(out[i + j]);
  for (; i < V; ++i) s[0] += double(out[i]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace

double log_sum_exp(const float* logits, int V) {
  float m = -INFINITY;
  for (int i = 0; i < V; ++i) m = std::max(m, logits[i]);
  thread_local std::vector<float> e;
  e.resize(size_t(V));
  return double(m) + std::log(exp_shifted(logits, V, m, e.data()));
}

void log_softmax(const float* logits, int V, std::vector<double>& out) {
  out.resize(size_t(V));
  const double lse = log_sum_exp(logits, V);
  for (int i = 0; i < V; ++i) out[size_t(i)] = double(logits[i]) - lse;
}

namespace {

// Token ids of a row of n scores (log-probabilities or logits: the same order), highest first,
// ties by id; only the first k sorted.
template <class T>
std::vector<int32_t> ranked(const T* score, size_t n, size_t k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, idx.size());
  auto better = [&](int32_t a, int32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(), better);
  idx.resize(k);
  return idx;
}

}  // namespace

std::vector<std::pair<int32_t, double>> top_logprobs(const float* logits, int V, double lse, int k) {
  std::vector<std::pair<int32_t, double>> out;
  if (k <= 0) return out;
  for (int32_t id : ranked(logits, size_t(V), size_t(k))) out.push_back({id, double(logits[id]) - lse});
  return out;
}

int32_t sample_token(const float* logits, int V, const SamplingOptions& o, uint64_t index) {
  LRNN_CHECK(V > 0, "sample_token: empty vocabulary");
  if (!(o.temperature > 0)) {  // greedy; the first of equal maxima
    return int32_t(std::max_element(logits, logits + V) - logits);
  }
  // The probabilities of softmax(logits / temperature).
  std::vector<float> scaled(logits, logits + V), e(static_cast<size_t>(V));
  for (float& x : scaled) x = float(double(x) / o.temperature);
  const float m = *std::max_element(scaled.begin(), scaled.end());
  const double sum = exp_shifted(scaled.data(), V, m, e.data());
  std::vector<double> p(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) p[size_t(i)] = double(e[size_t(i)]) / sum;
  // The candidates in order, most likely first (ties: the lower id first): the top_k most likely
  // (all when 0), then the shortest prefix of them whose probabilities reach top_p (at least one).
  // Without top_k the order comes from a heap, popped only as far as the walks below go (sorting
  // the whole vocabulary for every token was most of a draw's time at V = 32,000).
  auto better = [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b); };
  auto worse = [&](int32_t a, int32_t b) { return better(b, a); };
  std::vector<int32_t> heap, cand;
  if (o.top_k > 0) {
    cand = ranked(p.data(), p.size(), size_t(o.top_k));
  } else {
    heap.resize(size_t(V));
    std::iota(heap.begin(), heap.end(), 0);
    std::make_heap(heap.begin(), heap.end(), worse);
  }
  // The i-th candidate (i <= the number taken so far), or -1 past the last.
  auto candidate = [&](size_t i) -> int32_t {
    while (i >= cand.size() && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      cand.push_back(heap.back());
      heap.pop_back();
    }
    return i < cand.size() ? cand[i] : -1;
  };
  double total = 0;
  size_t n = 0;  // candidates kept (0: all of them, total summed over every token; with top_p at least 1)
  if (o.top_p < 1.0) {
    for (int32_t c; (c = candidate(n)) >= 0;) {
      total += p[size_t(c)];
      ++n;
      if (total >= o.top_p) break;
    }
  } else if (o.top_k > 0) {
    n = cand.size();
    for (int32_t c : cand) total += p[size_t(c)];
  } else {
    for (double x : p) total += x;
  }
  // A uniform number in [0, 1) with 53 random bits, addressed by (seed, index).
  const U32x4 b = Rng{o.seed, 0x67656e}.block(index);
  const double u = (double(b.v[0] >> 5) * 67108864.0 + double(b.v[1] >> 6)) * (1.0 / 9007199254740992.0);
  double target = u * total, cum = 0;
  int32_t last = candidate(0);
  for (size_t i = 0; n == 0 || i < n; ++i) {
    const int32_t c = candidate(i);
    if (c < 0) break;
    last = c;
    cum += p[size_t(c)];
    if (target < cum) return c;
  }
  return last;
}

namespace {

class HostReader final : public PieceReader {
 public:
  explicit HostReader(Model<float>& m) : m_(m) {}
  std::unique_ptr<DecodeState> new_state(int B) override { return m_.new_decode_state(B); }
  const float* read(const int32_t* tokens, int B, int T_, DecodeState& st) override {
    m_.forward_continue(tokens, B, T_, st);
    return m_.logits();
  }
  int vocab_size() const override { return m_.vocab_size(); }
  std::string model_type() const override { return m_.hf_config().value("model_type", std::string("?")); }
  std::string describe() const override { return "cpu"; }

 private:
  Model<float>& m_;
};

}  // namespace

std::unique_ptr<PieceReader> host_reader(Model<float>& model) { return std::make_unique<HostReader>(model); }

Decoder::Decoder(PieceReader& reader, int chunk) : reader_(reader), chunk_(chunk) { start(); }

Decoder::Decoder(Model<float>& model, int chunk) : own_(host_reader(model)), reader_(*own_), chunk_(chunk) { start(); }

void Decoder::start() {
  LRNN_CHECK(chunk_ > 0, "Decoder: chunk must be positive");
  state_ = reader_.new_state(1);
  if (state_) return;
  if (reader_.describe() == "cpu")
    LRNN_USER_ERROR("model type {}: cannot read text piece by piece yet (no decode state), so it cannot generate or "
                    "serve", reader_.model_type());
  LRNN_USER_ERROR("model type {}: cannot read text piece by piece on the GPU yet (no decode state there); "
                  "--device cpu can", reader_.model_type());
}

const float* Decoder::feed(std::span<const int32_t> tokens, const std::function<void(size_t, const float*)>& each) {
  LRNN_CHECK(!tokens.empty(), "Decoder::feed: no tokens");
  const int V = reader_.vocab_size();
  for (int32_t t : tokens)
    if (t < 0 || t >= V) LRNN_USER_ERROR("token id {} is outside the model's vocabulary [0, {})", t, V);
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk_)) {
    const int n = int(std::min(tokens.size() - at, size_t(chunk_)));
    const float* lg = reader_.read(tokens.data() + at, 1, n, *state_);
    if (each)
      for (int i = 0; i < n; ++i) each(at + size_t(i), lg + size_t(i) * V);
    last_.assign(lg + size_t(n - 1) * V, lg + size_t(n) * V);
  }
  return last_.data();
}

void Decoder::reset() {
  state_ = reader_.new_state(1);
  last_.clear();
}

int64_t Decoder::position() const { return state_->position; }
size_t Decoder::state_bytes() const { return state_->bytes(); }

TokenLossFn token_losses_piecewise(PieceReader& reader, int chunk) {
  LRNN_CHECK(chunk > 0, "token_losses_piecewise: chunk must be positive");
  return [&reader, chunk](const Batch& b, int rows, std::vector<double>& loss) {
    const int V = reader.vocab_size(), T = b.T;
    loss.assign(size_t(rows) * size_t(T), 0.0);
    for (size_t i = 0; i < loss.size(); ++i)
      LRNN_CHECK(b.labels[i] >= 0 && b.labels[i] < V, "label {} outside the vocabulary {}", b.labels[i], V);
    auto st = reader.new_state(rows);
    LRNN_CHECK(st, "token_losses_piecewise: the model has no decode state");
    std::vector<int32_t> piece;
    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int n = std::min(chunk, T - t0);
      piece.resize(size_t(rows) * size_t(n));
      for (int r = 0; r < rows; ++r)
        std::copy_n(b.tokens.begin() + std::ptrdiff_t(size_t(r) * T + size_t(t0)), n, piece.begin() + std::ptrdiff_t(size_t(r) * n));
      const float* lg = reader.read(piece.data(), rows, n, *st);
#pragma omp parallel for collapse(2) schedule(static)
      for (int r = 0; r < rows; ++r)
        for (int t = 0; t < n; ++t) {
          const size_t i = size_t(r) * T + size_t(t0 + t);
          loss[i] = token_loss(lg + (size_t(r) * n + size_t(t)) * size_t(V), V, b.labels[i]);
        }
    }
  };
}

namespace {

// Bytes at the end of s that start a UTF-8 character not yet complete (0 when s ends whole).
size_t incomplete_utf8_tail(const std::string& s) {
  size_t n = s.size(), back = 0;
  while (back < n && back < 4 && (uint8_t(s[n - 1 - back]) & 0xC0) == 0x80) ++back;  // continuation bytes
  if (back == n) return 0;
  const uint8_t lead = uint8_t(s[n - 1 - back]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return back + 1 < need ? back + 1 : 0;
}

bool ends_with_replacement(const std::string& s) {  // U+FFFD: SentencePiece's mark for incomplete bytes
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

Generation generate(Decoder& dec, const data::Tokenizer& tok, std::span<const int32_t> prompt,
                    const GenerateOptions& opt, const std::function<bool(const std::string&)>& on_text) {
  if (prompt.empty()) LRNN_USER_ERROR("generate: the prompt has no tokens");
  const float* logits = dec.feed(prompt);
  return generate_after(dec, tok, prompt.back(), logits, opt, on_text);
}

Generation generate_after(Decoder& dec, const data::Tokenizer& tok, int32_t last, const float* logits,
                          const GenerateOptions& opt, const std::function<bool(const std::string&)>& on_text) {
  LRNN_CHECK(opt.max_tokens >= 0, "generate: max_tokens < 0");
  Generation g;
  g.finish_reason = "length";
  const int V = dec.vocab_size();
  // The prompt's last token, then the generated ones; the incremental detokenizer's window
  // [prefix, read) starts at that token, whose text is the prompt's (so the first generated
  // token's leading space survives).
  std::vector<int32_t> ids{last};
  size_t prefix = 0, read = 1;
  std::string text;           // generated text made final so far
  size_t emitted = 0;         // bytes of text handed to on_text
  size_t hold = 0;            // bytes a stop string could still need at the end
  for (const auto& s : opt.stop) hold = std::max(hold, s.empty() ? size_t(0) : s.size() - 1);
  bool cancelled = false, stop_string = false;
  auto emit = [&](size_t upto) {
    if (upto <= emitted) return;
    if (on_text && !on_text(text.substr(emitted, upto - emitted))) cancelled = true;
    g.text += text.substr(emitted, upto - emitted);
    emitted = upto;
  };
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t t = sample_token(logits, V, opt.sampling, uint64_t(i));
    const double lse = log_sum_exp(logits, V);
    GeneratedToken drawn{t, double(logits[t]) - lse, top_logprobs(logits, V, lse, opt.top_logprobs)};
    if (opt.stop_at_eos && t == tok.eos_id()) {
      g.finish_reason = "stop";
      g.eos = std::move(drawn);
      break;
    }
    g.tokens.push_back(std::move(drawn));
    ids.push_back(t);
    // SentencePiece drops the space that starts a text, so a token's text is the difference
    // between decoding a window with and without it; the window starts at the last token whose
    // text is final, and text ending inside a UTF-8 character waits for its next bytes.
    const std::span<const int32_t> all(ids);
    const std::string before = tok.decode(all.subspan(prefix, read - prefix));
    const std::string now = tok.decode(all.subspan(prefix));
    if (now.size() > before.size() && now.compare(0, before.size(), before) == 0 && !ends_with_replacement(now) &&
        incomplete_utf8_tail(now) == 0) {
      text += now.substr(before.size());
      prefix = read;
      read = ids.size();
    }
    // The first stop string in the text ends it there.
    size_t cut = std::string::npos;
    for (const auto& s : opt.stop) {
      if (s.empty()) continue;
      size_t p = text.find(s, emitted > s.size() ? emitted - s.size() : 0);
      if (p != std::string::npos) cut = std::min(cut, p);
    }
    if (cut != std::string::npos) {
      text.resize(cut);
      emit(cut);
      g.finish_reason = "stop";
      stop_string = true;
      break;
    }
    size_t safe = text.size() > hold ? text.size() - hold : 0;
    while (safe > emitted && safe < text.size() && (uint8_t(text[safe]) & 0xC0) == 0x80) --safe;  // whole characters
    emit(safe);
    if (cancelled) {
      g.finish_reason = "cancelled";
      break;
    }
    if (i + 1 < opt.max_tokens) logits = dec.feed(std::span<const int32_t>(&ids.back(), 1));
  }
  if (g.finish_reason != "cancelled") {
    // What the detokenizer still holds (an unfinished character at the very end) and any text
    // held back for stop strings.
    const std::span<const int32_t> all(ids);
    const std::string before = tok.decode(all.subspan(prefix, read - prefix));
    const std::string now = tok.decode(all.subspan(prefix));
    if (!stop_string && now.size() > before.size() && now.compare(0, before.size(), before) == 0)
      text += now.substr(before.size());
    emit(text.size());
    if (cancelled) g.finish_reason = "cancelled";
  }
  return g;
}

}  // namespace lrnn
