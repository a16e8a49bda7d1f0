// Reading and continuing text with a trained language model, one piece at a time: the model's
// decode state (models/model.h DecodeState) carries everything between pieces, so a linear RNN
// reads and writes any number of tokens in constant memory (the Transformer keeps its KV cache).
// `lrnn generate` and `lrnn serve` are built on these.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include "data/tokenizer.h"
#include "models/model.h"
#include "train/evaluate.h"

namespace lrnn {

// How the next token is drawn from the model's distribution.
struct SamplingOptions {
  double temperature = 1.0;  // logits / temperature; 0 = greedy (the most likely token)
  int top_k = 0;             // only the k most likely tokens (0: all)
  double top_p = 1.0;        // only the most likely tokens whose probabilities sum to top_p (nucleus)
  uint64_t seed = 0;
};

// log softmax of a row of V logits, in double.
void log_softmax(const float* logits, int V, std::vector<double>& out);
// log sum exp of a row of V logits, in double: token i's log-probability is logits[i] minus it,
// bit for bit what log_softmax gives, without writing the row (what a generated token needs).
double log_sum_exp(const float* logits, int V);
// The k most likely tokens of a row of logits with their log-probabilities (logits[i] - lse, lse
// from log_sum_exp), most likely first (ties: the lower id first).
std::vector<std::pair<int32_t, double>> top_logprobs(const float* logits, int V, double lse, int k);
// The token drawn at position `index` of a generation: a pure function of (logits, options,
// index), so the same seed gives the same text on every machine whose logits agree.
int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, uint64_t index);

// Where piecewise reading runs: a model on the CPU's reference ops (host_reader) or its twin on a
// CUDA device (device_reader, CUDA builds: the weights uploaded once, the decode state in device
// memory, a generated token's forward replayed as one CUDA graph). Tokens and logits are in host
// memory either way.
class PieceReader {
 public:
  virtual ~PieceReader() = default;
  // A fresh decode state for B sequences before their first token; null when the model cannot
  // read piecewise here.
  virtual std::unique_ptr<DecodeState> new_state(int B) = 0;
  // The forward of tokens [B,T] that continue the sequences `st` has read: their logits [B,T,V],
  // valid until the next call.
  virtual const float* read(const int32_t* tokens, int B, int T_, DecodeState& st) = 0;
  virtual int vocab_size() const = 0;
  virtual std::string model_type() const = 0;  // for messages
  virtual std::string describe() const = 0;    // "cpu", "cuda: <device>, CUDA graphs"
  // Device memory this reader's process took since just before the reader was made (weights,
  // activations, states, library workspaces); 0 on the host.
  virtual size_t device_bytes() const { return 0; }
};

// The host model itself (it must outlive the reader).
std::unique_ptr<PieceReader> host_reader(Model<float>& model);
#ifdef LRNN_WITH_CUDA
// A device twin of `host` with its current parameters (infer/reader_cuda.cpp). UserError when no
// CUDA device is available or the model type has no CUDA path. The MLPs run with fp32 weights
// (TF32 GEMMs): a token's forward reads each weight once, where converting them to bf16 on every
// forward would add traffic instead of saving it.
std::unique_ptr<PieceReader> device_reader(const Model<float>& host, const std::string& model_type);
#endif

// Feeds tokens to a model through its decode state, `chunk` tokens per forward at most (so a
// long prompt takes memory for one chunk's activations, not for the whole prompt).
class Decoder {
 public:
  // UserError when the model cannot read piecewise (its type has no decode state there).
  explicit Decoder(PieceReader& reader, int chunk = 512);
  explicit Decoder(Model<float>& model, int chunk = 512);  // on the host model
  // Reads `tokens` after everything read so far. each(i, logits) is called for every token in
  // order with its [V] logits (the distribution of the token after it). Returns the logits after
  // the last token (valid until the next call). tokens must not be empty.
  const float* feed(std::span<const int32_t> tokens,
                    const std::function<void(size_t, const float*)>& each = {});
  void reset();                  // back to the empty sequence
  int64_t position() const;      // tokens read so far
  size_t state_bytes() const;    // memory the decode state holds
  int vocab_size() const { return reader_.vocab_size(); }

 private:
  void start();
  std::unique_ptr<PieceReader> own_;  // the host reader of Decoder(Model&)
  PieceReader& reader_;
  int chunk_;
  std::unique_ptr<DecodeState> state_;
  std::vector<float> last_;
};

// Per-token next-token losses of evaluation batches read `chunk` tokens at a time through the
// model's decode state (train/evaluate.h TokenLossFn): memory for one chunk's activations and
// logits, whatever the window length (length extrapolation to many times the training context).
// The same numbers as one forward over each window, to rounding.
// The reader must outlive the function.
TokenLossFn token_losses_piecewise(PieceReader& reader, int chunk);

// Generation: `prompt` is read, then up to max_tokens tokens are drawn and fed back. The text is
// handed over as it becomes final (whole UTF-8 characters; with stop strings, text that could
// still start one is held back); generation ends at EOS (not part of the text), at max_tokens,
// at the first stop string (not part of the text), or when on_text returns false.
struct GenerateOptions {
  int max_tokens = 256;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  bool stop_at_eos = true;
  int top_logprobs = 0;  // also keep the k most likely tokens at each generated position
};

struct GeneratedToken {
  int32_t token;
  double logprob;  // under the model's distribution (before temperature, top-k, top-p)
  std::vector<std::pair<int32_t, double>> top;  // GenerateOptions::top_logprobs most likely, else empty
};

struct Generation {
  std::vector<GeneratedToken> tokens;
  std::string text;            // what on_text was given, together
  std::string finish_reason;   // "length", "stop" (EOS or a stop string) or "cancelled"
  std::optional<GeneratedToken> eos;  // the EOS token drawn, when that ended the generation
};

Generation generate(Decoder& dec, const data::Tokenizer& tok, std::span<const int32_t> prompt,
                    const GenerateOptions& opt, const std::function<bool(const std::string&)>& on_text = {});
// The same after the prompt has been fed (e.g. with a callback that scores it): `logits` are the
// decoder's after the prompt's last token `last`.
Generation generate_after(Decoder& dec, const data::Tokenizer& tok, int32_t last, const float* logits,
                          const GenerateOptions& opt, const std::function<bool(const std::string&)>& on_text = {});

}  // namespace lrnn
