// Rotary position embedding, HF Llama convention (`rotate_half`): for head dim D (even),
// half = D/2, inv_freq[i] = theta^(-2i/D), angle a(t, i) = (t + offset) * inv_freq[i] at position t = 0..T-1,
//   out[i]        = x[i] cos a(t,i) - x[i+half] sin a(t,i)        (i < half)
//   out[i + half] = x[i+half] cos a(t,i) + x[i] sin a(t,i)
// i.e. out = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1).
// Layout: x, out [B,T,H,D]; token strides ldx, ldo (0: H*D), so q and k can be read straight out
// of a fused q|k|v projection. The angles are computed in double, then rounded to T.
// Backward accumulates dx += R(t)^T dout (the inverse rotation); dx shares ldx.
#pragma once

namespace lrnn::ops {

struct RopeDims {
  int B = 0, T = 0, H = 0, D = 0;
  double theta = 10000.0;
  int ldx = 0, ldo = 0;
  int offset = 0;  // position of the first token (a piece of a longer sequence: angles (t + offset) inv_freq)
  int lx() const { return ldx ? ldx : H * D; }
  int lo() const { return ldo ? ldo : H * D; }
};

template <class T>
void rope_forward(T* out, const T* x, const RopeDims& d);
template <class T>
void rope_backward(T* dx, const T* dout, const RopeDims& d);

}  // namespace lrnn::ops
