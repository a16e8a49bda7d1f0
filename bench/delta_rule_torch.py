"""The peer of bench/bench_delta_rule on the CPU: flash-linear-attention's PyTorch chunked delta rule
(`fla.ops.delta_rule.naive.delta_rule_chunkwise`, the WY form in plain tensor operations; fla's fast
kernels are Triton, GPU only), forward + backward through autograd, fp32, on one thread, at the
ungated DeltaNet shapes bench_delta_rule times (4 heads, beta in (0, 2)). One JSON line per shape:
milliseconds per forward + backward (the minimum over repetitions, as bench_delta_rule's).

    python3 bench/delta_rule_torch.py [--reps 5]

Needs torch, einops and the fla-core wheel (pure Python) in the environment; only the file
fla/ops/delta_rule/naive.py is loaded (fla's package itself imports Triton).
"""
import argparse
import importlib.util
import json
import os
import time

import torch


def naive_module():
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("delta_rule_torch.py: fla is not installed (pip install --no-deps fla-core==0.6.0)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "delta_rule", "naive.py")
    s = importlib.util.spec_from_file_location("fla_delta_rule_naive", path)
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    naive = naive_module()
    # (T, head dim, B): bench_delta_rule's ungated n_h = 1 shapes; the chunk (32) must divide T.
    for T, D, B in ((64, 32, 16), (128, 32, 16), (512, 64, 4), (1024, 64, 2), (2048, 128, 1)):
        H = 4
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, H, T, D, generator=g, requires_grad=True)
        k = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=g), dim=-1).requires_grad_(True)
        v = torch.randn(B, H, T, D, generator=g, requires_grad=True)
        beta = (2 * torch.sigmoid(torch.randn(B, H, T, generator=g))).requires_grad_(True)
        dout = torch.randn(B, H, T, D, generator=g)
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            o, _ = naive.delta_rule_chunkwise(q, k, v, beta, chunk_size=32)
            o.backward(dout)
            best = min(best, time.perf_counter() - t0)
            for x in (q, k, v, beta):
                x.grad = None
        print(json.dumps({"impl": "torch+fla naive chunkwise", "T": T, "D": D, "nh": 1, "gated": False, "B": B,
                          "ms": best * 1e3, "tokens_per_s": B * T / best, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
