"""The peer of lrnn's chunked delta rule on the GPU: flash-linear-attention's Triton kernels
(chunk_delta_rule, chunk_gated_delta_rule, chunk_gated_delta_product), bf16 inputs as fla runs them in
training, forward alone and forward + backward, at the shapes tests/cuda DeltaRuleCuda.DISABLED_Timing
times lrnn at (head dim 128, beta in (0, 2), L2-normalised keys). One JSON line per shape: milliseconds
(median of CUDA-event timings after warm-up).

    python3 bench/delta_rule_fla_gpu.py [--reps 20]

Needs torch with CUDA, triton and the flash-linear-attention + fla-core 0.6.0 wheels.
"""
import argparse
import json

import torch
import torch.nn.functional as F


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def case(B, T, H, D, nh, gate, reps):
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_product import chunk_gated_delta_product

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True)
    k = F.normalize(torch.randn(B, T * nh, H, D, device=dev), p=2, dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T * nh, H, D, device=dev, dtype=dt, requires_grad=True)
    beta = (2 * torch.rand(B, T * nh, H, device=dev).sigmoid()).to(dt).requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H, device=dev)).requires_grad_() if gate else None

    def fwd():
        if nh > 1:
            return chunk_gated_delta_product(q, k, v, g, beta, num_householder=nh)[0]
        if gate:
            return chunk_gated_delta_rule(q, k, v, g, beta)[0]
        return chunk_delta_rule(q, k, v, beta)[0]

    do = torch.randn(B, T, H, D, device=dev, dtype=dt)

    def fwd_bwd():
        fwd().backward(do)

    with torch.no_grad():
        t_f = timed(fwd, reps)
    t_fb = timed(fwd_bwd, reps)
    kind = f"gated_delta_product nh={nh}" if nh > 1 else "gated_delta_rule" if gate else "delta_rule"
    print(json.dumps({"impl": "fla", "kernel": kind, "B": B, "T": T, "H": H, "D": D, "n_h": nh, "gate": gate,
                      "fwd_ms": round(t_f, 3), "fwd_bwd_ms": round(t_fb, 3),
                      "device": torch.cuda.get_device_name()}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    for B, T, H, D, nh, gate in [(8, 4096, 16, 128, 1, False), (4, 2048, 16, 128, 1, False),
                                 (8, 2048, 8, 128, 1, False), (8, 512, 16, 64, 1, False),
                                 (8, 2048, 8, 128, 1, True), (8, 2048, 8, 128, 2, True), (8, 2048, 8, 128, 3, True)]:
        try:
            case(B, T, H, D, nh, gate, a.reps)
        except Exception as e:  # one shape failing (memory, a missing op) must not hide the others
            print(json.dumps({"impl": "fla", "B": B, "T": T, "H": H, "D": D, "n_h": nh, "gate": gate,
                              "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)


if __name__ == "__main__":
    main()
