#!/usr/bin/env bash
# make demo: train DeltaNet with eigenvalues in [0,1] and in [-1,1] on parity, on the CPU, five
# seeds each, and print scaled accuracy on the training lengths and on the longer test lengths:
# every seed, how many solve it, the best (as P1 reports) and the median.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${LRNN_DEMO_OUT:-runs/demo}
seeds=(0 1 2 3 4)
mkdir -p "$out"
for name in parity_delta_net parity_delta_net_2; do
  for seed in "${seeds[@]}"; do
    echo "== $name, seed $seed"
    build/lrnn train --config configs/demo/$name.yaml --out "$out/$name-seed$seed" --force \
      --set training.seed=$seed --set logging.progress=none > "$out/$name-seed$seed.json"
    cat "$out/$name-seed$seed.json"
  done
done
python3 - "$out" "${seeds[@]}" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
rows = [("DeltaNet [0,1]", "parity_delta_net", "0.017"), ("DeltaNet [-1,1]", "parity_delta_net_2", "1.000")]
print()
print("Parity, scaled accuracy ((acc - 0.5) / 0.5) on test lengths 40-256 (trained on 3-40),")
print(f"lrnn on the CPU, configs/demo/*.yaml, seeds {seeds[0]}-{seeds[-1]}")
head = "".join(f"{'seed ' + str(s):>9}" for s in seeds)
print(f"{'model':<17}{head}{'solved':>8}{'best':>7}{'median':>8}{'P1 best':>9}")
for label, name, paper in rows:
    test = [json.load(open(f"{out}/{name}-seed{s}/eval.json"))["scaled_accuracy"] for s in seeds]
    solved = sum(t >= 0.99 for t in test)
    cells = "".join(f"{t:>9.3f}" for t in test)
    print(f"{label:<17}{cells}{f'{solved}/{len(seeds)}':>8}{max(test):>7.3f}{statistics.median(test):>8.3f}{paper:>9}")
print("(solved: scaled accuracy >= 0.99. Over 74 runs measured on three CPUs, [-1,1] solves it about 2 times in 3")
print(" (the others fit 3-40 and fade past ~100 tokens) and [0,1] never; which seeds succeed depends on the CPU's")
print(" rounding: docs/RESULTS.md, \"Learning tests\")")
print(f"\nRuns, metrics and checkpoints: {out}/  (try: build/lrnn predict --run {out}/parity_delta_net_2-seed0 --tokens \"2 1 2 2\")")
PY
