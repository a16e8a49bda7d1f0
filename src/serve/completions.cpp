#include "serve/completions.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <fmt/format.h>
#include "core/check.h"

namespace lrnn::serve {

using nlohmann::json;

json error_body(const std::string& message, int status, const std::string& param) {
  const char* type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
                     {"code", nullptr}}}};
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw RequestError(400, msg, param); }

// Optional fields of a request, typed and ranged; `null` counts as absent.
const json* field(const json& r, const char* k) {
  auto it = r.find(k);
  return it == r.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json& r, const char* k, int64_t dflt, int64_t lo, int64_t hi) {
  const json* v = field(r, k);
  if (!v) return dflt;
  if (!v->is_number_integer()) bad(k, fmt::format("'{}' must be an integer", k));
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, x));
  return x;
}

double get_number(const json& r, const char* k, double dflt, double lo, double hi) {
  const json* v = field(r, k);
  if (!v) return dflt;
  if (!v->is_number()) bad(k, fmt::format("'{}' must be a number", k));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, x));
  return x;
}

bool get_bool(const json& r, const char* k, bool dflt) {
  const json* v = field(r, k);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(k, fmt::format("'{}' must be true or false", k));
  return v->get<bool>();
}

// Fields lrnn does not implement are refused unless they ask for what it does anyway.
void refuse_unsupported(const json& r) {
  if (get_int(r, "n", 1, 1, INT64_MAX) != 1) bad("n", "'n' must be 1 (one completion per prompt)");
  if (get_int(r, "best_of", 1, 1, INT64_MAX) != 1) bad("best_of", "'best_of' must be 1");
  if (get_bool(r, "stream", false)) bad("stream", "'stream' is not supported: ask without it");
  if (const json* s = field(r, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad("suffix", "'suffix' is not supported");
  for (const char* k : {"presence_penalty", "frequency_penalty", "repetition_penalty"})
    if (const json* v = field(r, k); v && !(v->is_number() && v->get<double>() == (k[0] == 'r' ? 1.0 : 0.0)))
      bad(k, fmt::format("'{}' is not supported", k));
  if (const json* v = field(r, "logit_bias"); v && !(v->is_object() && v->empty()))
    bad("logit_bias", "'logit_bias' is not supported");
}

json top_json(const CompletionService& s, const std::vector<std::pair<int32_t, double>>& top) {
  json o = json::object();
  for (const auto& [id, lp] : top) {
    const std::string t = s.token_text(id);
    if (!o.contains(t)) o[t] = lp;  // (pieces are distinct; a crafted model's duplicate keeps the likelier)
  }
  return o;
}

}  // namespace

CompletionService::CompletionService(Model<float>& model, data::Tokenizer tok, ServiceOptions opt)
    : tok_(std::move(tok)), opt_(std::move(opt)), dec_(model, opt_.chunk) {
  LRNN_CHECK(tok_.vocab_size() <= dec_.vocab_size(), "tokenizer larger than the model's vocabulary");
}

CompletionService::CompletionService(PieceReader& reader, data::Tokenizer tok, ServiceOptions opt)
    : tok_(std::move(tok)), opt_(std::move(opt)), dec_(reader, opt_.chunk) {
  LRNN_CHECK(tok_.vocab_size() <= dec_.vocab_size(), "tokenizer larger than the model's vocabulary");
}

int32_t CompletionService::document_start() const { return tok_.bos_id() >= 0 ? tok_.bos_id() : tok_.eos_id(); }

std::string CompletionService::token_text(int32_t id) const {
  const std::string p = tok_.piece(id);
  std::string out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, 3, "\xE2\x96\x81") == 0) {  // U+2581, SentencePiece's word boundary
      out += ' ';
      i += 3;
    } else {
      out += p[i++];
    }
  }
  return out;
}

std::vector<int32_t> CompletionService::encode(const std::string& text) const {
  if (size_t bad_at = data::find_invalid_utf8(text); bad_at != std::string::npos)
    throw RequestError(400, fmt::format("the text is not valid UTF-8 at byte {}", bad_at), "prompt");
  std::vector<std::pair<std::string, int32_t>> specials;
  for (int id : {tok_.bos_id(), tok_.eos_id()})
    if (id >= 0 && tok_.is_control(id)) specials.push_back({tok_.piece(id), id});
  std::vector<int32_t> out;
  size_t from = 0;
  while (from <= text.size()) {
    size_t at = std::string::npos;
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : specials) {
      size_t p = s.first.empty() ? std::string::npos : text.find(s.first, from);
      if (p < at || (p == at && hit && s.first.size() > hit->first.size())) at = p, hit = &s;
    }
    const std::string_view piece(text.data() + from, (at == std::string::npos ? text.size() : at) - from);
    if (!piece.empty()) tok_.encode_into(piece, out);
    if (!hit) break;
    out.push_back(hit->second);
    from = at + hit->first.size();
  }
  return out;
}

std::vector<CompletionService::Prompt> CompletionService::prompts(const json& p) const {
  std::vector<Prompt> out;
  auto ids_of = [&](const json& a) {
    Prompt q;
    for (const auto& x : a) {
      if (!x.is_number_integer()) bad("prompt", "a token prompt is a list of integer token ids");
      const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : x.get<int64_t>();
      if (id < 0 || id >= tok_.vocab_size())
        bad("prompt", fmt::format("token id {} is outside the vocabulary [0, {})", id, tok_.vocab_size()));
      q.ids.push_back(int32_t(id));
    }
    q.text = tok_.decode(q.ids);
    return q;
  };
  auto text_of = [&](const json& s) { return Prompt{encode(s.get<std::string>()), s.get<std::string>()}; };
  if (p.is_string()) {
    out.push_back(text_of(p));
  } else if (p.is_array() && !p.empty()) {
    if (p[0].is_number_integer()) {
      out.push_back(ids_of(p));
    } else {
      for (const auto& e : p) {
        if (e.is_string()) out.push_back(text_of(e));
        else if (e.is_array()) out.push_back(ids_of(e));
        else bad("prompt", "'prompt' is a text, a list of texts, a list of token ids or a list of such lists");
      }
    }
  } else {
    bad("prompt", "'prompt' is required: a text, a list of texts, a list of token ids or a list of such lists");
  }
  for (const auto& q : out) {
    if (q.ids.empty() && !opt_.doc_start)
      bad("prompt", "an empty prompt: the model needs at least one token to start from");
    if (int64_t(q.ids.size()) > opt_.max_prompt_tokens)
      throw RequestError(413, fmt::format("a prompt of {} tokens; at most {} are read", q.ids.size(),
                                          opt_.max_prompt_tokens), "prompt");
  }
  return out;
}

json CompletionService::completions(const json& r) {
  if (!r.is_object()) bad("", "the request body must be a JSON object");
  refuse_unsupported(r);
  GenerateOptions gen;
  gen.max_tokens = int(get_int(r, "max_tokens", 16, 0, opt_.max_tokens));
  gen.sampling.temperature = get_number(r, "temperature", 1.0, 0.0, 100.0);
  gen.sampling.top_p = get_number(r, "top_p", 1.0, 0.0, 1.0);
  if (gen.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  const int64_t top_k = get_int(r, "top_k", 0, -1, INT32_MAX);
  gen.sampling.top_k = top_k < 0 ? 0 : int(top_k);
  gen.sampling.seed = uint64_t(get_int(r, "seed", 0, INT64_MIN, INT64_MAX));
  if (const json* s = field(r, "stop")) {
    if (s->is_string()) gen.stop.push_back(s->get<std::string>());
    else if (s->is_array()) {
      for (const auto& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' is a text or a list of texts");
        gen.stop.push_back(x.get<std::string>());
      }
    } else bad("stop", "'stop' is a text or a list of texts");
  }
  const bool echo = get_bool(r, "echo", false);
  const int logprobs = field(r, "logprobs") ? int(get_int(r, "logprobs", 0, 0, opt_.max_logprobs)) : -1;
  gen.top_logprobs = std::max(logprobs, 0);
  const json* prompt = field(r, "prompt");
  std::vector<Prompt> ps = prompts(prompt ? *prompt : json());

  std::lock_guard<std::mutex> lock(mu_);
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    json c = complete_one(ps[i], gen, echo, logprobs, int(i));
    prompt_tokens += int64_t(ps[i].ids.size());
    completion_tokens += c["_generated"].get<int64_t>();
    c.erase("_generated");
    choices.push_back(std::move(c));
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {{"id", fmt::format("cmpl-{}", next_id_++)},
          {"object", "text_completion"},
          {"created", std::chrono::duration_cast<std::chrono::seconds>(now).count()},
          {"model", opt_.model_name},
          {"choices", choices},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json CompletionService::complete_one(const Prompt& p, const GenerateOptions& gen, bool echo, int logprobs, int index) {
  const int V = dec_.vocab_size();
  const int32_t ds = document_start();
  const bool lead = opt_.doc_start && (p.ids.empty() || p.ids[0] != ds);
  std::vector<int32_t> read;
  if (lead) read.push_back(ds);
  read.insert(read.end(), p.ids.begin(), p.ids.end());

  // Echo: the log-probability of every prompt token under what precedes it (null for a first
  // token that nothing precedes).
  json tokens = json::array(), token_lp = json::array(), top = json::array();
  const bool scored = echo && logprobs >= 0;
  if (scored && !lead && !p.ids.empty()) {
    tokens.push_back(token_text(p.ids[0]));
    token_lp.push_back(nullptr);
    top.push_back(nullptr);
  }
  dec_.reset();
  const float* logits = dec_.feed(read, [&](size_t i, const float* row) {
    if (!scored || i + 1 >= read.size()) return;
    const int32_t next = read[i + 1];
    const double lse = log_sum_exp(row, V);
    tokens.push_back(token_text(next));
    token_lp.push_back(double(row[next]) - lse);
    top.push_back(top_json(*this, top_logprobs(row, V, lse, logprobs)));
  });
  Generation g = generate_after(dec_, tok_, read.back(), logits, gen);
  auto add = [&](const GeneratedToken& t) {
    tokens.push_back(token_text(t.token));
    token_lp.push_back(t.logprob);
    top.push_back(top_json(*this, t.top));
  };
  if (logprobs >= 0) {
    for (const auto& t : g.tokens) add(t);
    if (g.eos) add(*g.eos);
  }
  json c = {{"index", index},
            {"text", echo ? p.text + g.text : g.text},
            {"finish_reason", g.finish_reason},
            {"logprobs", logprobs >= 0 ? json{{"tokens", tokens}, {"token_logprobs", token_lp}, {"top_logprobs", top}}
                                       : json(nullptr)},
            {"_generated", int64_t(g.tokens.size() + (g.eos ? 1 : 0))}};
  return c;
}

json CompletionService::models() const {
  json m = {{"id", opt_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "lrnn"}};
  if (opt_.max_model_len > 0) m["max_model_len"] = opt_.max_model_len;
  return {{"object", "list"}, {"data", json::array({m})}};
}

json CompletionService::tokenizer_info() const {
  auto piece_or_null = [&](int id) { return id >= 0 ? json(tok_.piece(id)) : json(nullptr); };
  json j = {{"eos_token", piece_or_null(tok_.eos_id())}, {"bos_token", piece_or_null(tok_.bos_id())},
            {"pad_token", piece_or_null(tok_.pad_id())}, {"unk_token", piece_or_null(tok_.unk_id())},
            {"vocab_size", tok_.vocab_size()},           {"tokenizer_class", "SentencePiece"}};
  if (opt_.max_model_len > 0) j["model_max_length"] = opt_.max_model_len;
  return j;
}

json CompletionService::tokenize(const json& r) const {
  if (!r.is_object()) bad("", "the request body must be a JSON object");
  const json* t = field(r, "prompt");
  if (!t) t = field(r, "text");
  if (!t || !t->is_string()) bad("prompt", "'prompt' (the text to tokenize) is required");
  std::vector<int32_t> ids;
  if (get_bool(r, "add_special_tokens", false) && tok_.bos_id() >= 0) ids.push_back(tok_.bos_id());
  std::vector<int32_t> rest = encode(t->get<std::string>());
  ids.insert(ids.end(), rest.begin(), rest.end());
  json j = {{"tokens", ids}, {"count", ids.size()}};
  if (opt_.max_model_len > 0) j["max_model_len"] = opt_.max_model_len;
  return j;
}

json CompletionService::detokenize(const json& r) const {
  if (!r.is_object()) bad("", "the request body must be a JSON object");
  const json* t = field(r, "tokens");
  if (!t || !t->is_array()) bad("tokens", "'tokens' (a list of token ids) is required");
  std::vector<int32_t> ids;
  for (const auto& x : *t) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok_.vocab_size())
      bad("tokens", fmt::format("'tokens' holds {}: not a token id in [0, {})", x.dump(), tok_.vocab_size()));
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  return {{"prompt", tok_.decode(ids)}};
}

}  // namespace lrnn::serve
