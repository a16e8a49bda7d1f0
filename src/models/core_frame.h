// The frame the models' network cores share. Each model's network is written once, as a core
// over a backend's ops (models/backend.h: CpuOps<T> or CudaOps): DeltaLMCore, MambaCore,
// XLSTMCore, LlamaCore, LstmCore. What they have in common lives here:
//
// - CoreFrame: the two arenas (activations, sized per (batch, length) and carved anew by every
//   forward; gradient buffers, kept between steps), each sized by a first carve pass into an
//   ArenaPlan and handed out by a second over the arena (the core's carve(a, B, T, train) and
//   carve_grads(a, B, T), taking every buffer with take()); the batch of the last forward, which
//   backward() reads again; the language-model head.
// - LmHead: the end of the network, h_out -> final norm -> lm_head -> logits -> mean
//   cross-entropy, and its backward into the residual stream's gradient.
// - CoreModel: a Model<T> whose forward and backward are its core's on the CPU.
//
// A core's forward is begin_forward(), the embedding, its blocks, head_.forward(); its backward
// begin_backward(), head_.backward(), its blocks in reverse, the embedding's backward.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>
#include "core/arena.h"
#include "core/check.h"
#include "core/dtype.h"
#include "io/schema.h"
#include "models/backend.h"
#include "models/model.h"

namespace lrnn {

// One buffer of n elements of a carve pass: counted into an ArenaPlan (nullptr), or taken from
// the arena.
template <class E, class Alloc>
E* take(Alloc& a, size_t n) {
  if constexpr (std::is_same_v<Alloc, ArenaPlan>) {
    a.template add<E>(n);
    return nullptr;
  } else {
    return a.template alloc<E>(n);
  }
}

// The most logits a language model's training step holds at once (elements; process-wide, one
// value for the CPU and one for devices; tests lower them; the environment variable
// LRNN_LM_HEAD_ELEMENTS sets both start values): above it the head works in chunks of rows
// (LmHead), which costs a second head GEMM (the logits again in the backward) and small GEMMs.
// CPU: 2^24 (64 MiB of fp32). Devices: 2^29 (2 GiB of fp32 logits, with bf16 dlogits 3 GiB):
// the 340M LM's batch of 8 x 2048 tokens at V 32000 (2^29.0 logits) fits whole. Measured on an
// H200 (2026-11-29, `lrnn train --device cuda`, hidden 1024, 4 and 24 layers, bf16): whole
// against chunks of 524 rows (the cap of 2^24), 462k -> 557k tokens/s at 4 layers (peak memory
// 14.3 -> 17.3 GB), 115k -> 120k at 24 layers (61.8 -> 64.7 GB).
inline size_t& lm_head_chunk_elements(bool device = false) {
  static const long long env = [] {
    const char* e = std::getenv("LRNN_LM_HEAD_ELEMENTS");
    return e ? std::atoll(e) : 0LL;
  }();
  static size_t cap[2] = {env > 0 ? size_t(env) : size_t(1) << 24, env > 0 ? size_t(env) : size_t(1) << 29};
  return cap[device ? 1 : 0];
}

// The head on the last residual stream hout [N, C]: xf = norm(hout), logits = lm_head(xf)
// [N, V] (no bias), and the mean cross-entropy over the counted labels. The final norm is an
// RMSNorm (fla, HF), or with layer_norm the xlstm package's LayerNorm (no bias, its weight an
// offset from 1).
//
// Large vocabularies: when every label counts (`dense`, language modelling) and a training
// batch's N·V logits exceed lm_head_chunk_elements(), the head never holds them all. The forward
// takes the loss chunk by chunk of R rows (R·V logits at a time, the chunk's mean loss weighted by
// its share of the rows), keeping only xf; the backward computes each chunk's logits again (one
// more GEMM of the head's size) for its dlogits, dx rows and the weight gradient. The result is
// the unchunked one up to the order of the sums. logits() then holds the last chunk's only.
//
// Mixed precision (`mixed`, a device core under cuda::GemmPrecision::BF16; RMSNorm only): the
// head's GEMMs take bf16 inputs with fp32 accumulation, as under the papers' bf16 autocast: xf is
// stored in bf16 (xfh), lm_head's weight is copied to bf16 (wh) at each forward, and the backward
// writes dlogits in bf16 (dlh) for the two gradient GEMMs. Logits, loss, the norm's statistics
// and every gradient stay fp32.
template <class T, class Ops>
struct LmHead {
  T *hout = nullptr, *mu = nullptr, *rstd = nullptr, *xf = nullptr, *logits = nullptr, *loss = nullptr;
  bf16 *xfh = nullptr, *wh = nullptr, *dlh = nullptr;  // mixed precision: xf, lm_head, dlogits in bf16
  bool layer_norm = false;
  bool mixed = false;
  double dloss = 1.0;  // the weight of this forward's mean loss in what the backward differentiates
  bool dense = false;  // every label counts (language modelling): the head may work in chunks
  size_t chunk = 0;    // rows per chunk of the last carve's training step (0: all rows at once)
  bool dl_ready = false;  // the last forward also wrote dlogits (into dlh), for the backward to use

  // Rows of logits a step on N positions holds at once: from 256 rows on a multiple of 128, so
  // that the head's GEMMs (rows x C x V) end on whole tiles (at V 32000 the default cap gives
  // 524 rows: 512).
  size_t rows(size_t N, size_t V, bool train) const {
    const size_t cap = lm_head_chunk_elements(Ops::kDevice);
    if (!train || !dense || N * V <= cap) return N;
    size_t R = std::max<size_t>(1, cap / V);
    if (R >= 256) R -= R % 128;
    return std::min(N, R);
  }

  template <class Alloc>
  void carve(Alloc& a, size_t N, size_t C, size_t V, bool layer_norm_, bool train, bool mixed_ = false) {
    layer_norm = layer_norm_;
    mixed = Ops::kDevice && mixed_;
    LRNN_CHECK(!(mixed && layer_norm), "the bf16 LM head has no LayerNorm");
    const size_t R = rows(N, V, train);
    chunk = R < N ? R : 0;
    hout = take<T>(a, N * C);
    mu = layer_norm ? take<T>(a, N) : nullptr;
    rstd = take<T>(a, N);
    xf = mixed ? nullptr : take<T>(a, N * C);
    xfh = mixed ? take<bf16>(a, N * C) : nullptr;
    wh = mixed ? take<bf16>(a, V * C) : nullptr;
    dlh = mixed && train ? take<bf16>(a, R * V) : nullptr;
    logits = take<T>(a, R * V);
    loss = take<T>(a, chunk ? 2 : 1);  // (+ one chunk's mean)
  }

  // logits [n, V] of the normalised rows from r0 on.
  void head_rows(T* out, const T* P, size_t head, int r0, int n, int C, int V) {
    if constexpr (Ops::kDevice) {
      if (mixed) {
        Ops::linear_forward(out, xfh + size_t(r0) * C, wh, n, C, V);
        return;
      }
    }
    Ops::linear_forward(out, xf + size_t(r0) * C, P + head, static_cast<const T*>(nullptr), n, C, V);
  }

  // lm_head's gradients for rows r0.. r0 + n from their dlogits (dlogits, or dlh when mixed): the
  // input gradient into dx's rows (overwritten), the weight gradient added into G (on the side
  // stream with side_dW; the ticket returned, else -1).
  int head_grads(T* dx, T* G, const T* P, size_t head, const T* dlogits, int r0, int n, int C, int V,
                 bool side_dW) {
    T* const dxr = dx + size_t(r0) * C;
    if constexpr (Ops::kDevice) {
      if (mixed) {
        const bf16* x = xfh + size_t(r0) * C;
        T* const no_dx = nullptr;  // (a typed null picks the overload with fp32 input gradients)
        if (!side_dW) {
          Ops::linear_backward(dxr, G + head, dlh, x, wh, n, C, V, false);
          return -1;
        }
        Ops::linear_backward(dxr, nullptr, dlh, x, wh, n, C, V, false);
        return Ops::side([&] { Ops::linear_backward(no_dx, G + head, dlh, x, wh, n, C, V); });
      }
    }
    const T* x = xf + size_t(r0) * C;
    if (!side_dW) {
      Ops::linear_backward(dxr, G + head, static_cast<T*>(nullptr), dlogits, x, P + head, n, C, V, false);
      return -1;
    }
    Ops::linear_backward(dxr, nullptr, nullptr, dlogits, x, P + head, n, C, V, false);
    return Ops::side([&] { Ops::linear_backward(nullptr, G + head, nullptr, dlogits, x, nullptr, n, C, V); });
  }

  // dlogits of n rows from their logits (into dlh when mixed).
  void ce_backward(T* dlogits, const int32_t* labels, int n, int V, double scale) {
    if constexpr (Ops::kDevice) {
      if (mixed) {
        Ops::cross_entropy_backward(dlh, logits, labels, n, V, scale);
        return;
      }
    }
    Ops::cross_entropy_backward(dlogits, logits, labels, n, V, scale);
  }

  // norm, head: the offsets of the final norm's weight and of lm_head's in P. Returns the mean
  // loss on the CPU, NaN on a device (it stays in *loss); 0 without labels.
  double forward(const T* P, size_t norm, size_t head, const int32_t* labels, int N, int C, int V, double eps) {
    if (layer_norm) Ops::layernorm_forward(xf, mu, rstd, hout, P + norm, N, C, 1, eps, 1.0);
    else if (!mixed) Ops::rmsnorm_forward(xf, rstd, hout, P + norm, N, C, eps);
    if constexpr (Ops::kDevice) {
      if (mixed) {
        Ops::rmsnorm_forward(xfh, rstd, hout, P + norm, N, C, eps);
        Ops::to_bf16(wh, P + head, size_t(V) * C);
      }
    }
    dl_ready = false;
    if (!chunk || !labels) {
      head_rows(logits, P, head, 0, N, C, V);
      if (!labels) return 0.0;
      if constexpr (Ops::kDevice) {
        // A training step's (dlh is carved for training): the loss and dlogits in one pass over
        // the logits, at this forward's loss weight. (An evaluation through the training core
        // writes dlh for nothing: the same loss.)
        if (dlh) {
          Ops::cross_entropy_loss_backward(loss, dlh, logits, labels, N, V, dloss);
          dl_ready = true;
          return std::numeric_limits<double>::quiet_NaN();
        }
      }
      return Ops::cross_entropy_loss(loss, logits, labels, N, V);
    }
    Ops::zero(loss, 1);
    double total = 0;
    for (int r0 = 0; r0 < N; r0 += int(chunk)) {
      const int n = std::min(int(chunk), N - r0);
      head_rows(logits, P, head, r0, n, C, V);
      const double share = double(n) / double(N);
      total += share * Ops::cross_entropy_loss(loss + 1, logits, labels + r0, n, V);
      Ops::add_scaled(loss, loss + 1, T(share), size_t(1));
    }
    return total;
  }

  // The backward of the last forward (which had labels): dlogits, lm_head's gradients (input
  // gradient into dx), the final norm's (input gradient into dh); dx and dh are overwritten, the
  // weight gradients accumulate into G. With side_dW, lm_head's weight gradient runs as side work
  // (Ops::side), which the caller joins before its backward returns; its ticket is returned (-1
  // without side_dW). dlogits (R rows of V) is unused when mixed.
  int backward(const T* P, T* G, size_t norm, size_t head, const int32_t* labels, T* dlogits, T* dx, T* dh, int N,
                int C, int V, bool side_dW) {
    // Input gradients whose first writer covers the whole buffer are overwritten (accumulate =
    // false) rather than zeroed and accumulated into: the same result, without the memset.
    int ticket = -1;
    if (chunk) {  // the logits again, a chunk at a time (dlogits holds one chunk)
      for (int r0 = 0; r0 < N; r0 += int(chunk)) {
        const int n = std::min(int(chunk), N - r0);
        head_rows(logits, P, head, r0, n, C, V);
        ce_backward(dlogits, labels + r0, n, V, dloss * double(n) / double(N));
        head_grads(dx, G, P, head, dlogits, r0, n, C, V, /*side_dW=*/false);
      }
    } else {
      if (!dl_ready) ce_backward(dlogits, labels, N, V, dloss);
      ticket = head_grads(dx, G, P, head, dlogits, 0, N, C, V, side_dW);
    }
    if (layer_norm) {  // (the LayerNorm's backward accumulates)
      Ops::zero(dh, size_t(N) * C);
      Ops::layernorm_backward(dh, G + norm, dx, hout, P + norm, mu, rstd, N, C, 1, 1.0);
    } else {
      Ops::rmsnorm_backward(dh, G + norm, dx, hout, P + norm, rstd, N, C, /*accumulate=*/false);
    }
    return ticket;
  }
};

// The decode state of a core (Model::new_decode_state): named host buffers, one per layer and
// kind (a conv tail, a recurrent state, a cache), each for B sequences.
template <class T>
struct CoreDecodeState : DecodeState {
  int B = 0;
  std::vector<std::vector<T>> buffers;
  size_t bytes() const override {
    size_t n = 0;
    for (const auto& b : buffers) n += b.capacity() * sizeof(T);
    return n;
  }
};

// The base of a core (CRTP: Core derives from CoreFrame<Core, T, Ops> and befriends it, which
// calls its carve and carve_grads). Every core offers, over flat parameter (P) and gradient (G)
// buffers in its backend's memory:
//   double forward(const T* P, const int32_t* tokens, const int32_t* labels, int B, int T_);
//     tokens, labels [B,T] in the backend's memory (labels may be null: no loss), read again by
//     backward(), so they must stay valid until then. Returns the mean loss on the CPU; on a
//     device it stays in loss() and NaN is returned.
//   void backward(const T* P, T* G);
//     accumulates the gradients of the last forward (which had labels) into G.
template <class Core, class T, class Ops>
class CoreFrame {
 public:
  // Sizes both arenas for a (B, T) step without running it (so later steps of at most that size
  // allocate nothing: what a captured CUDA graph needs).
  void reserve(int B, int T_, bool train) {
    ArenaPlan plan;
    core().carve(plan, B, T_, train);
    arena_.reserve(plan.bytes);
    if (train) {
      ArenaPlan gp;
      core().carve_grads(gp, B, T_);
      grad_arena_.reserve(gp.bytes);
    }
  }
  // Bytes both arenas need for a (B, T) step, without allocating (the memory check before a run).
  // A carve pass resets the buffer pointers: call it between steps, as reserve().
  size_t planned_bytes(int B, int T_, bool train) {
    ArenaPlan plan;
    core().carve(plan, B, T_, train);
    if (train) core().carve_grads(plan, B, T_);
    return plan.bytes;
  }
  const T* logits() const { return head_.logits; }  // [B,T,V] of the last forward
  const T* loss() const { return head_.loss; }      // its mean loss (where it had labels)
  // The backward differentiates w * (mean loss): w = 1 / A for each of A accumulated micro-batches.
  // Set before the forward (a device's training forward may form the loss's gradient already).
  void set_loss_weight(double w) { head_.dloss = w; }
  // Every label of a training batch counts (language modelling): the head may take the loss in
  // chunks of rows (LmHead) when the logits would be large.
  void set_dense_labels(bool d) { head_.dense = d; }
  // Rows of dlogits a training step on N positions needs (the cores' carve_grads).
  size_t logit_rows(size_t N, size_t V) const { return head_.rows(N, V, true); }
  double loss_weight() const { return head_.dloss; }
  // Changes whenever an arena moved (pointers captured before, e.g. in a CUDA graph, are stale).
  int generation() const { return arena_.generation() + grad_arena_.generation(); }
  // The forward (no labels) of a piece of the sequences `st` has read (Model::forward_continue;
  // CPU): the core's forward reads and advances the state through carried(i) while it runs.
  void forward_continue(const T* P, const int32_t* tokens, int B, int T_, DecodeState& st) {
    auto& s = dynamic_cast<CoreDecodeState<T>&>(st);
    LRNN_CHECK(s.B == B, "forward_continue: a state for {} sequences given {}", s.B, B);
    std::vector<T*> bufs;
    for (auto& b : s.buffers) bufs.push_back(b.empty() ? nullptr : b.data());
    carry_ = &s;
    forward_carried(P, tokens, B, T_, std::move(bufs));
    s.position += T_;
  }
  // The same over state buffers in the backend's memory (one per layer and kind, as the core's
  // new_state lays them out; null: empty): what the device model's piecewise reading runs.
  void forward_carried(const T* P, const int32_t* tokens, int B, int T_, std::vector<T*> bufs) {
    carried_ = std::move(bufs);
    struct Reset {
      CoreFrame& f;
      ~Reset() {
        f.carry_ = nullptr;
        f.carried_.clear();
      }
    } reset{*this};
    core().forward(P, tokens, nullptr, B, T_);
  }

 protected:
  // A forward's first step: carves the activations for (B, T_) (with what the backward needs when
  // there are labels) and keeps the batch, which must stay valid until backward().
  void begin_forward(const int32_t* tokens, const int32_t* labels, int B, int T_) {
    LRNN_CHECK(B > 0 && T_ > 0, "empty batch {}x{}", B, T_);
    const bool train = labels != nullptr;
    ArenaPlan plan;
    core().carve(plan, B, T_, train);
    arena_.reserve(plan.bytes);
    arena_.reset();
    core().carve(arena_, B, T_, train);
    Bc_ = B;
    Tc_ = T_;
    tokens_ = tokens;
    labels_ = labels;
    trained_ = train;
  }
  // A backward's first step: the gradient buffers for the last forward's batch (reused by every
  // layer, kept between steps: no page faults per step).
  void begin_backward() {
    LRNN_CHECK(trained_, "backward needs a forward with labels");
    ArenaPlan plan;
    core().carve_grads(plan, Bc_, Tc_);
    grad_arena_.reserve(plan.bytes);
    grad_arena_.reset();
    core().carve_grads(grad_arena_, Bc_, Tc_);
  }

  typename Ops::Arena arena_, grad_arena_;
  LmHead<T, Ops> head_{};
  const int32_t *tokens_ = nullptr, *labels_ = nullptr;
  int Bc_ = 0, Tc_ = 0;   // shape of the last forward
  bool trained_ = false;  // the last forward kept what backward needs
  // Buffer i of the decode state during a forward_continue (null otherwise, or when empty).
  T* carried(size_t i) const { return i < carried_.size() ? carried_[i] : nullptr; }
  CoreDecodeState<T>* carry_ = nullptr;  // the host state during a forward_continue (a KV cache grows in it)
  std::vector<T*> carried_;

 private:
  Core& core() { return static_cast<Core&>(*this); }
};

// A model computed by its core on the CPU reference ops, over its own flat parameter and
// gradient buffers. The model class fills net_ (its parameter layout and config) and adds its
// config.json; the device model (models/device_model_cuda.cpp) runs the same core on CudaOps.
template <class T, class Layout, template <class, class> class Core>
class CoreModel : public Model<T> {
 public:
  double forward(const int32_t* tokens, const int32_t* labels, int B, int T_) override {
    LRNN_CHECK(B > 0 && T_ > 0, "empty batch {}x{}", B, T_);
    // The core reads the batch again in backward(): a copy, so the caller's may go.
    const size_t N = size_t(B) * T_;
    tokens_.assign(tokens, tokens + N);
    if (labels) labels_.assign(labels, labels + N);
    return core_.forward(this->params.data(), tokens_.data(), labels ? labels_.data() : nullptr, B, T_);
  }
  void backward() override { core_.backward(this->params.data(), this->grads.data()); }
  // Piecewise reading where the core has it (new_state, forward_continue).
  std::unique_ptr<DecodeState> new_decode_state(int B) override {
    if constexpr (requires(CpuCore& c) { c.new_state(1); }) return core_.new_state(B);
    else return nullptr;
  }
  void forward_continue(const int32_t* tokens, int B, int T_, DecodeState& st) override {
    if constexpr (requires(CpuCore& c) { c.new_state(1); }) {
      LRNN_CHECK(B > 0 && T_ > 0, "empty batch {}x{}", B, T_);
      tokens_.assign(tokens, tokens + size_t(B) * T_);
      core_.forward_continue(this->params.data(), tokens_.data(), B, T_, st);
    } else {
      Model<T>::forward_continue(tokens, B, T_, st);
    }
  }
  const T* logits() const override { return core_.logits(); }
  void set_dense_labels(bool d) override { core_.set_dense_labels(d); }
  size_t activation_bytes(int B, int T_, bool train) override { return core_.planned_bytes(B, T_, train); }
  const Layout& net() const { return net_; }

 protected:
  Layout net_;

 private:
  using CpuCore = Core<T, CpuOps<T>>;
  CpuCore core_{net_};
  std::vector<int32_t> tokens_, labels_;
};

// The model block a config resolves to (every key, defaults filled in), for the run's config.yaml.
template <class Config>
YAML::Node resolved_block(Config c) {
  io::Schema s("", "model");
  c.describe(s);
  return s.dump();
}

}  // namespace lrnn

// The instantiations of a core (in its .cpp, where its carve functions are defined): on the CPU
// in float and double, and on CUDA where it is built; with the ArenaPlan passes of carve and
// carve_grads, which CoreFrame::reserve (instantiated wherever it is called) uses.
#define LRNN_INSTANTIATE_CORE_AS(Core, T, Ops)                                 \
  template class Core<T, Ops>;                                                  \
  template void Core<T, Ops>::carve<ArenaPlan>(ArenaPlan&, int, int, bool);     \
  template void Core<T, Ops>::carve_grads<ArenaPlan>(ArenaPlan&, int, int);
#ifdef LRNN_WITH_CUDA
#define LRNN_INSTANTIATE_CORE(Core)                     \
  LRNN_INSTANTIATE_CORE_AS(Core, float, CpuOps<float>)   \
  LRNN_INSTANTIATE_CORE_AS(Core, double, CpuOps<double>) \
  LRNN_INSTANTIATE_CORE_AS(Core, float, CudaOps)
#else
#define LRNN_INSTANTIATE_CORE(Core)                   \
  LRNN_INSTANTIATE_CORE_AS(Core, float, CpuOps<float>) \
  LRNN_INSTANTIATE_CORE_AS(Core, double, CpuOps<double>)
#endif
