#!/usr/bin/env python3
"""Golden reference data for the two baselines: the Llama-style Transformer (HF `LlamaForCausalLM`
semantics) and the LSTM language model (`torch.nn.LSTM` wrapped with an embedding and a head).

Float64 PyTorch. The Transformer is written out by hand (RMSNorm, RoPE as explicit 2x2 rotations of
the pairs (i, i + D/2), causal softmax attention with an explicit mask, SwiGLU) and then
cross-checked against transformers' own `rotate_half`/`apply_rotary_pos_emb` and, when transformers
is installed, against `LlamaForCausalLM` itself loaded with the same weights (strict
`load_state_dict`, so the checkpoint names and shapes are checked too). The LSTM model is
`nn.Embedding` + `nn.LSTM` + `nn.Linear`, cross-checked against a hand-written scalar LSTM loop.

Per case it writes tests/data/golden_{llama,lstm}_*.safetensors with the inputs, initial
parameters, logits, loss, every gradient and five clipped-AdamW steps (same format as
tools/golden_deltanet.py; metadata: `config` = the lrnn model block, `hf_config` = the
config.json lrnn must export). Dev-only: CI never runs this script.

    python3 tools/golden_baselines.py           # regenerates the goldens (byte-identical output)
    python3 tools/golden_baselines.py --check-run RUN_DIR [--tokens "1 2 2 1"] [--lrnn build/lrnn]

--check-run loads a trained lrnn run (model.safetensors + config.json) the way a user would:
`LlamaForCausalLM(LlamaConfig(**config.json))` with a strict `load_state_dict`, or `LSTMLM` (below)
for model_type "lstm", and compares its logits with `lrnn predict` on the same tokens.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as common  # noqa: E402
from golden_common import DT, make_batch, swiglu_mlp  # noqa: E402

EPS = 1e-6

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama
except ImportError:  # the hand-written twin is the oracle; transformers only adds a cross-check
    transformers = None


# ============================================================================ Transformer (Llama)

def llama_block(V, d, L, H, I, theta):
    return dict(model_type="llama", vocab_size=V, hidden_size=d, intermediate_size=I, num_hidden_layers=L,
                num_attention_heads=H, rms_norm_eps=EPS, rope_theta=theta, max_position_embeddings=2048,
                initializer_range=0.02)


def llama_hf_config(c):
    """What lrnn writes to config.json (transformers' LlamaConfig keys)."""
    d, H = c["hidden_size"], c["num_attention_heads"]
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": c["vocab_size"],
            "hidden_size": d, "intermediate_size": c["intermediate_size"],
            "num_hidden_layers": c["num_hidden_layers"], "num_attention_heads": H, "num_key_value_heads": H,
            "head_dim": d // H, "hidden_act": "silu", "max_position_embeddings": c["max_position_embeddings"],
            "initializer_range": c["initializer_range"], "rms_norm_eps": c["rms_norm_eps"],
            "rope_theta": c["rope_theta"], "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]},
            "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "pretraining_tp": 1, "tie_word_embeddings": False, "use_cache": True, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32"}


def llama_shapes(c):
    V, d, I = c["vocab_size"], c["hidden_size"], c["intermediate_size"]
    s = {"model.embed_tokens.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (d,)
        for n in "qkvo":
            s[p + f"self_attn.{n}_proj.weight"] = (d, d)
        s[p + "post_attention_layernorm.weight"] = (d,)
        s[p + "mlp.gate_proj.weight"] = (I, d)
        s[p + "mlp.up_proj.weight"] = (I, d)
        s[p + "mlp.down_proj.weight"] = (d, I)
    s["model.norm.weight"] = (d,)
    s["lm_head.weight"] = (V, d)
    return s


def llama_init(c, g, qk_gain):
    P = {}
    for name, shape in llama_shapes(c).items():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=g)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            if "q_proj" in name or "k_proj" in name:
                t = t * qk_gain  # larger attention logits: a peaked softmax
        P[name] = t.to(DT)
    return P


def rms_norm(x, w):
    return common.rms_norm(x, w, EPS)


def rope_explicit(x, theta):
    """x [B,T,H,D]: rotate each pair (x_i, x_{i+D/2}) by the angle t * theta^(-2i/D)."""
    B, T, H, D = x.shape
    half = D // 2
    out = torch.empty_like(x)
    for i in range(half):
        f = theta ** (-2.0 * i / D)
        a = torch.arange(T, dtype=DT) * f
        c, s = torch.cos(a)[None, :, None], torch.sin(a)[None, :, None]
        x1, x2 = x[..., i], x[..., i + half]
        out[..., i] = c * x1 - s * x2
        out[..., i + half] = s * x1 + c * x2
    return out


def causal_attention(q, k, v):
    """q, k, v [B,T,H,D] -> [B,T,H,D]: softmax(q k^T / sqrt(D) with j > i masked) v."""
    B, T, H, D = q.shape
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


def llama_forward(P, c, tokens):
    H, theta = c["num_attention_heads"], c["rope_theta"]
    h = P["model.embed_tokens.weight"][tokens]
    B, T, d = h.shape
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, P[p + "input_layernorm.weight"])
        q, k, v = (x @ P[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q, k, v = (t.reshape(B, T, H, d // H) for t in (q, k, v))
        q, k = rope_explicit(q, theta), rope_explicit(k, theta)
        h = h + causal_attention(q, k, v).reshape(B, T, d) @ P[p + "self_attn.o_proj.weight"].T
        h = h + swiglu_mlp(rms_norm(h, P[p + "post_attention_layernorm.weight"]), P, p + "mlp.")
    return rms_norm(h, P["model.norm.weight"]) @ P["lm_head.weight"].T


def llama_decay(name):
    return not name.endswith("norm.weight")


def check_rope_against_hf():
    """Our explicit rotation equals HF's `x * cos + rotate_half(x) * sin` (double-precision cos/sin
    built HF's way: emb = cat(freqs, freqs))."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 37, 3, 8, generator=g)
    for theta in (10000.0, 7.0):
        D = x.shape[-1]
        inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, dtype=DT) / D)
        freqs = torch.arange(x.shape[1], dtype=DT)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        hf_style = x * cos + torch.cat([-x2, x1], dim=-1) * sin
        err = (hf_style - rope_explicit(x, theta)).abs().max().item()
        if transformers is not None:  # transformers' own functions, in [B,H,T,D] layout
            xt = x.transpose(1, 2)
            q_hf, _ = modeling_llama.apply_rotary_pos_emb(xt, xt, emb.cos()[None], emb.sin()[None])
            err = max(err, (q_hf.transpose(1, 2) - rope_explicit(x, theta)).abs().max().item())
        print(f"RoPE theta={theta}: explicit rotation vs HF rotate_half max|diff|={err:.2e}")
        assert err < 1e-13, err


def check_llama_against_transformers(P, c, tokens, logits):
    if transformers is None:
        print("transformers not installed: skipped the LlamaForCausalLM cross-check")
        return None
    cfg = LlamaConfig(**{k: v for k, v in llama_hf_config(c).items() if k not in ("model_type",)})
    cfg.rope_theta = c["rope_theta"]  # older transformers read this; newer ones rope_parameters
    model = LlamaForCausalLM(cfg).to(DT).eval()
    ours = {n: tuple(t.shape) for n, t in P.items()}
    theirs = {n: tuple(t.shape) for n, t in model.state_dict().items() if not n.endswith("rotary_emb.inv_freq")}
    assert ours == theirs, (sorted(set(ours) ^ set(theirs)), [n for n in ours if ours[n] != theirs.get(n)])
    model.load_state_dict(P, strict=False)
    missing = [n for n in model.state_dict() if n not in P and not n.endswith("inv_freq")]
    assert not missing, missing
    inv = model.model.rotary_emb.inv_freq
    D = c["hidden_size"] // c["num_attention_heads"]
    want = 1.0 / c["rope_theta"] ** (torch.arange(0, D, 2, dtype=DT) / D)
    assert torch.allclose(inv.to(DT), want, rtol=1e-6), (inv, want)
    with torch.no_grad():
        hf = model(input_ids=tokens).logits
    # HF computes cos/sin in float32 even for a float64 model: agreement to ~1e-6, not 1e-15.
    err = ((hf - logits).abs().max() / logits.abs().max()).item()
    assert err < 1e-5, err
    return err


# ============================================================================ LSTM

def lstm_block(V, E, H, L):
    return dict(model_type="lstm", vocab_size=V, embedding_dim=E, hidden_size=H, num_layers=L)


def lstm_hf_config(c):
    return {"model_type": "lstm", "architectures": ["LSTMLM"], "vocab_size": c["vocab_size"],
            "embedding_dim": c["embedding_dim"], "hidden_size": c["hidden_size"], "num_layers": c["num_layers"],
            "bias": True, "batch_first": False, "dropout": 0.0, "bidirectional": False, "proj_size": 0,
            "modules": {"embedding": "torch.nn.Embedding(vocab_size, embedding_dim)",
                        "lstm": "torch.nn.LSTM(embedding_dim, hidden_size, num_layers)",
                        "head": "torch.nn.Linear(hidden_size, vocab_size)"}}


class LSTMLM(nn.Module):
    """The module whose state_dict lrnn's LSTM checkpoints are (names embedding.*, lstm.*, head.*)."""

    def __init__(self, vocab_size, embedding_dim, hidden_size, num_layers):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens):  # [B,T] -> [B,T,V]
        out, _ = self.lstm(self.embedding(tokens).transpose(0, 1))
        return self.head(out).transpose(0, 1)


def lstm_module(c):
    return LSTMLM(c["vocab_size"], c["embedding_dim"], c["hidden_size"], c["num_layers"]).to(DT)


def lstm_init(c, g, wscale, bias_shift):
    P = {}
    for name, t in lstm_module(c).state_dict().items():
        if name == "embedding.weight":
            x = torch.randn(t.shape, generator=g)
        elif "bias" in name:
            x = bias_shift + torch.randn(t.shape, generator=g)
        else:
            x = wscale * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[1])
        P[name] = x.to(DT)
    return P


def lstm_forward(P, c, tokens):
    m = lstm_module(c)
    return torch.func.functional_call(m, P, (tokens,))


def lstm_scalar_loop(P, c, tokens):
    """The torch.nn.LSTM equations, written out (gate order i, f, g, o)."""
    x = P["embedding.weight"][tokens]  # [B,T,E]
    B, T, _ = x.shape
    H = c["hidden_size"]
    for l in range(c["num_layers"]):
        Wi, Wh = P[f"lstm.weight_ih_l{l}"], P[f"lstm.weight_hh_l{l}"]
        b = P[f"lstm.bias_ih_l{l}"] + P[f"lstm.bias_hh_l{l}"]
        h, cc, outs = x.new_zeros(B, H), x.new_zeros(B, H), []
        for t in range(T):
            z = x[:, t] @ Wi.T + h @ Wh.T + b
            i, f, gg, o = torch.sigmoid(z[:, :H]), torch.sigmoid(z[:, H:2 * H]), torch.tanh(z[:, 2 * H:3 * H]), torch.sigmoid(z[:, 3 * H:])
            cc = f * cc + i * gg
            h = o * torch.tanh(cc)
            outs.append(h)
        x = torch.stack(outs, dim=1)
    return x @ P["head.weight"].T + P["head.bias"]


def lstm_decay(name):
    return "bias" not in name


# ============================================================================ cases

def write_case(fname, block, hf_cfg, forward, decay, P0, tokens, labels, extra_note):
    logits, loss, grads = common.forward_backward(forward, P0, tokens, labels)
    gold = common.Golden(fname, "tools/golden_baselines.py", block, forward, decay, P0, tokens, labels, logits, loss,
                         grads, hf_config=hf_cfg)
    print(f"{gold.summary(f', B,T={tuple(tokens.shape)}')}\n"
          f"  loss={loss.item():.12f}  FD max|diff|={gold.fd_err:.3e}  {extra_note}\n"
          f"{gold.adam_report()}")


def llama_case(fname, seed, V, d, L, H, I, theta, B, T, qk_gain):
    c = llama_block(V, d, L, H, I, theta)
    g = torch.Generator().manual_seed(seed)
    P0 = llama_init(c, g, qk_gain)
    tokens, labels = make_batch(c, B, T, g)
    fwd = lambda P, tok: llama_forward(P, c, tok)
    with torch.no_grad():
        logits = fwd(P0, tokens)
        # attention logit range of layer 0, to document the regime
        x = rms_norm(P0["model.embed_tokens.weight"][tokens], P0["model.layers.0.input_layernorm.weight"])
        q = (x @ P0["model.layers.0.self_attn.q_proj.weight"].T).reshape(B, T, H, d // H)
        k = (x @ P0["model.layers.0.self_attn.k_proj.weight"].T).reshape(B, T, H, d // H)
        s = torch.einsum("bihd,bjhd->bhij", rope_explicit(q, theta), rope_explicit(k, theta)) / math.sqrt(d // H)
    hf_err = check_llama_against_transformers(P0, c, tokens, logits)
    note = (f"layer-0 attention logits in [{s.min().item():.1f}, {s.max().item():.1f}]; "
            f"LlamaForCausalLM max rel diff={hf_err if hf_err is None else f'{hf_err:.2e}'}")
    write_case(fname, c, llama_hf_config(c), fwd, llama_decay, P0, tokens, labels, note)


def lstm_case(fname, seed, V, E, H, L, B, T, wscale, bias_shift):
    c = lstm_block(V, E, H, L)
    g = torch.Generator().manual_seed(seed)
    P0 = lstm_init(c, g, wscale, bias_shift)
    assert list(P0) == list(lstm_module(c).state_dict()), "names must be nn.LSTM's"
    tokens, labels = make_batch(c, B, T, g)
    fwd = lambda P, tok: lstm_forward(P, c, tok)
    with torch.no_grad():
        loop_err = (fwd(P0, tokens) - lstm_scalar_loop(P0, c, tokens)).abs().max().item()
    assert loop_err < 1e-12, loop_err
    write_case(fname, c, lstm_hf_config(c), fwd, lstm_decay, P0, tokens, labels,
               f"nn.LSTM vs scalar loop max|diff|={loop_err:.2e}")


def check_run(run, tokens_text, lrnn):
    import subprocess
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(run, "config.json")))
    state = {n: t.to(DT) for n, t in load_file(os.path.join(run, "model.safetensors")).items()}
    if cfg["model_type"] == "llama":
        assert transformers is not None, "pip install transformers to check a llama run"
        model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})).to(DT).eval()
        forward = lambda tok: model(input_ids=tok).logits
    elif cfg["model_type"] == "lstm":
        model = LSTMLM(cfg["vocab_size"], cfg["embedding_dim"], cfg["hidden_size"], cfg["num_layers"]).to(DT).eval()
        forward = model
    else:
        raise SystemExit(f"{run}: model_type {cfg['model_type']!r} is not a baseline")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [n for n in missing if not n.endswith("inv_freq")]
    assert not missing and not unexpected, (missing, unexpected)
    out = subprocess.run([lrnn, "predict", "--run", run, "--tokens", tokens_text], check=True, capture_output=True, text=True)
    ours = torch.tensor([p["logits"] for p in json.loads(out.stdout)["positions"]], dtype=DT)
    with torch.no_grad():
        theirs = forward(torch.tensor([[int(x) for x in tokens_text.split()]]))[0]
    err = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    print(f"{run}: {cfg['model_type']} checkpoint loads strictly into {type(model).__name__}; "
          f"lrnn predict vs PyTorch logits max rel diff {err:.2e} over {len(ours)} positions")
    assert err < 1e-4, err


def main():
    if "--check-run" in sys.argv:
        import argparse
        ap = argparse.ArgumentParser()
        ap.add_argument("--check-run", required=True)
        ap.add_argument("--tokens", default="1 2 2 1 2 1 1 2 2 2 1 2")
        ap.add_argument("--lrnn", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "lrnn"))
        a = ap.parse_args()
        return check_run(a.check_run, a.tokens, a.lrnn)
    common.deterministic()
    print(f"torch {torch.__version__}, transformers {transformers.__version__ if transformers else 'not installed'}")
    check_rope_against_hf()
    # T = 70 crosses lrnn's 64-query attention row blocks; theta 100 turns every frequency.
    llama_case("golden_llama_2layer.safetensors", 3003, V=5, d=32, L=2, H=4, I=48, theta=10000.0, B=3, T=20, qk_gain=2.0)
    llama_case("golden_llama_long_theta100.safetensors", 4004, V=3, d=16, L=1, H=2, I=32, theta=100.0, B=2, T=70, qk_gain=3.0)
    lstm_case("golden_lstm_2layer.safetensors", 5005, V=4, E=6, H=8, L=2, B=3, T=25, wscale=1.0, bias_shift=0.0)
    # Larger weights and shifted biases: many saturated gates, over 60 steps.
    lstm_case("golden_lstm_saturated.safetensors", 6006, V=3, E=3, H=16, L=1, B=2, T=60, wscale=3.0, bias_shift=1.5)


if __name__ == "__main__":
    main()
