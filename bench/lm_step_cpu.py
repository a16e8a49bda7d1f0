"""A language-model training step on the CPU, lrnn against PyTorch, side by side on this machine.

The same DeltaNet LM (fla's DeltaNetForCausalLM architecture: short convolutions, SiLU, L2-normed
q and k, beta from b_proj, [-1,1] eigenvalues, o_norm, SwiGLU MLPs, untied head) at the same shape,
fp32, on every core:
  lrnn:    `lrnn train` on random tokens (bench/random_shards.py), tokens/s of its last log line;
  PyTorch: the float64 twin of tools/golden_deltanet.py run in float32, with its delta rule replaced
           by flash-linear-attention's PyTorch chunked form (`delta_rule_chunkwise` of
           fla/ops/delta_rule/naive.py, the WY algorithm in tensor operations: fla's own kernels
           are Triton, GPU only), forward + backward through autograd + AdamW, best of --reps steps
           after one warm-up.
One JSON line each.

    python3 bench/lm_step_cpu.py --lrnn build/lrnn [--hidden 256 --layers 4 --heads 2 --context 1024
                                                    --batch 8 --vocab 1000 --steps 6]

Needs torch, einops and the fla-core wheel (pure Python; only naive.py is loaded).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tools")]
import golden_deltanet as twin  # noqa: E402
from delta_rule_torch import naive_module  # noqa: E402  (fla's naive.py, loaded without Triton)


def chunked_delta_rule(naive, chunk):
    def rule(q, k, v, beta):  # the twin's layout [B,T,H,D] and scale (q / sqrt(dk)), fla's [B,H,T,D]
        o, _ = naive.delta_rule_chunkwise(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          beta.transpose(1, 2), chunk_size=chunk)
        return o.transpose(1, 2)
    return rule


def torch_step_ms(a, naive):
    torch.manual_seed(0)
    c = twin.make_config(a.vocab, a.hidden, a.layers, a.heads, True, True)
    g = torch.Generator().manual_seed(0)
    P = {n: t.float().requires_grad_(True) for n, t in twin.init_params(c, g).items()}
    # The chunked form must be the twin's loop, in fp32 to rounding, before it is timed.
    loop = twin.delta_rule_loop
    q, k = (twin.l2_norm(torch.randn(1, 64, 2, 32, generator=g)) for _ in range(2))
    v, beta = torch.randn(1, 64, 2, 32, generator=g), 2 * torch.sigmoid(torch.randn(1, 64, 2, generator=g))
    err = (chunked_delta_rule(naive, 32)(q, k, v, beta) - loop(q, k, v, beta)).abs().max().item()
    if err > 1e-4:
        raise SystemExit(f"lm_step_cpu.py: the chunked delta rule differs from the loop by {err}")
    twin.delta_rule_loop = chunked_delta_rule(naive, a.chunk)
    opt = torch.optim.AdamW(list(P.values()), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01)
    tokens = torch.randint(0, a.vocab, (a.batch, a.context + 1), generator=g)
    best = float("inf")
    for i in range(a.steps + 1):
        t0 = time.perf_counter()
        logits = twin.forward(P, c, tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i > 0:  # the first step warms up
            best = min(best, time.perf_counter() - t0)
    twin.delta_rule_loop = loop
    return best * 1e3, sum(p.numel() for p in P.values())


def lrnn_tokens_per_s(a, work):
    data = os.path.join(work, "rand")
    subprocess.run([sys.executable, os.path.join(HERE, "random_shards.py"), "--out", data, "--vocab", str(a.vocab),
                    "--tokens", str(max(2_000_000, 4 * a.batch * (a.context + 1) * (a.steps + 2)))],
                   check=True, stdout=subprocess.DEVNULL)
    cfg = os.path.join(work, "lm.yaml")
    with open(cfg, "w") as f:
        f.write(f"""training: {{num_steps: {a.steps + 2}, batch_size: {a.batch}, lr: 3.0e-4, warmup_steps: 1,
            weight_decay: 0.01, beta2: 0.95, val_every: 0, checkpoint_every: 0}}
model: {{model_type: delta_net, hidden_size: {a.hidden}, num_hidden_layers: {a.layers}, num_heads: {a.heads},
         allow_neg_eigval: true, vocab_size: {a.vocab}}}
task: {{name: lm, data: {data}, context: {a.context}, eval_tokens: {a.context + 1}, eval_batch_size: 1}}
logging: {{log_every: 1, progress: none}}
""")
    run = os.path.join(work, "run")
    subprocess.run([a.lrnn, "train", "--config", cfg, "--out", run, "--force"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    rates = [j["tokens_per_s"] for j in lines if j["type"] == "train"][1:]  # the first step warms up
    return max(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lrnn", default=os.path.join(HERE, "..", "build", "lrnn"))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--chunk", type=int, default=64)
    a = p.parse_args()
    shape = {"hidden": a.hidden, "layers": a.layers, "heads": a.heads, "context": a.context, "batch": a.batch,
             "vocab": a.vocab, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as work:
        tps = lrnn_tokens_per_s(a, work)
    print(json.dumps({"impl": "lrnn", **shape, "ms_per_step": a.batch * a.context / tps * 1e3, "tokens_per_s": tps}),
          flush=True)
    ms, params = torch_step_ms(a, naive_module())
    print(json.dumps({"impl": f"PyTorch {torch.__version__} + fla naive chunkwise (chunk {a.chunk})", **shape,
                      "params": params, "ms_per_step": ms, "tokens_per_s": a.batch * a.context / ms * 1e3}), flush=True)


if __name__ == "__main__":
    main()
