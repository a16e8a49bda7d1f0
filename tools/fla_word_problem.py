#!/usr/bin/env python3
"""The PyTorch + fla twin of an lrnn word-problem run (P2's state tracking), for comparing the two
step by step: same model (fla's GatedDeltaProductForCausalLM built from the run's config.json),
same initial weights (the run's model.safetensors), words by the same definition (the group's
table from `lrnn data` with the run's task block; the evaluation set is lrnn's own), same recipe
(the config's AdamW, betas, eps, weight decay, warm-up + cosine to min_lr, clipping, steps,
batch), bf16 autocast (fla's DeltaProduct kernels take nothing else). Writes, like an lrnn run,
config.yaml (the config, with an `implementation` key that tools/plot.py keeps apart) and
metrics.jsonl: train lines (step, loss, loss_avg, grad_norm, lr, plus beta_mean and beta_gt1: the
mean of beta over the batch's sub-steps and the fraction of them above 1, the negative
eigenvalues) and a final eval line with the sequence accuracy up to each length (all predictions
right from position 1 to t) on the eval split.

    # an lrnn run directory with the initial weights (lr 0 for one step leaves them as drawn):
    lrnn train --config configs/state_tracking/s5_deltaproduct_nh4_neg.yaml --out init \\
        --set training.num_steps=1 --set training.lr=0 --set training.warmup_steps=0
    python3 tools/fla_word_problem.py --run init --config configs/state_tracking/s5_deltaproduct_nh4_neg.yaml \\
        --lrnn build/lrnn --out fla_s5 [--pool 100000]

--pool N trains on a fixed set of N sequences drawn once, in epochs (P2's protocol: 100k sequences;
lrnn's task.train_pool, whose value it takes by default), or with 0 on fresh ones every step; the
pool's sequences are drawn here by lrnn's definition, not lrnn's own. GPU only (fla's kernels are Triton). Dev tool: CI never
runs it.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import yaml


def lrnn_samples(lrnn, config, n, seed, split, length=None):
    """(inputs, targets) as int64 tensors [n, T] from `lrnn data` (targets -1 where unsupervised)."""
    cmd = [lrnn, "data", "--config", config, "--n", str(n), "--seed", str(seed), "--split", split]
    if length:
        cmd += ["--length", str(length)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    rows = [json.loads(line) for line in out]
    T = max(len(r["input"]) for r in rows)
    assert all(len(r["input"]) == T for r in rows), "fixed-length samples expected (train_len [L, L])"
    x = torch.tensor([r["input"] for r in rows], dtype=torch.long)
    y = torch.tensor([r["target"] for r in rows], dtype=torch.long)
    return x, y


def lr_at(step, total, warmup, lr, min_lr):
    """lrnn's schedule (src/train/schedule.h): linear warm-up, then cosine to min_lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - warmup - 1)
    p = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def word_sampler(tx, ty, bos, seed, device):
    """draw(n) -> (inputs, targets) [n, T]: n fresh words like the samples (tx, ty) of `lrnn data`
    (same length, BOS or not), inputs uniform over the elements the samples use, targets the prefix
    products by the composition table read off the samples (every (y_{t-1}, x_t) -> y_t pair)."""
    b = 1 if bos else 0
    T = tx.shape[1] - b
    prev, cur, nxt = ty[:, b:-1].reshape(-1), tx[:, b + 1:].reshape(-1), ty[:, b + 1:].reshape(-1)
    alphabet = torch.unique(tx[:, b:])
    order = int(ty[:, b:].max()) + 1
    table = torch.full((order, order), -1, dtype=torch.long)
    table[prev, cur] = nxt
    assert torch.equal(ty[:, b], tx[:, b]), "y_1 = x_1 expected"
    missing = int((table[:, alphabet] < 0).sum())
    assert missing == 0, f"{missing} products never seen: draw more samples"
    table, alphabet = table.to(device), alphabet.to(device)
    bos_tok = int(tx[0, 0]) if bos else None
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(n):
        x = alphabet[torch.randint(0, alphabet.numel(), (n, T), device=device, generator=gen)]
        y = torch.empty_like(x)
        y[:, 0] = x[:, 0]
        for t in range(1, T):
            y[:, t] = table[y[:, t - 1], x[:, t]]
        if bos:
            col = torch.full((n, 1), bos_tok, dtype=torch.long, device=device)
            x, y = torch.cat([col, x], 1), torch.cat([col, y], 1)
        return x, y

    draw.generator = gen
    return draw


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="lrnn run directory: config.yaml, config.json, model.safetensors")
    ap.add_argument("--config", help="the experiment YAML whose recipe and task to follow (default: the run's "
                    "config.yaml; give it when the run only holds the initial weights)")
    ap.add_argument("--lrnn", default="build/lrnn", help="the lrnn binary (for `lrnn data`)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pool", type=int, default=None,
                    help="train on a fixed set of this many sequences, reshuffled every epoch (0: fresh every step; "
                         "default: the config's task.train_pool)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the run's num_steps)")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop training after this long, then evaluate")
    ap.add_argument("--eval-samples", type=int, default=0, help="0: the run's task.eval_samples")
    ap.add_argument("--seed", type=int, default=None, help="data seed (default: the run's training.seed)")
    a = ap.parse_args()

    from fla.models import GatedDeltaProductConfig, GatedDeltaProductForCausalLM
    from safetensors.torch import load_file

    cfg_path = a.config or os.path.join(a.run, "config.yaml")
    cfg = yaml.safe_load(open(cfg_path))
    tr, task = cfg["training"], cfg["task"]
    hf = json.load(open(os.path.join(a.run, "config.json")))
    hf.pop("architectures", None)
    hf.pop("model_type", None)
    model = GatedDeltaProductForCausalLM(GatedDeltaProductConfig(**hf)).cuda()
    missing, unexpected = model.load_state_dict(load_file(os.path.join(a.run, "model.safetensors")), strict=False)
    if missing or unexpected:
        sys.exit(f"weights do not match fla's model: missing {missing}, unexpected {unexpected}")
    torch.backends.cuda.matmul.allow_tf32 = True

    if a.pool is None:
        a.pool = int(task.get("train_pool", 0))
    steps = a.steps or int(tr.get("num_steps", 1000))
    B = int(tr.get("batch_size", 64))
    lr, min_lr = float(tr.get("lr", 1e-3)), float(tr.get("min_lr", 1e-6))
    warmup, clip = int(tr.get("warmup_steps", 100)), float(tr.get("grad_clip", 1.0))
    seed = a.seed if a.seed is not None else int(tr.get("seed", 0))
    # lrnn decays every matrix but the norms' weights (and biases, none here): fla's exclusions.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(tr.get("weight_decay", 0.0))},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                            betas=(float(tr.get("beta1", 0.9)), float(tr.get("beta2", 0.999))),
                            eps=float(tr.get("adam_eps", 1e-8)))

    # Data. The group's composition table and input alphabet come from `lrnn data` (every pair
    # (y_{t-1}, x_t) -> y_t of a few thousand sequences: all of them, for groups up to S5), so the
    # words here follow lrnn's definition exactly; they are drawn on the GPU (lrnn's own draws
    # would take longer to parse than to train on).
    tx, ty = lrnn_samples(a.lrnn, cfg_path, 4000, seed, "train")
    assert int(task.get("tokens_per_element", 1)) == 1, "tokens_per_element > 1 is not supported here"
    draw = word_sampler(tx, ty, bool(task.get("bos", False)), seed, "cuda")
    if a.pool:
        px, py = zip(*(draw(min(8192, a.pool - s)) for s in range(0, a.pool, 8192)))
        px, py = torch.cat(px), torch.cat(py)
    state = {"x": None, "y": None, "pos": 0, "epoch": 0}

    def batch():
        if not a.pool:
            return draw(B)
        if state["x"] is None or state["pos"] + B > a.pool:
            perm = torch.randperm(a.pool, device="cuda", generator=draw.generator)
            state.update(x=px[perm], y=py[perm], pos=0, epoch=state["epoch"] + 1)
        s = state["pos"]
        state["pos"] += B
        return state["x"][s:s + B], state["y"][s:s + B]

    betas = []
    neg = bool(hf.get("allow_neg_eigval", False))
    attn = model.model.layers[0].attn
    hook = attn.b_proj.register_forward_hook(
        lambda m, i, o: betas.append((o.detach().float().sigmoid() * (2.0 if neg else 1.0))))

    os.makedirs(a.out, exist_ok=True)
    # The recipe it followed, marked as this implementation's (tools/plot.py then draws it as a
    # group of its own next to lrnn's run of the same config).
    import fla
    run_cfg = dict(cfg, implementation=f"fla {fla.__version__} + PyTorch {torch.__version__}")
    run_cfg["training"] = dict(tr, seed=seed, num_steps=steps)
    with open(os.path.join(a.out, "config.yaml"), "w") as f:
        yaml.safe_dump(run_cfg, f, sort_keys=False)
    log = open(os.path.join(a.out, "metrics.jsonl"), "w")
    every = int(cfg.get("logging", {}).get("log_every", 50))
    t0 = time.time()
    model.train()
    step, since, count = 0, None, 0  # since: the losses summed since the last log line (on the GPU)
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, steps, warmup, lr, min_lr)
        x, y = batch()
        betas.clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):  # fla's DeltaProduct kernels take bf16 only
            logits = model(input_ids=x).logits.float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        opt.step()
        since = since + loss.detach() if since is not None else loss.detach()
        count += 1
        if (step + 1) % every == 0 or step + 1 == steps:
            b = torch.cat([t.flatten() for t in betas])
            line = {"type": "train", "step": step + 1, "loss": loss.item(), "loss_avg": (since / count).item(),
                    "grad_norm": gn.item(),
                    "lr": opt.param_groups[0]["lr"], "beta_mean": b.mean().item(),
                    "beta_gt1": (b > 1).float().mean().item(), "elapsed_s": time.time() - t0}
            log.write(json.dumps(line) + "\n")
            log.flush()
            print(json.dumps(line), flush=True)
            since, count = None, 0
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            break
    hook.remove()

    # Sequence accuracy up to each length on the eval split (fixed eval length, e.g. 512).
    model.eval()
    n_eval = a.eval_samples or int(task.get("eval_samples", 512))
    ex, ey = lrnn_samples(a.lrnn, cfg_path, n_eval, seed, "eval")
    ok_prefix = []
    with torch.no_grad():
        for s in range(0, n_eval, 64):
            x, y = ex[s:s + 64].cuda(), ey[s:s + 64].cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pred = model(input_ids=x).logits.argmax(-1)
            right = (pred == y) | (y < 0)
            ok_prefix.append(right.cumprod(dim=1).float().cpu())
    acc = torch.cat(ok_prefix).mean(0)
    bos = 1 if task.get("bos", False) else 0
    curve = {int(t): float(acc[t - 1 + bos]) for t in (8, 16, 32, 64, 128, 192, 256, 384, 512)
             if t - 1 + bos < acc.shape[0]}
    line = {"type": "eval", "step": step + 1, "sequence_accuracy_up_to": curve, "samples": n_eval,
            "pool": a.pool, "elapsed_s": time.time() - t0}
    log.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
