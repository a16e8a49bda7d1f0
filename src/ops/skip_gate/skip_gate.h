// The output gate of the xlstm package's mLSTMLayer: out = (h + skip * x) * SiLU(z), per channel
// c < I of N rows, with a learnable per-channel skip weight [I].
// h, out [N,I] packed; x rows ldx apart (0: I) and z rows ldz apart (0: I), e.g. slices of wider
// buffers (the conv output or the xm half of proj_up; the z half of proj_up).
// Backward accumulates: dh += dout SiLU(z); dx += dout SiLU(z) skip; dskip += sum_n dout SiLU(z) x;
//                       dz += dout (h + skip x) SiLU'(z)    (dx, dz share the strides of x, z).
#pragma once

namespace lrnn::ops {
template <class T>
void skip_gate_forward(T* out, const T* h, const T* x, const T* skip, const T* z, int N, int I, int ldx = 0,
                       int ldz = 0);
template <class T>
void skip_gate_backward(T* dh, T* dx, T* dskip, T* dz, const T* dout, const T* h, const T* x, const T* skip,
                        const T* z, int N, int I, int ldx = 0, int ldz = 0);
}  // namespace lrnn::ops
