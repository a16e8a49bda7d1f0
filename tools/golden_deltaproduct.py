#!/usr/bin/env python3
"""Golden reference data for (Gated) DeltaProduct and Gated DeltaNet language models
(fla `GatedDeltaProductForCausalLM` / `GatedDeltaNetForCausalLM` semantics).

An independent, deliberately plain float64 PyTorch implementation: a loop over tokens and,
inside it, over the n_h Householder sub-steps, written as matrix products
S <- alpha * S, then S <- (I - beta k k^T) S + beta k v^T for each sub-step, o = S^T q / sqrt(dk).
It writes, per case, a safetensors file into tests/data/ with the inputs, initial parameters,
logits, loss, every gradient, and a few clipped-AdamW steps. Dev-only: CI never runs it.

    python3 tools/golden_deltaproduct.py   # regenerates tests/data/golden_deltaproduct_*.safetensors
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as common  # noqa: E402
from golden_common import DT, causal_depthwise_conv, make_batch, swiglu_mlp  # noqa: E402
from golden_deltanet import init_tensor, l2_norm, rms_norm  # noqa: E402


def make_config(model_type, V, d, L, H, head_dim, expand_v, nh, fg, og, conv, neg, I):
    """The engine's YAML model block (fla's keys). gated_deltanet: nh = 1, forget gate always on,
    the output gate is called use_gate."""
    c = dict(model_type=model_type, vocab_size=V, hidden_size=d, num_hidden_layers=L, num_heads=H,
             head_dim=head_dim, expand_v=expand_v, allow_neg_eigval=neg, use_short_conv=conv, conv_size=4,
             norm_eps=1e-6, intermediate_size=I)
    if model_type == "gated_deltaproduct":
        c.update(num_householder=nh, use_forget_gate=fg, use_output_gate=og)
    else:
        assert nh == 1 and fg
        c.update(use_gate=og)
    return c


def arch(c):
    """(n_h, forget gate, output gate) of either model type."""
    if c["model_type"] == "gated_deltaproduct":
        return c["num_householder"], c["use_forget_gate"], c["use_output_gate"]
    return 1, True, c["use_gate"]


def param_shapes(c):
    """Ordered {fla checkpoint name: shape}."""
    V, d, H, I = c["vocab_size"], c["hidden_size"], c["num_heads"], c["intermediate_size"]
    nh, fg, og = arch(c)
    Dk = c["head_dim"]
    Dv = int(round(Dk * c["expand_v"]))
    Kd, Vd = H * Dk, H * Dv
    s = {"model.embeddings.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.attn."
        s[f"model.layers.{i}.attn_norm.weight"] = (d,)
        s[p + "q_proj.weight"] = (Kd, d)
        s[p + "k_proj.weight"] = (nh * Kd, d)
        s[p + "v_proj.weight"] = (nh * Vd, d)
        s[p + "b_proj.weight"] = (nh * H, d)
        if fg:
            s[p + "a_proj.weight"] = (H, d)
            s[p + "A_log"] = (H,)
            s[p + "dt_bias"] = (H,)
        if c["use_short_conv"]:
            s[p + "q_conv1d.weight"] = (Kd, 1, 4)
            s[p + "k_conv1d.weight"] = (nh * Kd, 1, 4)
            s[p + "v_conv1d.weight"] = (nh * Vd, 1, 4)
        if og:
            s[p + "g_proj.weight"] = (Vd, d)
        s[p + "o_norm.weight"] = (Dv,)
        s[p + "o_proj.weight"] = (d, Vd)
        s[f"model.layers.{i}.mlp_norm.weight"] = (d,)
        s[f"model.layers.{i}.mlp.gate_proj.weight"] = (I, d)
        s[f"model.layers.{i}.mlp.up_proj.weight"] = (I, d)
        s[f"model.layers.{i}.mlp.down_proj.weight"] = (d, I)
    s["model.norm.weight"] = (d,)
    s["lm_head.weight"] = (V, d)
    return s


def no_decay(name):
    return name.endswith("norm.weight") or name.endswith("A_log") or name.endswith("dt_bias")


def init_params(c, g):
    """Test values, not fla's init: spread so every path (betas across (0, 2), decays from ~1 to
    ~0.1, open and closed output gates) carries signal. The gates' tensors here, the rest as DeltaNet's."""
    d = c["hidden_size"]
    P = {}
    for name, shape in param_shapes(c).items():
        if name.endswith("A_log"):
            t = torch.log(1 + 15 * torch.rand(shape, generator=g))
        elif name.endswith("dt_bias"):
            dt = torch.exp(math.log(1e-2) + torch.rand(shape, generator=g) * (math.log(1.0) - math.log(1e-2)))
            t = dt + torch.log(-torch.expm1(-dt))  # softplus^-1
        elif name.endswith("g_proj.weight"):
            t = torch.randn(shape, generator=g) * (2 / math.sqrt(d))
        else:
            t = init_tensor(name, shape, g, d)
        P[name] = t.to(DT)
    return P


# ----------------------------------------------------------------------------- model

def delta_product_loop(q, k, v, beta, logalpha):
    """q [B,T,H,dk], k [B,T,n,H,dk], v [B,T,n,H,dv], beta [B,T,n,H], logalpha [B,T,H] or None.
    Per token: S <- exp(logalpha) S, then for j = 0..n-1: S <- (I - beta k k^T) S + beta k v^T;
    o_t = S^T q_t / sqrt(dk). S [B,H,dk,dv] starts at 0."""
    B, T, n, H, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        if logalpha is not None:
            S = torch.exp(logalpha[:, t])[..., None, None] * S
        for j in range(n):
            kk, vv, bb = k[:, t, j], v[:, t, j], beta[:, t, j][..., None, None]
            kS = torch.einsum("bhk,bhkv->bhv", kk, S)                      # k^T S
            S = S - bb * kk[..., :, None] * kS[..., None, :] + bb * kk[..., :, None] * vv[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) / math.sqrt(dk))
    return torch.stack(out, dim=1)


def delta_product_matrices(q, k, v, beta, logalpha):
    """Cross-check with explicit transition matrices per (b, h):
    S_t = A_t S_{t-1} + B_t,  A_t = alpha_t H_{n-1} ... H_0,  H_j = I - beta_j k_j k_j^T,
    B_t = sum_j H_{n-1} ... H_{j+1} beta_j k_j v_j^T."""
    B, T, n, H, dk = k.shape
    o = q.new_zeros(B, T, H, v.shape[-1])
    eye = torch.eye(dk, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            S = q.new_zeros(dk, v.shape[-1])
            for t in range(T):
                Hs = [eye - beta[b, t, j, h] * torch.outer(k[b, t, j, h], k[b, t, j, h]) for j in range(n)]
                A = eye.clone()
                for j in range(n):
                    A = Hs[j] @ A
                if logalpha is not None:
                    A = torch.exp(logalpha[b, t, h]) * A
                Bt = torch.zeros_like(S)
                for j in range(n):
                    M = eye.clone()
                    for i in range(j + 1, n):
                        M = Hs[i] @ M
                    Bt = Bt + beta[b, t, j, h] * M @ torch.outer(k[b, t, j, h], v[b, t, j, h])
                S = A @ S + Bt
                o[b, t, h] = S.T @ q[b, t, h] / math.sqrt(dk)
    return o


def mixer(x, P, p, c, capture=None):
    B, T, d = x.shape
    H, Dk = c["num_heads"], c["head_dim"]
    Dv = int(round(Dk * c["expand_v"]))
    nh, fg, og = arch(c)
    q, k, v = (x @ P[p + f"{n}_proj.weight"].T for n in "qkv")
    if c["use_short_conv"]:
        q, k, v = (causal_depthwise_conv(t, P[p + f"{n}_conv1d.weight"]) for t, n in zip((q, k, v), "qkv"))
    q, k, v = F.silu(q), F.silu(k), F.silu(v)
    # fla: q "(h d)", k and v "t (n h d) -> (t n) h d": sub-step major within a token.
    q = l2_norm(q.reshape(B, T, H, Dk))
    k = l2_norm(k.reshape(B, T, nh, H, Dk))
    v = v.reshape(B, T, nh, H, Dv)
    beta = torch.sigmoid(x @ P[p + "b_proj.weight"].T).reshape(B, T, nh, H)
    if c["allow_neg_eigval"]:
        beta = 2 * beta
    logalpha = None
    if fg:
        logalpha = -torch.exp(P[p + "A_log"]) * F.softplus(x @ P[p + "a_proj.weight"].T + P[p + "dt_bias"])
    if capture is not None:
        capture.append(tuple(None if t is None else t.detach() for t in (q, k, v, beta, logalpha)))
    o = delta_product_loop(q, k, v, beta, logalpha)
    o = rms_norm(o, P[p + "o_norm.weight"])
    if og:  # fla FusedRMSNormGated: norm, then times silu(gate)
        o = o * F.silu((x @ P[p + "g_proj.weight"].T).reshape(B, T, H, Dv))
    return o.reshape(B, T, H * Dv) @ P[p + "o_proj.weight"].T


def forward(P, c, tokens, capture=None):
    h = P["model.embeddings.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + mixer(rms_norm(h, P[p + "attn_norm.weight"]), P, p + "attn.", c, capture)
        h = h + swiglu_mlp(rms_norm(h, P[p + "mlp_norm.weight"]), P, p + "mlp.")
    return rms_norm(h, P["model.norm.weight"]) @ P["lm_head.weight"].T


def decays(name):
    return not no_decay(name)


# ----------------------------------------------------------------------------- self-checks

def check_gradcheck():
    """torch.autograd.gradcheck of the whole loss w.r.t. every parameter on tiny configs."""
    for c in (make_config("gated_deltaproduct", 5, 8, 1, 2, 3, 2.0, 2, True, True, True, True, 6),
              make_config("gated_deltaproduct", 5, 8, 2, 2, 3, 1.0, 3, False, False, False, True, 6),
              make_config("gated_deltanet", 5, 8, 1, 2, 4, 1.0, 1, True, True, True, False, 6)):
        g = torch.Generator().manual_seed(7)
        P = init_params(c, g)
        tokens, labels = make_batch(c, 2, 5, g, empty_row_label=0)
        ok = common.gradcheck(lambda P, tok: forward(P, c, tok), P, tokens, labels)
        print(f"gradcheck tiny {c['model_type']} n_h={arch(c)[0]} gates={arch(c)[1:]} "
              f"({sum(t.numel() for t in P.values())} elements): {ok}")
        assert ok


# ----------------------------------------------------------------------------- cases

def run_case(fname, seed, c, B, T):
    g = torch.Generator().manual_seed(seed)
    P0 = init_params(c, g)
    tokens, labels = make_batch(c, B, T, g, empty_row_label=0)
    capture = []
    logits, loss, grads = common.forward_backward(lambda P, tok: forward(P, c, tok, capture), P0, tokens, labels)

    rule_err = max((delta_product_loop(*x) - delta_product_matrices(*x)).abs().max().item() for x in capture)
    assert rule_err < 1e-12, rule_err
    betas = torch.cat([x[3].flatten() for x in capture])
    alphas = torch.cat([x[4].exp().flatten() for x in capture]) if capture[0][4] is not None else None
    gold = common.Golden(fname, "tools/golden_deltaproduct.py", c, lambda P, tok: forward(P, c, tok), decays, P0,
                         tokens, labels, logits, loss, grads)
    arange = f", alpha range=[{alphas.min().item():.4f}, {alphas.max().item():.4f}]" if alphas is not None else ""
    print(f"{gold.summary()}\n"
          f"  loss={loss.item():.12f}  beta range=[{betas.min().item():.4f}, {betas.max().item():.4f}]{arange}\n"
          f"  token loop vs explicit matrices max|diff|={rule_err:.3e}  FD max|diff|={gold.fd_err:.3e}  "
          f"own AdamW vs torch max|diff|={gold.adam_err:.3e}\n"
          f"{gold.adam_report()}")


def main():
    common.deterministic()
    check_gradcheck()
    run_case("golden_deltaproduct_nh2_gates.safetensors", 3003,
             make_config("gated_deltaproduct", 5, 32, 2, 2, 8, 2.0, 2, True, True, True, True, 64), B=2, T=12)
    run_case("golden_deltaproduct_nh3_conv.safetensors", 4004,
             make_config("gated_deltaproduct", 6, 32, 1, 2, 16, 1.0, 3, False, False, True, True, 64), B=3, T=10)
    run_case("golden_gated_deltanet.safetensors", 5005,
             make_config("gated_deltanet", 7, 32, 2, 4, 8, 1.0, 1, True, True, True, False, 64), B=2, T=14)


if __name__ == "__main__":
    main()
