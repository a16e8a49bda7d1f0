// AdamW (decoupled weight decay, torch.optim.AdamW semantics) over the flat parameter buffer,
// global-norm gradient clipping, and the finite check that lets a step be skipped.
#pragma once
#include <cstddef>
#include <cmath>
#include <cstdint>
#include "core/hd.h"

namespace lrnn::ops {

struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based step for bias correction
};

// The per-element constants of one AdamW step.
template <class T>
struct AdamWConsts {
  T b1, b2, eps, step_size, inv_sqrt_bc2, decay;
};
template <class T>
AdamWConsts<T> adamw_consts(const AdamWParams& p);

// One element of the update, the same arithmetic on every backend: returns the new (p, m, v).
template <class T>
struct AdamWElement {
  T p, m, v;
};
template <class T>
LRNN_HD AdamWElement<T> adamw_element(T p, T g, T m, T v, bool decay, const AdamWConsts<T>& c) {
  if (decay) p *= c.decay;
  m = c.b1 * m + (T(1) - c.b1) * g;
  v = c.b2 * v + (T(1) - c.b2) * g * g;
  using std::sqrt;
  p -= c.step_size * m / (sqrt(v) * c.inv_sqrt_bc2 + c.eps);
  return {p, m, v};
}

// Updates params[N] in place with grads[N]; m, v are the moment buffers.
// decay_mask[i] != 0 where weight decay applies (null: everywhere).
template <class T>
void adamw_update(T* params, const T* grads, T* m, T* v, const uint8_t* decay_mask, size_t N,
                  const AdamWParams& p);
// True when adamw_update with the same arguments would leave every parameter and moment finite.
// A step that fails it is skipped (counted, nothing written): one bad update (a corrupt moment, a
// hyperparameter at its edge) must not turn the model into NaNs.
template <class T>
bool adamw_update_is_finite(const T* params, const T* grads, const T* m, const T* v, const uint8_t* decay_mask,
                            size_t N, const AdamWParams& p);

// Global L2 norm of grads[N] (accumulated in double); NaN/Inf propagate into the result.
template <class T>
double global_norm(const T* grads, size_t N);

// torch.nn.utils.clip_grad_norm_: grads *= min(1, max_norm / (norm + 1e-6)). Returns the factor.
template <class T>
double clip_by_global_norm(T* grads, size_t N, double norm, double max_norm);

}  // namespace lrnn::ops
