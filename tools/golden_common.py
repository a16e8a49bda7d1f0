"""What the golden writers (tools/golden_*.py) share: the float64 setting, the batch, the loss,
the building blocks more than one twin uses, the self-checks every case runs (finite differences,
gradcheck, a hand-written AdamW against torch's) and the deterministic safetensors file with the
inputs, parameters, logits, loss, gradients and AdamW trajectory (format: tests/data/README.md).

Plain PyTorch. A writer supplies its model as forward(P, tokens) -> logits over a dict P of named
float64 tensors, and which parameters AdamW decays.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open

torch.set_default_dtype(torch.float64)
DT = torch.float64
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0, steps=5)


def deterministic():
    """Same bytes on every run: deterministic kernels, one thread (a fixed reduction order)."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


# ----------------------------------------------------------------------------- building blocks

def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def causal_depthwise_conv(x, w, b=None):
    """x [B,T,C], w [C,1,K], b [C] or None: y[b,t,c] = b[c] + sum_j w[c,0,j] x[b, t-(K-1)+j, c],
    x = 0 before t = 0."""
    B, T, C = x.shape
    K = w.shape[-1]
    xp = torch.cat([x.new_zeros(B, K - 1, C), x], dim=1)
    y = sum(w[:, 0, j] * xp[:, j:j + T, :] for j in range(K))
    return y if b is None else y + b


def swiglu_mlp(x, P, p):
    """down(silu(gate(x)) * up(x)) with the weights {p}gate_proj, {p}up_proj, {p}down_proj (fla, HF Llama)."""
    return (F.silu(x @ P[p + "gate_proj.weight"].T) * (x @ P[p + "up_proj.weight"].T)) @ P[p + "down_proj.weight"].T


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)


# ----------------------------------------------------------------------------- data

def make_batch(c, B, T, g, empty_row_label=None):
    """Random tokens and labels, 30% of the labels -1 (ignored). A row left without a supervised
    label gets one at position 0: `empty_row_label`, or a random token when None."""
    V = c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[torch.rand(B, T, generator=g) < 0.3] = -1
    for b in range(B):  # at least one supervised label per sequence
        if (labels[b] == -1).all():
            labels[b, 0] = torch.randint(0, V, (1,), generator=g) if empty_row_label is None else empty_row_label
    return tokens, labels


# ----------------------------------------------------------------------------- gradients, optimiser

def forward_backward(forward, P0, tokens, labels):
    """Logits, loss and the gradient of every parameter at P0."""
    P = {n: t.clone().requires_grad_(True) for n, t in P0.items()}
    logits = forward(P, tokens)
    loss = loss_fn(logits, labels)
    loss.backward()
    return logits, loss, {n: t.grad.detach().clone() for n, t in P.items()}


def gradcheck(forward, P, tokens, labels, names=None, fast_mode=False):
    """torch.autograd.gradcheck of the loss w.r.t. the parameters `names` (all by default; the
    others held fixed)."""
    names = list(P) if names is None else names
    fixed = {n: t for n, t in P.items() if n not in names}
    fn = lambda *ts: loss_fn(forward({**fixed, **dict(zip(names, ts))}, tokens), labels)  # noqa: E731
    return torch.autograd.gradcheck(fn, [P[n].clone().requires_grad_(True) for n in names],
                                    eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=fast_mode)


def check_fd(forward, P0, tokens, labels, grads, per_tensor=3, h=1e-5, relative=False):
    """Central differences on a few entries of every parameter: the largest |fd - grad| (divided by
    max(1, |fd|) when `relative`)."""
    g = torch.Generator().manual_seed(123)
    worst = 0.0
    with torch.no_grad():
        for n, t in P0.items():
            for idx in torch.randint(0, t.numel(), (per_tensor,), generator=g).tolist():
                P = {m: x.clone() for m, x in P0.items()}
                P[n].view(-1)[idx] += h
                lp = loss_fn(forward(P, tokens), labels)
                P[n].view(-1)[idx] -= 2 * h
                lm = loss_fn(forward(P, tokens), labels)
                fd = ((lp - lm) / (2 * h)).item()
                err = abs(fd - grads[n].view(-1)[idx].item())
                worst = max(worst, err / max(1.0, abs(fd)) if relative else err)
    return worst


def adamw_trajectory(forward, decays, P0, tokens, labels):
    """ADAMW["steps"] steps on the same batch: loss, backward, clip_grad_norm_, torch.optim.AdamW
    with weight decay on the parameters `decays(name)` names. Returns the losses, the norms before
    clipping, the final parameters, and how far a hand-written AdamW fed with the same clipped
    gradients ends from torch's (it documents the exact update the engine must match)."""
    a = ADAMW
    P = {n: t.clone().requires_grad_(True) for n, t in P0.items()}
    opt = torch.optim.AdamW([dict(params=[t for n, t in P.items() if decays(n)], weight_decay=a["weight_decay"]),
                             dict(params=[t for n, t in P.items() if not decays(n)], weight_decay=0.0)],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"], foreach=False)
    ref = {n: t.clone() for n, t in P0.items()}
    m = {n: torch.zeros_like(t) for n, t in P0.items()}
    s = {n: torch.zeros_like(t) for n, t in P0.items()}
    losses, norms = [], []
    for step in range(1, a["steps"] + 1):
        opt.zero_grad()
        loss = loss_fn(forward(P, tokens), labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), a["max_grad_norm"], foreach=False)
        losses.append(loss.detach())
        norms.append(norm.detach())
        grads = {n: t.grad.clone() for n, t in P.items()}
        opt.step()
        for n in ref:  # own AdamW on torch's clipped grads (params agree, so grads agree)
            wd = a["weight_decay"] if decays(n) else 0.0
            ref[n] = ref[n] * (1 - a["lr"] * wd)
            m[n] = a["beta1"] * m[n] + (1 - a["beta1"]) * grads[n]
            s[n] = a["beta2"] * s[n] + (1 - a["beta2"]) * grads[n] ** 2
            mhat, shat = m[n] / (1 - a["beta1"] ** step), s[n] / (1 - a["beta2"] ** step)
            ref[n] = ref[n] - a["lr"] * mhat / (shat.sqrt() + a["eps"])
    err = max((ref[n] - P[n].detach()).abs().max().item() for n in P)
    return torch.stack(losses), torch.stack(norms), {n: t.detach() for n, t in P.items()}, err


# ----------------------------------------------------------------------------- file output

def write_safetensors(path, tensors, metadata):
    """safetensors.torch.save_file emits __metadata__ in random (Rust HashMap) order, so the bytes
    would change on every run. Write the format directly: u64 header length, JSON header (metadata
    first, then tensors sorted by name), space-padded to 8 bytes, then little-endian raw data."""
    assert sys.byteorder == "little"
    dtypes = {torch.float64: "F64", torch.int64: "I64"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        blob = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with safe_open(path, framework="pt") as f:  # read back with the reference library
        assert f.metadata() == metadata and sorted(f.keys()) == sorted(tensors)
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), tensors[name]), name


class Golden:
    """One golden case, checked and written: the gradients at P0 against central differences
    (to 1e-7), the AdamW trajectory (torch's against the hand-written one, to 1e-12), then the file."""

    def __init__(self, fname, generator, config, forward, decays, P0, tokens, labels, logits, loss, grads,
                 hf_config=None, fd_relative=False, max_bytes=1_000_000):
        self.fname, self.P0, self.labels, self.loss = fname, P0, labels, loss
        self.fd_err = check_fd(forward, P0, tokens, labels, grads, relative=fd_relative)
        assert self.fd_err < 1e-7, self.fd_err
        self.a_loss, self.a_norm, a_params, self.adam_err = adamw_trajectory(forward, decays, P0, tokens, labels)
        assert self.adam_err < 1e-12, self.adam_err
        assert self.a_loss[0].item() == loss.item()
        t = {"inputs": tokens.to(torch.int64), "labels": labels.to(torch.int64), "logits": logits.detach(),
             "loss": loss.detach().reshape(()), "adam.loss": self.a_loss, "adam.grad_norm": self.a_norm}
        for n in P0:
            t["param." + n] = P0[n]
            t["grad." + n] = grads[n]
            t["adam.param." + n] = a_params[n]
        meta = {"config": json.dumps(config, sort_keys=True)}
        if hf_config is not None:
            meta["hf_config"] = json.dumps(hf_config, sort_keys=True)
        meta.update(adamw=json.dumps(ADAMW, sort_keys=True), generator=generator)
        path = os.path.join(OUT_DIR, fname)
        write_safetensors(path, t, meta)
        self.size, self.tensors = os.path.getsize(path), len(t)
        assert max_bytes is None or self.size < max_bytes, f"{fname}: {self.size} bytes; golden files stay below {max_bytes}"

    def summary(self, extra=""):
        """The first line of a case's report."""
        return (f"{self.fname}: {self.tensors} tensors, {self.size} bytes, "
                f"params={sum(x.numel() for x in self.P0.values())}{extra}, "
                f"supervised={int((self.labels != -1).sum())}/{self.labels.numel()}")

    def adam_report(self, norms=False):
        """The last line(s) of a case's report: the AdamW losses (and gradient norms)."""
        r = f"  adam.loss={[round(x, 6) for x in self.a_loss.tolist()]}"
        return r + (f"\n  adam.grad_norm={[round(x, 6) for x in self.a_norm.tolist()]}" if norms else "")
