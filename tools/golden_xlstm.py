#!/usr/bin/env python3
"""Golden reference data for the xLSTM language models (xlstm package `xLSTMLMModel` semantics:
a stack of mLSTM blocks, or of sLSTM blocks).

An independent, deliberately plain float64 PyTorch implementation with token loops, written from
the package's documented behaviour (stabilised exponential gating, residual LayerNorm weights,
block-diagonal projections, the CUDA-backend sLSTM parameter layout). It writes, per case, a
safetensors file into tests/data/ with the inputs, initial parameters, logits, loss, every
gradient, and the result of a few clipped-AdamW steps. Dev-only: CI never runs this script.

    python3 tools/golden_xlstm.py          # regenerates tests/data/golden_{mlstm,slstm}_*.safetensors
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as common  # noqa: E402
from golden_common import DT, causal_depthwise_conv, make_batch  # noqa: E402

LN_EPS, MLSTM_EPS = 1e-5, 1e-6


def round_up(factor, d, multiple):
    return int(math.ceil(factor * d / multiple) * multiple)


def make_config(model_type, V, d, L, H, K, multiple=8, **kw):
    """The lrnn `model:` block (every key explicit), also stored in the golden's metadata."""
    c = dict(model_type=model_type, vocab_size=V, embedding_dim=d, num_blocks=L, num_heads=H, conv1d_kernel_size=K,
             round_proj_up_to_multiple_of=multiple)
    if model_type == "mlstm":
        c.update(proj_factor=kw.get("proj_factor", 2.0), qkv_proj_blocksize=kw.get("qkv_proj_blocksize", 4),
                 bias=kw.get("bias", False))
    else:
        c.update(group_norm_weight=kw.get("group_norm_weight", True), ffn_proj_factor=kw.get("ffn_proj_factor", 1.3))
    return c


def dims(c):
    d, H = c["embedding_dim"], c["num_heads"]
    if c["model_type"] == "mlstm":
        inner = round_up(c["proj_factor"], d, c["round_proj_up_to_multiple_of"])
        return dict(inner=inner, dh=inner // H, bs=c["qkv_proj_blocksize"], nb=inner // c["qkv_proj_blocksize"])
    return dict(dh=d // H, ffn=round_up(c["ffn_proj_factor"], d, c["round_proj_up_to_multiple_of"]))


def param_shapes(c):
    """Ordered {xlstm state_dict name: shape}."""
    V, d, H, K = c["vocab_size"], c["embedding_dim"], c["num_heads"], c["conv1d_kernel_size"]
    D = dims(c)
    s = {"token_embedding.weight": (V, d)}
    for l in range(c["num_blocks"]):
        p = f"xlstm_block_stack.blocks.{l}."
        s[p + "xlstm_norm.weight"] = (d,)
        if c["model_type"] == "mlstm":
            I, bs, nb = D["inner"], D["bs"], D["nb"]
            s[p + "xlstm.proj_up.weight"] = (2 * I, d)
            for n in "qkv":
                s[p + f"xlstm.{n}_proj.weight"] = (nb, bs, bs)
            if c["bias"]:
                s[p + "xlstm.proj_up.bias"] = (2 * I,)
                for n in "qkv":
                    s[p + f"xlstm.{n}_proj.bias"] = (I,)
                s[p + "xlstm.proj_down.bias"] = (d,)
            if K:
                s[p + "xlstm.conv1d.conv.weight"] = (I, 1, K)
                s[p + "xlstm.conv1d.conv.bias"] = (I,)
            for g in ("igate", "fgate"):
                s[p + f"xlstm.mlstm_cell.{g}.weight"] = (H, 3 * I)
                s[p + f"xlstm.mlstm_cell.{g}.bias"] = (H,)
            s[p + "xlstm.mlstm_cell.outnorm.weight"] = (I,)
            s[p + "xlstm.learnable_skip"] = (I,)
            s[p + "xlstm.proj_down.weight"] = (d, I)
        else:
            dh, U = D["dh"], D["ffn"]
            if K:
                s[p + "xlstm.conv1d.conv.weight"] = (d, 1, K)
                s[p + "xlstm.conv1d.conv.bias"] = (d,)
            for g in ("fgate", "igate", "zgate", "ogate"):
                s[p + f"xlstm.{g}.weight"] = (H, dh, dh)
            s[p + "xlstm.slstm_cell._recurrent_kernel_"] = (H, dh, 4 * dh)  # CUDA-backend layout
            s[p + "xlstm.slstm_cell._bias_"] = (H * 4 * dh,)
            if c["group_norm_weight"]:
                s[p + "xlstm.group_norm.weight"] = (d,)
            s[p + "ffn_norm.weight"] = (d,)
            s[p + "ffn.proj_up.weight"] = (2 * U, d)
            s[p + "ffn.proj_down.weight"] = (d, U)
    s["xlstm_block_stack.post_blocks_norm.weight"] = (d,)
    s["lm_head.weight"] = (V, d)
    return s


def decays(name):
    """The package's optimizer groups (xLSTMLMModel._create_weight_decay_optim_groups, embedding excluded)."""
    return name != "token_embedding.weight" and "weight" in name and "norm" not in name


def init_params(c, g):
    """Random values chosen so that every path carries signal and both stabiliser branches occur."""
    P = {}
    for name, shape in param_shapes(c).items():
        if "norm.weight" in name:
            t = 0.2 * torch.randn(shape, generator=g)  # offsets from 1
        elif name.endswith("conv.weight"):
            t = torch.rand(shape, generator=g) - 0.5
        elif name.endswith("learnable_skip"):
            t = 1 + 0.3 * torch.randn(shape, generator=g)
        elif name.endswith("igate.bias") and "mlstm_cell" in name:
            t = 2.0 * torch.randn(shape, generator=g)
        elif name.endswith("fgate.bias") and "mlstm_cell" in name:
            t = torch.linspace(0.5, 3.0, shape[0]) + 0.5 * torch.randn(shape, generator=g)
        elif name.endswith("_recurrent_kernel_"):
            t = torch.randn(shape, generator=g) * (0.8 / math.sqrt(shape[1]))
        elif name.endswith("_bias_"):
            t = 1.5 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.2 * torch.randn(shape, generator=g)
        elif name == "token_embedding.weight":
            t = torch.randn(shape, generator=g)
        else:  # [out, in] matrices and [heads, out, in] blocks
            t = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        P[name] = t.to(DT)
    return P


# ----------------------------------------------------------------------------- components

def layer_norm(x, w, groups=1):
    """LayerNorm without bias over `groups` equal slices of the last dim; weight stored as offset from 1."""
    shp = x.shape
    x = x.reshape(*shp[:-1], groups, shp[-1] // groups)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = ((x - mu) / torch.sqrt(var + LN_EPS)).reshape(shp)
    return y if w is None else y * (1 + w)


def headwise(x, w, b=None):
    """Block-diagonal map: x [..., H*I], w [H, O, I] -> [..., H*O]."""
    H, O, I = w.shape
    y = torch.einsum("...hi,hoi->...ho", x.reshape(*x.shape[:-1], H, I), w).reshape(*x.shape[:-1], H * O)
    return y if b is None else y + b


def mlstm_loop(q, k, v, ipre, fpre, stats=None):
    """Recurrent stabilised mLSTM. q,k,v [B,T,H,D], ipre/fpre [B,T,H] -> [B,T,H,D]."""
    B, T, H, D = q.shape
    C = q.new_zeros(B, H, D, D)
    n = q.new_zeros(B, H, D)
    m = None
    out = []
    for t in range(T):
        lf, i = F.logsigmoid(fpre[:, t]), ipre[:, t]
        if t == 0:
            m_new, a = i, torch.zeros_like(i)
        else:
            m_new = torch.maximum(lf + m, i)
            a = torch.exp(lf + m - m_new)
            if stats is not None:
                stats["f_branch"] += int((lf + m >= i).sum())
                stats["steps"] += i.numel()
        b = torch.exp(i - m_new)
        kk = k[:, t] / math.sqrt(D)
        C = a[..., None, None] * C + b[..., None, None] * kk[..., :, None] * v[:, t][..., None, :]
        n = a[..., None] * n + b[..., None] * kk
        num = torch.einsum("bhij,bhi->bhj", C, q[:, t])
        s = (n * q[:, t]).sum(-1)
        floor = torch.exp(-m_new)
        if stats is not None:
            stats["floor"] += int((floor > s.abs()).sum())
            stats["tokens"] += s.numel()
        den = torch.maximum(s.abs(), floor) + MLSTM_EPS
        out.append(num / den[..., None])
        m = m_new
    return torch.stack(out, dim=1)


def mlstm_parallel(q, k, v, ipre, fpre):
    """Cross-check: the package's parallel form (decay matrix, row-wise max stabiliser)."""
    B, T, H, D = q.shape
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B,H,T,D]
    lf = F.logsigmoid(fpre).transpose(1, 2)           # [B,H,T]
    cum = torch.cumsum(lf, -1)
    logD = cum[..., :, None] - cum[..., None, :] + ipre.transpose(1, 2)[..., None, :]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    logD = torch.where(mask, logD, torch.tensor(-math.inf))
    mx = logD.max(-1, keepdim=True).values
    Cm = (q @ (k / math.sqrt(D)).transpose(-1, -2)) * torch.exp(logD - mx)
    norm = torch.maximum(Cm.sum(-1, keepdim=True).abs(), torch.exp(-mx)) + MLSTM_EPS
    return ((Cm / norm) @ v).transpose(1, 2)


def slstm_loop(raw_x, R, bias):
    """Recurrent stabilised sLSTM. raw_x [B,T,4,H,D] (gates i,f,z,o), R [H,D,4,D], bias [H,4,D] -> y [B,T,H,D]."""
    B, T, _, H, D = raw_x.shape
    y = raw_x.new_zeros(B, H, D)
    c, n, m = torch.zeros_like(y), torch.zeros_like(y), None
    out = []
    for t in range(T):
        raw = raw_x[:, t] + bias.transpose(0, 1) + torch.einsum("bha,hagj->bghj", y, R)
        ir, fr, zr, orr = raw.unbind(1)
        lf = F.logsigmoid(fr)
        if t == 0:
            m_new, fg = ir, torch.zeros_like(ir)
        else:
            m_new = torch.maximum(ir, lf + m)
            fg = torch.exp(lf + m - m_new)
        ig = torch.exp(ir - m_new)
        c = fg * c + ig * torch.tanh(zr)
        n = fg * n + ig
        y = torch.sigmoid(orr) * c / n
        m = m_new
        out.append(y)
    return torch.stack(out, dim=1)


def slstm_unstabilised(raw_x, R, bias):
    """Cross-check: the sLSTM without the stabiliser (exp(i), sigmoid(f)) — fine in float64 for moderate gates."""
    B, T, _, H, D = raw_x.shape
    y = raw_x.new_zeros(B, H, D)
    c, n = torch.zeros_like(y), torch.zeros_like(y)
    out = []
    for t in range(T):
        raw = raw_x[:, t] + bias.transpose(0, 1) + torch.einsum("bha,hagj->bghj", y, R)
        ir, fr, zr, orr = raw.unbind(1)
        c = torch.sigmoid(fr) * c + torch.exp(ir) * torch.tanh(zr)
        n = torch.sigmoid(fr) * n + torch.exp(ir)
        y = torch.sigmoid(orr) * c / n
        out.append(y)
    return torch.stack(out, dim=1)


# ----------------------------------------------------------------------------- model

def conv_silu(x, P, p, c):
    """SiLU(causal conv1d(x) + bias), or x itself without a conv (conv1d_kernel_size 0)."""
    if not c["conv1d_kernel_size"]:
        return x
    return F.silu(causal_depthwise_conv(x, P[p + "conv1d.conv.weight"], P[p + "conv1d.conv.bias"]))


def mlstm_layer(x, P, p, c, capture):
    B, T, d = x.shape
    D = dims(c)
    I, H = D["inner"], c["num_heads"]
    bias = (lambda n: P.get(p + n)) if c["bias"] else (lambda n: None)
    up = x @ P[p + "proj_up.weight"].T
    if c["bias"]:
        up = up + P[p + "proj_up.bias"]
    xm, z = up[..., :I], up[..., I:]
    xc = conv_silu(xm, P, p, c)
    q = headwise(xc, P[p + "q_proj.weight"], bias("q_proj.bias"))
    k = headwise(xc, P[p + "k_proj.weight"], bias("k_proj.bias"))
    v = headwise(xm, P[p + "v_proj.weight"], bias("v_proj.bias"))
    gin = torch.cat([q, k, v], dim=-1)
    ipre = gin @ P[p + "mlstm_cell.igate.weight"].T + P[p + "mlstm_cell.igate.bias"]
    fpre = gin @ P[p + "mlstm_cell.fgate.weight"].T + P[p + "mlstm_cell.fgate.bias"]
    qh, kh, vh = (t.reshape(B, T, H, I // H) for t in (q, k, v))
    if capture is not None:
        capture.append((qh.detach(), kh.detach(), vh.detach(), ipre.detach(), fpre.detach()))
    h = mlstm_loop(qh, kh, vh, ipre, fpre).reshape(B, T, I)
    hn = layer_norm(h, P[p + "mlstm_cell.outnorm.weight"], groups=H)
    hs = (hn + P[p + "learnable_skip"] * xc) * F.silu(z)
    y = hs @ P[p + "proj_down.weight"].T
    return y + P[p + "proj_down.bias"] if c["bias"] else y


def slstm_layer(x, P, p, c, capture):
    B, T, d = x.shape
    H, dh = c["num_heads"], dims(c)["dh"]
    xc = conv_silu(x, P, p, c)
    # The package's sLSTMLayer.forward puts the module named `fgate` into the input-gate slot and
    # `igate` into the forget-gate slot (cat([i, f, z, o]) with i = fgate(x_conv), f = igate(x_conv)).
    gates = [headwise(xc, P[p + "fgate.weight"]), headwise(xc, P[p + "igate.weight"]),
             headwise(x, P[p + "zgate.weight"]), headwise(x, P[p + "ogate.weight"])]
    raw = torch.stack([t.reshape(B, T, H, dh) for t in gates], dim=2)  # [B,T,4,H,dh]
    R = P[p + "slstm_cell._recurrent_kernel_"].reshape(H, dh, 4, dh)
    bias = P[p + "slstm_cell._bias_"].reshape(H, 4, dh)
    if capture is not None:
        capture.append((raw.detach(), R.detach(), bias.detach()))
    y = slstm_loop(raw, R, bias).reshape(B, T, d)
    return layer_norm(y, P.get(p + "group_norm.weight"), groups=H)


def forward(P, c, tokens, capture=None):
    h = P["token_embedding.weight"][tokens]
    for l in range(c["num_blocks"]):
        p = f"xlstm_block_stack.blocks.{l}."
        x = layer_norm(h, P[p + "xlstm_norm.weight"])
        if c["model_type"] == "mlstm":
            h = h + mlstm_layer(x, P, p + "xlstm.", c, capture)
        else:
            h = h + slstm_layer(x, P, p + "xlstm.", c, capture)
            g, u = (layer_norm(h, P[p + "ffn_norm.weight"]) @ P[p + "ffn.proj_up.weight"].T).chunk(2, dim=-1)
            h = h + (F.gelu(g) * u) @ P[p + "ffn.proj_down.weight"].T
    h = layer_norm(h, P["xlstm_block_stack.post_blocks_norm.weight"])
    return h @ P["lm_head.weight"].T


# ----------------------------------------------------------------------------- self-checks

def check_param_counts():
    for mt, expect in (("mlstm", 219_792), ("slstm", 216_960)):
        c = make_config(mt, 3, 128, 2, 4, 4, multiple=64)
        n = sum(math.prod(s) for s in param_shapes(c).values())
        print(f"param count {mt} V=3 d=128 L=2 H=4 conv 4: {n}")
        assert n == expect, n


def check_cells():
    """The token loops against the second formulations, values and gradients, in hard regimes."""
    g = torch.Generator().manual_seed(5)
    B, T, H, D = 2, 40, 2, 4
    for i_mean, f_mean in ((0.0, 2.0), (30.0, 0.0), (-30.0, 8.0), (0.0, -15.0)):
        ins = [torch.randn(B, T, H, D, generator=g) for _ in range(3)] + \
              [i_mean + 3 * torch.randn(B, T, H, generator=g), f_mean + 3 * torch.randn(B, T, H, generator=g)]
        ins = [x.requires_grad_(True) for x in ins]
        w = torch.randn(B, T, H, D, generator=g)
        a, b = mlstm_loop(*ins), mlstm_parallel(*ins)
        ga = torch.autograd.grad((a * w).sum(), ins)
        gb = torch.autograd.grad((b * w).sum(), ins)
        err = (a - b).abs().max().item()
        gerr = max(((x - y).abs().max() / (y.abs().max() + 1e-300)).item() for x, y in zip(ga, gb))
        print(f"mLSTM loop vs parallel (i ~ {i_mean}, f ~ {f_mean}): max|diff| {err:.2e}, grads rel {gerr:.2e}")
        assert err < 1e-10 and gerr < 1e-9, (err, gerr)
    for scale in (1.0, 4.0):
        raw = (scale * torch.randn(B, T, 4, H, D, generator=g)).requires_grad_(True)
        R = (0.5 * torch.randn(H, D, 4, D, generator=g)).requires_grad_(True)
        bias = torch.randn(H, 4, D, generator=g).requires_grad_(True)
        w = torch.randn(B, T, H, D, generator=g)
        a, b = slstm_loop(raw, R, bias), slstm_unstabilised(raw, R, bias)
        ga = torch.autograd.grad((a * w).sum(), (raw, R, bias))
        gb = torch.autograd.grad((b * w).sum(), (raw, R, bias))
        err = (a - b).abs().max().item()
        gerr = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(ga, gb))
        print(f"sLSTM stabilised vs unstabilised (gate scale {scale}): max|diff| {err:.2e}, grads rel {gerr:.2e}")
        assert err < 1e-10 and gerr < 1e-9, (err, gerr)


def check_gradcheck():
    for mt, kw in (("mlstm", dict(bias=True)), ("slstm", dict())):
        c = make_config(mt, 5, 8, 1, 2, 2, multiple=4, **kw)
        g = torch.Generator().manual_seed(7)
        P = init_params(c, g)
        tokens, labels = make_batch(c, 2, 5, g)
        ok = common.gradcheck(lambda P, tok: forward(P, c, tok), P, tokens, labels)
        print(f"gradcheck tiny {mt} ({sum(t.numel() for t in P.values())} elements in {len(P)} params): {ok}")
        assert ok


# ----------------------------------------------------------------------------- cases

def run_case(fname, seed, c, B, T):
    g = torch.Generator().manual_seed(seed)
    P0 = init_params(c, g)
    tokens, labels = make_batch(c, B, T, g)
    capture = []
    logits, loss, grads = common.forward_backward(lambda P, tok: forward(P, c, tok, capture), P0, tokens, labels)

    # Both branches of every max must occur, or the golden would not test them.
    note = ""
    if c["model_type"] == "mlstm":
        st = dict(f_branch=0, steps=0, floor=0, tokens=0)
        for q, k, v, ip, fp in capture:
            mlstm_loop(q, k, v, ip, fp, st)
            err = (mlstm_loop(q, k, v, ip, fp) - mlstm_parallel(q, k, v, ip, fp)).abs().max().item()
            assert err < 1e-10, err
        assert 0 < st["f_branch"] < st["steps"] and 0 < st["floor"] < st["tokens"], st
        ipre = torch.cat([x[3].flatten() for x in capture])
        note = (f"  stabiliser: m from the forget branch {st['f_branch']}/{st['steps']}, normaliser at exp(-m) "
                f"{st['floor']}/{st['tokens']}, igate preacts in [{ipre.min():.2f}, {ipre.max():.2f}]\n")
    else:
        for raw, R, bias in capture:
            err = (slstm_loop(raw, R, bias) - slstm_unstabilised(raw, R, bias)).abs().max().item()
            assert err < 1e-10, err
        raw = torch.cat([x[0][:, :, 0].flatten() for x in capture])
        note = f"  input-gate preacts (without recurrence) in [{raw.min():.2f}, {raw.max():.2f}]\n"
    gold = common.Golden(fname, "tools/golden_xlstm.py", c, lambda P, tok: forward(P, c, tok), decays, P0, tokens,
                         labels, logits, loss, grads)
    print(f"{gold.summary()}\n  loss={loss.item():.12f}  FD max|diff|={gold.fd_err:.3e}  "
          f"own AdamW vs torch max|diff|={gold.adam_err:.3e}\n" + note + gold.adam_report())


def main():
    common.deterministic()
    check_param_counts()
    check_cells()
    check_gradcheck()
    run_case("golden_mlstm_conv.safetensors", 3003, make_config("mlstm", 5, 16, 2, 2, 4), B=3, T=12)
    run_case("golden_mlstm_bias_noconv.safetensors", 4004,
             make_config("mlstm", 7, 16, 1, 4, 0, bias=True, qkv_proj_blocksize=8), B=2, T=14)
    run_case("golden_slstm_conv.safetensors", 5005, make_config("slstm", 5, 16, 2, 2, 4), B=3, T=12)
    run_case("golden_slstm_noconv.safetensors", 6006,
             make_config("slstm", 7, 16, 1, 4, 0, group_norm_weight=False), B=2, T=14)


if __name__ == "__main__":
    main()
