#include "ops/adamw/adamw.h"
#include <cmath>
#include <vector>
#include <omp.h>

namespace lrnn::ops {

template <class T>
AdamWConsts<T> adamw_consts(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(p.beta1, double(p.step));
  const double bc2 = 1.0 - std::pow(p.beta2, double(p.step));
  return {T(p.beta1), T(p.beta2), T(p.eps), T(p.lr / bc1), T(1.0 / std::sqrt(bc2)), T(1.0 - p.lr * p.weight_decay)};
}

template <class T>
void adamw_update(T* params, const T* grads, T* m, T* v, const uint8_t* decay_mask, size_t N,
                  const AdamWParams& p) {
  const AdamWConsts<T> c = adamw_consts<T>(p);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; ++i) {
    auto e = adamw_element(params[i], grads[i], m[i], v[i], !decay_mask || decay_mask[i], c);
    params[i] = e.p;
    m[i] = e.m;
    v[i] = e.v;
  }
}

template <class T>
bool adamw_update_is_finite(const T* params, const T* grads, const T* m, const T* v, const uint8_t* decay_mask,
                            size_t N, const AdamWParams& p) {
  const AdamWConsts<T> c = adamw_consts<T>(p);
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t i = 0; i < N; ++i) {
    auto e = adamw_element(params[i], grads[i], m[i], v[i], !decay_mask || decay_mask[i], c);
    bad |= !(std::isfinite(e.p) && std::isfinite(e.m) && std::isfinite(e.v));
  }
  return !bad;
}

template <class T>
double global_norm(const T* grads, size_t N) {
  const int nt = omp_get_max_threads();
  std::vector<double> part(nt, 0.0);
#pragma omp parallel num_threads(nt)
  {
    double acc = 0;
#pragma omp for schedule(static)
    for (size_t i = 0; i < N; ++i) acc += double(grads[i]) * double(grads[i]);
    part[omp_get_thread_num()] = acc;
  }
  double s = 0;
  for (double x : part) s += x;  // fixed order: reproducible
  return std::sqrt(s);
}

template <class T>
double clip_by_global_norm(T* grads, size_t N, double norm, double max_norm) {
  double f = max_norm / (norm + 1e-6);
  if (f >= 1.0) return 1.0;
  const T ft = T(f);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; ++i) grads[i] *= ft;
  return f;
}

#define INST(T)                                                                                   \
  template AdamWConsts<T> adamw_consts<T>(const AdamWParams&);                                    \
  template void adamw_update<T>(T*, const T*, T*, T*, const uint8_t*, size_t, const AdamWParams&); \
  template bool adamw_update_is_finite<T>(const T*, const T*, const T*, const T*, const uint8_t*, size_t, \
                                          const AdamWParams&);                                    \
  template double global_norm<T>(const T*, size_t);                                               \
  template double clip_by_global_norm<T>(T*, size_t, double, double);
INST(float)
INST(double)
}  // namespace lrnn::ops
