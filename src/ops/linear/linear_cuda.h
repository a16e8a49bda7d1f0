// CUDA linear layer through cuBLAS (TF32 tensor cores or fp32, cuda::set_gemm_precision): the
// contract of linear.h — out[N,OC] = inp[N,IC] W[OC,IC]^T + bias; backward accumulates into
// dinp, dW, dbias (each may be null).
#pragma once
namespace lrnn::ops::cuda {
void linear_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC);
void linear_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC);
}  // namespace lrnn::ops::cuda
