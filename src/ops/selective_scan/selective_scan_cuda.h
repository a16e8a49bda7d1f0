// CUDA Mamba-1 selective scan: the contract of selective_scan.h (device pointers, fp32 state and
// accumulators, the same layouts and token strides, both eigenvalue ranges), launched on
// cuda::stream(). Backward accumulates into every non-null gradient. The chunk-start states
// (ckpt) use the CPU layout [B][ceil(T/kScanChunk)][N][Di] (state index outer, channel inner),
// so either side's checkpoints serve the other. State sizes up to kScanCudaMaxN.
#pragma once
#include "ops/selective_scan/selective_scan.h"

namespace lrnn::ops::cuda {

constexpr int kScanCudaMaxN = 512;

void selective_scan_forward(float* y, const SelectiveScanInputs<float>& in, const SelectiveScanDims& d,
                            float* ckpt = nullptr, float* state = nullptr);
void selective_scan_backward(const SelectiveScanGrads<float>& grad, const float* dy,
                             const SelectiveScanInputs<float>& in, const SelectiveScanDims& d,
                             const float* ckpt = nullptr);

}  // namespace lrnn::ops::cuda
