// The completions API of `lrnn serve`: what an OpenAI-style client asks a language-model run and
// what it gets back, without the HTTP around it (serve/http.h carries it over the network), so it
// can be tested in-process. It answers what lm-evaluation-harness's `local-completions` model
// sends, unmodified:
//
//   POST /v1/completions  {prompt: text | [text] | [ids] | [[ids]], max_tokens (16), temperature (1),
//                          top_p (1), top_k (0 or -1: all), seed (0), stop (text | [text]), echo (false),
//                          logprobs (null | k <= 100), n (1), model (ignored)}
//     -> {id, object: "text_completion", created, model, choices: [{index, text, finish_reason,
//         logprobs: {tokens, token_logprobs, top_logprobs} | null}], usage}
//   GET  /v1/models       -> {object: "list", data: [{id, object: "model", owned_by, max_model_len}]}
//   GET  /tokenizer_info  -> {eos_token, bos_token, pad_token, unk_token, vocab_size, model_max_length}
//   POST /tokenize        {prompt | text, add_special_tokens (false)} -> {tokens, count, max_model_len}
//   POST /detokenize      {tokens} -> {prompt}
//
// A prompt is read after the document-start token (BOS, or EOS where the tokenizer has no BOS: what
// the training data put before every document) unless the prompt already starts with it or the
// service runs without (ServiceOptions::doc_start): the model then conditions every token of the
// prompt, the first included, as in training; that token is never echoed. The log-probability of
// the first prompt token is null when nothing precedes it (OpenAI's convention), and echo with
// max_tokens 1 returns the prompt's tokens and one generated token — lm-eval scores
// `token_logprobs[ctxlen:-1]` and calls a continuation greedy when each of its log-probabilities
// equals the largest of its `top_logprobs` (the same numbers, so an exact comparison holds). A
// generation that ends at EOS keeps EOS out of the text but lists it in the log-probabilities, so
// that slice always has the generated token to drop. Token strings are SentencePiece pieces with
// the word-boundary mark (U+2581) shown as a space; no text_offset is given.
//
// Log-probabilities are log-softmax of the model's fp32 logits in double, the numbers `lrnn eval`
// averages. Requests are served one at a time (the model's buffers are shared); reading a prompt
// takes memory for `chunk` tokens at a time, and the linear RNNs keep only their recurrent state
// between chunks.
#pragma once
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "models/model.h"

namespace lrnn::serve {

// A request the client got wrong: the HTTP status (400, 404, 413, ...), the message and the
// request field it is about, for OpenAI's error body.
struct RequestError : std::runtime_error {
  int status;
  std::string param;
  RequestError(int status_, const std::string& msg, std::string param_ = "")
      : std::runtime_error(msg), status(status_), param(std::move(param_)) {}
};

// The OpenAI error body {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(const std::string& message, int status, const std::string& param = "");

struct ServiceOptions {
  std::string model_name = "lrnn";  // what /v1/models lists and responses name
  bool doc_start = true;            // read the document-start token before each prompt
  int chunk = 512;                  // prompt tokens per forward
  int64_t max_model_len = 0;        // reported to clients (the training context; 0: none)
  int64_t max_prompt_tokens = int64_t(1) << 20;
  int max_tokens = 1 << 16;         // the largest max_tokens a request may ask for
  int max_logprobs = 100;
};

class CompletionService {
 public:
  // The model read on the host, or through `reader` (e.g. on a GPU; it must outlive the service).
  CompletionService(Model<float>& model, data::Tokenizer tok, ServiceOptions opt);
  CompletionService(PieceReader& reader, data::Tokenizer tok, ServiceOptions opt);

  // Each throws RequestError for a bad request.
  nlohmann::json completions(const nlohmann::json& request);
  nlohmann::json models() const;
  nlohmann::json tokenizer_info() const;
  nlohmann::json tokenize(const nlohmann::json& request) const;
  nlohmann::json detokenize(const nlohmann::json& request) const;

  // Token ids of a text, where the tokenizer's special pieces written out ("<s>", "</s>") are
  // their ids, as Hugging Face tokenizers read them (lm-eval asks for the id of its EOS string so).
  std::vector<int32_t> encode(const std::string& text) const;
  // The token as the API shows it: its piece, U+2581 as a space.
  std::string token_text(int32_t id) const;
  const data::Tokenizer& tokenizer() const { return tok_; }
  int32_t document_start() const;  // BOS, or EOS without BOS

 private:
  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;  // as given, or the ids decoded
  };
  std::vector<Prompt> prompts(const nlohmann::json& p) const;
  nlohmann::json complete_one(const Prompt& p, const GenerateOptions& gen, bool echo, int logprobs, int index);

  data::Tokenizer tok_;
  ServiceOptions opt_;
  Decoder dec_;
  std::mutex mu_;  // one request reads the model at a time
  uint64_t next_id_ = 0;
};

}  // namespace lrnn::serve
