// What every language model in lrnn offers the training loop, evaluation, inference and export.
// Parameters and gradients live in one flat buffer each, laid out by `layout` with the public
// checkpoint's names.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>
#include "core/memory.h"
#include "core/params.h"
#include <fmt/format.h>
#include "models/hf/hf_files.h"

namespace lrnn {

// What a model carries from one forward to the next when it reads a sequence piece by piece
// (generation, scoring a long text in constant memory): the recurrent state of every layer and
// the short convolutions' last inputs for the linear RNNs, fixed in size whatever the length;
// the keys and values of every token so far (the KV cache) for the Transformer.
class DecodeState {
 public:
  virtual ~DecodeState() = default;
  virtual size_t bytes() const = 0;  // memory held now
  int64_t position = 0;              // tokens read so far
};

template <class T>
class Model {
 public:
  virtual ~Model() = default;

  // tokens, labels [B,T] row-major; labels < 0 are ignored; labels may be null (no loss).
  // Returns the mean cross-entropy over counted labels (0 without labels). Keeps what the
  // backward needs until the next forward.
  virtual double forward(const int32_t* tokens, const int32_t* labels, int B, int T_) = 0;
  // Accumulates d(loss)/d(params) into `grads` for the last forward (which must have had labels).
  virtual void backward() = 0;
  virtual const T* logits() const = 0;  // [B,T,V] of the last forward (see set_dense_labels)
  // Every label of a training batch counts (language modelling): a model may then take the loss of
  // a large vocabulary in chunks of rows, never holding all B·T·V logits (logits() after a
  // training forward is then not the whole batch's; forwards without labels are unaffected).
  virtual void set_dense_labels(bool) {}
  // Bytes of activations (and, with train, of activation gradients) a forward on a [B,T] batch
  // allocates, computed without allocating; for the memory check before a run. Call it between
  // steps only (it may reset the model's buffer pointers).
  virtual size_t activation_bytes(int B, int T_, bool train) { return 0; }
  virtual int vocab_size() const = 0;
  // Piecewise reading (models/model.h DecodeState): a fresh state for B sequences before their
  // first token, or null when this model cannot continue a forward (the caller then says so).
  virtual std::unique_ptr<DecodeState> new_decode_state(int B) { return nullptr; }
  // The forward of tokens [B,T] that continue the sequences `st` has read; logits() then holds
  // their [B,T,V] logits and `st` the state after them. The logits equal those of one forward over
  // the whole sequences (to rounding). No labels, nothing kept for a backward.
  virtual void forward_continue(const int32_t* tokens, int B, int T_, DecodeState& st);
  // The public implementation's config (fla / HF `config.json`).
  virtual nlohmann::json hf_config() const = 0;
  // Further files the run directory needs beside config.json (file name -> contents): the code of
  // a custom architecture where no peer class computes this model (HF's convention: config.json's
  // `auto_map` names "module.Class", loaded with trust_remote_code=True). By default the files of
  // src/models/hf/ that hf_config()'s auto_map names; empty for models a peer library loads.
  virtual std::vector<std::pair<std::string, std::string>> hf_files() const { return hf::files_for(hf_config()); }
  // The model block as lrnn resolved it (written into the run's config.yaml).
  virtual YAML::Node resolved_config() const = 0;

  const ParamLayout& layout() const { return layout_; }
  std::vector<T> params, grads;

 protected:
  // Parameters and gradients, after checking they fit the machine (core/memory.h): a model
  // whose sizes ask for more is refused before anything is allocated.
  void allocate() {
    check_memory(2 * layout_.total() * sizeof(T),
                 fmt::format("model: {} parameters (model.hidden_size, num_hidden_layers, vocab_size, "
                             "intermediate_size, ...; weights and gradients)", layout_.total()));
    params.assign(layout_.total(), T(0));
    grads.assign(layout_.total(), T(0));
  }
  ParamLayout layout_;
};

template <class T>
void Model<T>::forward_continue(const int32_t*, int, int, DecodeState&) {
  throw std::logic_error("forward_continue: this model has no decode state (new_decode_state returned null)");
}

// Builds the model named by `model.model_type` from the YAML model block (validated; errors
// name `where` and the key). `seed` initialises the parameters.
template <class T>
std::unique_ptr<Model<T>> create_model(const YAML::Node& block, const std::string& where, uint64_t seed);

// The model block parsed, validated and resolved (every key written out, defaults filled in) as
// create_model would build it, without building it: no memory for the parameters (a 1.3B-parameter
// config validates in microseconds).
YAML::Node resolve_model_block(const YAML::Node& block, const std::string& where);

// Names of the model types `create_model` knows.
std::vector<std::string> model_types();

}  // namespace lrnn
