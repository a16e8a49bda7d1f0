// The delta rule in chunked (WY) form on tensor cores: the contract of delta_rule_cuda.h for long
// sequences at language-model head sizes, where the recurrent kernels (delta_rule_cuda.cu) leave
// the tensor cores idle. The math is delta_rule_chunked_cpu.cpp's, chunk for chunk:
//
// The sub-steps of all tokens form one sequence of events e (token t, sub-step j = e mod n_h). A
// chunk holds Ct = 64 / n_h tokens, so at most 64 events (rows, zero-padded to 64). With G_i the
// cumulative log decay inside the chunk (the token's gate on its first sub-step), gamma_i =
// exp(G_i), and S0 the state at the chunk's start:
//   A_ij = (k_i . k_j) exp(G_i - G_j) (j < i),  M = I + diag(beta) A,  Tinv = M^-1
//   W = Tinv diag(beta gamma) K,  U = Tinv diag(beta) V,  U~ = U - W S0
//   o_r = scale (gamma_r S0^T q_r + sum_{j <= r} (q_r . k_j) exp(G_r - G_j) u~_j)  (reading events)
//   S_next = gamma_63 S0 + K^T diag(exp(G_63 - G)) U~
// Kernels (each a grid of thread blocks of 16 warps, prep of 8; every product a tensor-core MMA
// with fp32 accumulation on operands that stay fp32 in memory and are rounded as a warp loads
// them: TF32 16x16x8 tiles from nvcuda::wmma, or bf16 mma.m16n8k16 (Mma below); a warp computes
// a strip of up to 16 x 64 of the result at a time):
//   prep     one block per chunk: gathers K, Q (zero-padded, contiguous), beta, G; forms A, the
//            inverse Tinv (a forward substitution, one column per warp at a time, in fp32), W, U,
//            and P = (Q K^T) . exp(G_r - G_j) masked to j <= r (without the scale), which the
//            output, dstate and grad kernels read instead of forming it again
//   state    one block per (b, h, block of state columns), walking the chunks in order: stores
//            S0 (the checkpoint), U~ = U - W S0, S = gamma S + K^T diag(D) U~ (fp32 state in
//            shared memory; the next chunk's W, K, U and G are copied in by cp.async meanwhile;
//            with bf16 products and Dv a multiple of 32, state_s_kernel: ldmatrix products on
//            bf16 parts and remainders of the operands, in blocks of all Dv columns where blocks
//            of 64 would take more waves of the SMs)
//   output   one block per (chunk, column block): o = scale (diag(gamma) Q S0 + P U~) (with bf16
//            products, output_s_kernel: its operands staged once as bf16 tiles and fed to the MMAs
//            by ldmatrix, each warp's strips of o formed in registers and stored to o directly)
// Backward (prep's arrays are the forward's, kept in the checkpoint; without one, prep and state run
// again first):
//   dstate   one block per (b, h, column block), chunks in reverse: dU~ = diag(D) K dS + P^T dO,
//            dS0 = gamma dS + scale Q^T diag(gamma) dO - W^T dU~ (stores dS after each chunk, dU~;
//            each operand of the next chunk is copied in as soon as its buffer is free; with bf16
//            products and Dv a multiple of 32, dstate_s_kernel, as state_s_kernel, its wide
//            blocks keeping dS as three bf16 parts instead of fp32)
//   grad     one block per chunk, all of Dv: dq, dk, dv, dbeta, dg from S0, dS, U~, dU~ and the
//            transposed products of delta_rule_chunked_cpu.cpp (no atomics: deterministic); with
//            bf16 products and head dims that are multiples of 32, every operand staged once as a
//            bf16 tile and fed to the MMAs by ldmatrix (grad_s_kernel)
// With bf16 products, where all five kernels are the bf16-tile ones, the states and U~ (the
// checkpoint) and the backward's dS and dU~ go to memory as bf16: the values the readers rounded
// them to before, so the same products from half the bytes (Args::hs, hg; the gate's term
// gamma_63 sum(dS . S0) then sums those bf16 values too). Forward and backward must then run under
// one GEMM precision: the backward refuses a checkpoint written under another.
// In the fp32-tile kernels operands live in shared memory where it holds them (one block per SM),
// else are read from global memory (L2) by the MMA loads: the fp32-tile grad kernel stages U~ and
// then dU~ and reads S0 and dS (Dk x Dv each) from L2 by strips that share each fragment of them
// over 64 rows (mm_b), so that each is read about once per product. The bf16-tile kernels stage
// every operand once, converting it as it is staged.
//
// Error analysis. Tinv is exact arithmetic's M^-1, computed in fp32 by substitution; its entries
// are those of the chunk's products of transitions I - beta k k^T (norm <= 1 with unit keys and
// beta <= 2), so bounded, and beta up to 2 does not make them grow. Every matrix product rounds its
// inputs to TF32 (10-bit mantissa, relative error 2^-11) or bf16 (8 bits, 2^-9) and accumulates in
// fp32; the state, Tinv and all accumulators stay fp32, and G sums in double (as on the CPU). With
// GemmPrecision::FP32 every product runs as three TF32 products (the operands split into a TF32
// part and a TF32 remainder: fp32-level accuracy), which is what the tests use to compare against
// the CPU reference at fp32 tolerance.
//
// Long sequences at eigenvalues of modulus 1 (beta = 2: the state-tracking regime). An error that
// differs from chunk to chunk adds up like a random walk over the T/64 chunks, but one that every
// occurrence of a token repeats adds up over the tokens, and at |1 - beta |k|^2| = 1 nothing damps
// it. Rounding makes two such errors, and the kernels remove both:
//  - A rounded unit key k~ is a little longer or shorter than 1 (bf16: |k~|^2 off by up to 2^-8),
//    which moves the transition's eigenvalue along it, 1 - beta |k~|^2, off -1: the state along that
//    key grows or decays geometrically. So prep rounds the keys once (every kernel reads that k~,
//    so A = K~ K~^T and the transitions agree) and scales beta to beta~ = beta |k|^2 / |k~|^2,
//    which puts the eigenvalue back where the fp32 key has it. The backward differentiates through
//    beta~ with the ratio held fixed (its dependence on k is of the rounding's size).
//  - With W, S0 or U~ rounded where they carry the state (U~ = U - W S0, S = gamma S + K~^T
//    diag(D) U~), a chunk's transition is no longer the product of its tokens' transitions, the same
//    way for every chunk of the same tokens. So W's product and the state kernel run at a 16-bit
//    mantissa's accuracy (kCarry: three bf16 products on split operands; a numpy emulation of S5
//    through 10^4 tokens gave the same worst deviation as fp32 products, 0.031) whatever the
//    others' precision, and so do the two products of the dstate
//    kernel that carry dS back (K dS, W^T dU~); the products read by the outputs and the other
//    gradients keep the chosen precision.
// Measured on an H200 (2026-11-28) by the hand-set trackers of tests/cuda/test_delta_rule_cuda.cpp
// (10^4 tokens: parity, S3, Z5 as 5-cycles and S5 as words of reflections):
//  - forward: with bf16 products every read-out right, worst deviation 3.1e-2 (Z5 as 5-cycles; S5
//    3.0e-2), where the bf16 kernels without these two remedies lost S3 after 5,054 tokens; with
//    TF32 1.5e-2 (S5 7.4e-3);
//  - backward (the last read-out's value gradients through all 10^4 tokens): worst 2.3e-2 |q| with
//    bf16 products and 3.3e-3 with TF32; with dstate's two carrying products in the products' own
//    precision it was 0.17 (bf16) and 8.1e-2 (TF32);
//  - the carry as three bf16 products (Bf16x3) tracks as well as three TF32 products (Fp32), and
//    costs less: one TF32 MMA does half a bf16 MMA's work per instruction.
// A rotation made of two reflections whose directions are not representable (Z5 by 72 degrees)
// turns by its rounded angle at any input precision below fp32: that is the inputs' precision, and
// no kernel removes it. The cost, in one run on one H200 (B 8, T 2048, H 8, head dim 128, bf16
// products, forward + backward): no remedy (the day before, another H200) 3.07 ms; the remedies
// with the carry as Fp32 and dstate uncarried 3.52 ms (state kernel 0.58 ms, dstate 0.48 ms, from
// the call before); as here, 3.28 ms (state kernel 0.34 ms, dstate 0.53 ms). At B 8, T 4096,
// H 16: 13.73 -> 12.75 ms.
// The TF32 and bf16 errors against an fp64 reference are measured against those of the fp64
// recurrence run on q, k, v rounded the same way: (T 1024, head dim 128, beta in (0, 2), with and
// without a gate) 1.0-2.6x for TF32 and 1.2-1.9x for bf16, though the kernels also round U, Tinv,
// P, the outputs' states and every gradient that a product reads.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#include <algorithm>
#include <type_traits>
#include <unordered_map>
#include <vector>
#include "cuda/runtime.h"
#include "ops/delta_rule/delta_rule_cuda.h"

#define LRNN_CHUNKED_REQUIRE(cond)                                                                      \
  do {                                                                                                  \
    if (!(cond)) ::lrnn::cuda::fail(cudaErrorInvalidValue, "CUDA chunked delta rule: " #cond, __FILE__, __LINE__); \
  } while (0)

namespace lrnn::ops::cuda {
namespace {

namespace wmma = nvcuda::wmma;
constexpr int kE = kGpuChunkEvents;  // event rows per chunk (64)
constexpr int kLdE = kE + 4;         // leading dimension of 64 x 64 tiles in shared memory
// Threads per block, per kernel (measured on an H200 in one run, B 8 x T 2048 x H 8, head dim 128,
// bf16 products, 8 warps -> 16: grad 1339 -> 1183 us, dstate 579 -> 470, state 325 -> 271,
// output 347 -> 318, prep 362 -> 496): 16 warps where a block is alone on its SM (the walks,
// output, grad: 121-222 KB of shared memory each), so that twice the warps hide each other's
// latency; 8 for prep, which holds two blocks per SM, and for the bf16-tile output kernel, which
// holds two too (see forward_impl).
constexpr int kPrepThreads = 256;
constexpr int kThreads = 512;
constexpr int kMaxWarps = kThreads / 32;
// The warps of the running block (the helpers below serve blocks of either size).
__device__ __forceinline__ int nwarps() { return blockDim.x >> 5; }
constexpr unsigned kFull = 0xffffffffu;

template <bool T_>
using LayoutOf = std::conditional_t<T_, wmma::col_major, wmma::row_major>;
template <bool AT>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LayoutOf<AT>>;
template <bool BT>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LayoutOf<BT>>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// What the products' inputs are rounded to (cuda::GemmPrecision picks): TF32 (10-bit mantissa,
// 16x16x8 wmma tiles); fp32-level accuracy by three TF32 products (the operands split into a TF32
// part and a TF32 remainder: al b + a bl + a b); bf16 (8-bit mantissa, mma.m16n8k16: twice the
// TF32 rate and half its instructions per product, every pair of inputs converted by one cvt).
// Accumulators are fp32 in all three.
// Bf16x3: each operand split into a bf16 part and a bf16 remainder, three bf16 products (al b +
// a bl + a b): a 16-bit mantissa's accuracy at half the MMA cost of three TF32 products.
enum class Mma { Tf32, Fp32, Bf16, Bf16x3 };
// The products that carry the state from chunk to chunk (W, and the state kernel's U~ = U - W S0
// and S = gamma S + K^T diag(D) U~) run as three bf16 products on split operands whatever the
// others' precision: with their
// operands rounded, a chunk's transition is no longer the product of its tokens' transitions, and
// at eigenvalues of modulus 1 (beta = 2) the difference adds up over the chunks (the opening
// comment gives the measurement).
// (Under GemmPrecision::FP32, what the tests compare with the CPU at fp32 tolerance, it stays
// three TF32 products.)
template <Mma MM>
constexpr Mma kCarry = MM == Mma::Fp32 ? Mma::Fp32 : Mma::Bf16x3;

// x as a product of precision MM reads it (round to nearest, as the conversions below do).
template <Mma MM>
__device__ __forceinline__ float operand_value(float x) {
  if constexpr (MM == Mma::Bf16) return __bfloat162float(__float2bfloat16_rn(x));
  else if constexpr (MM == Mma::Tf32) return wmma::__float_to_tf32(x);
  else return x;
}

// Rounds a fragment to TF32; PRECISE: the remainder (x - tf32(x), itself in TF32) goes to `lo`.
template <bool PRECISE, class F>
__device__ __forceinline__ void to_tf32(F& hi, F& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float x = hi.x[i], h = wmma::__float_to_tf32(x);
    hi.x[i] = h;
    if (PRECISE) lo.x[i] = wmma::__float_to_tf32(x - h);
  }
}

// acc += a b in TF32, or with PRECISE also the two remainder products first (al b + a bl: the
// operands' TF32 remainders, see to_tf32), which gives fp32-level accuracy.
template <bool PRECISE, class FA, class FB>
__device__ __forceinline__ void mma_tf32(FragC& acc, const FA& a, const FA& al, const FB& b, const FB& bl) {
  if (PRECISE) {
    wmma::mma_sync(acc, al, b, acc);
    wmma::mma_sync(acc, a, bl, acc);
  }
  wmma::mma_sync(acc, a, b, acc);
}

// Writes one accumulator tile: alpha acc + beta cin (cin's tile at the same place, if given).
__device__ __forceinline__ void put_tile(FragC& acc, float* out, int ldo, const float* cin, int ldc, int m0, int n0,
                                         float alpha, float beta) {
  if (cin) {
    FragC c;
    wmma::load_matrix_sync(c, cin + size_t(m0) * ldc + n0, ldc, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = alpha * acc.x[i] + beta * c.x[i];
  } else {
#pragma unroll
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= alpha;
  }
  wmma::store_matrix_sync(out + size_t(m0) * ldo + n0, acc, ldo, wmma::mem_row_major);
}

// Two fp32 values as a bf16 pair (lo in the low half: the lower k index), rounded to nearest.
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Two fp32 values as a bf16 pair, and (lo given) their remainders x - bf16(x) as another.
__device__ __forceinline__ uint32_t bf16_pair(float x, float y, uint32_t* lo) {
  if (lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    *lo = bf16_pair(x - hf.x, y - hf.y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  return bf16_pair(x, y);
}
// Elements k and k+1 of a row of an operand: adjacent (one 8-byte load) or `stride` apart; with
// lo, split into a bf16 pair and the pair of remainders.
template <bool ADJACENT>
__device__ __forceinline__ uint32_t k_pair(const float* p, int stride, uint32_t* lo = nullptr) {
  if (ADJACENT) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    return bf16_pair(v.x, v.y, lo);
  }
  return bf16_pair(p[0], p[stride], lo);
}
// d += a b on one 16 x 8 tile, k 16 (PTX ISA, mma.m16n8k16 with .bf16: lane = 4 g + t holds
// a = rows g, g+8 x k 2t, 2t+1, 2t+8, 2t+9; b = k 2t, 2t+1, 2t+8, 2t+9 x column g; d = rows g, g+8
// x columns 2t, 2t+1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Writes two adjacent results of an MMA accumulator (row, columns col and col + 1): alpha acc +
// beta cin (cin's elements at the same place, if given).
__device__ __forceinline__ void put_pair(float* out, int ldo, const float* cin, int ldc, size_t row, int col, float x,
                                         float y, float alpha, float beta) {
  float2 v = make_float2(alpha * x, alpha * y);
  if (cin) {
    const float2 c = *reinterpret_cast<const float2*>(cin + row * ldc + col);
    v.x += beta * c.x, v.y += beta * c.y;
  }
  *reinterpret_cast<float2*>(out + row * ldo + col) = v;
}

// The blocks of mm below: a warp computes MT x NT tiles of 16 x 16 at a time, each fragment of A
// shared over the NT tiles of its row and each of B over the MT tiles of its column.
template <int MT, int NT, bool AT, bool BT, Mma MM>
__device__ void mm_tiles(float* out, int ldo, const float* A, int lda, const float* B, int ldb, int M, int N, int K,
                         float alpha, const float* cin, int ldc, float beta) {
  const int warp = threadIdx.x >> 5, sn = N / (16 * NT), blocks = M / (16 * MT) * sn;
  if constexpr (MM == Mma::Bf16 || MM == Mma::Bf16x3) {
    constexpr bool SPLIT = MM == Mma::Bf16x3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
    for (int t = warp; t < blocks; t += nwarps()) {
      const int m0 = (t / sn) * 16 * MT, n0 = (t % sn) * 16 * NT;
      float acc[MT][2 * NT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 2 * NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
      // op(A)(m, k) = A[m lda + k] (k adjacent) or A[k lda + m]; op(B)(k, n) = B[n ldb + k] or B[k ldb + n].
      auto a_at = [&](int m, int k, uint32_t* lo) {
        return AT ? k_pair<false>(A + size_t(k) * lda + m, lda, lo) : k_pair<true>(A + size_t(m) * lda + k, 1, lo);
      };
      auto b_at = [&](int k, int n, uint32_t* lo) {
        return BT ? k_pair<true>(B + size_t(n) * ldb + k, 1, lo) : k_pair<false>(B + size_t(k) * ldb + n, ldb, lo);
      };
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[MT][4], b[2 * NT][2], al[MT][4], bl[2 * NT][2];  // (al, bl: the remainders, SPLIT)
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const int m = m0 + 16 * i + g, k = k0 + t2;
          a[i][0] = a_at(m, k, SPLIT ? &al[i][0] : nullptr), a[i][1] = a_at(m + 8, k, SPLIT ? &al[i][1] : nullptr);
          a[i][2] = a_at(m, k + 8, SPLIT ? &al[i][2] : nullptr), a[i][3] = a_at(m + 8, k + 8, SPLIT ? &al[i][3] : nullptr);
        }
#pragma unroll
        for (int j = 0; j < 2 * NT; ++j) {
          b[j][0] = b_at(k0 + t2, n0 + 8 * j + g, SPLIT ? &bl[j][0] : nullptr);
          b[j][1] = b_at(k0 + t2 + 8, n0 + 8 * j + g, SPLIT ? &bl[j][1] : nullptr);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < 2 * NT; ++j) {
            if constexpr (SPLIT) {  // the small terms first
              mma_bf16(acc[i][j], al[i], b[j][0], b[j][1]);
              mma_bf16(acc[i][j], a[i], bl[j][0], bl[j][1]);
            }
            mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
          }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 2 * NT; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            put_pair(out, ldo, cin, ldc, m0 + 16 * i + g + 8 * h, n0 + 8 * j + t2, acc[i][j][2 * h],
                     acc[i][j][2 * h + 1], alpha, beta);
    }
  } else {
    constexpr bool PRECISE = MM == Mma::Fp32;
    for (int t = warp; t < blocks; t += nwarps()) {
      const int m0 = (t / sn) * 16 * MT, n0 = (t % sn) * 16 * NT;
      FragC acc[MT][NT];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) wmma::fill_fragment(acc[i][j], 0.f);
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 8) {
        FragA<AT> a[MT], al[MT];
        FragB<BT> b[NT], bl[NT];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const int m = m0 + 16 * i;
          wmma::load_matrix_sync(a[i], AT ? A + size_t(k0) * lda + m : A + size_t(m) * lda + k0, lda);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int n = n0 + 16 * j;
          wmma::load_matrix_sync(b[j], BT ? B + size_t(n) * ldb + k0 : B + size_t(k0) * ldb + n, ldb);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) to_tf32<PRECISE>(a[i], al[i]);
#pragma unroll
        for (int j = 0; j < NT; ++j) to_tf32<PRECISE>(b[j], bl[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_tf32<PRECISE>(acc[i][j], a[i], al[i], b[j], bl[j]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) put_tile(acc[i][j], out, ldo, cin, ldc, m0 + 16 * i, n0 + 16 * j, alpha, beta);
    }
  }
}

// out[M x N] = alpha op(A) op(B) + beta cin, by all warps of the block. op(A) is M x K: A[m*lda + k],
// or with AT A[k*lda + m]; op(B) is K x N: B[k*ldb + n], or with BT B[n*ldb + k]. M, N multiples of
// 16, K of 16; pointers 32-byte aligned, leading dims multiples of 4. cin may be out (each tile reads
// only its own part of it), but A and B must not alias out. No barrier inside: the caller
// synchronises around it.
// A warp computes a strip of 16 x 64, 16 x 32 or 16 x 16 (the widest that still gives every warp
// one), the tiles sharing the A fragment, the k loop unrolled by two: several fragment loads and
// independent products in flight per warp, which is what hides their latency (one block per SM).
template <bool AT, bool BT, Mma MM>
__device__ void mm(float* out, int ldo, const float* A, int lda, const float* B, int ldb, int M, int N, int K,
                   float alpha, const float* cin = nullptr, int ldc = 0, float beta = 0.f) {
  const int mt = M >> 4, nt = N >> 4;
  if (nt % 4 == 0 && mt * (nt / 4) >= nwarps())
    mm_tiles<1, 4, AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
  else if (nt % 2 == 0 && mt * (nt / 2) >= nwarps())
    mm_tiles<1, 2, AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
  else
    mm_tiles<1, 1, AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
}

// mm for a B read from global memory (L2): a warp computes a strip 16 MT tall and 16 wide, sharing
// each B fragment over its MT tiles, so that B is read MT times less often than by mm's strips
// (which read it once per 16 rows). MT is the largest of 4, 2 that still gives every warp a strip;
// where none does, mm.
template <bool AT, bool BT, Mma MM>
__device__ void mm_b(float* out, int ldo, const float* A, int lda, const float* B, int ldb, int M, int N, int K,
                     float alpha, const float* cin = nullptr, int ldc = 0, float beta = 0.f) {
  const int mt = M >> 4, nt = N >> 4;
  if (mt % 4 == 0 && mt / 4 * nt >= nwarps())
    mm_tiles<4, 1, AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
  else if (mt % 2 == 0 && mt / 2 * nt >= nwarps())
    mm_tiles<2, 1, AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
  else
    mm<AT, BT, MM>(out, ldo, A, lda, B, ldb, M, N, K, alpha, cin, ldc, beta);
}

// 16-byte loads and stores where p is 16-byte aligned, else element by element.
__device__ __forceinline__ float4 load4(const float* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) return *reinterpret_cast<const float4*>(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
  }
}

// ---- bf16 operand tiles in shared memory, read by ldmatrix (Mma::Bf16) ----
// A tile is row-major bf16 with a leading dimension ld (elements) that is a multiple of 8 with
// ld / 8 odd (kBfPad added to a multiple of 16 columns): each row starts 16-byte aligned and the
// eight rows one ldmatrix phase reads fall in distinct bank groups. A warp then loads a 16 x 16
// fragment of A, or two 8-column fragments of B, with one instruction and no conversion, where
// the fp32 tiles above cost four to eight loads and conversions per fragment (ncu: ~35
// instructions per MMA in the bf16 kernels before).
using bf16 = __nv_bfloat16;
constexpr int kBfPad = 8;
// Lays out a kernel's shared-memory regions one after the other, each 128-byte aligned.
struct SmemCursor {
  size_t off = 0;
  __host__ __device__ size_t take(size_t bytes) {
    const size_t o = off;
    off += (bytes + 127) / 128 * 128;
    return o;
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8 x 8 b16 matrices; lane 8 j + r gives row r of matrix j (PTX ISA, ldmatrix).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// acc += op(A) op(B) for the 16 x 32 strip at (m0, n0), A and B bf16 tiles in shared memory, op as
// in mm (AT: A stored K x M; BT: B stored N x K), K a multiple of 16: per k step of 16 one ldmatrix
// for A, two for B (four 8-column tiles), four MMAs. acc[q] is the 16 x 8 tile at column n0 + 8 q
// (mma_bf16's layout: this lane's rows g and g + 8, columns 2 t and 2 t + 1).
template <bool AT, bool BT>
__device__ __forceinline__ void strip_s(float (&acc)[4][4], const bf16* A, int lda, const bf16* B, int ldb, int m0,
                                        int n0, int K) {
  const int lane = threadIdx.x & 31, r = lane & 7, j = lane >> 3;
  // This lane's row address within a 16 x 16 block (see ldsm_x4): A's matrices are (rows 0-7,
  // k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); B's (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7),
  // (8-15, 8-15), i.e. the two k halves of two 8-column tiles.
  const int a_row = AT ? r + 8 * (j >> 1) : r + 8 * (j & 1), a_col = AT ? 8 * (j & 1) : 8 * (j >> 1);
  const int b_row = BT ? r + 8 * (j >> 1) : r + 8 * (j & 1), b_col = BT ? 8 * (j & 1) : 8 * (j >> 1);
  // Stored (row, col) of this lane's address: A(m, k) is A[m lda + k] or, with AT, A[k lda + m];
  // B(k, n) is B[k ldb + n] or, with BT, B[n ldb + k].
  const bf16* pa = AT ? A + size_t(a_row) * lda + m0 + a_col : A + size_t(m0 + a_row) * lda + a_col;
  const bf16* pb0 = BT ? B + size_t(n0 + b_row) * ldb + b_col : B + size_t(b_row) * ldb + n0 + b_col;
  const bf16* pb1 = BT ? pb0 + size_t(16) * ldb : pb0 + 16;
  const size_t a_step = AT ? size_t(16) * lda : 16, b_step = BT ? 16 : size_t(16) * ldb;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b0[4], b1[4];
    if (AT) ldsm_x4_t(a, pa); else ldsm_x4(a, pa);
    if (BT) ldsm_x4(b0, pb0), ldsm_x4(b1, pb1); else ldsm_x4_t(b0, pb0), ldsm_x4_t(b1, pb1);
    mma_bf16(acc[0], a, b0[0], b0[1]);
    mma_bf16(acc[1], a, b0[2], b0[3]);
    mma_bf16(acc[2], a, b1[0], b1[1]);
    mma_bf16(acc[3], a, b1[2], b1[3]);
    pa += a_step, pb0 += b_step, pb1 += b_step;
  }
}

// One term op(A) op(B) of a sum of products (mm_s_to), over K.
struct TermS {
  const bf16* A;
  int lda;
  const bf16* B;
  int ldb, K;
};
// Hands a strip's accumulators to epi(row, col, x, y): the results at (row, col) and (row, col + 1).
template <class Epi>
__device__ __forceinline__ void strip_out(const float (&acc)[4][4], int m0, int n0, const Epi& epi) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h) epi(m0 + g + 8 * h, n0 + 8 * q + t2, acc[q][2 * h], acc[q][2 * h + 1]);
}

// The M x N sum of products op(A_i) op(B_i) over the terms (the same op for all; the first terms
// summed first), A and B bf16 tiles in shared memory, fp32 accumulation, by all warps of the block,
// a 16 x 32 strip per warp at a time (strip t to warp t mod warps: calls of the same M and N give a
// warp the same strips). M a multiple of 16, N of 32; no barrier inside.
template <bool AT, bool BT, int NT, class Epi>
__device__ void mm_s_to(int M, int N, Epi epi, const TermS (&terms)[NT]) {
  const int sn = N >> 5, strips = (M >> 4) * sn;
  for (int t = threadIdx.x >> 5; t < strips; t += nwarps()) {
    const int m0 = (t / sn) * 16, n0 = (t % sn) * 32;
    float acc[4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
#pragma unroll
    for (int i = 0; i < NT; ++i) strip_s<AT, BT>(acc, terms[i].A, terms[i].lda, terms[i].B, terms[i].ldb, m0, n0, terms[i].K);
    strip_out(acc, m0, n0, epi);
  }
}

// out[M x N] (fp32) = alpha op(A) op(B) + beta cin (mm's contract, on bf16 tiles: mm_s_to).
template <bool AT, bool BT>
__device__ void mm_s(float* out, int ldo, const bf16* A, int lda, const bf16* B, int ldb, int M, int N, int K,
                     float alpha, const float* cin = nullptr, int ldc = 0, float beta = 0.f) {
  mm_s_to<AT, BT>(M, N, [&](int row, int col, float x, float y) { put_pair(out, ldo, cin, ldc, row, col, x, y, alpha, beta); },
                  {TermS{A, lda, B, ldb, K}});
}

// Stages rows x cols fp32 values (global or shared; cols a multiple of 4) for products: row r from
// src + rowoff(r), or zeros where rowoff(r) < 0, handed to put(r, c, v) four at a time (columns c
// to c + 3), which converts and stores them. Rows over the warps, 4 values a lane, four rows' loads
// in flight before their stores. ALIGNED: every row 16-byte aligned (else checked per row).
template <bool ALIGNED, class RowOff, class Put>
__device__ void stage_rows(const float* src, int rows, int cols, RowOff rowoff, Put put) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c4 = cols >> 2, nw = nwarps();
  for (int r0 = warp; r0 < rows; r0 += 4 * nw)
    for (int q = lane; q < c4; q += 32) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int rr = r0 + u * nw;
        const long long off = rr < rows ? rowoff(rr) : -1;
        v[u] = off < 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
               : ALIGNED ? *reinterpret_cast<const float4*>(src + off + 4 * q) : load4(src + off + 4 * q);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (r0 + u * nw < rows) put(r0 + u * nw, 4 * q, v[u]);
    }
}
// One tile of stage: rows x 4 c4 fp32 values, row r from src + rowoff(r) (zeros where it is < 0;
// rows 16-byte aligned), handed to put(r, c, v) four at a time.
template <class RowOff, class Put>
struct StageTile {
  const float* src;
  int rows, c4;
  RowOff rowoff;
  Put put;
  __device__ __forceinline__ void load(float4 (&v)[4], int r0, int q, int nw) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int r = r0 + u * nw;
      const long long off = r < rows && q < c4 ? rowoff(r) : -1;
      v[u] = off < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) : *reinterpret_cast<const float4*>(src + off + 4 * q);
    }
  }
  __device__ __forceinline__ void store(const float4 (&v)[4], int r0, int q, int nw) const {
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (r0 + u * nw < rows && q < c4) put(r0 + u * nw, 4 * q, v[u]);
  }
};
template <class RowOff, class Put>
__device__ __forceinline__ StageTile<RowOff, Put> stage_tile(const float* src, int rows, int cols, RowOff rowoff, Put put) {
  return {src, rows, cols >> 2, rowoff, put};
}
// stage's step for one lane: the loads of every tile's rows, then their stores in reverse order.
template <class S, class... R>
__device__ __forceinline__ void stage_step(int r0, int q, int nw, const S& s, const R&... rest) {
  float4 v[4];
  s.load(v, r0, q, nw);
  if constexpr (sizeof...(R) > 0) stage_step(r0, q, nw, rest...);
  s.store(v, r0, q, nw);
}
// Stages several tiles at once (stage_rows' pattern): each lane's loads of all of them are in
// flight before any of their stores, so a stage waits on memory once, not once per tile.
template <class... S>
__device__ void stage(const S&... s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = nwarps();
  int rows = 0, c4 = 0;
  ((rows = max(rows, s.rows), c4 = max(c4, s.c4)), ...);
  for (int r0 = warp; r0 < rows; r0 += 4 * nw)
    for (int q = lane; q < c4; q += 32) stage_step(r0, q, nw, s...);
}
// One tile of stage whose loads a lane holds in registers across other work: load() early, put()
// later converts and stores them. Only where one pass of the block covers the tile (rows up to 4
// a warp, 4 columns a lane); otherwise put() stages it then.
template <class T>
struct HeldTile {
  T t;
  float4 v[4];
  bool held;
  __device__ __forceinline__ explicit HeldTile(const T& tile) : t(tile), held(tile.rows <= 4 * nwarps() && tile.c4 <= 32) {}
  __device__ __forceinline__ void load() {
    if (held) t.load(v, threadIdx.x >> 5, threadIdx.x & 31, nwarps());
  }
  __device__ __forceinline__ void put() {
    if (held)
      t.store(v, threadIdx.x >> 5, threadIdx.x & 31, nwarps());
    else
      stage(t);
  }
};
// Asks L2 for the lines of rows x cols fp32 values (row r at src + rowoff(r), skipped where < 0;
// one request per 128 bytes of a row), by all threads of the block, without waiting for them.
template <class RowOff>
__device__ __forceinline__ void prefetch_l2(const float* src, int rows, int cols, RowOff rowoff) {
  const int lines = (cols + 31) >> 5;
  for (int i = threadIdx.x; i < rows * lines; i += blockDim.x) {
    const int r = i / lines;
    const long long off = rowoff(r);
    if (off >= 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src + off + 32 * (i - r * lines)));
  }
}

// Four values as bf16 at dst (8-byte aligned), each times f.
__device__ __forceinline__ void put_bf16x4(bf16* dst, float4 v, float f = 1.f) {
  uint2 w;
  w.x = bf16_pair(f * v.x, f * v.y), w.y = bf16_pair(f * v.z, f * v.w);
  *reinterpret_cast<uint2*>(dst) = w;
}
// Two fp32 values as a bf16 pair at hi and their remainders at lo (bf16 tiles, 4-byte aligned).
__device__ __forceinline__ void put_split(bf16* hi, bf16* lo, float x, float y) {
  uint32_t l;
  *reinterpret_cast<uint32_t*>(hi) = bf16_pair(x, y, &l);
  *reinterpret_cast<uint32_t*>(lo) = l;
}
// An fp32 pair as three bf16 pairs (a part, its remainder, the remainder's remainder) whose sum
// in that order is the pair exactly, and back (join3): x - bf16(x) is exact and has at most 16
// significant bits, its remainder at most 8.
__device__ __forceinline__ void split3(float2 x, uint32_t* hi, uint32_t* lo, uint32_t& lo2) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x.x, x.y);
  const float2 hf = __bfloat1622float2(h);
  const float2 r = make_float2(x.x - hf.x, x.y - hf.y);
  const __nv_bfloat162 l = __floats2bfloat162_rn(r.x, r.y);
  const float2 lf = __bfloat1622float2(l);
  *hi = *reinterpret_cast<const uint32_t*>(&h);
  *lo = *reinterpret_cast<const uint32_t*>(&l);
  lo2 = bf16_pair(r.x - lf.x, r.y - lf.y);
}
__device__ __forceinline__ float2 join3(uint32_t hi, uint32_t lo, uint32_t lo2) {
  auto f = [](uint32_t u) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u)); };
  const float2 a = f(hi), b = f(lo), c = f(lo2);
  return make_float2((a.x + b.x) + c.x, (a.y + b.y) + c.y);
}
// stage_tile's row offsets of a dense tile (row stride ld), and its put for a bf16 tile (ld).
__device__ __forceinline__ auto row_stride(int ld) {
  return [=](int r) { return (long long)r * ld; };
}
__device__ __forceinline__ auto bf16_rows(bf16* dst, int ld) {
  return [=](int r, int col, float4 v) { put_bf16x4(dst + r * ld + col, v); };
}
// A rows x cols fp32 tile with row stride lds (16-byte aligned rows) as a bf16 tile (rounded to
// nearest, as the MMA loads of the fp32 tiles round).
__device__ __forceinline__ void to_bf16_tile(bf16* dst, int ldd, const float* src, size_t lds, int rows, int cols) {
  stage_rows<true>(src, rows, cols, row_stride(int(lds)), bf16_rows(dst, ldd));
}

// f(r, c) for every element of a rows x cols tile: rows over the warps, columns over the lanes (no
// index divisions: the element loops were what the kernels spent their issue slots on).
template <class F>
__device__ __forceinline__ void each(int rows, int cols, F f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < rows; r += nwarps())
    for (int c = lane; c < cols; c += 32) f(r, c);
}

// The checkpointed states and U~, and the backward's dS and dU~, are fp32, or bf16 where every
// kernel that writes or reads them is a bf16-tile one (Args::hs, Args::hg; a bf16 array uses the
// first half of its fp32 region). The readers round them to bf16 as they stage them, so the walks
// write those very values (the state's bf16 part: rounded to nearest) and the readers copy them:
// the same products from half the bytes.
// One tile of stage into a bf16 tile (dst, ldd) from fp32 (rounded to nearest, four values a
// 16-byte load) or bf16 values (half: copied, eight a load): rows x cols at src + r * lds
// (elements; cols a multiple of 8, 16-byte aligned rows).
struct StageToBf16 {
  const void* src;
  long long lds;
  int rows, c4;
  bool half;
  bf16* dst;
  int ldd;
  __device__ __forceinline__ void load(float4 (&v)[4], int r0, int q, int nw) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int r = r0 + u * nw;
      if (r >= rows || q >= c4) {
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        continue;
      }
      const size_t e = size_t(r) * lds + size_t(half ? 8 : 4) * q;
      v[u] = half ? *reinterpret_cast<const float4*>(static_cast<const bf16*>(src) + e)
                  : *reinterpret_cast<const float4*>(static_cast<const float*>(src) + e);
    }
  }
  __device__ __forceinline__ void store(const float4 (&v)[4], int r0, int q, int nw) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int r = r0 + u * nw;
      if (r >= rows || q >= c4) continue;
      if (half)
        *reinterpret_cast<float4*>(dst + r * ldd + 8 * q) = v[u];
      else
        put_bf16x4(dst + r * ldd + 4 * q, v[u]);
    }
  }
};
__device__ __forceinline__ StageToBf16 stage_to_bf16(const float* base, bool half, size_t at, long long lds, int rows,
                                                     int cols, bf16* dst, int ldd) {
  const void* p = half ? static_cast<const void*>(reinterpret_cast<const bf16*>(base) + at)
                       : static_cast<const void*>(base + at);
  return {p, lds, rows, half ? cols >> 3 : cols >> 2, half, dst, ldd};
}
// The same tile, where it is bf16 in memory, started as cp.async copies instead (the caller
// commits and waits), returning the tile left to stage: none then (rows 0), else the fp32 tile.
__device__ __forceinline__ StageToBf16 copy_or_stage_to_bf16(const float* base, bool half, size_t at, long long lds,
                                                             int rows, int cols, bf16* dst, int ldd) {
  if (!half) return stage_to_bf16(base, false, at, lds, rows, cols, dst, ldd);
  const bf16* src = reinterpret_cast<const bf16*>(base) + at;
  each(rows, cols >> 3, [&](int r, int q) { __pipeline_memcpy_async(dst + r * ldd + 8 * q, src + r * lds + 8 * q, 16); });
  return stage_to_bf16(base, true, at, lds, 0, cols, dst, ldd);
}
// Asks L2 for the lines of such a tile.
__device__ __forceinline__ void prefetch_l2_of(const float* base, bool half, size_t at, int lds, int rows, int cols) {
  if (half)
    prefetch_l2(reinterpret_cast<const float*>(reinterpret_cast<const bf16*>(base) + at), rows, cols / 2,
                row_stride(lds / 2));
  else
    prefetch_l2(base + at, rows, cols, row_stride(lds));
}
// Writes a rows x cols bf16 tile of shared memory (src, lds) to base's bf16 array from element at,
// row stride ldd (cols a multiple of 8, 16-byte aligned rows).
__device__ __forceinline__ void put_bf16_tile(float* base, size_t at, int ldd, const bf16* src, int lds, int rows,
                                              int cols) {
  bf16* dst = reinterpret_cast<bf16*>(base) + at;
  each(rows, cols >> 3, [&](int r, int q) {
    *reinterpret_cast<float4*>(dst + size_t(r) * ldd + 8 * q) = *reinterpret_cast<const float4*>(src + r * lds + 8 * q);
  });
}
// Two results at element at of base: fp32, or (half) a bf16 pair rounded to nearest.
__device__ __forceinline__ void put_pair_of(float* base, bool half, size_t at, float x, float y) {
  if (half)
    *reinterpret_cast<uint32_t*>(reinterpret_cast<bf16*>(base) + at) = bf16_pair(x, y);
  else
    *reinterpret_cast<float2*>(base + at) = make_float2(x, y);
}

// Starts copying a rows x cols tile (cols a multiple of 4, both sides 16-byte aligned rows) from
// global into shared memory (cp.async, 16 bytes a copy); the caller commits and waits.
__device__ __forceinline__ void copy_async(float* dst, int ldd, const float* src, size_t lds, int rows, int cols) {
  each(rows, cols >> 2, [&](int r, int q) { __pipeline_memcpy_async(dst + r * ldd + 4 * q, src + r * lds + 4 * q, 16); });
}

// Copies a rows x cols tile (cols a multiple of 4; 16-byte aligned rows) between memories, 4 floats a
// lane at a time.
__device__ __forceinline__ void copy_tile(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
  each(rows, cols >> 2, [&](int r, int q) {
    *reinterpret_cast<float4*>(dst + size_t(r) * ldd + 4 * q) = *reinterpret_cast<const float4*>(src + size_t(r) * lds + 4 * q);
  });
}

// Row gathers and scatters between the caller's strided tensors and contiguous tiles. rowoff(i) is
// the element offset of row i's first element in the strided tensor, or -1 for a row that is not
// there (gathered as zeros, not scattered). A warp takes four rows at a time (their loads all in
// flight before any store), a lane 4 columns (one 16-byte access where the row is aligned).
template <class RowOff>
__device__ void gather_rows(float* sdst, int ldd, float* gdst, const float* src, int rows, int cols, RowOff rowoff,
                            const float* rowscale = nullptr) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c4 = cols >> 2, nw = nwarps();
  for (int r0 = warp; r0 < rows; r0 += 4 * nw)
    for (int q = lane; q < c4; q += 32) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u * nw;
        const long long off = r < rows ? rowoff(r) : -1;
        v[u] = off >= 0 ? load4(src + off + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u * nw;
        if (r >= rows) break;
        float4 x = v[u];
        if (rowscale) {
          const float f = rowscale[r];
          x.x *= f, x.y *= f, x.z *= f, x.w *= f;
        }
        if (sdst) *reinterpret_cast<float4*>(sdst + r * ldd + 4 * q) = x;
        if (gdst) *reinterpret_cast<float4*>(gdst + size_t(r) * cols + 4 * q) = x;
      }
    }
}
// gather_rows into shared memory by cp.async (16 bytes a copy; rows that are not there are zeroed,
// and a row not 16-byte aligned is copied through registers). The caller commits and waits.
template <class RowOff>
__device__ void gather_rows_async(float* sdst, int ldd, const float* src, int rows, int cols, RowOff rowoff) {
  each(rows, cols >> 2, [&](int r, int q) {
    const long long off = rowoff(r);
    float* d = sdst + r * ldd + 4 * q;
    const float* p = src + off + 4 * q;
    if (off < 0) *reinterpret_cast<float4*>(d) = make_float4(0.f, 0.f, 0.f, 0.f);
    else if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) __pipeline_memcpy_async(d, p, 16);
    else *reinterpret_cast<float4*>(d) = load4(p);
  });
}
template <class RowOff>
__device__ void scatter_rows(float* dst, const float* src, int lds, int rows, int cols, bool accumulate, RowOff rowoff) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c4 = cols >> 2, nw = nwarps();
  for (int r0 = warp; r0 < rows; r0 += 4 * nw)
    for (int q = lane; q < c4; q += 32) {
      float4 old[4];
      long long off[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u * nw;
        off[u] = r < rows ? rowoff(r) : -1;
        old[u] = accumulate && off[u] >= 0 ? load4(dst + off[u] + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (off[u] < 0) continue;
        const float4 x = *reinterpret_cast<const float4*>(src + (r0 + u * nw) * lds + 4 * q);
        store4(dst + off[u] + 4 * q, make_float4(old[u].x + x.x, old[u].y + x.y, old[u].z + x.z, old[u].w + x.w));
      }
    }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

struct Args {
  const float *q, *k, *v, *bl, *g, *dout;
  float *o, *dq, *dk, *dv, *dbl, *dg;
  long long lq, lk, lv, lb;      // token strides
  int T, H, Dk, Dv, nh;
  int Ct, NC, Rp;                // tokens per chunk, chunks per sequence, query rows (Ct rounded up to 16)
  int BV;                        // state columns per block (state, output, dstate kernels)
  float bscale, scale;
  bool accumulate;
  // Per chunk ch = bh * NC + c (prep's, in the checkpoint: GpuChunkedCkpt):
  float *Kc, *Qc, *W, *U, *Tm, *beta;  // [ch][64][Dk], [ch][Rp][Dk], [ch][64][Dk], [ch][64][Dv], [ch][64][64], [ch][64]
  float* Pm;                            // [ch][Rp][64]: (Q K^T) . exp(G_row - G_j), masked to j <= row (no scale)
  double* G;                            // [ch][64]
  float *dS, *dUt;                      // backward: [ch][Dk][Dv] (dL/dS after the chunk), [ch][64][Dv]
  // The checkpoints (delta_rule_gpu_chunked_ckpt_size): states [bh][NC+1][Dk][Dv], then U~ [ch][64][Dv].
  float *states, *Ut;
  bool hs, hg;                          // states and U~ / dS and dU~ stored as bf16 (StageToBf16)
  float* state_io;                      // forward: carried state [bh][Dk][Dv] (in and out), or null
  int BH;                               // sequences x heads
};

// Where event i (row i of chunk c) and reading row r live.
struct Ev {
  int t, j;
  bool ok;
};
__device__ __forceinline__ Ev event(const Args& a, int c, int i) {
  const int tok = i / a.nh;
  Ev e{c * a.Ct + tok, i % a.nh, false};
  e.ok = i < a.Ct * a.nh && e.t < a.T;
  return e;
}
__device__ __forceinline__ bool row_ok(const Args& a, int c, int r) { return r < a.Ct && c * a.Ct + r < a.T; }
// Events of one token share no gate (see delta_rule_chunked_cpu.cpp: such decay terms get no gate
// gradient); padding rows count as the chunk's last real token.
__device__ __forceinline__ int token_of(const Args& a, int c, int i) {
  const int last = min(a.Ct, a.T - c * a.Ct) * a.nh - 1;
  return min(i, last) / a.nh;
}
__device__ __forceinline__ size_t tok_index(const Args& a, int b, int t) { return size_t(b) * a.T + t; }

// Element offsets of an event's key / value row, a reading row's query row, and a token's output
// row (the head's slice, column 0), or -1 where the chunk has no such event or row.
__device__ __forceinline__ long long key_row(const Args& a, int b, int h, int c, int i) {
  const Ev e = event(a, c, i);
  return e.ok ? (long long)(tok_index(a, b, e.t) * a.lk + (size_t(e.j) * a.H + h) * a.Dk) : -1;
}
__device__ __forceinline__ long long value_row(const Args& a, int b, int h, int c, int i) {
  const Ev e = event(a, c, i);
  return e.ok ? (long long)(tok_index(a, b, e.t) * a.lv + (size_t(e.j) * a.H + h) * a.Dv) : -1;
}
__device__ __forceinline__ long long query_row(const Args& a, int b, int h, int c, int r) {
  return row_ok(a, c, r) ? (long long)(tok_index(a, b, c * a.Ct + r) * a.lq + size_t(h) * a.Dk) : -1;
}
__device__ __forceinline__ long long out_row(const Args& a, int b, int h, int c, int r) {
  return row_ok(a, c, r) ? (long long)((tok_index(a, b, c * a.Ct + r) * a.H + h) * a.Dv) : -1;
}

// Loads G of chunk ch into shared memory (and D_i = exp(G_63 - G_i), gamma_i = exp(G_i)).
__device__ void load_decays(const Args& a, size_t ch, double* G, float* gam, float* D) {
  for (int i = threadIdx.x; i < kE; i += blockDim.x) G[i] = a.G[ch * kE + i];
  __syncthreads();
  for (int i = threadIdx.x; i < kE; i += blockDim.x) {
    gam[i] = expf(float(G[i]));
    D[i] = expf(float(G[kE - 1] - G[i]));
  }
}

// ---- prep: one block per chunk (grid NC x BH) ----
// Its steps, shared by the fp32-tile and bf16-tile forms:
// beta and the gate of each event of chunk c (beta, gam: shared arrays).
__device__ __forceinline__ void prep_events(const Args& a, int b, int h, int c, float* beta, float* gam) {
  const int tid = threadIdx.x;
  if (tid < kE) {
    const Ev e = event(a, c, tid);
    beta[tid] = e.ok ? a.bscale * sigmoidf(a.bl[tok_index(a, b, e.t) * a.lb + size_t(e.j) * a.H + h]) : 0.f;
    gam[tid] = a.g && e.ok && e.j == 0 ? a.g[tok_index(a, b, e.t) * a.H + h] : 0.f;  // the event's gate
  }
}
// The keys as the products read them, k~ (rounded: every kernel reads these; into X, Kg and, given,
// the bf16 tile Kh), and beta~ = beta |k|^2 / |k~|^2, which keeps each transition's eigenvalue
// along its key, 1 - beta |k|^2, as the fp32 key gives it (the file's opening comment says why).
// Ends with a barrier.
template <Mma MM>
__device__ void round_keys(float* X, int ldx, float* Kg, int Dk, float* beta, bf16* Kh = nullptr, int lbK = 0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < kE; i += nwarps()) {
    float n = 0.f, nr = 0.f;
    for (int col = lane; col < Dk; col += 32) {
      const float x = X[i * ldx + col], xr = operand_value<MM>(x);
      X[i * ldx + col] = Kg[size_t(i) * Dk + col] = xr;
      if (Kh) Kh[i * lbK + col] = __float2bfloat16_rn(xr);
      n += x * x, nr += xr * xr;
    }
    for (int o = 16; o; o >>= 1) n += __shfl_xor_sync(kFull, n, o), nr += __shfl_xor_sync(kFull, nr, o);
    if (lane == 0 && nr > 0.f) beta[i] *= n / nr;
  }
  __syncthreads();
}
// round_keys in one pass where a lane holds its share of the keys (prep_s, Dk <= 128): each warp's
// rows (round_keys' rows: warp + 8 u) loaded at once, before the queries are staged, and after the
// barrier that makes beta ready rounded, written (Kg, Kh) and their norms reduced together — the
// same sums in the same order, so the same beta~ bit for bit. (ncu, H200, B 8 x T 2048 x H 8: the
// gathers and round_keys, each row's shuffles after the last, were 39 % of prep_s's stall samples.)
struct HeldKeys {
  static constexpr int kRows = kE / (kPrepThreads / 32), kCols = 4;  // per lane: Dk <= 32 kCols
  float x[kRows][kCols];
  template <class RowOff>
  __device__ __forceinline__ void load(const float* k, int Dk, RowOff rowoff) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const long long off = rowoff(warp + 8 * u);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int col = lane + 32 * j;
        x[u][j] = off >= 0 && col < Dk ? k[off + col] : 0.f;
      }
    }
  }
  // Ends with a barrier.
  template <Mma MM>
  __device__ __forceinline__ void round(float* Kg, int Dk, float* beta, bf16* Kh, int lbK) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float n[kRows], nr[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int i = warp + 8 * u;
      n[u] = nr[u] = 0.f;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int col = lane + 32 * j;
        if (col >= Dk) continue;
        const float v = x[u][j], vr = operand_value<MM>(v);
        Kg[size_t(i) * Dk + col] = vr;
        Kh[i * lbK + col] = __float2bfloat16_rn(vr);
        n[u] += v * v, nr[u] += vr * vr;
      }
    }
    for (int o = 16; o; o >>= 1)
#pragma unroll
      for (int u = 0; u < kRows; ++u) n[u] += __shfl_xor_sync(kFull, n[u], o), nr[u] += __shfl_xor_sync(kFull, nr[u], o);
    if (lane == 0)
#pragma unroll
      for (int u = 0; u < kRows; ++u)
        if (nr[u] > 0.f) beta[warp + 8 * u] *= n[u] / nr[u];
    __syncthreads();
  }
};
static_assert(kPrepThreads == 256, "HeldKeys: 8 warps, 8 rows each");
// G = the cumulative log decay (in double), gam = exp(G); G and beta written out for the other
// kernels. A barrier after G, none at the end.
__device__ void prep_decays(const Args& a, size_t ch, double* G, const float* beta, float* gam) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    double acc = 0;
    for (int i = 0; i < kE; ++i) G[i] = acc += double(gam[i]);
  }
  __syncthreads();
  if (tid < kE) {
    gam[tid] = expf(float(G[tid]));
    a.G[ch * kE + tid] = G[tid];
    a.beta[ch * kE + tid] = beta[tid];
  }
}
// exp(G_i - G_j), the decay from event j to event i of a chunk: 1 without a gate (G is then 0, and
// exp(0) is 1 exactly: the same values without the 4096 exponentials a chunk that prep and the
// gradient kernels' element passes would spend on it).
__device__ __forceinline__ float decay(bool gated, const double* G, int i, int j) {
  return gated ? expf(float(G[i] - G[j])) : 1.f;
}
// Mt = M transposed (Mt[j][i] = M_ij = beta_i (K K^T)_ij exp(G_i - G_j), strictly lower M) from
// As = K K^T. No barrier.
__device__ __forceinline__ void form_mt(bool gated, const float* As, float* Mt, const float* beta, const double* G) {
  each(kE, kE, [&](int i, int j) { Mt[j * kLdE + i] = j < i ? beta[i] * As[i * kLdE + j] * decay(gated, G, i, j) : 0.f; });
}
// Tn = Tinv = (I + M)^-1 (Mt: M transposed, strictly lower M) in blocks of 16 rows, all in fp32:
// first the four diagonal blocks' inverses by substitution (x_j = delta_jc - sum_{m<j} M_jm x_m, 16
// steps: warp w takes columns 8w..8w+7, a half-warp one column, lane r the running sum of the
// block's row r), then the blocks below them a diagonal at a time, T_ij = -T_ii sum_{k=j}^{i-1} M_ik
// T_kj, the sums kept in the zero blocks above the diagonal (cleared at the end). The substitution
// over all 64 rows (64 dependent steps of a shuffle and two FMAs) was a quarter of the bf16-tile
// prep kernel's stall samples (ncu, H200, B 8 x T 2048 x H 8); predicted from them -19 % for that
// kernel, seen (with V asked of L2 at its start) 350 -> 313 us there, 1304 -> 1175 us at B 8 x
// T 4096 x H 16. Blocks of kPrepThreads threads; ends without a barrier.
__device__ __forceinline__ void solve_tinv(const float* Mt, float* Tn) {
  static_assert(kPrepThreads == 256 && kE == 64, "8 warps of 8 columns; 16 x 16 blocks a thread each entry");
  constexpr int kB = 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane & 15, half = lane & 16;
  {
    const int blk = warp >> 1, base = blk * kB;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int t = 0; t < kB; ++t) {
      const int j = base + t;
      const float m = Mt[j * kLdE + base + r];
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const int col = warp * 8 + qq * 2 + (half >> 4);
        const float x = __shfl_sync(kFull, float(t == (col & 15)) - s[qq], half + t);
        if (r == t) Tn[j * kLdE + col] = x;
        s[qq] += m * x;
      }
    }
  }
  __syncthreads();
  for (int d = 1; d < kE / kB; ++d) {
    const int n = (kE / kB - d) * kB * kB;  // entries of this diagonal's blocks
    for (int e = tid; e < n; e += kPrepThreads) {
      const int j = e >> 8, i = j + d, rr = (e >> 4) & 15, cc = e & 15;
      float x = 0.f;
      for (int k = j; k < i; ++k)
#pragma unroll
        for (int u = 0; u < kB; ++u) x += Mt[(k * kB + u) * kLdE + i * kB + rr] * Tn[(k * kB + u) * kLdE + j * kB + cc];
      Tn[(j * kB + rr) * kLdE + i * kB + cc] = x;  // the sum, in block (j, i) above the diagonal
    }
    __syncthreads();
    for (int e = tid; e < n; e += kPrepThreads) {
      const int j = e >> 8, i = j + d, rr = (e >> 4) & 15, cc = e & 15;
      float x = 0.f;
#pragma unroll
      for (int u = 0; u < kB; ++u) x += Tn[(i * kB + rr) * kLdE + i * kB + u] * Tn[(j * kB + u) * kLdE + i * kB + cc];
      Tn[(i * kB + rr) * kLdE + j * kB + cc] = -x;
    }
    __syncthreads();
  }
  each(kE, kE, [&](int row, int col) {
    if ((row >> 4) < (col >> 4)) Tn[row * kLdE + col] = 0.f;
  });
}

template <Mma MM>
__global__ void __launch_bounds__(kPrepThreads) prep_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const size_t ch = size_t(bh) * a.NC + c;
  const int Dk = a.Dk, Dv = a.Dv, ldx = max(Dk, Dv) + 4;
  float* X = sm;               // [64][ldx]: K, then diag(beta gamma) K, then diag(beta) V
  float* As = X + kE * ldx;    // [64][kLdE]: K K^T
  float* Mt = As + kE * kLdE;  // [64][kLdE]: M transposed (Mt[j][i] = M_ij, strictly lower M)
  float* Tn = Mt + kE * kLdE;  // [64][kLdE]: Tinv
  __shared__ double G[kE];
  __shared__ float beta[kE], gam[kE];

  float* Kg = a.Kc + ch * kE * Dk;
  gather_rows(X, ldx, Kg, a.k, kE, Dk, [&](int i) { return key_row(a, b, h, c, i); });
  gather_rows(nullptr, 0, a.Qc + ch * size_t(a.Rp) * Dk, a.q, a.Rp, Dk, [&](int r) { return query_row(a, b, h, c, r); });
  prep_events(a, b, h, c, beta, gam);
  __syncthreads();
  if constexpr (MM != Mma::Fp32) round_keys<MM>(X, ldx, Kg, Dk, beta);
  prep_decays(a, ch, G, beta, gam);
  mm<false, true, MM>(As, kLdE, X, ldx, X, ldx, kE, kE, Dk, 1.f);
  __syncthreads();
  form_mt(a.g != nullptr, As, Mt, beta, G);
  __syncthreads();
  solve_tinv(Mt, Tn);
  __syncthreads();
  // P = (Q K^T) . exp(G_row - G_j) for j <= row (the reading event of query row r), else 0, kept for
  // the output, dstate and grad kernels (the queries were written to Qc above by this block).
  mm<false, true, MM>(As, kLdE, a.Qc + ch * size_t(a.Rp) * Dk, Dk, X, ldx, a.Rp, kE, Dk, 1.f);
  __syncthreads();
  float* Pg = a.Pm + ch * size_t(a.Rp) * kE;
  each(a.Rp, kE, [&](int r, int j) {
    const int row = r * a.nh + a.nh - 1;
    Pg[r * kE + j] = row_ok(a, c, r) && j <= row ? As[r * kLdE + j] * decay(a.g != nullptr, G, row, j) : 0.f;
  });
  each(kE, Dk, [&](int i, int col) { X[i * ldx + col] *= beta[i] * gam[i]; });
  __syncthreads();
  // W carries the state from chunk to chunk (U~ = U - W S0): at kCarry's accuracy.
  mm<false, false, kCarry<MM>>(a.W + ch * kE * Dk, Dk, Tn, kLdE, X, ldx, kE, Dk, kE, 1.f);
  __syncthreads();
  gather_rows(X, ldx, nullptr, a.v, kE, Dv, [&](int i) { return value_row(a, b, h, c, i); }, beta);
  __syncthreads();
  mm<false, false, MM>(a.U + ch * kE * Dv, Dv, Tn, kLdE, X, ldx, kE, Dv, kE, 1.f);
  float* Tg = a.Tm + ch * kE * kE;
  copy_tile(Tg, kE, Tn, kLdE, kE, kE);
}

// ---- prep on bf16 tiles (Mma::Bf16, head dims multiples of 32): the same steps, its four
// products by mm_s_to (W at the carry's accuracy: three products on T and diag(beta gamma) K~ as
// bf16 parts and remainders), P written by its product's epilogue ----
// Shared memory (byte offsets; ~104 KB at head dim 128, so two blocks share an SM as before):
//   K~ (bf16) | Q, then diag(beta) V (bf16) | K K^T (fp32), then T's parts (bf16) |
//   Mt (fp32), then diag(beta gamma) K~'s part (bf16) | Tinv (fp32) | that remainder (bf16);
//   the fp32 keys are gathered over Mt and Tinv's regions first.
struct PrepSLayout {
  size_t K, Q, A, M, T, L, bytes;
};
__host__ __device__ inline PrepSLayout prep_s_layout(int Dk, int Dv, int Rp) {
  auto mx = [](size_t x, size_t y) { return x > y ? x : y; };
  const size_t lbK = Dk + kBfPad, lbV = Dv + kBfPad, lbE = kE + kBfPad, fE = size_t(kE) * kLdE * 4;
  const size_t hK = kE * lbK * 2, X = size_t(kE) * (Dk + 4) * 4;
  PrepSLayout L{};
  SmemCursor cur;
  auto take = [&](size_t bytes) { return cur.take(bytes); };
  L.K = take(hK);
  L.Q = take(mx(Rp * lbK * 2, kE * lbV * 2));
  L.A = take(mx(fE, 2 * kE * lbE * 2));
  const size_t m = (mx(fE, hK) + 127) / 128 * 128;  // M's region as take() rounds it
  L.M = take(m);
  L.T = take(mx(fE, X > m ? X - m : 0));
  L.L = take(hK);
  L.bytes = cur.off;
  return L;
}

template <Mma MM>
__global__ void __launch_bounds__(kPrepThreads) prep_s_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H, Rp = a.Rp, nh = a.nh;
  const size_t ch = size_t(bh) * a.NC + c;
  const int Dk = a.Dk, Dv = a.Dv, ldx = Dk + 4, lbK = Dk + kBfPad, lbV = Dv + kBfPad, lbE = kE + kBfPad;
  const PrepSLayout L = prep_s_layout(Dk, Dv, Rp);
  auto hp = [&](size_t off) { return reinterpret_cast<bf16*>(smb + off); };
  auto fp = [&](size_t off) { return reinterpret_cast<float*>(smb + off); };
  bf16 *Kh = hp(L.K), *Qh = hp(L.Q), *Vh = hp(L.Q), *Thi = hp(L.A), *Tlo = Thi + kE * lbE, *Xhi = hp(L.M), *Xlo = hp(L.L);
  float *As = fp(L.A), *Mt = fp(L.M), *Tn = fp(L.T), *X = fp(L.M);  // X: [64][ldx] fp32 keys, over Mt and Tn
  __shared__ double G[kE];
  __shared__ float beta[kE], gam[kE];

  float* Kg = a.Kc + ch * kE * Dk;
  float* Qg = a.Qc + ch * size_t(Rp) * Dk;
  prefetch_l2(a.v, kE, Dv, [&](int i) { return value_row(a, b, h, c, i); });  // staged after the solve
  const bool held = Dk <= 32 * HeldKeys::kCols;
  HeldKeys keys;
  auto krow = [&](int i) { return key_row(a, b, h, c, i); };
  if (held)
    keys.load(a.k, Dk, krow);
  else
    gather_rows(X, ldx, nullptr, a.k, kE, Dk, krow);
  stage_rows<false>(a.q, Rp, Dk, [&](int r) { return query_row(a, b, h, c, r); }, [&](int r, int col, float4 v) {
    *reinterpret_cast<float4*>(Qg + size_t(r) * Dk + col) = v;
    put_bf16x4(Qh + r * lbK + col, v);
  });
  prep_events(a, b, h, c, beta, gam);
  __syncthreads();
  if (held)
    keys.round<MM>(Kg, Dk, beta, Kh, lbK);
  else
    round_keys<MM>(X, ldx, Kg, Dk, beta, Kh, lbK);
  prep_decays(a, ch, G, beta, gam);
  // K K^T; P = (Q K^T) . exp(G_row - G_j) for j <= row, else 0 (as prep_kernel's), written out.
  mm_s_to<false, true>(kE, kE, [&](int r, int col, float x, float y) { *reinterpret_cast<float2*>(As + r * kLdE + col) = make_float2(x, y); },
                       {TermS{Kh, lbK, Kh, lbK, Dk}});
  float* Pg = a.Pm + ch * size_t(Rp) * kE;
  mm_s_to<false, true>(Rp, kE, [&](int r, int j, float x, float y) {
    const int row = r * nh + nh - 1;
    float2 v = make_float2(0.f, 0.f);
    if (row_ok(a, c, r)) {
      if (j <= row) v.x = x * decay(a.g != nullptr, G, row, j);
      if (j + 1 <= row) v.y = y * decay(a.g != nullptr, G, row, j + 1);
    }
    *reinterpret_cast<float2*>(Pg + r * kE + j) = v;
  }, {TermS{Qh, lbK, Kh, lbK, Dk}});
  __syncthreads();
  // diag(beta~) V into Q's region (free now) as bf16, its loads in flight over form_mt (Dv <= 128:
  // a float4 of each of the warp's 8 rows a lane), else staged after the solve.
  const bool vheld = Dv <= 128;
  if (vheld) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float4 vv[HeldKeys::kRows];
#pragma unroll
    for (int u = 0; u < HeldKeys::kRows; ++u) {
      const long long off = value_row(a, b, h, c, warp + 8 * u);
      vv[u] = off >= 0 && 4 * lane < Dv ? load4(a.v + off + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    form_mt(a.g != nullptr, As, Mt, beta, G);
#pragma unroll
    for (int u = 0; u < HeldKeys::kRows; ++u)
      if (4 * lane < Dv) put_bf16x4(Vh + (warp + 8 * u) * lbV + 4 * lane, vv[u], beta[warp + 8 * u]);
  } else {
    form_mt(a.g != nullptr, As, Mt, beta, G);
  }
  __syncthreads();
  solve_tinv(Mt, Tn);
  __syncthreads();
  // Tinv and diag(beta gamma) K~ as bf16 parts and remainders (W's operands), diag(beta) V (U's).
  each(kE, kE / 2, [&](int i, int j) { put_split(Thi + i * lbE + 2 * j, Tlo + i * lbE + 2 * j, Tn[i * kLdE + 2 * j], Tn[i * kLdE + 2 * j + 1]); });
  each(kE, Dk / 2, [&](int i, int j) {
    const float f = beta[i] * gam[i];
    put_split(Xhi + i * lbK + 2 * j, Xlo + i * lbK + 2 * j, f * __bfloat162float(Kh[i * lbK + 2 * j]),
              f * __bfloat162float(Kh[i * lbK + 2 * j + 1]));
  });
  if (!vheld)
    stage_rows<false>(a.v, kE, Dv, [&](int i) { return value_row(a, b, h, c, i); },
                      [&](int r, int col, float4 v) { put_bf16x4(Vh + r * lbV + col, v, beta[r]); });
  __syncthreads();
  // W = Tinv diag(beta gamma) K~ (it carries the state: the remainders' products first), U = Tinv diag(beta) V.
  float* Wg = a.W + ch * kE * Dk;
  float* Ug = a.U + ch * kE * Dv;
  mm_s_to<false, false>(kE, Dk, [&](int r, int col, float x, float y) { *reinterpret_cast<float2*>(Wg + size_t(r) * Dk + col) = make_float2(x, y); },
                        {TermS{Tlo, lbE, Xhi, lbK, kE}, TermS{Thi, lbE, Xlo, lbK, kE}, TermS{Thi, lbE, Xhi, lbK, kE}});
  mm_s_to<false, false>(kE, Dv, [&](int r, int col, float x, float y) { *reinterpret_cast<float2*>(Ug + size_t(r) * Dv + col) = make_float2(x, y); },
                        {TermS{Thi, lbE, Vh, lbV, kE}});
  copy_tile(a.Tm + ch * kE * kE, kE, Tn, kLdE, kE, kE);
}

// ---- state: one block per (column block, bh), chunks in order ----
// The chunk's W, K and U columns are staged in shared memory with cp.async, two chunks deep: the
// next chunk's copies run while this one computes (the walk is sequential, so load latency would
// otherwise add up chunk after chunk).
template <Mma MM>
__global__ void __launch_bounds__(kThreads) state_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  const int BV = a.BV, ldS = BV + 4, c0 = blockIdx.x * BV, bh = blockIdx.y, Dk = a.Dk, Dv = a.Dv;
  const int ldK = Dk + 4, stage_floats = 2 * kE * ldK + kE * ldS;
  float* S = sm;                  // [Dk][ldS]
  float* Us = S + Dk * ldS;       // [64][ldS]
  float* stages = Us + kE * ldS;  // 2 x (W [64][ldK] | K [64][ldK] | U [64][ldS])
  __shared__ __align__(16) double G[2][kE];
  __shared__ float gam[kE], D[kE];
  auto issue = [&](int c) {
    float* st = stages + (c & 1) * stage_floats;
    const size_t ch = size_t(bh) * a.NC + c;
    if (threadIdx.x < kE / 2) __pipeline_memcpy_async(G[c & 1] + 2 * threadIdx.x, a.G + ch * kE + 2 * threadIdx.x, 16);
    copy_async(st, ldK, a.W + ch * kE * Dk, Dk, kE, Dk);
    copy_async(st + kE * ldK, ldK, a.Kc + ch * kE * Dk, Dk, kE, Dk);
    copy_async(st + 2 * kE * ldK, ldS, a.U + ch * kE * Dv + c0, Dv, kE, BV);
  };
  const float* init = a.state_io ? a.state_io + size_t(bh) * Dk * Dv : nullptr;
  each(Dk, BV, [&](int r, int col) { S[r * ldS + col] = init ? init[r * Dv + c0 + col] : 0.f; });
  issue(0);
  __pipeline_commit();
  for (int c = 0; c < a.NC; ++c) {
    const size_t ch = size_t(bh) * a.NC + c;
    __syncthreads();  // S is final; the stage refilled below is no longer read
    if (c + 1 < a.NC) issue(c + 1);
    __pipeline_commit();
    float* st = a.states + (size_t(bh) * (a.NC + 1) + c) * Dk * Dv;
    copy_tile(st + c0, Dv, S, ldS, Dk, BV);
    __pipeline_wait_prior(1);
    __syncthreads();
    if (threadIdx.x < kE) {
      const double* g = G[c & 1];
      gam[threadIdx.x] = expf(float(g[threadIdx.x]));
      D[threadIdx.x] = expf(float(g[kE - 1] - g[threadIdx.x]));
    }
    const float* Ws = stages + (c & 1) * stage_floats;
    const float* Ks = Ws + kE * ldK;
    const float* Ub = Ks + kE * ldK;
    mm<false, false, MM>(Us, ldS, Ws, ldK, S, ldS, kE, BV, Dk, -1.f, Ub, ldS, 1.f);
    __syncthreads();
    float* ut = a.Ut + ch * kE * Dv;
    each(kE, BV, [&](int i, int col) {
      const float u = Us[i * ldS + col];
      ut[i * Dv + c0 + col] = u;
      Us[i * ldS + col] = u * D[i];
    });
    __syncthreads();
    mm<true, false, MM>(S, ldS, Ks, ldK, Us, ldS, Dk, BV, kE, 1.f, S, ldS, gam[kE - 1]);
  }
  __syncthreads();
  float* st = a.states + (size_t(bh) * (a.NC + 1) + a.NC) * Dk * Dv;
  float* fin = a.state_io ? a.state_io + size_t(bh) * Dk * Dv : nullptr;
  copy_tile(st + c0, Dv, S, ldS, Dk, BV);
  if (fin) copy_tile(fin + c0, Dv, S, ldS, Dk, BV);
}

// The walks' common pieces (state_s_kernel, dstate_s_kernel):
// gamma_i = exp(G_i) and D_i = exp(G_63 - G_i) of one chunk's G (by its first 64 threads).
__device__ __forceinline__ void walk_decays(const double* G, float* gam, float* D) {
  const int i = threadIdx.x;
  if (i < kE) {
    gam[i] = expf(float(G[i]));
    D[i] = expf(float(G[kE - 1] - G[i]));
  }
}
// stage_tile's put for -W as a bf16 part and remainder (two tiles, leading dimension ld).
__device__ __forceinline__ auto negated_split_rows(bf16* hi, bf16* lo, int ld) {
  return [=](int r, int col, float4 v) {
    put_split(hi + r * ld + col, lo + r * ld + col, -v.x, -v.y);
    put_split(hi + r * ld + col + 2, lo + r * ld + col + 2, -v.z, -v.w);
  };
}
// mm_s_to's epilogue for a walked state: S = g S + (the products), in fp32 (S, ldS) and as a bf16
// part and remainder (hi, lo, ld) for the next chunk's products.
__device__ __forceinline__ auto decayed_state(float* S, int ldS, bf16* hi, bf16* lo, int ld, float g) {
  return [=](int r, int col, float x, float y) {
    float2& s = *reinterpret_cast<float2*>(S + r * ldS + col);
    s.x = g * s.x + x, s.y = g * s.y + y;
    put_split(hi + r * ld + col, lo + r * ld + col, s.x, s.y);
  };
}

// ---- state on bf16 tiles (Mma::Bf16, Dv a multiple of 32): the state kernel's walk with its two
// products on operands staged as bf16 parts and remainders (ldmatrix), at the carry's accuracy ----
// Per chunk: A: U~ = U - W S (three bf16 products on split W and S), written out in fp32 and, times
// D, as a bf16 part and remainder; B: S = gamma_63 S + K~^T diag(D) U~ (two: K~ is bf16 already),
// fp32 in shared memory and as parts. K~ of chunk c is loaded at the start of phase A of chunk c
// and W of chunk c + 1 at the start of phase B of chunk c, each held in registers over the
// phase's products and stored after them (U of chunk c + 1 by cp.async, as fp32), each asked of L2
// a phase ahead. (H200, each against the form before in one call: staging each operand in the
// phase that does not read it, 338 -> 308 us at B 8 x T 2048 x H 8 and 1326 -> 1187 us at B 8 x
// T 4096 x H 16; holding its loads in registers over the products, 307 -> 280 and 1179 -> 1090 us.
// Not taken: blocks of 32 columns, two per SM, 1384 us at the larger shape; nor, where blocks of 64
// columns leave SMs idle, blocks of 32 columns of 8 warps, two per SM: at the smaller shape 128 ->
// 256 blocks, 297 -> 399 us under ncu, the forward 784 -> 887 us — each block still stages every
// chunk's W and K, and the chain of chunks is no shorter.)
// WIDE: one block per sequence and head, all Dv columns (BV = Dv, up to 128), where blocks of BV
// columns would take more waves of the SMs (state_walk_wide): U is then read into registers by
// each warp for its strips of phase A instead of staged (its 34 KB of shared memory do not fit
// beside the rest at Dv = 128: 224 KB), and phase A has a strip for every warp. Each result is
// the same sequence of MMAs either way. (H200, B 8 x T 4096 x H 16: 128 blocks in one wave
// instead of 256 in two, 1025-1031 -> 729-733 us; a chunk costs a block 11.4 us instead of 8.2.)
struct StateSLayout {
  size_t S, hi, lo, U, Whi, Wlo, K, Uhi, Ulo, bytes;  // byte offsets
};
__host__ __device__ inline StateSLayout state_s_layout(int Dk, int BV, bool wide) {
  const size_t lbK = Dk + kBfPad, lbS = BV + kBfPad;
  StateSLayout L{};
  SmemCursor cur;
  auto take = [&](size_t bytes) { return cur.take(bytes); };
  L.S = take(size_t(Dk) * (BV + 4) * 4);
  L.hi = take(Dk * lbS * 2), L.lo = take(Dk * lbS * 2);
  L.U = wide ? 0 : take(size_t(kE) * (BV + 4) * 4);
  L.Whi = take(kE * lbK * 2), L.Wlo = take(kE * lbK * 2), L.K = take(kE * lbK * 2);
  L.Uhi = take(kE * lbS * 2), L.Ulo = take(kE * lbS * 2);
  L.bytes = cur.off;
  return L;
}

template <Mma MM, bool WIDE>
__global__ void __launch_bounds__(kThreads) state_s_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  const int BV = WIDE ? a.Dv : a.BV, c0 = blockIdx.x * BV, bh = blockIdx.y, Dk = a.Dk, Dv = a.Dv;
  const StateSLayout L = state_s_layout(Dk, BV, WIDE);
  const int lbK = Dk + kBfPad, lbS = BV + kBfPad, ldS = BV + 4;
  auto hp = [&](size_t off) { return reinterpret_cast<bf16*>(smb + off); };
  float* S = reinterpret_cast<float*>(smb + L.S);  // [Dk][ldS]
  float* Uf = reinterpret_cast<float*>(smb + L.U); // [64][ldS]: U's columns
  bf16 *Shi = hp(L.hi), *Slo = hp(L.lo), *Whi = hp(L.Whi), *Wlo = hp(L.Wlo), *Kh = hp(L.K), *Uhi = hp(L.Uhi),
       *Ulo = hp(L.Ulo);
  __shared__ float gam[2][kE], D[2][kE];
  auto chunk = [&](int c) { return size_t(bh) * a.NC + c; };
  // Phase A's operands of chunk c: -W as a bf16 part and remainder, U (cp.async: the caller
  // commits and waits), the decays. Phase B's: K~.
  auto w_tile = [&](int c) {
    return stage_tile(a.W + chunk(c) * kE * Dk, kE, Dk, row_stride(Dk), negated_split_rows(Whi, Wlo, lbK));
  };
  auto k_tile = [&](int c) { return stage_tile(a.Kc + chunk(c) * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(Kh, lbK)); };
  auto decays_and_u = [&](int c) {
    walk_decays(a.G + chunk(c) * kE, gam[c & 1], D[c & 1]);
    if constexpr (!WIDE) copy_async(Uf, ldS, a.U + chunk(c) * kE * Dv + c0, Dv, kE, BV);
  };
  const float* init = a.state_io ? a.state_io + size_t(bh) * Dk * Dv : nullptr;
  each(Dk, BV, [&](int r, int col) {
    const float x = init ? init[r * Dv + c0 + col] : 0.f;
    const bf16 hi = __float2bfloat16_rn(x);
    S[r * ldS + col] = x;
    Shi[r * lbS + col] = hi;
    Slo[r * lbS + col] = __float2bfloat16_rn(x - __bfloat162float(hi));
  });
  decays_and_u(0);
  stage(w_tile(0));
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  for (int c = 0; c < a.NC; ++c) {
    const size_t ch = chunk(c);
    const bool next = c + 1 < a.NC;
    // Phase A: S (the chunk's start) out; U~ = U - W S. The chunk's K~ is loaded meanwhile (held in
    // registers, stored after the products), the next chunk's W and U asked of L2.
    HeldTile<decltype(k_tile(c))> kt(k_tile(c));
    kt.load();
    if (next) {
      prefetch_l2(a.W + (ch + 1) * kE * Dk, kE, Dk, row_stride(Dk));
      prefetch_l2(a.U + (ch + 1) * kE * Dv + c0, kE, BV, row_stride(Dv));
    }
    const size_t s_at = (size_t(bh) * (a.NC + 1) + c) * Dk * Dv + c0;
    if (a.hs)
      put_bf16_tile(a.states, s_at, Dv, Shi, lbS, Dk, BV);
    else
      copy_tile(a.states + s_at, Dv, S, ldS, Dk, BV);
    {
      const size_t ut = ch * kE * Dv + c0;
      const float* Dc = D[c & 1];
      // U~ = U + (the products) at (r, col), (r, col + 1): out, and times D as parts.
      auto put_ut = [&](int r, int col, float x, float y) {
        put_pair_of(a.Ut, a.hs, ut + size_t(r) * Dv + col, x, y);
        put_split(Uhi + r * lbS + col, Ulo + r * lbS + col, Dc[r] * x, Dc[r] * y);
      };
      const TermS terms[3] = {TermS{Wlo, lbK, Shi, lbS, Dk}, TermS{Whi, lbK, Slo, lbS, Dk},
                              TermS{Whi, lbK, Shi, lbS, Dk}};
      if constexpr (WIDE) {
        // mm_s_to's strips, each warp's U for its strip loaded before the strip's products.
        const float* Ug = a.U + ch * kE * Dv + c0;
        const int sn = BV >> 5, strips = (kE >> 4) * sn, lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
        for (int t = threadIdx.x >> 5; t < strips; t += nwarps()) {
          const int m0 = (t / sn) * 16, n0 = (t % sn) * 32;
          float2 u[4][2];
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              u[q][hh] = *reinterpret_cast<const float2*>(Ug + size_t(m0 + g + 8 * hh) * Dv + n0 + 8 * q + t2);
          float acc[4][4];
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
#pragma unroll
          for (int i = 0; i < 3; ++i) strip_s<false, false>(acc, terms[i].A, terms[i].lda, terms[i].B, terms[i].ldb, m0, n0, Dk);
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              put_ut(m0 + g + 8 * hh, n0 + 8 * q + t2, acc[q][2 * hh] + u[q][hh].x, acc[q][2 * hh + 1] + u[q][hh].y);
        }
      } else {
        mm_s_to<false, false>(
            kE, BV,
            [&](int r, int col, float x, float y) {
              const float2 u = *reinterpret_cast<const float2*>(Uf + r * ldS + col);
              put_ut(r, col, x + u.x, y + u.y);
            },
            terms);
      }
    }
    kt.put();
    __syncthreads();
    // Phase B: S = gamma_63 S + K^T diag(D) U~. The next chunk's W is loaded meanwhile (held, then
    // split and stored), its U copied (cp.async) and its decays formed; its K~ asked of L2.
    HeldTile<decltype(w_tile(c))> wt(w_tile(next ? c + 1 : c));
    if (next) {
      wt.load();
      decays_and_u(c + 1);
      prefetch_l2(a.Kc + (ch + 1) * kE * Dk, kE, Dk, row_stride(Dk));
    }
    const float g63 = gam[c & 1][kE - 1];
    mm_s_to<true, false>(
        Dk, BV,
        decayed_state(S, ldS, Shi, Slo, lbS, g63),
        {TermS{Kh, lbK, Ulo, lbS, kE}, TermS{Kh, lbK, Uhi, lbS, kE}});
    if (next) wt.put();
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
  }
  const size_t s_at = (size_t(bh) * (a.NC + 1) + a.NC) * Dk * Dv + c0;
  if (a.hs)
    put_bf16_tile(a.states, s_at, Dv, Shi, lbS, Dk, BV);
  else
    copy_tile(a.states + s_at, Dv, S, ldS, Dk, BV);
  if (a.state_io) copy_tile(a.state_io + size_t(bh) * Dk * Dv + c0, Dv, S, ldS, Dk, BV);
}

// ---- output: one block per (chunk, bh, column block) ----
// o = scale (diag(gamma) Q S0 + P U~), its four operands staged once as fp32 tiles (mm).
template <Mma MM>
__global__ void __launch_bounds__(kThreads) output_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H, BV = a.BV, ldS = BV + 4;
  const int c0 = blockIdx.z * BV, Dk = a.Dk, Dv = a.Dv, ldK = Dk + 4;
  const size_t ch = size_t(bh) * a.NC + c;
  __shared__ double G[kE];
  __shared__ float gam[kE], D[kE];
  const float* S0g = a.states + (size_t(bh) * (a.NC + 1) + c) * Dk * Dv + c0;
  float* Qs = sm;                   // [Rp][ldK]
  float* S0 = Qs + a.Rp * ldK;      // [Dk][ldS]
  float* Ub = S0 + Dk * ldS;        // [64][ldS] U~ columns
  float* Ps = Ub + kE * ldS;        // [Rp][kLdE]
  float* Os = Ps + a.Rp * kLdE;     // [Rp][ldS]: the outputs' columns
  copy_async(Qs, ldK, a.Qc + ch * a.Rp * Dk, Dk, a.Rp, Dk);
  copy_async(S0, ldS, S0g, Dv, Dk, BV);
  copy_async(Ub, ldS, a.Ut + ch * kE * Dv + c0, Dv, kE, BV);
  copy_async(Ps, kLdE, a.Pm + ch * a.Rp * kE, kE, a.Rp, kE);
  __pipeline_commit();
  load_decays(a, ch, G, gam, D);
  __pipeline_wait_prior(0);
  __syncthreads();
  mm<false, false, MM>(Os, ldS, Qs, ldK, S0, ldS, a.Rp, BV, Dk, 1.f);
  __syncthreads();
  each(a.Rp, BV, [&](int r, int col) { Os[r * ldS + col] *= row_ok(a, c, r) ? gam[r * a.nh + a.nh - 1] : 0.f; });
  __syncthreads();
  mm<false, false, MM>(Os, ldS, Ps, kLdE, Ub, ldS, a.Rp, BV, kE, a.scale, Os, ldS, a.scale);
  __syncthreads();
  scatter_rows(a.o, Os, ldS, a.Rp, BV, false, [&](int r) {
    const long long o = out_row(a, b, h, c, r);
    return o < 0 ? o : o + c0;
  });
}

// ---- output on bf16 tiles (Mma::Bf16, column blocks of 32 or 64), in one pass ----
// Q, S0, U~ and P are staged once as bf16 tiles (their loads in flight together); each warp then
// takes 16 x 32 strips of o: Q S0 into its registers, each row times its gamma, P U~ added by the
// same MMAs, and the strip, times scale, stored straight to o. No fp32 output tile, so ~54 KB of
// shared memory at head dim 128 and four blocks of 8 warps per SM (registers capped at 64 for
// it), where the form with an output tile and a scatter pass held two.
__host__ __device__ constexpr bool output_bf16_tiles(Mma mm, int BV) { return mm == Mma::Bf16 && BV % 32 == 0; }
constexpr int kOutputSBlocks = 4;  // blocks per SM the launch bounds ask for

struct OutputSLayout {
  size_t Q, S, U, P, bytes;  // byte offsets
};
__host__ __device__ inline OutputSLayout output_s_layout(int Dk, int BV, int Rp) {
  const size_t lbK = Dk + kBfPad, lbS = BV + kBfPad, lbE = kE + kBfPad;
  OutputSLayout L{};
  SmemCursor cur;
  L.Q = cur.take(Rp * lbK * 2), L.S = cur.take(Dk * lbS * 2), L.U = cur.take(kE * lbS * 2);
  L.P = cur.take(Rp * lbE * 2);
  L.bytes = cur.off;
  return L;
}

template <Mma MM>
__global__ void __launch_bounds__(kPrepThreads, kOutputSBlocks) output_s_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H, BV = a.BV, Rp = a.Rp;
  const int c0 = blockIdx.z * BV, Dk = a.Dk, Dv = a.Dv, nh = a.nh;
  const int lbK = Dk + kBfPad, lbS = BV + kBfPad, lbE = kE + kBfPad;
  const size_t ch = size_t(bh) * a.NC + c;
  __shared__ double G[kE];
  __shared__ float gam[kE], D[kE];
  const OutputSLayout L = output_s_layout(Dk, BV, Rp);
  bf16 *Qh = reinterpret_cast<bf16*>(smb + L.Q), *Sh = reinterpret_cast<bf16*>(smb + L.S);
  bf16 *Uh = reinterpret_cast<bf16*>(smb + L.U), *Ph = reinterpret_cast<bf16*>(smb + L.P);
  // S0 and U~ by cp.async where they are bf16 in memory (H200: 490-495 -> 464-470 us at B 8 x
  // T 4096 x H 16), the others two tiles' loads in flight at a time (all four: 64 more registers,
  // which spill under the cap).
  const StageToBf16 s0 =
      copy_or_stage_to_bf16(a.states, a.hs, (size_t(bh) * (a.NC + 1) + c) * Dk * Dv + c0, Dv, Dk, BV, Sh, lbS);
  const StageToBf16 ut = copy_or_stage_to_bf16(a.Ut, a.hs, ch * kE * Dv + c0, Dv, kE, BV, Uh, lbS);
  __pipeline_commit();
  const auto qt = stage_tile(a.Qc + ch * Rp * Dk, Rp, Dk, row_stride(Dk), bf16_rows(Qh, lbK));
  const auto pt = stage_tile(a.Pm + ch * Rp * kE, Rp, kE, row_stride(kE), bf16_rows(Ph, lbE));
  if (a.hs) {  // S0 and U~ by cp.async: Q's and P's loads in flight together
    stage(qt, pt);
  } else {
    stage(qt, s0);
    stage(ut, pt);
  }
  load_decays(a, ch, G, gam, D);
  __pipeline_wait_prior(0);
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, sn = BV >> 5, strips = (Rp >> 4) * sn;
  const float scale = a.scale;
  for (int t = threadIdx.x >> 5; t < strips; t += nwarps()) {
    const int m0 = (t / sn) * 16, n0 = (t % sn) * 32;
    float acc[4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    strip_s<false, false>(acc, Qh, lbK, Sh, lbS, m0, n0, Dk);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // rows m0 + g and m0 + g + 8: times gamma (0 past the chunk)
      const int r = m0 + g + 8 * hh;
      const float f = row_ok(a, c, r) ? gam[r * nh + nh - 1] : 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q][2 * hh] *= f, acc[q][2 * hh + 1] *= f;
    }
    strip_s<false, false>(acc, Ph, lbE, Uh, lbS, m0, n0, kE);
    strip_out(acc, m0, n0, [&](int r, int col, float x, float y) {
      const long long o = out_row(a, b, h, c, r);
      if (o < 0) return;
      float* p = a.o + o + c0 + col;
      if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
        *reinterpret_cast<float2*>(p) = make_float2(scale * x, scale * y);
      } else {
        p[0] = scale * x, p[1] = scale * y;
      }
    });
  }
}

// ---- dstate: one block per (column block, bh), chunks in reverse ----
// Each operand buffer is refilled for the next chunk (in walk order) by cp.async as soon as the
// chunk's last product with it is done, one group per buffer in the order the products use them
// (K and G; P; Q and dO; W), so the copies run while the chunk computes and every wait below is
// for a group committed two or three groups before.
template <Mma MM>
__global__ void __launch_bounds__(kThreads) dstate_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  const int bh = blockIdx.y, b = bh / a.H, h = bh % a.H, BV = a.BV, ldS = BV + 4, c0 = blockIdx.x * BV;
  const int Dk = a.Dk, Dv = a.Dv, ldK = Dk + 4, tid = threadIdx.x;
  float* dS = sm;                   // [Dk][ldS]
  float* Ps = dS + Dk * ldS;        // [Rp][kLdE]
  float* dO = Ps + a.Rp * kLdE;     // [Rp][ldS]
  float* dU = dO + a.Rp * ldS;      // [64][ldS]
  float* Ks = dU + kE * ldS;        // [64][ldK]
  float* Qs = Ks + kE * ldK;        // [Rp][ldK]
  float* Ws = Qs + a.Rp * ldK;      // [64][ldK]
  __shared__ __align__(16) double G[kE];
  __shared__ float gam[kE], D[kE];
  auto chunk = [&](int c) { return size_t(bh) * a.NC + c; };
  auto issue_k = [&](int c) {
    if (c >= 0) {
      copy_async(Ks, ldK, a.Kc + chunk(c) * kE * Dk, Dk, kE, Dk);
      if (tid < kE / 2) __pipeline_memcpy_async(G + 2 * tid, a.G + chunk(c) * kE + 2 * tid, 16);
    }
    __pipeline_commit();
  };
  auto issue_p = [&](int c) {
    if (c >= 0) copy_async(Ps, kLdE, a.Pm + chunk(c) * a.Rp * kE, kE, a.Rp, kE);
    __pipeline_commit();
  };
  auto issue_q = [&](int c) {
    if (c >= 0) {
      copy_async(Qs, ldK, a.Qc + chunk(c) * a.Rp * Dk, Dk, a.Rp, Dk);
      gather_rows_async(dO, ldS, a.dout, a.Rp, BV, [&](int r) {
        const long long o = out_row(a, b, h, c, r);
        return o < 0 ? o : o + c0;
      });
    }
    __pipeline_commit();
  };
  auto issue_w = [&](int c) {
    copy_async(Ws, ldK, a.W + chunk(c) * kE * Dk, Dk, kE, Dk);
    __pipeline_commit();
  };
  each(Dk, ldS, [&](int r, int col) { dS[r * ldS + col] = 0.f; });
  issue_k(a.NC - 1);
  issue_p(a.NC - 1);
  issue_q(a.NC - 1);
  for (int c = a.NC - 1; c >= 0; --c) {
    const size_t ch = chunk(c);
    __syncthreads();  // the chunk before is done: dS is final, Ws free
    issue_w(c);
    copy_tile(a.dS + ch * Dk * Dv + c0, Dv, dS, ldS, Dk, BV);
    __pipeline_wait_prior(3);  // K, G
    __syncthreads();
    if (tid < kE) {
      gam[tid] = expf(float(G[tid]));
      D[tid] = expf(float(G[kE - 1] - G[tid]));
    }
    // The two products that carry dS from chunk to chunk (K dS here, W^T dU~ below) at kCarry's
    // accuracy, as the state kernel's.
    mm<false, false, kCarry<MM>>(dU, ldS, Ks, ldK, dS, ldS, kE, BV, Dk, 1.f);
    __syncthreads();
    issue_k(c - 1);
    each(kE, BV, [&](int i, int col) { dU[i * ldS + col] *= D[i]; });
    __pipeline_wait_prior(2);  // P, Q, dO
    __syncthreads();
    mm<true, false, MM>(dU, ldS, Ps, kLdE, dO, ldS, kE, BV, a.Rp, a.scale, dU, ldS, 1.f);  // += scale P^T dO
    __syncthreads();
    issue_p(c - 1);
    copy_tile(a.dUt + ch * kE * Dv + c0, Dv, dU, ldS, kE, BV);
    each(a.Rp, BV, [&](int r, int col) { dO[r * ldS + col] *= row_ok(a, c, r) ? a.scale * gam[r * a.nh + a.nh - 1] : 0.f; });
    __syncthreads();
    // dS0 = gamma_63 dS + scale Q^T diag(gamma) dO - W^T dU~
    mm<true, false, MM>(dS, ldS, Qs, ldK, dO, ldS, Dk, BV, a.Rp, 1.f, dS, ldS, gam[kE - 1]);
    __syncthreads();
    issue_q(c - 1);
    __pipeline_wait_prior(3);  // W
    __syncthreads();
    mm<true, false, kCarry<MM>>(dS, ldS, Ws, ldK, dU, ldS, Dk, BV, kE, -1.f, dS, ldS, 1.f);
  }
}

// ---- dstate on bf16 tiles (Mma::Bf16, Dv a multiple of 32): the dstate kernel's walk with every
// product an MMA on operands staged as bf16 tiles (ldmatrix) ----
// ncu had the fp32-tile dstate kernel under bf16 products bound by its instruction count (an
// instruction every 6.7 cycles per warp, ~35 per MMA: loads and conversions of fp32 operands). Per
// chunk, two phases:
//   A: dU~ = diag(D) K dS + scale P^T dO (written out in fp32, and as a bf16 part and remainder)
//   B: dS = gamma_63 dS + scale Q^T diag(gamma) dO - W^T dU~ (fp32 in shared memory, and as parts)
// The products that carry dS (K dS, W^T dU~) at the carry's accuracy, as three bf16 products on
// split operands (Bf16x3; K~ is bf16 already, so K dS is two); the others in bf16. Operands are
// staged for the phase that does not read them while the other computes: Q, diag(gamma) dO and W
// of chunk c during phase A of chunk c, K, P and dO of chunk c - 1 during phase B of chunk c (the
// warps that have no strip of a phase's product start staging at once), a stage's tiles loaded
// together (stage) and its lines asked of L2 a phase ahead. (H200, the same call: 530 -> 362 us at
// B 8 x T 2048 x H 8, 2069 -> 1412 us at B 8 x T 4096 x H 16; 425 us with the tiles staged one
// after the other and no prefetch.)
// WIDE: one block per sequence and head, all Dv columns (BV = Dv, up to 128), where blocks of BV
// columns would take more waves of the SMs (dstate_walk_wide), as the state walk's. Its fp32 dS
// (67 KB at head dim 128) does not fit beside the rest, so it is kept exactly as three bf16 parts:
// the part and remainder the products read (shared memory) and the remainder's remainder, which
// phase B's warps hold in registers for their strips (a warp has the same strips every chunk).
// hi + lo + lo2 is the fp32 value bit for bit (x - bf16(x) has at most 16 significant bits,
// its own remainder at most 8), so the walk is the narrow one's, bit for bit.
struct DstateSLayout {
  size_t dS, hi, lo, K, P, dO, Q, dOg, Whi, Wlo, Uhi, Ulo, bytes;  // byte offsets
};
__host__ __device__ inline DstateSLayout dstate_s_layout(int Dk, int BV, int Rp, bool wide) {
  const size_t lbK = Dk + kBfPad, lbS = BV + kBfPad, lbE = kE + kBfPad;
  DstateSLayout L{};
  SmemCursor cur;
  auto take = [&](size_t bytes) { return cur.take(bytes); };
  L.dS = wide ? 0 : take(size_t(Dk) * (BV + 4) * 4);
  L.hi = take(Dk * lbS * 2), L.lo = take(Dk * lbS * 2);
  L.K = take(kE * lbK * 2), L.P = take(Rp * lbE * 2), L.dO = take(Rp * lbS * 2);
  L.Q = take(Rp * lbK * 2), L.dOg = take(Rp * lbS * 2), L.Whi = take(kE * lbK * 2), L.Wlo = take(kE * lbK * 2);
  L.Uhi = take(kE * lbS * 2), L.Ulo = take(kE * lbS * 2);
  L.bytes = cur.off;
  return L;
}
__host__ __device__ constexpr bool walk_bf16_tiles(Mma mm, int Dv) { return mm == Mma::Bf16 && Dv % 32 == 0; }


// Phase B's strips a warp of a wide walk holds (dstate_walk_wide allows no more).
constexpr int kWideStrips = 2;
template <Mma MM, bool WIDE>
__global__ void __launch_bounds__(kThreads) dstate_s_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  const int bh = blockIdx.y, b = bh / a.H, h = bh % a.H, BV = WIDE ? a.Dv : a.BV, c0 = blockIdx.x * BV;
  const int Dk = a.Dk, Dv = a.Dv, Rp = a.Rp, nh = a.nh, tid = threadIdx.x, warp = tid >> 5;
  const DstateSLayout L = dstate_s_layout(Dk, BV, Rp, WIDE);
  const int lbK = Dk + kBfPad, lbS = BV + kBfPad, lbE = kE + kBfPad, ldS = BV + 4;
  auto hp = [&](size_t off) { return reinterpret_cast<bf16*>(smb + off); };
  float* dS = reinterpret_cast<float*>(smb + L.dS);
  bf16 *Shi = hp(L.hi), *Slo = hp(L.lo), *Kh = hp(L.K), *Ph = hp(L.P), *dOh = hp(L.dO), *Qh = hp(L.Q);
  bf16 *dOg = hp(L.dOg), *Whi = hp(L.Whi), *Wlo = hp(L.Wlo), *Uhi = hp(L.Uhi), *Ulo = hp(L.Ulo);
  __shared__ float gam[2][kE], D[2][kE];
  auto chunk = [&](int c) { return size_t(bh) * a.NC + c; };
  auto dout_row = [&](int c, int r) {
    const long long o = out_row(a, b, h, c, r);
    return o < 0 ? o : o + c0;
  };
  // Phase A's operands of chunk c: K, P, dO; and its decays.
  auto stage1 = [&](int c) {
    const size_t ch = chunk(c);
    walk_decays(a.G + ch * kE, gam[c & 1], D[c & 1]);
    stage(stage_tile(a.Kc + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(Kh, lbK)),
          stage_tile(a.Pm + ch * Rp * kE, Rp, kE, row_stride(kE), bf16_rows(Ph, lbE)),
          stage_tile(a.dout, Rp, BV, [&](int r) { return dout_row(c, r); }, bf16_rows(dOh, lbS)));
  };
  // Phase B's of chunk c: Q, scale diag(gamma) dO, and -W as a bf16 part and remainder. (Staged
  // by the 8 warps that have no strip in phase A alone, instead of by all after their strips: no
  // change, H200, 358-360 vs 361 us at B 8 x T 2048 x H 8, 1401 vs 1396-1398 us at B 8 x T 4096 x
  // H 16, +1 % with sub-steps; the strips, not their share of the staging, set the phase's time.)
  auto stage2 = [&](int c) {
    const size_t ch = chunk(c);
    const float* gm = gam[c & 1];
    stage(stage_tile(a.Qc + ch * Rp * Dk, Rp, Dk, row_stride(Dk), bf16_rows(Qh, lbK)),
          stage_tile(a.dout, Rp, BV, [&](int r) { return dout_row(c, r); },
                     [&](int r, int col, float4 v) {
                       put_bf16x4(dOg + r * lbS + col, v, row_ok(a, c, r) ? a.scale * gm[r * nh + nh - 1] : 0.f);
                     }),
          stage_tile(a.W + ch * kE * Dk, kE, Dk, row_stride(Dk), negated_split_rows(Whi, Wlo, lbK)));
  };
  // The lines of the stages of chunk c, into L2 a phase before they are staged.
  auto prefetch1 = [&](int c) {
    const size_t ch = chunk(c);
    prefetch_l2(a.Kc + ch * kE * Dk, kE, Dk, row_stride(Dk));
    prefetch_l2(a.Pm + ch * Rp * kE, Rp, kE, row_stride(kE));
    prefetch_l2(a.dout, Rp, BV, [&](int r) { return dout_row(c, r); });
  };
  auto prefetch2 = [&](int c) {
    const size_t ch = chunk(c);
    prefetch_l2(a.Qc + ch * Rp * Dk, Rp, Dk, row_stride(Dk));
    prefetch_l2(a.W + ch * kE * Dk, kE, Dk, row_stride(Dk));
  };
  if constexpr (!WIDE) each(Dk, BV, [&](int r, int col) { dS[r * ldS + col] = 0.f; });
  each(Dk, BV, [&](int r, int col) { Shi[r * lbS + col] = Slo[r * lbS + col] = __float2bfloat16_rn(0.f); });
  uint32_t lo2[kWideStrips][4][2] = {};  // WIDE: the remainders' remainders of this lane's dS pairs
  stage1(a.NC - 1);
  __syncthreads();
  const int lane = tid & 31, g = lane >> 2, sn = BV >> 5;
  for (int c = a.NC - 1; c >= 0; --c) {
    const size_t ch = chunk(c);
    // Phase A: dS (after chunk c) out; dU~.
    if (c > 0) prefetch1(c - 1);
    if (WIDE || a.hg)  // (a wide walk runs only with a.hg)
      put_bf16_tile(a.dS, ch * Dk * Dv + c0, Dv, Shi, lbS, Dk, BV);
    else
      copy_tile(a.dS + ch * Dk * Dv + c0, Dv, dS, ldS, Dk, BV);
    {
      const float* Dc = D[c & 1];
      const size_t dUg = ch * kE * Dv + c0;
      for (int t = warp; t < (kE >> 4) * sn; t += nwarps()) {
        const int m0 = (t / sn) * 16, n0 = (t % sn) * 32;
        float acc[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
        strip_s<false, false>(acc, Kh, lbK, Slo, lbS, m0, n0, Dk);
        strip_s<false, false>(acc, Kh, lbK, Shi, lbS, m0, n0, Dk);
        const float f0 = Dc[m0 + g] / a.scale, f1 = Dc[m0 + g + 8] / a.scale;
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q][0] *= f0, acc[q][1] *= f0, acc[q][2] *= f1, acc[q][3] *= f1;
        strip_s<true, false>(acc, Ph, lbE, dOh, lbS, m0, n0, Rp);
        strip_out(acc, m0, n0, [&](int r, int col, float x, float y) {
          x *= a.scale, y *= a.scale;
          put_pair_of(a.dUt, a.hg, dUg + size_t(r) * Dv + col, x, y);
          put_split(Uhi + r * lbS + col, Ulo + r * lbS + col, x, y);
        });
      }
    }
    stage2(c);
    __syncthreads();
    // Phase B: dS0 = gamma_63 dS + scale Q^T diag(gamma) dO - W^T dU~ (W negated when staged; the
    // remainders' products first).
    if (c > 0) prefetch2(c - 1);
    const float g63 = gam[c & 1][kE - 1];
    const TermS terms[4] = {TermS{Wlo, lbK, Uhi, lbS, kE}, TermS{Whi, lbK, Ulo, lbS, kE}, TermS{Qh, lbK, dOg, lbS, Rp},
                            TermS{Whi, lbK, Uhi, lbS, kE}};
    if constexpr (WIDE) {
      // mm_s_to's strips and epilogue (decayed_state), dS read from and written to its three parts.
      const int strips = (Dk >> 4) * sn, t2 = (lane & 3) * 2;
#pragma unroll
      for (int s = 0; s < kWideStrips; ++s) {
        const int t = warp + s * kMaxWarps;
        if (t >= strips) break;
        const int m0 = (t / sn) * 16, n0 = (t % sn) * 32;
        float acc[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) strip_s<true, false>(acc, terms[i].A, terms[i].lda, terms[i].B, terms[i].ldb, m0, n0, terms[i].K);
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int at = (m0 + g + 8 * hh) * lbS + n0 + 8 * q + t2;
            uint32_t& r2 = lo2[s][q][hh];
            float2 x = join3(*reinterpret_cast<const uint32_t*>(Shi + at), *reinterpret_cast<const uint32_t*>(Slo + at), r2);
            x.x = g63 * x.x + acc[q][2 * hh], x.y = g63 * x.y + acc[q][2 * hh + 1];
            split3(x, reinterpret_cast<uint32_t*>(Shi + at), reinterpret_cast<uint32_t*>(Slo + at), r2);
          }
      }
    } else {
      mm_s_to<true, false>(Dk, BV, decayed_state(dS, ldS, Shi, Slo, lbS, g63), terms);
    }
    if (c > 0) stage1(c - 1);
    __syncthreads();
  }
}

// Sums of a block's per-thread values (deterministic: warps by shuffles, then warp 0 in order).
__device__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < nwarps(); ++w) s += red[w];
  return s;
}

// The end of the grad kernels: the beta logits' gradients from dbeta, and the gates' from dG by a
// reverse cumulative sum (G_i sums the gates of events 0..i), G_63's own gradient (dGL) first. dG,
// dbeta and beta in shared memory, final (a barrier after their last writes).
__device__ void write_beta_gate_grads(const Args& a, int b, int h, int c, const float* beta, const float* dbeta,
                                      float* dG, float dGL) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    dG[kE - 1] += dGL;
    float acc = 0.f;
    for (int i = kE - 1; i >= 0; --i) dG[i] = acc += dG[i];
  }
  __syncthreads();
  if (tid < kE) {
    const Ev e = event(a, c, tid);
    if (e.ok) {
      const size_t tb = tok_index(a, b, e.t);
      float* pb = a.dbl + tb * a.lb + size_t(e.j) * a.H + h;
      // d beta / dx = beta sigmoid(-x) (1 - sigmoid(x) is 0 in float from x ~ 17 on)
      const float v = dbeta[tid] * beta[tid] * sigmoidf(-a.bl[tb * a.lb + size_t(e.j) * a.H + h]);
      *pb = a.accumulate ? *pb + v : v;
      if (a.g && e.j == 0) {
        float* pg = a.dg + tb * a.H + h;
        *pg = a.accumulate ? *pg + dG[tid] : dG[tid];
      }
    }
  }
}

// The element terms both grad kernels share (their products differ; these are the same math on
// the same fp32 values). Shared arrays: G, gam, D, beta, dG, dbeta, tok, red as in the kernels.
// Per event of chunk c: beta, zeroed dG and dbeta, and the event's token within the chunk.
__device__ __forceinline__ void grad_events(const Args& a, int c, size_t ch, float* beta, float* dG, float* dbeta,
                                            int* tok) {
  const int tid = threadIdx.x;
  if (tid < kE) {
    beta[tid] = a.beta[ch * kE + tid];
    dG[tid] = dbeta[tid] = 0.f;
    tok[tid] = token_of(a, c, tid);
  }
}
// S_next = gamma_63 S0 + K^T diag(D) U~: d gamma_63 (as d G_63) = gamma_63 sum(dS . S0), by all
// threads (fp32 S0 and dS, Dk x Dv each); 0 without a gate.
__device__ float grad_gate_of_state(bool gated, const float* dS, const float* S0, int n, const float* gam, float* red) {
  if (!gated) return 0.f;
  float part = 0.f;
  for (int x = threadIdx.x; x < n; x += blockDim.x) part += dS[x] * S0[x];
  return gam[kE - 1] * block_sum(part, red);
}
// The same from bf16 tiles of dS and S0 in shared memory (rows x cols, leading dimension ld; cols
// even), after a barrier.
__device__ float grad_gate_of_state(bool gated, const bf16* dS, const bf16* S0, int rows, int cols, int ld,
                                    const float* gam, float* red) {
  if (!gated) return 0.f;
  float part = 0.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < rows; r += nwarps())
    for (int q = 2 * lane; q < cols; q += 64) {
      const float2 d = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dS + r * ld + q));
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(S0 + r * ld + q));
      part += d.x * x.x + d.y * x.y;
    }
  return gam[kE - 1] * block_sum(part, red);
}
// dK = diag(D) U~ dS^T in place. With a gate, dd_i = (K dS)_i . u~_i = k_i . (U~ dS^T)_i (read
// before the scaling): D_i = exp(G_63 - G_i) gives +dd D_i to G_63 (returned, by all threads) and
// -dd D_i to G_i. key(i, col): the chunk's rounded key k~_i.
template <class Key>
__device__ float grad_scale_dk(bool gated, float* dK, int ldK, int Dk, Key key, const float* D, const int* tok, float* dG,
                               float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float gl_part = 0.f;
  for (int i = warp; i < kE; i += nwarps()) {
    float dd = 0.f;
    for (int col = lane; col < Dk; col += 32) {
      float& x = dK[i * ldK + col];
      if (gated) dd += x * key(i, col);
      x *= D[i];
    }
    if (!gated) continue;
#pragma unroll
    for (int o = 16; o; o >>= 1) dd += __shfl_xor_sync(kFull, dd, o);
    if (tok[kE - 1] != tok[i]) {
      if (lane == 0) dG[i] -= dd * D[i];
      gl_part += dd * D[i];
    }
  }
  return gated ? block_sum(lane == 0 ? gl_part : 0.f, red) : 0.f;
}
// dQ = scale diag(gamma) dO S0^T in place (dQ's rows Rp, from dO S0^T); with a gate, d G_row +=
// dQ_r . q_r, a lane's values of q_r loaded before its first store (the stores to dQ may alias
// them as far as the compiler knows, so a load after a store would wait for it). Without a gate
// q is not read.
__device__ void grad_scale_dq(const Args& a, int c, float* dQ, int ldK, const float* Qc, const float* gam, float* dG) {
  constexpr int kU = 4;  // columns a lane holds at once (head dims up to 128 in one pass)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, Dk = a.Dk, nh = a.nh;
  const bool gated = a.g != nullptr;
  for (int r = warp; r < a.Rp; r += nwarps()) {
    const float f = row_ok(a, c, r) ? a.scale * gam[r * nh + nh - 1] : 0.f;
    float acc = 0.f;
    for (int c0 = 0; c0 < Dk; c0 += 32 * kU) {
      float q[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int col = c0 + lane + 32 * u;
        q[u] = gated && col < Dk ? Qc[size_t(r) * Dk + col] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int col = c0 + lane + 32 * u;
        if (col >= Dk) break;
        float& v = dQ[r * ldK + col];
        v *= f;
        acc += v * q[u];
      }
    }
    if (!gated) continue;
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(kFull, acc, o);
    if (lane == 0 && row_ok(a, c, r)) dG[r * nh + nh - 1] += acc;
  }
}
// The gate's sums of e = dP . P (E: [Rp][kLdE]): row sums to the reading event, column sums from
// the key's event.
__device__ __forceinline__ void grad_gate_of_e(bool gated, const float* E, int Rp, int nh, float* dG) {
  const int tid = threadIdx.x;
  if (gated && tid < kE) {
    float s = 0.f;
    for (int r = 0; r < Rp; ++r) s -= E[r * kLdE + tid];
    if (tid % nh == nh - 1 && tid / nh < Rp)
      for (int j = 0; j < kE; ++j) s += E[(tid / nh) * kLdE + j];
    dG[tid] += s;
  }
}
// Per event, from dX (the values' side, ldX) and dY (the keys', ldY): dv = beta dX, into dvs
// (shared, ldvs) where dvs is given, else into a.dv (added where a.accumulate); dbeta = dX . v +
// gamma dY . k; dK += beta gamma dY; dG += beta gamma dY . k. A lane's loads of a row's values (and
// of the dv it adds to), up to 8 of each, are all in flight before its first store: ncu had the
// bf16-tile grad kernel waiting 22 % of its time on this loop when each column's load of v, load
// of dv and store of dv followed one another (a store may alias the next load, so the compiler
// kept them in order: 8 round trips to memory a row).
template <class Key>
__device__ void grad_event_terms(const Args& a, int b, int h, int c, const float* dX, int ldX, const float* dY, int ldY,
                                 Key key, float* dK, int ldK, const float* beta, const float* gam, float* dbeta, float* dG,
                                 float* dvs, int ldvs) {
  constexpr int kU = 8;  // columns a lane holds at once (head dims up to 256 in one pass)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < kE; i += nwarps()) {
    float dvd = 0.f, dkd = 0.f;
    const long long vrow = value_row(a, b, h, c, i);
    const bool add = dvs == nullptr && a.accumulate && vrow >= 0;
    for (int c0 = 0; c0 < a.Dv; c0 += 32 * kU) {
      float x[kU], v[kU], old[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int col = c0 + lane + 32 * u;
        const bool in = col < a.Dv;
        x[u] = in ? dX[i * ldX + col] : 0.f;
        v[u] = in && vrow >= 0 ? a.v[vrow + col] : 0.f;
        old[u] = in && add ? a.dv[vrow + col] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int col = c0 + lane + 32 * u;
        if (col >= a.Dv) continue;
        dvd += x[u] * v[u];
        if (dvs)
          dvs[i * ldvs + col] = beta[i] * x[u];
        else if (vrow >= 0)
          a.dv[vrow + col] = old[u] + beta[i] * x[u];
      }
    }
    const float bg = beta[i] * gam[i];
    for (int col = lane; col < a.Dk; col += 32) {
      const float y = dY[i * ldY + col];
      dkd += y * key(i, col);
      dK[i * ldK + col] += bg * y;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
      dvd += __shfl_xor_sync(kFull, dvd, o);
      dkd += __shfl_xor_sync(kFull, dkd, o);
    }
    if (lane == 0) {
      dbeta[i] += dvd + gam[i] * dkd;
      dG[i] += bg * dkd;
    }
  }
}
// dbeta_i += sum_j e2_ij, and the gate's sums of beta_i e2_ij (+ row, - column; not within a
// token), from e2 = dM . A (E: [64][kLdE], strictly lower).
__device__ __forceinline__ void grad_beta_of_e2(bool gated, const float* E, const float* beta, const int* tok,
                                                float* dbeta, float* dG) {
  const int tid = threadIdx.x;
  if (tid < kE) {
    float db = 0.f, row = 0.f, col = 0.f;
    for (int j = 0; j < tid; ++j) {
      db += E[tid * kLdE + j];
      if (gated && tok[tid] != tok[j]) row += beta[tid] * E[tid * kLdE + j];
    }
    if (gated)
      for (int i = tid + 1; i < kE; ++i)
        if (tok[i] != tok[tid]) col += beta[i] * E[i * kLdE + tid];
    dbeta[tid] += db;
    dG[tid] += row - col;
  }
}

// ---- grad: one block per chunk (grid NC x BH), all of Dk and Dv ----
template <Mma MM>
__global__ void __launch_bounds__(kThreads) grad_kernel(Args a) {
  extern __shared__ __align__(128) float sm[];
  const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H, Dk = a.Dk, Dv = a.Dv;
  const int Rp = a.Rp;
  const size_t ch = size_t(bh) * a.NC + c;
  const int ldK = Dk + 4, ldV = Dv + 4, ldX = max(Dk, Dv) + 4;
  float* bK = sm;                // [64][ldK] dK
  float* bQ = bK + kE * ldK;     // [64][ldK] dQ (Rp rows), then dW, then dY... (see below)
  float* bO = bQ + kE * ldK;     // [64][ldV] dO (Rp rows), then dX
  float* bT = bO + kE * ldV;     // [64][ldX] U~ (staged), then dU~ (staged), then dY
  float* P1 = bT + kE * ldX;     // [64][kLdE] P (Rp rows, staged), then K K^T
  float* P2 = P1 + kE * kLdE;    // [64][kLdE] dP, then dM, then F
  float* Ks = P2 + kE * kLdE;    // [64][ldK] the chunk's keys (staged)
  float* Ts = Ks + kE * ldK;     // [64][kLdE] Tinv (staged)
  __shared__ double G[kE];
  __shared__ float gam[kE], D[kE], beta[kE], dG[kE], dbeta[kE], red[kMaxWarps];
  __shared__ int tok[kE];
  const float* S0 = a.states + (size_t(bh) * (a.NC + 1) + c) * Dk * Dv;
  const float* dS = a.dS + ch * Dk * Dv;
  const float* Ut = a.Ut + ch * kE * Dv;
  const float* dUt = a.dUt + ch * kE * Dv;
  copy_async(Ks, ldK, a.Kc + ch * kE * Dk, Dk, kE, Dk);
  copy_async(Ts, kLdE, a.Tm + ch * kE * kE, kE, kE, kE);
  copy_async(P1, kLdE, a.Pm + ch * Rp * kE, kE, Rp, kE);
  copy_async(bT, ldX, Ut, Dv, kE, Dv);
  __pipeline_commit();
  const float* Qc = a.Qc + ch * Rp * Dk;
  const bool gated = a.g != nullptr;

  grad_events(a, c, ch, beta, dG, dbeta, tok);
  gather_rows(bO, ldV, nullptr, a.dout, Rp, Dv, [&](int r) { return out_row(a, b, h, c, r); });
  load_decays(a, ch, G, gam, D);
  __pipeline_wait_prior(0);
  __syncthreads();
  float dGL = grad_gate_of_state(gated, dS, S0, Dk * Dv, gam, red);
  mm_b<false, true, MM>(bK, ldK, bT, ldX, dS, Dv, kE, Dk, Dv, 1.f);  // U~ dS^T
  mm_b<false, true, MM>(bQ, ldK, bO, ldV, S0, Dv, Rp, Dk, Dv, 1.f);  // dO S0^T
  __syncthreads();
  dGL += grad_scale_dk(gated, bK, ldK, Dk, [&](int i, int col) { return Ks[i * ldK + col]; }, D, tok, dG, red);
  grad_scale_dq(a, c, bQ, ldK, Qc, gam, dG);
  __syncthreads();
  // dP = scale dO U~^T (P, decayed and masked without scale, is in P1). Then dU~ is staged where
  // U~ was.
  mm<false, true, MM>(P2, kLdE, bO, ldV, bT, ldX, Rp, kE, Dv, a.scale);
  __syncthreads();
  copy_async(bT, ldX, dUt, Dv, kE, Dv);
  __pipeline_commit();
  // e = dP . P feeds dG (+ to the row's event, - to the column's, unless one token); dP becomes
  // d(Q K^T) = dP . decay, masked. P1 keeps e.
  each(Rp, kE, [&](int r, int j) {
    const int i = r * a.nh + a.nh - 1;
    float& dp = P2[r * kLdE + j];
    float& p = P1[r * kLdE + j];
    if (!row_ok(a, c, r) || j > i) {
      dp = p = 0.f;
      return;
    }
    p = (gated && j < i && tok[i] != tok[j]) ? dp * p : 0.f;
    dp *= decay(gated, G, i, j);
  });
  __syncthreads();
  grad_gate_of_e(gated, P1, Rp, a.nh, dG);
  mm<false, false, MM>(bQ, ldK, P2, kLdE, Ks, ldK, Rp, Dk, kE, 1.f, bQ, ldK, 1.f);  // dQ += dP K
  mm_b<true, false, MM>(bK, ldK, P2, kLdE, Qc, Dk, kE, Dk, Rp, 1.f, bK, ldK, 1.f);  // dK += dP^T Q
  __syncthreads();
  scatter_rows(a.dq, bQ, ldK, Rp, Dk, a.accumulate, [&](int r) { return query_row(a, b, h, c, r); });
  __pipeline_wait_prior(0);
  __syncthreads();
  // U~ = U - W S0: dW = -dU~ S0^T. Then dX = Tinv^T dU~, dY = Tinv^T dW.
  mm_b<false, true, MM>(bQ, ldK, bT, ldX, S0, Dv, kE, Dk, Dv, -1.f);
  mm<true, false, MM>(bO, ldV, Ts, kLdE, bT, ldX, kE, Dv, kE, 1.f);
  __syncthreads();
  mm<true, false, MM>(bT, ldX, Ts, kLdE, bQ, ldK, kE, Dk, kE, 1.f);
  __syncthreads();
  // dM = -(dX U^T + dY W^T) (the strictly lower part is used).
  mm_b<false, true, MM>(P2, kLdE, bO, ldV, a.U + ch * kE * Dv, Dv, kE, kE, Dv, -1.f);
  mm<false, true, MM>(P1, kLdE, Ks, ldK, Ks, ldK, kE, kE, Dk, 1.f);  // K K^T
  __syncthreads();
  mm_b<false, true, MM>(P2, kLdE, bT, ldX, a.W + ch * kE * Dk, Dk, kE, kE, Dk, -1.f, P2, kLdE, 1.f);
  grad_event_terms(a, b, h, c, bO, ldV, bT, ldX, [&](int i, int col) { return Ks[i * ldK + col]; }, bK, ldK, beta, gam,
                   dbeta, dG, bO, ldV);  // dv in place of dX
  __syncthreads();
  // M = I + diag(beta) A, A = (K K^T) . decay: dbeta_i += sum_j dM_ij A_ij; F = beta_i dM_ij decay
  // (-> dK += F K + F^T K); e = beta_i dM_ij A_ij feeds dG (+ row, - column; not within a token).
  each(kE, kE, [&](int i, int j) {
    float& dm = P2[i * kLdE + j];
    float& kk = P1[i * kLdE + j];
    if (j >= i) {
      dm = kk = 0.f;
      return;
    }
    const float dec = decay(gated, G, i, j);
    const float A = kk * dec, da = beta[i] * dm;
    kk = dm * A;                                      // kept for dbeta (row sums)
    dm = da * dec;                                    // F
  });
  __syncthreads();
  grad_beta_of_e2(gated, P1, beta, tok, dbeta, dG);
  mm<false, false, MM>(bK, ldK, P2, kLdE, Ks, ldK, kE, Dk, kE, 1.f, bK, ldK, 1.f);  // += F K
  __syncthreads();
  mm<true, false, MM>(bK, ldK, P2, kLdE, Ks, ldK, kE, Dk, kE, 1.f, bK, ldK, 1.f);  // += F^T K
  __syncthreads();
  scatter_rows(a.dk, bK, ldK, kE, Dk, a.accumulate, [&](int i) { return key_row(a, b, h, c, i); });
  scatter_rows(a.dv, bO, ldV, kE, Dv, a.accumulate, [&](int i) { return value_row(a, b, h, c, i); });
  write_beta_gate_grads(a, b, h, c, beta, dbeta, dG, dGL);
}

// ---- grad on bf16 tiles (Mma::Bf16, head dims multiples of 32): the grad kernel's math, every
// product an mm_s_to on operands staged once as bf16 tiles (ldmatrix, no conversion per MMA) ----
// ncu on the fp32-tile grad kernel under bf16 products (H200): its warps waited on the L2 strips
// of S0, dS, U and W loaded right before their conversion (26 % of stalls), on instruction fetch
// (19 %: 17.5 k instructions, every mm call site inlining three strip shapes), and spilled
// registers. Here each operand is read from global memory once (S0 and dS a second time, from L2,
// for the gate's sum), converted as it is staged, and every product is one short loop. (H200, the
// same call: 1320 -> 821 us at B 8 x T 2048 x H 8, 5205 -> 3187 us at B 8 x T 4096 x H 16.) The products that fed each other through fp32 tiles now feed
// bf16 tiles written by their epilogues (dW, dX, dY, dP, F), which is where the products read
// them rounded before, so the values are those of the fp32-tile kernel up to the order of sums;
// the two products F K and F^T K are one, (F + F^T) K. Tiles are staged two at a time (their loads
// in flight together), each phase's later loads asked of L2 a phase or more ahead, and the event
// terms load a row's values at once (H200, ncu at B 8 x T 2048 x H 8: 856 -> 677 us; the backward
// 1225 -> 1036 us there, 4816 -> 4025 us at B 8 x T 4096 x H 16).
// Persistent: a block per resident slot takes chunk after chunk (grid: resident_blocks). Where U~,
// S0 and dS are bf16 in memory, the next chunk's three tiles are copied by cp.async into R3-R5
// once phase 7 is done with them, in flight over phases 8 and 9 and the stores, so phase 0 stages
// only K~ and dO (H200, one call alternating with the form before, profiled: 651 -> 638 us at
// B 8 x T 2048 x H 8, 2521-2527 -> 2444-2446 us at B 8 x T 4096 x H 16, with the two loads-before-
// stores changes of grad_scale_dq and the dP pass; values bit for bit). Thread 0's clock at each
// barrier (B 8 x T 2048 x H 8, before this change) put phase 0 at 20 % of a chunk's ~68k cycles,
// phases 2 and 6 (staging and element terms) at 16 % and 18 %, the five product phases together
// at 33 %. (Persistent with the next chunk's operands only asked of L2 during phase 6: 669 -> 669
// us and 2549 -> 2541 us, its waits on memory moved to the barriers.)
//
// Shared memory (the phases below; every region 128-byte aligned), 219 KB at Dk = Dv = 128:
//   R0 K~ (bf16)                      R1 dK (fp32 accumulator, the whole kernel)
//   R2 dQ, then dX, then dM (fp32)    R3 S0 (bf16), then dY (fp32)
//   R4 dS (bf16), then Q | dU~, then Tinv | U (bf16)
//   R5 U~, then dW, then W (bf16)     R6 dO, then dP, then dX, then F + F^T (bf16)
//   R7 dP (fp32), then dY (bf16)      R8 e = dP . P, then K K^T (fp32)
struct GradSLayout {
  int lbK, lbV;     // bf16 leading dimensions (Dk, Dv + kBfPad)
  size_t r[9], r4b;  // byte offsets of R0..R8, and of R4's second part
  size_t bytes;
};
__host__ __device__ inline GradSLayout grad_s_layout(int Dk, int Dv) {
  GradSLayout L{};
  L.lbK = Dk + kBfPad, L.lbV = Dv + kBfPad;
  auto al = [](size_t n) { return (n + 127) / 128 * 128; };
  auto mx = [](size_t x, size_t y) { return x > y ? x : y; };
  const size_t hK = size_t(kE) * L.lbK * 2, hV = size_t(kE) * L.lbV * 2, hE = size_t(kE) * (kE + kBfPad) * 2;
  const size_t fK = size_t(kE) * (Dk + 4) * 4, fV = size_t(kE) * (Dv + 4) * 4, fE = size_t(kE) * kLdE * 4;
  const size_t st = size_t(Dk) * L.lbV * 2;  // a Dk x Dv state tile
  L.r4b = al(mx(hK, hE));
  const size_t sz[9] = {hK, fK, mx(mx(fK, fV), fE), mx(st, fK), mx(st, L.r4b + hV), mx(hV, hK), mx(hV, hE), mx(fE, hK), fE};
  SmemCursor cur;
  for (int i = 0; i < 9; ++i) L.r[i] = cur.take(sz[i]);
  L.bytes = cur.off;
  return L;
}
__host__ __device__ constexpr bool grad_bf16_tiles(Mma mm, int Dk, int Dv) {
  return mm == Mma::Bf16 && Dk % 32 == 0 && Dv % 32 == 0;
}

template <Mma MM>
__global__ void __launch_bounds__(kThreads) grad_s_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  const int Dk = a.Dk, Dv = a.Dv, Rp = a.Rp, nh = a.nh;
  const GradSLayout L = grad_s_layout(Dk, Dv);
  const int lbK = L.lbK, lbV = L.lbV, lbE = kE + kBfPad, ldK = Dk + 4, ldV = Dv + 4;
  auto hreg = [&](int i, size_t extra = 0) { return reinterpret_cast<bf16*>(smb + L.r[i] + extra); };
  auto freg = [&](int i) { return reinterpret_cast<float*>(smb + L.r[i]); };
  bf16 *Kh = hreg(0), *S0h = hreg(3), *dSh = hreg(4), *Qh = hreg(4), *Th = hreg(4), *R4b = hreg(4, L.r4b);
  bf16 *R5 = hreg(5), *R6 = hreg(6), *dYh = hreg(7);
  float *dK = freg(1), *R2 = freg(2), *dY = freg(3), *dP = freg(7), *P1 = freg(8);
  __shared__ double G[kE];
  __shared__ float gam[kE], D[kE], beta[kE], dG[kE], dbeta[kE], red[kMaxWarps];
  __shared__ int tok[kE];
  const bool gated = a.g != nullptr;
  // Chunk w = bh * NC + c: where its state and U~ start.
  auto s_of = [&](int w) { return (size_t(w / a.NC) * (a.NC + 1) + w % a.NC) * Dk * Dv; };
  auto u_of = [&](int w) { return size_t(w) * kE * Dv; };
  // Where U~, S0 (a.hs) and dS (a.hg) are bf16 in memory, a chunk's three tiles are copied by
  // cp.async while the chunk before it finishes (phases 8 and 9 and its stores, which leave their
  // regions alone), so its phase 0 stages only K~ and dO.
  const bool ahead = a.hs && a.hg;
  auto copy_ahead = [&](int w) {
    copy_or_stage_to_bf16(a.Ut, true, u_of(w), Dv, kE, Dv, R5, lbV);
    copy_or_stage_to_bf16(a.dS, true, size_t(w) * Dk * Dv, Dv, Dk, Dv, dSh, lbV);
    copy_or_stage_to_bf16(a.states, true, s_of(w), Dv, Dk, Dv, S0h, lbV);
    __pipeline_commit();
  };
  // Epilogues of mm_s_to: fp32 results stored (alpha x) or added, bf16 results stored.
  auto put = [](float* o, int ld, float alpha) {
    return [=](int r, int col, float x, float y) { *reinterpret_cast<float2*>(o + r * ld + col) = make_float2(alpha * x, alpha * y); };
  };
  auto add = [](float* o, int ld) {
    return [=](int r, int col, float x, float y) {
      float2& v = *reinterpret_cast<float2*>(o + r * ld + col);
      v.x += x, v.y += y;
    };
  };
  auto put_h = [](bf16* o, int ld, float alpha) {
    return [=](int r, int col, float x, float y) { *reinterpret_cast<uint32_t*>(o + r * ld + col) = bf16_pair(alpha * x, alpha * y); };
  };
  auto put_both = [](float* o, int ld, bf16* oh, int ldh) {
    return [=](int r, int col, float x, float y) {
      *reinterpret_cast<float2*>(o + r * ld + col) = make_float2(x, y);
      *reinterpret_cast<uint32_t*>(oh + r * ldh + col) = bf16_pair(x, y);
    };
  };
  const int chunks = a.NC * a.BH;
  if (ahead && int(blockIdx.x) < chunks) copy_ahead(blockIdx.x);
  for (int w = blockIdx.x; w < chunks; w += gridDim.x) {
    const int c = w % a.NC, bh = w / a.NC, b = bh / a.H, h = bh % a.H;
    const size_t ch = size_t(w), s_at = s_of(w), u_at = u_of(w);
    const float* Qc = a.Qc + ch * Rp * Dk;

    // Phase 0: stage K~ and dO, U~, dS and S0 copied during the chunk before (ahead), else staged
    // here (two tiles' loads in flight together). Each later phase's loads from memory are asked of
    // L2 a phase or more ahead (below). (Copying U~, dS and S0 by cp.async in this phase, in flight
    // while K~ and dO are staged, was slower than staging them: H200, 2496-2504 -> 2516-2518 us at
    // B 8 x T 4096 x H 16, 644 -> 652 us at B 8 x T 2048 x H 8.)
    grad_events(a, c, ch, beta, dG, dbeta, tok);
    if (ahead) {
      // (dO is 16-byte aligned: delta_rule_backward_chunked)
      stage(stage_tile(a.Kc + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(Kh, lbK)),
            stage_tile(a.dout, Rp, Dv, [&](int r) { return out_row(a, b, h, c, r); }, bf16_rows(R6, lbV)));
    } else {
      stage(stage_tile(a.Kc + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(Kh, lbK)),
            stage_to_bf16(a.Ut, a.hs, u_at, Dv, kE, Dv, R5, lbV));
      stage(stage_to_bf16(a.dS, a.hg, ch * Dk * Dv, Dv, Dk, Dv, dSh, lbV),
            stage_to_bf16(a.states, a.hs, s_at, Dv, Dk, Dv, S0h, lbV));
      stage_rows<false>(a.dout, Rp, Dv, [&](int r) { return out_row(a, b, h, c, r); },
                        [&](int r, int col, float4 v) { put_bf16x4(R6 + r * lbV + col, v); });
    }
    load_decays(a, ch, G, gam, D);
    if (ahead) __pipeline_wait_prior(0);
    __syncthreads();
    // (the gate's sum from the bf16 tiles the products read)
    float dGL = grad_gate_of_state(gated, dSh, S0h, Dk, Dv, lbV, gam, red);
    // Phase 1: U~ dS^T, dO S0^T, dP = scale dO U~^T.
    prefetch_l2(Qc, Rp, Dk, row_stride(Dk));
    prefetch_l2_of(a.dUt, a.hg, u_at, Dv, kE, Dv);
    if (a.accumulate) prefetch_l2(a.dq, Rp, Dk, [&](int r) { return query_row(a, b, h, c, r); });
    mm_s_to<false, true>(kE, Dk, put(dK, ldK, 1.f), {TermS{R5, lbV, dSh, lbV, Dv}});
    mm_s_to<false, true>(Rp, Dk, put(R2, ldK, 1.f), {TermS{R6, lbV, S0h, lbV, Dv}});
    mm_s_to<false, true>(Rp, kE, put(dP, kLdE, a.scale), {TermS{R6, lbV, R5, lbV, Dv}});
    __syncthreads();
    // Phase 2: stage Q and dU~; the element terms of dK, dQ and dP.
    stage(stage_tile(Qc, Rp, Dk, row_stride(Dk), bf16_rows(Qh, lbK)),
          stage_to_bf16(a.dUt, a.hg, u_at, Dv, kE, Dv, R4b, lbV));
    auto key = [&](int i, int col) { return __bfloat162float(Kh[i * lbK + col]); };  // k~: exact in bf16
    dGL += grad_scale_dk(gated, dK, ldK, Dk, key, D, tok, dG, red);
    grad_scale_dq(a, c, R2, ldK, Qc, gam, dG);
    // e = dP . P feeds dG (+ to the row's event, - to the column's, unless one token), kept in R8;
    // dP becomes d(Q K^T) = dP . decay, masked, as bf16 (R6: dO is no longer read).
    // (A lane's two values of P loaded before its stores, which may alias them: grad_scale_dq.)
    {
      static_assert(kE == 64, "two columns a lane");
      const float* Pg = a.Pm + ch * Rp * kE;
      const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
      for (int r = warp; r < Rp; r += nwarps()) {
        const int i = r * nh + nh - 1;
        float p[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) p[u] = gated ? Pg[r * kE + lane + 32 * u] : 0.f;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int j = lane + 32 * u;
          float e = 0.f, v = 0.f;
          if (row_ok(a, c, r) && j <= i) {
            const float dp = dP[r * kLdE + j];
            e = (gated && j < i && tok[i] != tok[j]) ? dp * p[u] : 0.f;
            v = dp * decay(gated, G, i, j);
          }
          P1[r * kLdE + j] = e;
          R6[r * lbE + j] = __float2bfloat16_rn(v);
        }
      }
    }
    __syncthreads();
    // Phase 3: the gate's sums of e; dQ += dP K, dK += dP^T Q, dW = -dU~ S0^T (U~ = U - W S0).
    grad_gate_of_e(gated, P1, Rp, nh, dG);
    prefetch_l2(a.Tm + ch * kE * kE, kE, kE, row_stride(kE));
    prefetch_l2(a.U + ch * kE * Dv, kE, Dv, row_stride(Dv));
    prefetch_l2(a.W + ch * kE * Dk, kE, Dk, row_stride(Dk));
    prefetch_l2(a.v, kE, Dv, [&](int i) { return value_row(a, b, h, c, i); });
    if (a.accumulate) prefetch_l2(a.dv, kE, Dv, [&](int i) { return value_row(a, b, h, c, i); });
    mm_s_to<false, false>(Rp, Dk, add(R2, ldK), {TermS{R6, lbE, Kh, lbK, kE}});
    mm_s_to<true, false>(kE, Dk, add(dK, ldK), {TermS{R6, lbE, Qh, lbK, Rp}});
    mm_s_to<false, true>(kE, Dk, put_h(R5, lbK, -1.f), {TermS{R4b, lbV, S0h, lbV, Dv}});
    __syncthreads();
    // Phase 4: dq out; stage Tinv; K K^T.
    scatter_rows(a.dq, R2, ldK, Rp, Dk, a.accumulate, [&](int r) { return query_row(a, b, h, c, r); });
    to_bf16_tile(Th, lbE, a.Tm + ch * kE * kE, kE, kE, kE);
    mm_s_to<false, true>(kE, kE, put(P1, kLdE, 1.f), {TermS{Kh, lbK, Kh, lbK, Dk}});
    __syncthreads();
    // Phase 5: dX = Tinv^T dU~, dY = Tinv^T dW (fp32 for the element terms, bf16 for dM).
    mm_s_to<true, false>(kE, Dv, put_both(R2, ldV, R6, lbV), {TermS{Th, lbE, R4b, lbV, kE}});
    mm_s_to<true, false>(kE, Dk, put_both(dY, ldK, dYh, lbK), {TermS{Th, lbE, R5, lbK, kE}});
    __syncthreads();
    // Phase 6: stage U and W; per event: dv = beta dX; dbeta = dX . v + gamma dY . k;
    // dK += beta gamma dY; dG += beta gamma dY . k.
    stage(stage_tile(a.U + ch * kE * Dv, kE, Dv, row_stride(Dv), bf16_rows(R4b, lbV)),
          stage_tile(a.W + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(R5, lbK)));
    grad_event_terms(a, b, h, c, R2, ldV, dY, ldK, key, dK, ldK, beta, gam, dbeta, dG, nullptr, 0);
    __syncthreads();
    // Phase 7: dM = -(dX U^T + dY W^T) (the strictly lower part is used), one product over Dv + Dk.
    if (a.accumulate) prefetch_l2(a.dk, kE, Dk, [&](int i) { return key_row(a, b, h, c, i); });
    mm_s_to<false, true>(kE, kE, put(R2, kLdE, -1.f), {TermS{R6, lbV, R4b, lbV, Dv}, TermS{dYh, lbK, R5, lbK, Dk}});
    __syncthreads();
    // R3, R4 and R5 are not read again for this chunk: the next one's U~, dS and S0 into them; its
    // K~ and dO asked of L2.
    if (const int wn = w + gridDim.x; wn < chunks) {
      if (ahead) copy_ahead(wn);
      const int cn = wn % a.NC, bhn = wn / a.NC;
      prefetch_l2(a.Kc + size_t(wn) * kE * Dk, kE, Dk, row_stride(Dk));
      prefetch_l2(a.dout, Rp, Dv, [&](int r) { return out_row(a, bhn / a.H, bhn % a.H, cn, r); });
    }
    // Phase 8: M = I + diag(beta) A, A = (K K^T) . decay: dbeta_i += sum_j dM_ij A_ij (e2 = dM_ij A_ij
    // kept in R8); F = beta_i dM_ij decay (-> dK += F K + F^T K = (F + F^T) K, as bf16 in R6); e2
    // scaled by beta_i feeds dG (+ row, - column; not within a token).
    each(kE, kE, [&](int i, int j) {
      if (j > i) return;
      if (j == i) {
        R6[i * lbE + i] = __float2bfloat16_rn(0.f);
        return;
      }
      const float dm = R2[i * kLdE + j];
      const float dec = decay(gated, G, i, j);
      P1[i * kLdE + j] = dm * P1[i * kLdE + j] * dec;
      const bf16 f = __float2bfloat16_rn(beta[i] * dm * dec);
      R6[i * lbE + j] = f, R6[j * lbE + i] = f;
    });
    __syncthreads();
    // Phase 9: dbeta and the gate's sums of e2; dK += (F + F^T) K.
    grad_beta_of_e2(gated, P1, beta, tok, dbeta, dG);
    mm_s_to<false, false>(kE, Dk, add(dK, ldK), {TermS{R6, lbE, Kh, lbK, kE}});
    __syncthreads();
    scatter_rows(a.dk, dK, ldK, kE, Dk, a.accumulate, [&](int i) { return key_row(a, b, h, c, i); });
    write_beta_gate_grads(a, b, h, c, beta, dbeta, dG, dGL);
    __syncthreads();  // the next chunk's phase 0 writes what the lines above read
  }
}

// ---- grad_r: grad_s's math at two blocks an SM (Dk = Dv = 128, the states, U~, dS and dU~ bf16
// in memory) ----
// grad_s is one block of 16 warps an SM (219 KB of shared memory): its staging phases leave the
// tensor cores idle and nothing else runs meanwhile (thread 0's clock at its barriers: staging and
// element phases ~55 % of a chunk, products ~33 %; the same kernel at 8 warps takes 1.34x, not 2x,
// the time). Here a block is 8 warps in ~100 KB, two an SM (H200, n_h 1, each kernel profiled, the
// two builds alternating: 638-639 -> 471-472 us at B 8 x T 2048 x H 8, 2441-2451 -> 1803-1809 us at
// B 8 x T 4096 x H 16, -26 %; predicted -25 to -35 % from the 8-warp grad_s's 1.34x). The
// accumulators that grad_s kept in fp32 tiles live in registers: warp w owns rows 16 (w >> 1) and,
// of each 64 x 128 result (dK, dQ, dW, dX, dY), the strips of 16 x 32 at columns 32 (w & 1) and 64
// + 32 (w & 1) — so a 64-row half of S0 or dS (their rows are dK's and dQ's columns) feeds one
// strip of every warp — and of each 64 x 64 result (dP, K K^T, dM) the strip at column 32 (w & 1).
// Element passes run on the fragments; row and column sums go through small shared arrays, summed
// in a fixed order.
// Shared memory: five 64 x 136 bf16 regions and one 64 x 72:
//   A: U~, then Q, then dX        B: dO, then K~          C: a half of S0, then of dS, then Tinv, then U
//   D: dU~, then W                E: dW, then dY          F: dP', then F + F^T
constexpr int kGradRThreads = 256;
struct GradRLayout {
  size_t A, B, C, D, E, F, bytes;
};
__host__ __device__ inline GradRLayout grad_r_layout() {
  GradRLayout L{};
  SmemCursor cur;
  const size_t t = size_t(kE) * (128 + kBfPad) * 2, e = size_t(kE) * (kE + kBfPad) * 2;
  L.A = cur.take(t), L.B = cur.take(t), L.C = cur.take(t), L.D = cur.take(t), L.E = cur.take(t), L.F = cur.take(e);
  L.bytes = cur.off;
  return L;
}
// Copies rows x cols bf16 values (rows packed, cols a multiple of 8) into a tile (dst, ldd) by
// cp.async; the caller commits and waits. (copy_or_stage_to_bf16's bf16 branch does the same
// copies, but grad_r built on it spilled 80 bytes instead of 32 in its any-n_h instance.)
__device__ __forceinline__ void copy_bf16_rows(bf16* dst, int ldd, const bf16* src, int rows, int cols) {
  each(rows, cols >> 3, [&](int r, int q) { __pipeline_memcpy_async(dst + r * ldd + 8 * q, src + size_t(r) * cols + 8 * q, 16); });
}
// f(row, col, x, y, h) on a strip's accumulators (strip_out's pairs), x and y by reference; h: the
// row's half of the strip (row m0 + lane / 4 + 8 h), a constant once unrolled (index by it).
template <class F>
__device__ __forceinline__ void each_pair(float (&acc)[4][4], int m0, int n0, F f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h) f(m0 + g + 8 * h, n0 + 8 * q + t2, acc[q][2 * h], acc[q][2 * h + 1], h);
}
// Two adjacent values of a caller's array (8-byte aligned or not), and the result of adding (acc)
// or storing two there.
__device__ __forceinline__ float2 load2(const float* p) {
  return (reinterpret_cast<uintptr_t>(p) & 7) ? make_float2(p[0], p[1]) : *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ void put2(float* p, float x, float y, bool acc) {
  if (acc) {
    const float2 o = load2(p);
    x += o.x, y += o.y;
  }
  if (reinterpret_cast<uintptr_t>(p) & 7)
    p[0] = x, p[1] = y;
  else
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
// Sums over the four lanes that share a row (the quad): the row's sum over a strip's 32 columns.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}
// Sums over the eight lanes that share a column pair position (lane & 3): a column's sum over
// the strip's 16 rows, given each lane's sum of its two rows.
__device__ __forceinline__ float column_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 4);
  v += __shfl_xor_sync(kFull, v, 8);
  return v + __shfl_xor_sync(kFull, v, 16);
}

// NH: the sub-steps a token, 1 (its own instance: every row a query row, as many registers as
// before n_h > 1 was taken) or 0 (any, a.nh).
template <Mma MM, int NH>
__global__ void __launch_bounds__(kGradRThreads, 2) grad_r_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smb[];
  constexpr int Dk = 128, Dv = 128, lb = 128 + kBfPad, lbE = kE + kBfPad;
  const GradRLayout L = grad_r_layout();
  auto hp = [&](size_t off) { return reinterpret_cast<bf16*>(smb + off); };
  bf16 *RA = hp(L.A), *RB = hp(L.B), *RC = hp(L.C), *RD = hp(L.D), *RE = hp(L.E), *RF = hp(L.F);
  __shared__ double G[kE];
  __shared__ float gam[kE], D[kE], beta[kE], dG[kE], dbeta[kE], red[kGradRThreads / 32];
  __shared__ float rows2[2][kE], cols4[4][kE];  // per-warp partial sums: by column half, by row block
  __shared__ int tok[kE];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp >> 1), cb = warp & 1;
  const int n0 = 32 * cb, n1 = 64 + 32 * cb;  // this warp's strips of a 128-wide result (and n0 of a 64-wide)
  const bool gated = a.g != nullptr;
  // Query rows (Rp of the 64: Ct = 64 / n_h tokens read out, zero-padded to a multiple of 16): the
  // warps whose rows lie beyond them form no dP, dQ or dq (their rows of dP' are zero).
  const int nh = NH ? NH : a.nh, Rp = NH == 1 ? kE : a.Rp;
  const bool qrows = NH == 1 || m0 < Rp;
  auto reader = [&](int r) { return r * nh + nh - 1; };  // the event at which query row r reads out
  const int chunks = a.NC * a.BH;
  // rows2 / cols4 -> per event: the sum of both column halves' row sums (sign sr) and of the four
  // row blocks' column sums (sign sc), added to out[i] by threads i < 64. Barriers before and after.
  auto fold = [&](float* out, float sr, float sc) {
    __syncthreads();
    if (threadIdx.x < kE) {
      const int i = threadIdx.x;
      out[i] += sr * (rows2[0][i] + rows2[1][i]) + sc * (cols4[0][i] + cols4[1][i] + cols4[2][i] + cols4[3][i]);
    }
    __syncthreads();
  };
  auto clear_sums = [&]() {
    for (int i = threadIdx.x; i < 2 * kE; i += blockDim.x) rows2[i / kE][i % kE] = 0.f;
    for (int i = threadIdx.x; i < 4 * kE; i += blockDim.x) cols4[i / kE][i % kE] = 0.f;
  };
  for (int w = blockIdx.x; w < chunks; w += gridDim.x) {
    const int c = w % a.NC, bh = w / a.NC, b = bh / a.H, h = bh % a.H;
    const size_t ch = size_t(w), s_at = (size_t(bh) * (a.NC + 1) + c) * Dk * Dv, u_at = ch * kE * Dv;
    const float* Qc = a.Qc + ch * Rp * Dk;
    const bf16* S0g = reinterpret_cast<const bf16*>(a.states) + s_at;
    const bf16* dSg = reinterpret_cast<const bf16*>(a.dS) + ch * Dk * Dv;
    // Phase 0: U~ -> A, dO -> B, dU~ -> D, S0's first half -> C.
    grad_events(a, c, ch, beta, dG, dbeta, tok);
    clear_sums();
    copy_or_stage_to_bf16(a.Ut, true, u_at, Dv, kE, Dv, RA, lb);
    copy_or_stage_to_bf16(a.dUt, true, u_at, Dv, kE, Dv, RD, lb);
    copy_bf16_rows(RC, lb, S0g, 64, Dv);
    __pipeline_commit();
    stage(stage_tile(a.dout, kE, Dv, [&](int r) { return out_row(a, b, h, c, r); }, bf16_rows(RB, lb)));
    load_decays(a, ch, G, gam, D);
    __pipeline_wait_prior(0);
    __syncthreads();
    // Phase 1: dP = scale dO U~^T (its element pass on the fragments: d(Q K^T) as bf16 into F; the
    // gate's sums of e = dP . P); per half of S0: dQ += dO S0^T, dW = -dU~ S0^T (bf16 into E).
    float aQ[2][4][4] = {}, aK[2][4][4] = {};
    {
      float p[4][4] = {};
      if (qrows) strip_s<false, true>(p, RB, lb, RA, lb, m0, n0, Dv);
      const float* Pg = a.Pm + ch * Rp * kE;
      float colpart[4][2] = {};
      float rowpart[2] = {};
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int r = m0 + (lane >> 2) + 8 * (k >> 1), jj = n0 + 8 * q + (lane & 3) * 2 + (k & 1), i = reader(r);
          const float dp = a.scale * p[q][k];
          float e = 0.f, o = 0.f;
          if (row_ok(a, c, r) && jj <= i) {
            e = (gated && jj < i && tok[i] != tok[jj]) ? dp * Pg[r * kE + jj] : 0.f;
            o = dp * decay(gated, G, i, jj);
          }
          RF[r * lbE + jj] = __float2bfloat16_rn(o);
          rowpart[k >> 1] += e;
          colpart[q][k & 1] += e;
        }
      if (gated) {
        const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = m0 + g + 8 * hh;
          const float s = quad_sum(rowpart[hh]);
          if ((lane & 3) == 0 && (NH == 1 || row_ok(a, c, r))) rows2[cb][reader(r)] = s;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float s = column_sum(colpart[q][u]);
            if (g == 0) cols4[m0 >> 4][n0 + 8 * q + t2 + u] = s;
          }
      }
    }
    for (int half = 0; half < 2; ++half) {
      if (half == 1) {
        __syncthreads();
        copy_bf16_rows(RC, lb, S0g + size_t(64) * Dv, 64, Dv);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();
      }
      if (qrows) strip_s<false, true>(aQ[half], RB, lb, RC, lb, m0, n0, Dv);
      float wacc[4][4] = {};
      strip_s<false, true>(wacc, RD, lb, RC, lb, m0, n0, Dv);
      each_pair(wacc, m0, n0, [&](int r, int col, float& x, float& y, int) {
        *reinterpret_cast<uint32_t*>(RE + r * lb + 64 * half + col) = bf16_pair(-x, -y);
      });
    }
    // The gate's sums of e (rows to the reading event, columns from the key's) into dG.
    if (gated) fold(dG, 1.f, -1.f), clear_sums();
    __syncthreads();
    // Phase 2: per half of dS: dK = U~ dS^T; K~ -> B (dO is read no more).
    const auto kt = stage_tile(a.Kc + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(RB, lb));
    for (int half = 0; half < 2; ++half) {
      copy_bf16_rows(RC, lb, dSg + size_t(64) * half * Dv, 64, Dv);
      __pipeline_commit();
      if (half == 0) stage(kt);
      __pipeline_wait_prior(0);
      __syncthreads();
      strip_s<false, true>(aK[half], RA, lb, RC, lb, m0, n0, Dv);
      __syncthreads();
    }
    // The state's gate term: d gamma_63 sum(dS . S0), both bf16 in memory (read again: L2).
    float dGL = 0.f;
    if (gated) {
      float part = 0.f;
      for (int e = threadIdx.x * 2; e < Dk * Dv; e += blockDim.x * 2) {
        const float2 d = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dSg + e));
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(S0g + e));
        part += d.x * x.x + d.y * x.y;
      }
      dGL = gam[kE - 1] * block_sum(part, red);
    }
    // dK = diag(D) U~ dS^T (with a gate, dd_i = k~_i . (U~ dS^T)_i gives -dd D to G_i and +dd D to
    // G_63, not within the last token); dQ = scale diag(gamma) dO S0^T (with a gate, d G_i += dQ_r . q_r
    // at the event i where row r reads out).
    {
      float ddp[2] = {}, dqp[2] = {};
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int nn = s ? n1 : n0;
        each_pair(aK[s], m0, nn, [&](int i, int col, float& x, float& y, int hh) {
          if (gated) ddp[hh] += x * __bfloat162float(RB[i * lb + col]) + y * __bfloat162float(RB[i * lb + col + 1]);
          x *= D[i], y *= D[i];
        });
        each_pair(aQ[s], m0, nn, [&](int r, int col, float& x, float& y, int hh) {
          const bool ok = row_ok(a, c, r);
          const float f = ok ? a.scale * gam[reader(r)] : 0.f;
          x *= f, y *= f;
          if (gated && (NH == 1 || ok)) {  // (Qc has Rp rows, zero beyond Ct)
            const float2 q = *reinterpret_cast<const float2*>(Qc + size_t(r) * Dk + col);
            dqp[hh] += x * q.x + y * q.y;
          }
        });
      }
      if (gated) {
        const int g = lane >> 2;
        float glp = 0.f;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = m0 + g + 8 * hh;  // a key's event, and a query row
          const float dd = quad_sum(ddp[hh]), dq = quad_sum(dqp[hh]);
          if ((lane & 3) == 0) {
            const float t = tok[kE - 1] != tok[i] ? dd * D[i] : 0.f;
            if (NH == 1) {
              rows2[cb][i] = dq - t;
            } else {
              rows2[cb][i] = -t;
              if (row_ok(a, c, i)) cols4[cb][reader(i)] = dq;  // (cols4 as a second per-half array here)
            }
            glp += t;
          }
        }
        dGL += block_sum(glp, red);
        fold(dG, 1.f, NH == 1 ? 0.f : 1.f), clear_sums();
      }
    }
    // Phase 3: Q -> A (U~ is read no more); dQ += dP' K~, dK += dP'^T Q; dq out.
    // (Rows from Rp on zero: dP'^T Q sums over all 64.)
    stage(stage_tile(Qc, kE, Dk, [&](int r) { return r < Rp ? (long long)r * Dk : -1ll; }, bf16_rows(RA, lb)));
    __syncthreads();
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int nn = s ? n1 : n0;
      if (qrows) strip_s<false, false>(aQ[s], RF, lbE, RB, lb, m0, nn, kE);
      strip_s<true, false>(aK[s], RF, lbE, RA, lb, m0, nn, kE);
      if (qrows)
        each_pair(aQ[s], m0, nn, [&](int r, int col, float& x, float& y, int) {
          const long long off = query_row(a, b, h, c, r);
          if (off >= 0) put2(a.dq + off + col, x, y, a.accumulate);
        });
    }
    __syncthreads();
    // Phase 4: Tinv -> C; dX = Tinv^T dU~: dv = beta dX out, dbeta += dX . v; dX as bf16 -> A.
    to_bf16_tile(RC, lbE, a.Tm + ch * kE * kE, kE, kE, kE);
    __syncthreads();
    {
      float dvp[2] = {};
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int nn = s ? n1 : n0;
        float x[4][4] = {};
        strip_s<true, false>(x, RC, lbE, RD, lb, m0, nn, kE);
        each_pair(x, m0, nn, [&](int i, int col, float& p, float& q, int hh) {
          const long long vrow = value_row(a, b, h, c, i);
          if (vrow >= 0) {
            const float2 v = load2(a.v + vrow + col);
            dvp[hh] += p * v.x + q * v.y;
            put2(a.dv + vrow + col, beta[i] * p, beta[i] * q, a.accumulate);
          }
          *reinterpret_cast<uint32_t*>(RA + i * lb + col) = bf16_pair(p, q);
        });
      }
      const int g = lane >> 2;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(dvp[hh]);
        if ((lane & 3) == 0) rows2[cb][m0 + g + 8 * hh] = s;
      }
    }
    // dY = Tinv^T dW: dK += beta gamma dY, dbeta += gamma dY . k~, dG += beta gamma dY . k~; dY as
    // bf16 -> E once every warp has read dW.
    {
      float y[2][4][4] = {};
#pragma unroll
      for (int s = 0; s < 2; ++s) strip_s<true, false>(y[s], RC, lbE, RE, lb, m0, s ? n1 : n0, kE);
      float dkp[2] = {};
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int nn = s ? n1 : n0;
        each_pair(y[s], m0, nn, [&](int i, int col, float& p, float& q, int hh) {
          dkp[hh] += p * __bfloat162float(RB[i * lb + col]) + q * __bfloat162float(RB[i * lb + col + 1]);
        });
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int nn = s ? n1 : n0;
        // aK and y share the fragment layout.
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = m0 + (lane >> 2) + 8 * (e >> 1);
            aK[s][q][e] += beta[i] * gam[i] * y[s][q][e];
          }
        (void)nn;
      }
      const int g = lane >> 2;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + g + 8 * hh;
        const float s = quad_sum(dkp[hh]);
        if ((lane & 3) == 0) cols4[cb][i] = s;  // (cols4 as a second per-half row array here)
      }
      __syncthreads();
      if (threadIdx.x < kE) {
        const int i = threadIdx.x;
        const float dvd = rows2[0][i] + rows2[1][i], dkd = cols4[0][i] + cols4[1][i];
        dbeta[i] += dvd + gam[i] * dkd;
        dG[i] += beta[i] * gam[i] * dkd;
      }
#pragma unroll
      for (int s = 0; s < 2; ++s)
        each_pair(y[s], m0, s ? n1 : n0, [&](int i, int col, float& p, float& q, int) {
          *reinterpret_cast<uint32_t*>(RE + i * lb + col) = bf16_pair(p, q);
        });
    }
    __syncthreads();
    clear_sums();
    // Phase 5: U -> C, W -> D (Tinv and dU~ are read no more).
    stage(stage_tile(a.U + ch * kE * Dv, kE, Dv, row_stride(Dv), bf16_rows(RC, lb)),
          stage_tile(a.W + ch * kE * Dk, kE, Dk, row_stride(Dk), bf16_rows(RD, lb)));
    __syncthreads();
    // Phase 6: dM = -(dX U^T + dY W^T) and A = K K^T on the same strip; M = I + diag(beta) A . decay:
    // dbeta_i += sum_j dM_ij A_ij decay, F = beta_i dM_ij decay (F + F^T as bf16 -> F), the gate's
    // sums of beta_i e2_ij (+ row, - column; not within a token).
    {
      float m[4][4] = {}, kk[4][4] = {};
      strip_s<false, true>(m, RA, lb, RC, lb, m0, n0, Dv);
      strip_s<false, true>(m, RE, lb, RD, lb, m0, n0, Dk);
      strip_s<false, true>(kk, RB, lb, RB, lb, m0, n0, Dk);
      float rowdb[2] = {}, rowg[2] = {}, colg[4][2] = {};
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + (lane >> 2) + 8 * (e >> 1), j = n0 + 8 * q + (lane & 3) * 2 + (e & 1);
          float f = 0.f;
          if (j < i) {
            const float dm = -m[q][e];
            const float dec = decay(gated, G, i, j);
            const float e2 = dm * kk[q][e] * dec;
            rowdb[e >> 1] += e2;
            if (gated && tok[i] != tok[j]) {
              rowg[e >> 1] += beta[i] * e2;
              colg[q][e & 1] += beta[i] * e2;
            }
            f = beta[i] * dm * dec;
          }
          if (j <= i) {
            const bf16 fb = __float2bfloat16_rn(f);
            RF[i * lbE + j] = fb, RF[j * lbE + i] = fb;
          }
        }
      const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float db = quad_sum(rowdb[hh]), rg = quad_sum(rowg[hh]);
        if ((lane & 3) == 0) rows2[cb][m0 + g + 8 * hh] = db, cols4[cb][m0 + g + 8 * hh] = rg;
      }
      __syncthreads();
      if (threadIdx.x < kE) {
        const int i = threadIdx.x;
        dbeta[i] += rows2[0][i] + rows2[1][i];
        dG[i] += cols4[0][i] + cols4[1][i];
      }
      __syncthreads();
      clear_sums();
      __syncthreads();
      if (gated)
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float s = column_sum(colg[q][u]);
            if (g == 0) cols4[m0 >> 4][n0 + 8 * q + t2 + u] = s;
          }
      if (gated) fold(dG, 0.f, -1.f);
    }
    __syncthreads();
    // Phase 7: dK += (F + F^T) K~; dk out; beta's and the gates' gradients.
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int nn = s ? n1 : n0;
      strip_s<false, false>(aK[s], RF, lbE, RB, lb, m0, nn, kE);
      each_pair(aK[s], m0, nn, [&](int i, int col, float& x, float& y, int) {
        const long long off = key_row(a, b, h, c, i);
        if (off >= 0) put2(a.dk + off + col, x, y, a.accumulate);
      });
    }
    write_beta_gate_grads(a, b, h, c, beta, dbeta, dG, dGL);
    __syncthreads();
  }
}

// ---- host side ----

struct Geometry {
  int Ct, NC, Rp, BV;
};
Geometry geometry(const DeltaRuleDims& d) {
  Geometry g{};
  g.Ct = delta_rule_gpu_chunk_tokens(d.n_h);
  g.NC = (d.T + g.Ct - 1) / g.Ct;
  g.Rp = (g.Ct + 15) / 16 * 16;
  g.BV = d.Dv % 64 == 0 ? 64 : d.Dv % 32 == 0 ? 32 : 16;
  return g;
}

size_t prep_smem(const DeltaRuleDims& d) { return (size_t(kE) * (std::max(d.Dk, d.Dv) + 4) + 3 * kE * kLdE) * 4; }
size_t state_smem(const DeltaRuleDims& d, const Geometry& g) {
  return ((size_t(d.Dk) + kE) * (g.BV + 4) + 2 * (2 * size_t(kE) * (d.Dk + 4) + size_t(kE) * (g.BV + 4))) * 4;
}
size_t output_smem(const DeltaRuleDims& d, const Geometry& g) {
  return (size_t(g.Rp) * (d.Dk + 4) + size_t(d.Dk + kE + g.Rp) * (g.BV + 4) + size_t(g.Rp) * kLdE) * 4;
}
size_t dstate_smem(const DeltaRuleDims& d, const Geometry& g) {
  return (size_t(d.Dk) * (g.BV + 4) + size_t(g.Rp) * kLdE + size_t(g.Rp + kE) * (g.BV + 4) +
          size_t(2 * kE + g.Rp) * (d.Dk + 4)) * 4;
}
size_t grad_smem(const DeltaRuleDims& d) {
  return (size_t(kE) * (3 * (d.Dk + 4) + (d.Dv + 4) + (std::max(d.Dk, d.Dv) + 4)) + 3 * kE * kLdE) * 4;
}

// One device allocation that only grows, for the per-chunk work arrays. Growing inside a captured
// CUDA graph is allowed (the allocation is not a stream operation; the capture mode is relaxed
// for it), and an outgrown buffer is kept, not freed: a graph captured earlier may still use it.
struct Workspace {
  std::vector<float*> old;
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t floats) {
    if (floats > n) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      LRNN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      float* q = nullptr;
      const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&q), floats * sizeof(float));
      cudaThreadExchangeStreamCaptureMode(&mode);
      LRNN_CUDA_CHECK(e);
      if (p) old.push_back(p);
      p = q, n = floats;
    }
    return p;
  }
};
Workspace& workspace() {
  static thread_local Workspace w;  // one per host thread (and so per device: one process per GPU)
  return w;
}

size_t up64(size_t n) { return (n + 63) / 64 * 64; }

// Lays the work arrays out: the checkpoint's (GpuChunkedCkpt: the states, U~ and prep's arrays)
// in ckpt, or in the workspace without one, and the backward's dS and dU~ in the workspace.
Args make(const DeltaRuleDims& d, bool backward, float* ckpt) {
  const Geometry gm = geometry(d);
  Args a{};
  a.T = d.T, a.H = d.H, a.Dk = d.Dk, a.Dv = d.Dv, a.nh = d.n_h, a.BH = d.B * d.H;
  a.Ct = gm.Ct, a.NC = gm.NC, a.Rp = gm.Rp, a.BV = gm.BV;
  a.lq = d.lq(), a.lk = d.lk(), a.lv = d.lv(), a.lb = d.lb();
  a.bscale = float(beta_scale(d.range)), a.scale = float(d.out_scale());
  const size_t nch = size_t(d.B) * d.H * gm.NC;
  const GpuChunkedCkpt L = delta_rule_gpu_chunked_ckpt_layout(d);
  const size_t ndS = backward ? up64(nch * d.Dk * d.Dv) : 0, ndU = backward ? up64(nch * kE * d.Dv) : 0;
  float* w = workspace().get(ndS + ndU + (ckpt ? 0 : L.total));
  a.dS = backward ? w : nullptr, a.dUt = backward ? w + ndS : nullptr;
  float* ck = ckpt ? ckpt : w + ndS + ndU;
  // cp.async and float4 accesses read its rows 16 bytes at a time (every region starts on a
  // multiple of 64 floats), the log decays are doubles.
  LRNN_CHUNKED_REQUIRE((reinterpret_cast<uintptr_t>(ck) & 15) == 0);
  a.states = ck + L.states, a.Ut = ck + L.ut;
  a.Kc = ck + L.keys, a.Qc = ck + L.queries, a.W = ck + L.w, a.U = ck + L.u, a.Tm = ck + L.inverse;
  a.beta = ck + L.beta, a.G = reinterpret_cast<double*>(ck + L.log_decay), a.Pm = ck + L.qk;
  return a;
}

// name: what LRNN_CUDA_PROFILE=1 reports the kernel's time under. Each kernel is opted in to all
// the dynamic shared memory it may have once, on its first launch (delta_rule_chunked_cuda_applies
// keeps every size within it).
template <auto Kernel>
void opt_in() {
  static const bool allowed = [] {
    lrnn::cuda::allow_max_dynamic_smem(reinterpret_cast<const void*>(Kernel));
    return true;
  }();
  (void)allowed;
}
template <auto Kernel, int Threads = kThreads>
void launch(const char* name, dim3 grid, size_t smem, const Args& a) {
  lrnn::cuda::OpTimer timer(name);
  opt_in<Kernel>();
  Kernel<<<grid, Threads, smem, lrnn::cuda::stream()>>>(a);
  LRNN_CUDA_LAUNCH_CHECK();
}

// How many blocks of a kernel (Threads threads, smem bytes of dynamic shared memory) the GPU
// holds at once: the grid of a kernel whose blocks take work items in turn. Asked of the
// occupancy API once per size and host thread (a thread drives one device).
template <auto Kernel, int Threads = kThreads>
int resident_blocks(size_t smem) {
  static thread_local std::unordered_map<size_t, int> known;
  if (const auto it = known.find(smem); it != known.end()) return it->second;
  opt_in<Kernel>();
  int per_sm = 0;
  LRNN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, Threads, smem));
  return known[smem] = std::max(1, per_sm) * lrnn::cuda::num_sms();
}

// The dynamic shared memory a kernel may have (queried once per kernel).
template <auto Kernel>
size_t dynamic_smem_limit() {
  static const size_t v = lrnn::cuda::max_dynamic_smem(reinterpret_cast<const void*>(Kernel));
  return v;
}
// The bf16-tile prep, state, dstate and grad kernels where the precision and head dims allow them
// and their tiles fit (head dims up to 128), else the fp32-tile ones.
template <Mma P>
bool prep_s_fits(const DeltaRuleDims& d) {
  return grad_bf16_tiles(P, d.Dk, d.Dv) &&
         prep_s_layout(d.Dk, d.Dv, geometry(d).Rp).bytes <= dynamic_smem_limit<prep_s_kernel<P>>();
}
template <Mma P>
bool output_s_fits(const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  return output_bf16_tiles(P, gm.BV) && output_s_layout(d.Dk, gm.BV, gm.Rp).bytes <= dynamic_smem_limit<output_s_kernel<P>>();
}
template <Mma P>
bool state_s_fits(const DeltaRuleDims& d) {
  return walk_bf16_tiles(P, d.Dv) &&
         state_s_layout(d.Dk, geometry(d).BV, false).bytes <= dynamic_smem_limit<state_s_kernel<P, false>>();
}
// Whether a walk's blocks of all Dv columns (one per sequence and head) take fewer waves of the
// SMs than blocks of BV columns by more than cost10 / 10, a wide block's cost per chunk against a
// narrow one's.
bool walk_wide_pays(const DeltaRuleDims& d, int cost10) {
  const Geometry gm = geometry(d);
  const long long bh = (long long)d.B * d.H, sms = lrnn::cuda::num_sms();
  const long long waves = (bh * (d.Dv / gm.BV) + sms - 1) / sms, waves_wide = (bh + sms - 1) / sms;
  return 10 * waves > cost10 * waves_wide;
}
// The state walk in one block per sequence and head (all Dv columns) where blocks of BV columns
// would take more waves of the SMs: a chunk then costs a block 1.4x (measured, H200: 11.4 vs
// 8.2 us at head dim 128; phase B does two strips a warp instead of one, the staging of K~ and W
// is the same), so it pays where the waves drop by more than that.
template <Mma P>
bool state_walk_wide(const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  if (gm.BV == d.Dv || d.Dv > 128 || !walk_bf16_tiles(P, d.Dv) ||
      state_s_layout(d.Dk, d.Dv, true).bytes > dynamic_smem_limit<state_s_kernel<P, true>>())
    return false;
  return walk_wide_pays(d, 14);
}
template <Mma P>
bool dstate_s_fits(const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  return walk_bf16_tiles(P, d.Dv) &&
         dstate_s_layout(d.Dk, gm.BV, gm.Rp, false).bytes <= dynamic_smem_limit<dstate_s_kernel<P, false>>();
}
// The same for the backward's walk (dstate_s_kernel<P, true>; with dS and dU~ stored as bf16,
// Args::hg): phase A's strips are then one per warp, phase B's two (kWideStrips), where blocks of
// 64 columns have half their warps idle in phase A and one strip a warp in phase B. Predicted 1.5x
// a chunk; measured (H200, B 8 x T 4096 x H 16) 17.0 vs 10.9 us, 1.56x: the walk 1396-1399 ->
// 1087 us there.
template <Mma P>
bool dstate_walk_wide(const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  if (gm.BV == d.Dv || d.Dv > 128 || !walk_bf16_tiles(P, d.Dv) || (d.Dk / 16) * (d.Dv / 32) > kWideStrips * kMaxWarps ||
      dstate_s_layout(d.Dk, d.Dv, gm.Rp, true).bytes > dynamic_smem_limit<dstate_s_kernel<P, true>>())
    return false;
  return walk_wide_pays(d, 16);
}
template <Mma P>
bool grad_s_fits(const DeltaRuleDims& d) {
  return grad_bf16_tiles(P, d.Dk, d.Dv) && grad_s_layout(d.Dk, d.Dv).bytes <= dynamic_smem_limit<grad_s_kernel<P>>();
}

// grad_r (two blocks an SM) where its fixed shape applies: head dims 128, the states, U~, dS and
// dU~ bf16 in memory.
template <Mma P>
bool grad_r_applies(const DeltaRuleDims& d, const Args& a) {
  return d.Dk == 128 && d.Dv == 128 && a.hs && a.hg &&
         grad_r_layout().bytes <= dynamic_smem_limit<grad_r_kernel<P, 1>>() &&
         grad_r_layout().bytes <= dynamic_smem_limit<grad_r_kernel<P, 0>>();
}

// Whether the states and U~ go to memory as bf16 (Args::hs): where every kernel that writes or
// reads them is a bf16-tile one. The backward's dS and dU~ likewise (Args::hg), decided by
// backward_impl.
template <Mma P>
bool states_half(const DeltaRuleDims& d) {
  if constexpr (P == Mma::Bf16)
    return state_s_fits<P>(d) && output_s_fits<P>(d) && grad_s_fits<P>(d);
  else
    return false;
}

template <Mma P>
void launch_prep(const Args& a, const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  const dim3 grid(unsigned(gm.NC), unsigned(d.B) * d.H);
  if constexpr (P == Mma::Bf16) {
    if (prep_s_fits<P>(d))
      return launch<prep_s_kernel<P>, kPrepThreads>("delta chunked: prep", grid, prep_s_layout(d.Dk, d.Dv, gm.Rp).bytes, a);
  }
  launch<prep_kernel<P>, kPrepThreads>("delta chunked: prep", grid, prep_smem(d), a);
}

template <Mma P>
void forward_impl(const Args& args, const DeltaRuleDims& d, bool outputs) {
  Args a = args;
  a.hs = states_half<P>(d);
  const Geometry gm = geometry(d);
  const unsigned BH = unsigned(d.B) * d.H, NC = unsigned(gm.NC), VB = unsigned(d.Dv / gm.BV);
  launch_prep<P>(a, d);
  if constexpr (P == Mma::Bf16) {
    if (state_walk_wide<P>(d)) {
      launch<state_s_kernel<P, true>>("delta chunked: state", dim3(1, BH), state_s_layout(d.Dk, d.Dv, true).bytes, a);
    } else if (state_s_fits<P>(d)) {
      launch<state_s_kernel<P, false>>("delta chunked: state", dim3(VB, BH), state_s_layout(d.Dk, gm.BV, false).bytes, a);
    } else {
      launch<state_kernel<kCarry<P>>>("delta chunked: state", dim3(VB, BH), state_smem(d, gm), a);
    }
  } else {
    launch<state_kernel<kCarry<P>>>("delta chunked: state", dim3(VB, BH), state_smem(d, gm), a);
  }
  if (!outputs) return;
  // The bf16-tile form in blocks of 8 warps: its products are 8 strips of 16 x 32 at head dim 128
  // (half of 16 warps would idle), and several blocks share an SM, so one block's loads overlap
  // another's products (ncu, H200, B 8 x T 2048 x H 8, the form with an output tile: at 16 warps
  // one block per SM, 36 % of the stalls waiting on its global loads).
  if constexpr (P == Mma::Bf16) {
    if (output_s_fits<P>(d))
      return launch<output_s_kernel<P>, kPrepThreads>("delta chunked: output", dim3(NC, BH, VB),
                                                      output_s_layout(d.Dk, gm.BV, gm.Rp).bytes, a);
  }
  launch<output_kernel<P>>("delta chunked: output", dim3(NC, BH, VB), output_smem(d, gm), a);
}

template <Mma P>
void backward_impl(const Args& args, const DeltaRuleDims& d) {
  const Geometry gm = geometry(d);
  const unsigned BH = unsigned(d.B) * d.H, NC = unsigned(gm.NC), VB = unsigned(d.Dv / gm.BV);
  Args a = args;
  a.hs = states_half<P>(d);
  // prep's arrays are the forward's, in the checkpoint.
  if constexpr (walk_bf16_tiles(P, 32)) {
    const bool tiles = dstate_s_fits<P>(d);  // (dO 16-byte aligned: delta_rule_backward_chunked)
    a.hg = tiles && grad_s_fits<P>(d);
    if (a.hg && dstate_walk_wide<P>(d))
      launch<dstate_s_kernel<P, true>>("delta chunked: dstate", dim3(1, BH), dstate_s_layout(d.Dk, d.Dv, gm.Rp, true).bytes, a);
    else if (tiles)
      launch<dstate_s_kernel<P, false>>("delta chunked: dstate", dim3(VB, BH), dstate_s_layout(d.Dk, gm.BV, gm.Rp, false).bytes, a);
    else
      launch<dstate_kernel<P>>("delta chunked: dstate", dim3(VB, BH), dstate_smem(d, gm), a);
  } else {
    launch<dstate_kernel<P>>("delta chunked: dstate", dim3(VB, BH), dstate_smem(d, gm), a);
  }
  if constexpr (P == Mma::Bf16) {
    if (grad_r_applies<P>(d, a)) {
      const size_t smem = grad_r_layout().bytes;
      constexpr auto one = grad_r_kernel<P, 1>, any = grad_r_kernel<P, 0>;
      const int slots = d.n_h == 1 ? resident_blocks<one, kGradRThreads>(smem) : resident_blocks<any, kGradRThreads>(smem);
      const dim3 grid(std::min(NC * BH, unsigned(slots)));
      return d.n_h == 1 ? launch<one, kGradRThreads>("delta chunked: grad", grid, smem, a)
                        : launch<any, kGradRThreads>("delta chunked: grad", grid, smem, a);
    }
  }
  if constexpr (grad_bf16_tiles(P, 32, 32)) {
    if (grad_s_fits<P>(d)) {
      const size_t smem = grad_s_layout(d.Dk, d.Dv).bytes;
      return launch<grad_s_kernel<P>>("delta chunked: grad", dim3(std::min(NC * BH, unsigned(resident_blocks<grad_s_kernel<P>>(smem)))),
                                      smem, a);
    }
  }
  launch<grad_kernel<P>>("delta chunked: grad", dim3(NC, BH), grad_smem(d), a);
}


// The products' input precision of the current cuda::GemmPrecision, and the kernels for it.
Mma mma_mode() {
  switch (lrnn::cuda::gemm_precision()) {
    case lrnn::cuda::GemmPrecision::FP32: return Mma::Fp32;
    case lrnn::cuda::GemmPrecision::BF16: return Mma::Bf16;
    default: return Mma::Tf32;
  }
}
void run_forward(const Args& a, const DeltaRuleDims& d, bool outputs) {
  switch (mma_mode()) {
    case Mma::Fp32: return forward_impl<Mma::Fp32>(a, d, outputs);
    case Mma::Bf16: return forward_impl<Mma::Bf16>(a, d, outputs);
    default: return forward_impl<Mma::Tf32>(a, d, outputs);
  }
}
void run_backward(const Args& a, const DeltaRuleDims& d) {
  switch (mma_mode()) {
    case Mma::Fp32: return backward_impl<Mma::Fp32>(a, d);
    case Mma::Bf16: return backward_impl<Mma::Bf16>(a, d);
    default: return backward_impl<Mma::Tf32>(a, d);
  }
}

// Whether the current precision's kernels store the states as bf16, and the format each
// checkpoint buffer was last written in (by address, on this host thread): a backward under another
// GEMM precision than its forward's would read the states in the wrong format.
bool states_half_now(const DeltaRuleDims& d) { return mma_mode() == Mma::Bf16 && states_half<Mma::Bf16>(d); }
// Where the output gradients do not start 16-byte aligned (a caller's slice), the backward copies
// them to this buffer first: the bf16 walk reads their rows 16 bytes at a time, and so every
// alignment takes the same kernels (the same results).
Workspace& dout_copy() {
  static thread_local Workspace w;
  return w;
}
std::unordered_map<const float*, bool>& ckpt_formats() {
  static thread_local std::unordered_map<const float*, bool> m;
  return m;
}

void set_inputs(Args& a, const float* q, const float* k, const float* v, const float* bl, const float* g) {
  a.q = q, a.k = k, a.v = v, a.bl = bl, a.g = g;
}

}  // namespace

bool delta_rule_chunked_cuda_applies(const DeltaRuleDims& d) {
  if (d.Dk % 16 || d.Dv % 16 || d.Dk <= 0 || d.Dv <= 0 || d.n_h > kE) return false;
  const Geometry gm = geometry(d);
  // The static arrays (G, gates, ...) do not depend on the precision parameter: one instance tells.
  return prep_smem(d) <= dynamic_smem_limit<prep_kernel<Mma::Tf32>>() &&
         state_smem(d, gm) <= dynamic_smem_limit<state_kernel<Mma::Tf32>>() &&
         output_smem(d, gm) <= dynamic_smem_limit<output_kernel<Mma::Tf32>>() &&
         dstate_smem(d, gm) <= dynamic_smem_limit<dstate_kernel<Mma::Tf32>>() &&
         grad_smem(d) <= dynamic_smem_limit<grad_kernel<Mma::Tf32>>();
}

// Measured on one H100 in one run (2026-11-28, at 1cf130a: `SECTIONS=kernel scripts/gpu-run.sh`,
// tests/cuda DeltaRuleCuda.DISABLED_Timing), forward + backward in microseconds, recurrent (tiled)
// vs chunked:
//   head dim 128, B 8 x H 8:  T 64: 207 vs 270;  T 128: 416 vs 345;  T 256: 822 vs 621;
//                             T 512: 1634 vs 1229;  T 2048: 6501 vs 4803
//   T 2048 with a forget gate: 12991 vs 5309;  n_h 2 (gated): 18676 vs 9012;  n_h 3: 24569 vs 13376
//   B 8 x H 16, T 4096: 24000 vs 18629
//   head dim 64, B 8 x H 16, T 512: no gate 1156 vs 1288;  gate 1554 vs 1390;  n_h 2, gate 2275 vs 2331
// So the chunked form from T = 128 at head dims of 128 and more (1.2-1.4x without a gate, 1.8-2.4x
// with one or with sub-steps, where the recurrent backward rebuilds states inside every chunk); at
// head dim 64 the two are within 12% either way and the recurrent kernels stay.
// Re-checked on an H200 with the kernels as they are now (2026-11-28; the recurrent rows from one
// call, the chunked from the next, TF32 / bf16 products): head dim 128, B 8 x H 8, T 64: 213 vs
// 223 / 171; T 128: 418 vs 305 / 231; head dim 64, B 8 x H 16, T 512: 1158 vs 1215 / 969, gate
// 1554 vs 1283 / 1058, n_h 2 with a gate 2275 vs 2216 / 1840. The rule stays one for both
// precisions (a model sizes its checkpoints by it once, whatever the precision later).
// Again on an H200 with the kernels of ad6ac0c (2026-11-29, one call, `SECTIONS="tests kernel
// lm-speed" scripts/gpu-run.sh`), head dim 64, B 8 x H 16, T 512, recurrent vs chunked TF32 /
// bf16: no gate 1157 vs 1007 / 555; gate 1554 vs 1071 / 627; n_h 2 with a gate 2275 vs 1839 /
// 1119 — the chunked form now wins there in both precisions (1.15-1.45x TF32, 2.0-2.5x bf16), so
// it takes head dims from 64 at T >= 512 too (T 128-256 at head dim 64 are not measured). Its
// checkpoint there is ~1.6x the recurrent layout's (512 vs 320 floats a token at head dim 64).
bool delta_rule_chunked_cuda_pays(const DeltaRuleDims& d, bool) {
  const int dmin = std::min(d.Dk, d.Dv);
  return delta_rule_chunked_cuda_applies(d) && ((dmin >= 128 && d.T >= 128) || (dmin >= 64 && d.T >= 512));
}

bool delta_rule_chunked_state_walk_wide(const DeltaRuleDims& d) {
  return delta_rule_chunked_cuda_applies(d) && mma_mode() == Mma::Bf16 && state_walk_wide<Mma::Bf16>(d);
}
bool delta_rule_chunked_dstate_walk_wide(const DeltaRuleDims& d) {
  return delta_rule_chunked_cuda_applies(d) && mma_mode() == Mma::Bf16 && dstate_s_fits<Mma::Bf16>(d) &&
         grad_s_fits<Mma::Bf16>(d) && dstate_walk_wide<Mma::Bf16>(d);
}

void delta_rule_forward_chunked(float* o, const float* q, const float* k, const float* v, const float* beta_logit,
                                const float* g, const DeltaRuleDims& d, float* ckpt, float* state) {
  LRNN_CHUNKED_REQUIRE(delta_rule_chunked_cuda_applies(d));
  LRNN_CHUNKED_REQUIRE(!(ckpt && state));
  if (d.B == 0 || d.T == 0) return;
  Args a = make(d, false, ckpt);
  set_inputs(a, q, k, v, beta_logit, g);
  a.o = o;
  a.state_io = state;
  if (ckpt) ckpt_formats()[ckpt] = states_half_now(d);
  run_forward(a, d, o != nullptr);
}

void delta_rule_backward_chunked(float* dq, float* dk, float* dv, float* dbeta_logit, float* dg, const float* dout,
                                 const float* q, const float* k, const float* v, const float* beta_logit,
                                 const float* g, const DeltaRuleDims& d, const float* ckpt, bool accumulate) {
  LRNN_CHUNKED_REQUIRE(delta_rule_chunked_cuda_applies(d));
  if (d.B == 0 || d.T == 0) return;
  if (ckpt) {
    const auto f = ckpt_formats().find(ckpt);
    if (f != ckpt_formats().end() && f->second != states_half_now(d))
      ::lrnn::cuda::fail(cudaErrorInvalidValue,
                         "CUDA chunked delta rule: the checkpoint was written under another GEMM precision (its "
                         "states are stored as bf16 only under BF16); run the forward and backward under one",
                         __FILE__, __LINE__);
  }
  if ((reinterpret_cast<uintptr_t>(dout) & 15) != 0) {
    const size_t n = size_t(d.B) * d.T * d.H * d.Dv;
    float* copy = dout_copy().get(n);
    LRNN_CUDA_CHECK(cudaMemcpyAsync(copy, dout, n * sizeof(float), cudaMemcpyDeviceToDevice, lrnn::cuda::stream()));
    dout = copy;
  }
  // Without the forward's checkpoints they are recomputed into the workspace.
  Args a = make(d, true, const_cast<float*>(ckpt));
  set_inputs(a, q, k, v, beta_logit, g);
  if (!ckpt) run_forward(a, d, false);
  a.dout = dout;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dbl = dbeta_logit, a.dg = dg;
  a.accumulate = accumulate;
  run_backward(a, d);
}

}  // namespace lrnn::ops::cuda
