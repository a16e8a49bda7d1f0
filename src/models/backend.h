// The ops a model's forward and backward call, per backend. A model's network code is written
// once against `Ops::name(...)` and instantiated with CpuOps<T> (the reference ops, float or
// double) or CudaOps (the CUDA ops, float, device memory, all launched on one stream). Each
// backend also names its activation arena.
#pragma once
#include <limits>
#include <utility>
#include "core/arena.h"
#include "ops/attention/attention.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/forget_gate/forget_gate.h"
#include "ops/geglu/geglu.h"
#include "ops/gated_rmsnorm/gated_rmsnorm.h"
#include "ops/headwise_linear/headwise_linear.h"
#include "ops/l2norm/l2norm.h"
#include "ops/layernorm/layernorm.h"
#include "ops/linear/linear.h"
#include "ops/mlstm_cell/mlstm_cell.h"
#include "ops/lstm_cell/lstm_cell.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/rope/rope.h"
#include "ops/selective_scan/selective_scan.h"
#include "ops/short_conv/short_conv.h"
#include "ops/skip_gate/skip_gate.h"
#include "ops/slstm_cell/slstm_cell.h"
#include "ops/swiglu/swiglu.h"
#ifdef LRNN_WITH_CUDA
#include "cuda/arena.h"
#include "ops/attention/attention_cuda.h"
#include "ops/cross_entropy/cross_entropy_cuda.h"
#include "ops/delta_rule/delta_rule_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/embedding/embedding_cuda.h"
#include "ops/forget_gate/forget_gate_cuda.h"
#include "ops/geglu/geglu_cuda.h"
#include "ops/gated_rmsnorm/gated_rmsnorm_cuda.h"
#include "ops/headwise_linear/headwise_linear_cuda.h"
#include "ops/l2norm/l2norm_cuda.h"
#include "ops/layernorm/layernorm_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/mlstm_cell/mlstm_cell_cuda.h"
#include "ops/lstm_cell/lstm_cell_cuda.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/rope/rope_cuda.h"
#include "ops/selective_scan/selective_scan_cuda.h"
#include "ops/short_conv/short_conv_cuda.h"
#include "ops/skip_gate/skip_gate_cuda.h"
#include "ops/slstm_cell/slstm_cell_cuda.h"
#include "ops/swiglu/swiglu_cuda.h"
#endif

namespace lrnn {

// The ops with the same contract on both backends.
#define LRNN_MODEL_OPS(X)                                                                            \
  X(embedding_forward) X(embedding_backward) X(rmsnorm_forward) X(rmsnorm_backward) X(linear_forward)  \
  X(linear_forward_residual) X(linear_backward) X(short_conv_forward) X(short_conv_l2norm_forward)     \
  X(short_conv_backward) X(short_conv_advance_tail) X(l2norm_forward) X(l2norm_backward)               \
  X(forget_gate_forward) X(forget_gate_backward) X(gated_rmsnorm_forward) X(gated_rmsnorm_backward)    \
  X(delta_rule_forward) X(delta_rule_backward) X(swiglu_forward) X(swiglu_backward)                    \
  X(cross_entropy_backward) X(add_inplace) X(add_scaled) X(zero)
// ... and those Mamba adds (row-major strided GEMM, selective scan).
#define LRNN_MAMBA_OPS(X) X(gemm) X(selective_scan_forward) X(selective_scan_backward)
// ... and those the xLSTMs add (LayerNorm, block-diagonal linear, GELU gate, the two cells).
#define LRNN_XLSTM_OPS(X)                                                                       \
  X(layernorm_forward) X(layernorm_backward) X(headwise_linear_forward) X(headwise_linear_backward) \
  X(geglu_forward) X(geglu_backward) X(skip_gate_forward) X(skip_gate_backward) X(slstm_forward)    \
  X(slstm_backward) X(mlstm_forward) X(mlstm_backward)
// ... and those of the baselines: the LSTM layer and its layout changes (LSTM), rotary embeddings
// and causal softmax attention (Llama).
#define LRNN_BASELINE_OPS(X)                                                                        \
  X(lstm_forward) X(lstm_backward) X(lstm_time_major_ids) X(lstm_batch_major) X(rope_forward)       \
  X(rope_backward) X(attention_forward) X(attention_backward)

// ... and those only the CUDA backend has (mixed precision: bf16 storage; the bf16 GEMMs,
// SwiGLU and RMSNorm output are overloads of the names above).
#define LRNN_CUDA_ONLY_OPS(X) X(to_bf16) X(cross_entropy_loss_backward)

template <class T>
struct CpuOps {
  static constexpr bool kDevice = false;
  using Arena = lrnn::Arena;
  // The CPU computes every tensor in T.
  static constexpr bool bf16_gemms() { return false; }
  // Side-stream overlap (see CudaOps): on the CPU the work simply runs in order.
  template <class F>
  static int side(F&& f) {
    f();
    return 0;
  }
  static void wait(int) {}
  static void join() {}
#define LRNN_CPU_OP(name) \
  template <class... A>   \
  static decltype(auto) name(A&&... a) { return ops::name<T>(std::forward<A>(a)...); }
  LRNN_MODEL_OPS(LRNN_CPU_OP)
  LRNN_MAMBA_OPS(LRNN_CPU_OP)
  LRNN_XLSTM_OPS(LRNN_CPU_OP)
  LRNN_BASELINE_OPS(LRNN_CPU_OP)
#undef LRNN_CPU_OP
  // The delta rule's checkpoint buffer for the training forward: both CPU algorithms fill the
  // recurrent layout (ops::delta_rule_ckpt_size also covers the GPU's chunked one, which the CPU
  // never runs).
  static size_t delta_rule_ckpt_size(const ops::DeltaRuleDims& d, bool) { return ops::delta_rule_recurrent_ckpt_size(d); }
  // Mean loss over counted labels, returned to the host (and kept in *loss).
  static double cross_entropy_loss(T* loss, const T* logits, const int32_t* labels, int N, int V) {
    double l = ops::cross_entropy_forward<T>(nullptr, logits, labels, N, V);
    *loss = T(l);
    return l;
  }
};

#ifdef LRNN_WITH_CUDA
struct CudaOps {
  static constexpr bool kDevice = true;
  using Arena = cuda::DeviceArena;
#define LRNN_CUDA_OP(name) \
  template <class... A>    \
  static decltype(auto) name(A&&... a) {             \
    cuda::OpTimer timer(#name);                       \
    return ops::cuda::name(std::forward<A>(a)...);    \
  }
  LRNN_MODEL_OPS(LRNN_CUDA_OP)
  LRNN_MAMBA_OPS(LRNN_CUDA_OP)
  LRNN_XLSTM_OPS(LRNN_CUDA_OP)
  LRNN_BASELINE_OPS(LRNN_CUDA_OP)
  LRNN_CUDA_ONLY_OPS(LRNN_CUDA_OP)
#undef LRNN_CUDA_OP
  // Whether the models that support it run their projections in bf16 (cuda::GemmPrecision::BF16).
  static bool bf16_gemms() { return cuda::gemm_precision() == cuda::GemmPrecision::BF16; }
  // The delta rule's checkpoint buffer: the layout of the kernels these dims take.
  static size_t delta_rule_ckpt_size(const ops::DeltaRuleDims& d, bool gated) {
    return ops::cuda::delta_rule_ckpt_size(d, gated);
  }
  // Runs f's ops on the side stream (after everything queued so far) and returns a ticket that
  // wait() turns into a dependency of the main stream; join() waits for all side work. The
  // caller keeps what f reads unchanged until it waits (cuda::fork in cuda/runtime.h).
  template <class F>
  static int side(F&& f) {
    cuda::fork();
    struct Back {  // back to the main stream should f throw
      bool done = false;
      ~Back() {
        if (!done) cuda::unfork();
      }
    } back;
    f();
    back.done = true;
    return cuda::unfork();
  }
  static void wait(int ticket) { cuda::wait(ticket); }
  static void join() { cuda::join(); }
  // The mean loss stays on the device in *loss; nothing comes back to the host (returns NaN).
  static double cross_entropy_loss(float* loss, const float* logits, const int32_t* labels, int N, int V) {
    cuda::OpTimer timer("cross_entropy_loss");
    ops::cuda::cross_entropy_loss(loss, nullptr, logits, labels, N, V);
    return std::numeric_limits<double>::quiet_NaN();
  }
};
#endif

}  // namespace lrnn
