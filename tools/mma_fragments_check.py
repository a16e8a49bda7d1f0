# Checks the lane addressing of mm_s (src/ops/delta_rule/delta_rule_chunked_cuda.cu) on the CPU: emulates
# ldmatrix .x4 (and .trans) and mma.m16n8k16 with the fragment layouts of the PTX ISA, runs mm_s's
# loop for every (AT, BT) on padded tiles, and prints the largest difference from A @ B.
#   .venv/bin/python3 tools/mma_fragments_check.py
# Emulates mm_s's lane addressing with PTX ldmatrix (.x4, .trans) and mma.m16n8k16 fragment layouts.
import numpy as np
rng = np.random.default_rng(0)

def ldsm_x4(mem, addrs, trans):
    # addrs[l] = (flat index) row start for lane l; matrix j rows from lanes 8j..8j+7
    regs = [[None]*4 for _ in range(32)]
    for j in range(4):
        mat = np.array([mem[addrs[8*j+i]: addrs[8*j+i]+8] for i in range(8)])  # 8x8
        for l in range(32):
            g, t = l // 4, l % 4
            if not trans: regs[l][j] = (mat[g, 2*t], mat[g, 2*t+1])
            else:         regs[l][j] = (mat[2*t, g], mat[2*t+1, g])
    return regs

def mma(acc, a, b0, b1):
    # per-lane fragments -> reconstruct A (16x16), B (16x8), then acc += A B in fragment layout
    A = np.zeros((16,16)); B = np.zeros((16,8))
    for l in range(32):
        g, t = l//4, l%4
        A[g, 2*t:2*t+2] = a[l][0]; A[g+8, 2*t:2*t+2] = a[l][1]
        A[g, 2*t+8:2*t+10] = a[l][2]; A[g+8, 2*t+8:2*t+10] = a[l][3]
        B[2*t:2*t+2, g] = b0[l]; B[2*t+8:2*t+10, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l//4, l%4
        acc[l][0] += C[g, 2*t]; acc[l][1] += C[g, 2*t+1]; acc[l][2] += C[g+8, 2*t]; acc[l][3] += C[g+8, 2*t+1]

def mm_s(AT, BT, A, lda, B, ldb, M, N, K):
    out = np.zeros((M, N))
    sn = N // 32; strips = (M // 16) * sn
    for t_ in range(strips):
        m0, n0 = (t_ // sn) * 16, (t_ % sn) * 32
        acc = [[[0.0]*4 for _ in range(32)] for q in range(4)]
        pa, pb0, pb1 = [], [], []
        for lane in range(32):
            r, j = lane & 7, lane >> 3
            a_row = r + 8*(j >> 1) if AT else r + 8*(j & 1); a_col = 8*(j & 1) if AT else 8*(j >> 1)
            b_row = r + 8*(j >> 1) if BT else r + 8*(j & 1); b_col = 8*(j & 1) if BT else 8*(j >> 1)
            pa.append(a_row*lda + m0 + a_col if AT else (m0 + a_row)*lda + a_col)
            p0 = (n0 + b_row)*ldb + b_col if BT else b_row*ldb + n0 + b_col
            pb0.append(p0); pb1.append(p0 + 16*ldb if BT else p0 + 16)
        a_step = 16*lda if AT else 16; b_step = 16 if BT else 16*ldb
        for k0 in range(0, K, 16):
            a = ldsm_x4(A, pa, AT)
            b0 = ldsm_x4(B, pb0, not BT); b1 = ldsm_x4(B, pb1, not BT)
            mma(acc[0], a, [x[0] for x in b0], [x[1] for x in b0])
            mma(acc[1], a, [x[2] for x in b0], [x[3] for x in b0])
            mma(acc[2], a, [x[0] for x in b1], [x[1] for x in b1])
            mma(acc[3], a, [x[2] for x in b1], [x[3] for x in b1])
            pa = [p + a_step for p in pa]; pb0 = [p + b_step for p in pb0]; pb1 = [p + b_step for p in pb1]
        for q in range(4):
            for l in range(32):
                g, t2 = l >> 2, (l & 3)*2
                for h in range(2):
                    out[m0 + g + 8*h, n0 + 8*q + t2] = acc[q][l][2*h]; out[m0 + g + 8*h, n0 + 8*q + t2 + 1] = acc[q][l][2*h+1]
    return out

worst = 0.0
for AT in (False, True):
    for BT in (False, True):
        M, N, K = 32, 64, 48
        Am = rng.standard_normal((M, K)); Bm = rng.standard_normal((K, N))
        lda = (M if AT else K) + 8; ldb = (K if BT else N) + 8
        As = np.zeros(((K if AT else M) * lda)); Bs = np.zeros(((N if BT else K) * ldb))
        for m in range(M):
            for k in range(K):
                As[(k*lda + m) if AT else (m*lda + k)] = Am[m, k]
        for k in range(K):
            for n in range(N):
                Bs[(n*ldb + k) if BT else (k*ldb + n)] = Bm[k, n]
        out = mm_s(AT, BT, As, lda, Bs, ldb, M, N, K)
        err = np.abs(out - Am @ Bm).max()
        worst = max(worst, err)
        print(f"AT={AT!s:5} BT={BT!s:5}  max |mm_s - A @ B| = {err:.1e}")
# fp64 emulation: a wrong lane address gives an O(1) difference, rounding ~1e-14.
raise SystemExit(0 if worst < 1e-10 else 1)
