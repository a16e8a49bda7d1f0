"""The peer measurements for lrnn's language models: PyTorch + flash-linear-attention (fla) on the
same GPU, at the same shape, in the same run (scripts/gpu-check.sh runs both: SECTIONS="lm-speed lm-gen").

    python3 bench/lm_fla.py train --model delta_net --hidden 1024 --layers 24 --heads 8 \
        --vocab 32000 --context 2048 --batch 8 [--neg] [--householder 2] [--steps 20]
    python3 bench/lm_fla.py generate --model delta_net --hidden 512 --layers 8 --heads 8 \
        --vocab 32000 --tokens 1024

train: milliseconds per optimizer step (under torchrun: PyTorch DDP over the GPUs, --batch rows per
GPU, tokens per second of all GPUs together, printed by rank 0) (bf16 autocast, fla's fused cross-entropy, fused AdamW
lr 3e-4 β2 0.95 wd 0.01, gradient clipping at 1.0), tokens per second and peak GPU memory, after
warm-up steps. generate: greedy generation of exactly --tokens tokens after a 16-token prompt with
fla's recurrent cache (Hugging Face generate), tokens per second and peak GPU memory. Random weights
(speed only). One JSON line per measurement on stdout.
"""
import argparse
import json
import time

import torch


def build(a):
    import fla.models as fm
    common = dict(hidden_size=a.hidden, num_hidden_layers=a.layers, num_heads=a.heads, vocab_size=a.vocab,
                  allow_neg_eigval=a.neg, use_short_conv=True, tie_word_embeddings=False)
    if a.model == "delta_net":
        cfg, cls = fm.DeltaNetConfig(**common), fm.DeltaNetForCausalLM
    elif a.model == "gated_deltanet":
        cfg, cls = fm.GatedDeltaNetConfig(head_dim=a.hidden // a.heads, **common), fm.GatedDeltaNetForCausalLM
    elif a.model == "gated_deltaproduct":
        cfg = fm.GatedDeltaProductConfig(head_dim=a.hidden // a.heads, num_householder=a.householder,
                                         use_forget_gate=True, **common)
        cls = fm.GatedDeltaProductForCausalLM
    else:
        raise SystemExit(f"unknown --model {a.model}")
    return cls(cfg).cuda()


def train(a):
    import os
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl")
    model = build(a)
    params = sum(p.numel() for p in model.parameters())
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randint(0, a.vocab, (a.batch, a.context), device="cuda", generator=g)
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    if rank == 0:
        print(json.dumps({"impl": "fla", "what": "train", "model": a.model, "neg": a.neg, "hidden": a.hidden,
                          "layers": a.layers, "heads": a.heads, "vocab": a.vocab, "context": a.context,
                          "batch": a.batch * world, "gpus": world, "params": params, "ms_per_step": ms,
                          "tokens_per_s": a.batch * world * a.context / ms * 1e3,
                          "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


@torch.no_grad()
def generate(a):
    model = build(a).eval()
    prompt = torch.randint(4, a.vocab, (1, 16), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)  # warm-up (compiles kernels)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False)
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    n = out.shape[1] - prompt.shape[1]
    print(json.dumps({"impl": "fla", "what": "generate", "model": a.model, "hidden": a.hidden, "layers": a.layers,
                      "heads": a.heads, "vocab": a.vocab, "tokens": n, "seconds": s, "tokens_per_s": n / s,
                      "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["train", "generate"])
    p.add_argument("--model", default="delta_net")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--householder", type=int, default=2)
    p.add_argument("--neg", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tokens", type=int, default=1024)
    a = p.parse_args()
    train(a) if a.what == "train" else generate(a)


if __name__ == "__main__":
    main()
