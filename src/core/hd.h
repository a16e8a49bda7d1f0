// LRNN_HD: a function compiled for both the host and, under nvcc, the device (inlined), so one
// piece of arithmetic serves the CPU reference and the CUDA kernel alike.
#pragma once

#if defined(__CUDACC__)
#define LRNN_HD __host__ __device__ __forceinline__
#else
#define LRNN_HD inline
#endif
