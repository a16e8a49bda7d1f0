// CUDA cross-entropy with ignore index (labels < 0), the contract of cross_entropy.h except
// that the mean loss stays on the device (no host synchronisation inside a training step):
//   loss[0] = mean over counted labels of (logsumexp(logits_n) - logits_n[label_n])  (0 if none)
//   losses[n] (optional, may be null) = that row's loss (0 for ignored rows)
// Backward overwrites dlogits (like the CPU version): dloss / count * (softmax - onehot), rows
// with ignored labels get 0. It counts the labels itself (in cuda::scratch).
#pragma once
#include <cstdint>
#include "core/dtype.h"
namespace lrnn::ops::cuda {
void cross_entropy_loss(float* loss, float* losses, const float* logits, const int32_t* labels, int N, int V);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss);
// The same with dlogits stored in bf16 (rounded to nearest even): the input of the head's bf16
// GEMMs under mixed precision.
void cross_entropy_backward(bf16* dlogits, const float* logits, const int32_t* labels, int N, int V, double dloss);
// Both at once, for a training step whose backward follows: loss[0] as cross_entropy_loss and
// dlogits as cross_entropy_backward (up to the logsumexp's order of summation), with each long
// row (V >= 2048) read from memory once instead of three times.
void cross_entropy_loss_backward(float* loss, float* dlogits, const float* logits, const int32_t* labels, int N, int V,
                                 double dloss);
void cross_entropy_loss_backward(float* loss, bf16* dlogits, const float* logits, const int32_t* labels, int N, int V,
                                 double dloss);
}  // namespace lrnn::ops::cuda
