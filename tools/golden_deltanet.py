#!/usr/bin/env python3
"""Golden reference data for the DeltaNet language model (fla `DeltaNetForCausalLM` semantics).

An independent, deliberately plain float64 PyTorch implementation. It writes, per case, a
safetensors file into tests/data/ with the inputs, initial parameters, logits, loss, every
gradient, and the result of a few clipped-AdamW steps. Dev-only: CI never runs this script.

    python3 tools/golden_deltanet.py            # regenerates tests/data/golden_deltanet_*.safetensors
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as common  # noqa: E402
from golden_common import DT, causal_depthwise_conv, loss_fn, make_batch, swiglu_mlp  # noqa: E402,F401

CONV, EPS = 4, 1e-6


def make_config(V, d, L, H, conv, neg, tie=False):
    c = dict(vocab_size=V, hidden_size=d, num_hidden_layers=L, num_heads=H, use_short_conv=conv,
             allow_neg_eigval=neg, conv_size=CONV, norm_eps=EPS,
             intermediate_size=256 * math.ceil(int(d * 4 * 2 / 3) / 256))
    if tie:
        c["tie_word_embeddings"] = True  # lm_head is the embedding matrix: one tensor, both gradients
    return c


def param_shapes(c):
    """Ordered {fla checkpoint name: shape}."""
    V, d, H, I = c["vocab_size"], c["hidden_size"], c["num_heads"], c["intermediate_size"]
    s = {"model.embeddings.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "attn_norm.weight"] = (d,)
        for n in "qkv":
            s[p + f"attn.{n}_proj.weight"] = (d, d)
        if c["use_short_conv"]:
            for n in "qkv":
                s[p + f"attn.{n}_conv1d.weight"] = (d, 1, CONV)
        s[p + "attn.b_proj.weight"] = (H, d)
        s[p + "attn.o_norm.weight"] = (d // H,)
        s[p + "attn.o_proj.weight"] = (d, d)
        s[p + "mlp_norm.weight"] = (d,)
        s[p + "mlp.gate_proj.weight"] = (I, d)
        s[p + "mlp.up_proj.weight"] = (I, d)
        s[p + "mlp.down_proj.weight"] = (d, I)
    s["model.norm.weight"] = (d,)
    if not c.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, d)
    return s


def init_tensor(name, shape, g, d):
    """Test values (not fla's init) for one tensor of a width-d delta-rule model: norm weights
    around 1, conv kernels U(-0.5, 0.5), beta logits spread over most of sigmoid's range."""
    if name.endswith("norm.weight"):
        return 1 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith("conv1d.weight"):
        return torch.rand(shape, generator=g) - 0.5
    if name.endswith("b_proj.weight"):
        return torch.randn(shape, generator=g) * (3 / math.sqrt(d))
    if name == "model.embeddings.weight":
        return torch.randn(shape, generator=g)
    return torch.randn(shape, generator=g) / math.sqrt(shape[1])  # projections and lm_head: [out, in]


def init_params(c, g):
    return {name: init_tensor(name, shape, g, c["hidden_size"]).to(DT) for name, shape in param_shapes(c).items()}


# ----------------------------------------------------------------------------- model

def rms_norm(x, w):
    return common.rms_norm(x, w, EPS)


def l2_norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def delta_rule_loop(q, k, v, beta):
    """q,k [B,T,H,dk], v [B,T,H,dv], beta [B,T,H] -> o [B,T,H,dv]. S [B,H,dk,dv] starts at 0."""
    B, T, H, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        q_t, k_t, v_t, b_t = q[:, t], k[:, t], v[:, t], beta[:, t]
        u = v_t - torch.einsum("bhkv,bhk->bhv", S, k_t)                    # v_t - S^T k_t
        S = S + b_t[..., None, None] * k_t[..., :, None] * u[..., None, :]  # S + beta k u^T
        out.append(torch.einsum("bhkv,bhk->bhv", S, q_t) * dk ** -0.5)      # S^T q_t / sqrt(dk)
    return torch.stack(out, dim=1)


def delta_rule_matrices(q, k, v, beta):
    """Cross-check: S_t = (I - beta k k^T) S_{t-1} + beta k v^T, per (b, h) with explicit matrices."""
    B, T, H, dk = q.shape
    o = q.new_zeros(B, T, H, v.shape[-1])
    eye = torch.eye(dk, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            S = q.new_zeros(dk, v.shape[-1])
            for t in range(T):
                kk, bt = k[b, t, h].reshape(dk, 1), beta[b, t, h]
                S = (eye - bt * kk @ kk.T) @ S + bt * kk @ v[b, t, h].reshape(1, -1)
                o[b, t, h] = (S.T @ q[b, t, h].reshape(dk, 1)).reshape(-1) / math.sqrt(dk)
    return o


def attention(x, P, p, c, capture=None):
    B, T, d = x.shape
    H = c["num_heads"]
    q, k, v = (x @ P[p + f"attn.{n}_proj.weight"].T for n in "qkv")
    if c["use_short_conv"]:
        q, k, v = (causal_depthwise_conv(t, P[p + f"attn.{n}_conv1d.weight"]) for t, n in zip((q, k, v), "qkv"))
    q, k, v = (F.silu(t).reshape(B, T, H, d // H) for t in (q, k, v))
    q, k = l2_norm(q), l2_norm(k)
    beta = torch.sigmoid(x @ P[p + "attn.b_proj.weight"].T)
    if c["allow_neg_eigval"]:
        beta = 2 * beta
    if capture is not None:
        capture.append((q.detach(), k.detach(), v.detach(), beta.detach()))
    o = rms_norm(delta_rule_loop(q, k, v, beta), P[p + "attn.o_norm.weight"]).reshape(B, T, d)
    return o @ P[p + "attn.o_proj.weight"].T


def forward(P, c, tokens, capture=None):
    h = P["model.embeddings.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + attention(rms_norm(h, P[p + "attn_norm.weight"]), P, p, c, capture)
        h = h + swiglu_mlp(rms_norm(h, P[p + "mlp_norm.weight"]), P, p + "mlp.")
    head = P["model.embeddings.weight"] if c.get("tie_word_embeddings", False) else P["lm_head.weight"]
    return rms_norm(h, P["model.norm.weight"]) @ head.T


def decays(name):
    """AdamW decays everything but the norm weights."""
    return not name.endswith("norm.weight")


# ----------------------------------------------------------------------------- self-checks

def check_param_count():
    n = sum(math.prod(s) for s in param_shapes(make_config(3, 128, 2, 4, True, False)).values())
    print(f"param count V=3 d=128 L=2 H=4 conv: {n}")
    assert n == 529_856, n


def check_gradcheck():
    """Full gradcheck w.r.t. every non-MLP parameter (the 256-wide MLP is held fixed to keep it fast),
    plus fast-mode (random-projection) gradcheck w.r.t. all parameters."""
    for conv, neg in ((True, True), (False, False)):
        c = make_config(5, 8, 2, 2, conv, neg)
        g = torch.Generator().manual_seed(7)
        P = init_params(c, g)
        tokens, labels = make_batch(c, 2, 5, g)
        for fast in (False, True):
            names = [n for n in P if fast or ".mlp." not in n]
            ok = common.gradcheck(lambda P, tok: forward(P, c, tok), P, tokens, labels, names, fast_mode=fast)
            print(f"gradcheck tiny (conv={conv}, neg={neg}, fast_mode={fast}, "
                  f"{sum(P[n].numel() for n in names)} elements in {len(names)} params): {ok}")
            assert ok


# ----------------------------------------------------------------------------- cases

def lm_batch(V, B, T, g):
    """Language modelling: windows of T + 1 tokens, every next token supervised (no ignored label)."""
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def run_case(fname, seed, V, d, L, H, conv, neg, B, T, tie=False, lm=False):
    c = make_config(V, d, L, H, conv, neg, tie)
    g = torch.Generator().manual_seed(seed)
    P0 = init_params(c, g)
    if tie:  # the tied matrix is both embedding and head: unit rows would give logits of ~sqrt(d)
        P0["model.embeddings.weight"] = P0["model.embeddings.weight"] / math.sqrt(d)
    tokens, labels = lm_batch(V, B, T, g) if lm else make_batch(c, B, T, g)
    capture = []
    logits, loss, grads = common.forward_backward(lambda P, tok: forward(P, c, tok, capture), P0, tokens, labels)

    rule_err = max((delta_rule_loop(*x) - delta_rule_matrices(*x)).abs().max().item() for x in capture)
    assert rule_err < 1e-12, rule_err
    betas = torch.cat([x[3].flatten() for x in capture])
    gold = common.Golden(fname, "tools/golden_deltanet.py", c, lambda P, tok: forward(P, c, tok), decays, P0, tokens,
                         labels, logits, loss, grads, max_bytes=None)
    print(f"{gold.summary()}\n"
          f"  loss={loss.item():.12f}  beta range=[{betas.min().item():.4f}, {betas.max().item():.4f}]\n"
          f"  delta rule loop vs matrices max|diff|={rule_err:.3e}  FD max|diff|={gold.fd_err:.3e}  "
          f"own AdamW vs torch max|diff|={gold.adam_err:.3e}\n"
          f"{gold.adam_report(norms=True)}")


def main():
    common.deterministic()
    check_param_count()
    check_gradcheck()
    run_case("golden_deltanet_neg.safetensors", 1001, V=3, d=32, L=2, H=2, conv=True, neg=True, B=3, T=16)
    run_case("golden_deltanet_pos_noconv.safetensors", 2002, V=7, d=32, L=1, H=4, conv=False, neg=False, B=2, T=20)
    # A language model: a 256-token vocabulary, tied embeddings, every next token supervised.
    run_case("golden_deltanet_lm_tied.safetensors", 3003, V=256, d=32, L=1, H=2, conv=True, neg=True, B=2, T=24,
             tie=True, lm=True)


if __name__ == "__main__":
    main()
