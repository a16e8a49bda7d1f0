#!/usr/bin/env bash
# lrnn and its PyTorch + fla twin (tools/fla_word_problem.py) side by side on one GPU, on one
# word-problem config: same model, same initial weights, same samples and recipe, so the loss
# curves compare step by step (docs/EXPERIMENTS.md, P2's state tracking). Both run at once for
# SECONDS_RUN seconds, on the config's data (task.train_pool: a fixed set in epochs, or fresh
# sequences); POOL=N sets the pool of both (0: fresh).
#   scripts/gpu-twin.sh BIN_DIR OUT_DIR [CONFIG]     (BIN_DIR holds lrnn: build-gpu or a pack;
#                                                     fla on PYTHONPATH: scripts/gpu-run.sh's wheels)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-gpu}
OUT=${2:-gpu-twin-out}
CONFIG=${3:-configs/state_tracking/s5_deltaproduct_nh4_neg.yaml}
SECONDS_=${SECONDS_RUN:-240}
POOL=${POOL:-}
SEED=${SEED:-0}
export TRITON_CACHE_AUTOTUNING=1  # (fla's autotuning took minutes: keep it for the next process)
mkdir -p "$OUT"
init=$(mktemp -d)
# The initial weights: one step at lr 0 leaves them as drawn from the seed (lrnn's run below draws
# the same ones).
"$BIN/lrnn" train --config "$CONFIG" --out "$init" --force --set training.num_steps=1 --set training.lr=0 \
  --set training.warmup_steps=0 --set training.val_every=0 --set task.eval_samples=64 --set training.seed="$SEED" \
  --set logging.progress=none >"$OUT/init.log" 2>&1 || { echo "init run failed"; tail "$OUT/init.log"; exit 1; }
# lrnn stops at SIGINT after the step it is in and saves a checkpoint; then the same evaluation
# (LRNN=0 leaves lrnn's run out).
p1=
[[ "${LRNN:-1}" == 0 ]] || (
  timeout -s INT "$SECONDS_" "$BIN/lrnn" train --config "$CONFIG" --out "$OUT/lrnn" --force --set training.device=cuda \
    --set training.seed="$SEED" --set training.val_every=0 --set logging.progress=none ${POOL:+--set task.train_pool=$POOL}
  "$BIN/lrnn" eval --run "$OUT/lrnn" --set task.eval_samples=512
) >"$OUT/lrnn.log" 2>&1 &
[[ "${LRNN:-1}" == 0 ]] || p1=$!
python3 tools/fla_word_problem.py --run "$init" --config "$CONFIG" --lrnn "$BIN/lrnn" --out "$OUT/fla" --max-seconds "$SECONDS_" \
  --eval-samples 512 --seed "$SEED" ${POOL:+--pool "$POOL"} >"$OUT/fla.log" 2>&1 &
p2=$!
wait $p1 $p2  # (unquoted: an empty one drops out)
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def lines(run):
    p = os.path.join(out, run, "metrics.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
runs = {r: lines(r) for r in ("lrnn", "fla")}
train = {r: {j["step"]: j for j in ls if j["type"] == "train"} for r, ls in runs.items()}
steps = sorted(set().union(*[set(t) for t in train.values()]))
print("| step | " + " | ".join(f"{r} loss | {r} grad norm" for r in runs) + " |")
print("|---|" + "---|---|" * len(runs))
for s in steps[:: max(1, len(steps) // 25)] + steps[-1:]:
    cells = []
    for r in runs:
        j = train[r].get(s)
        cells += [f"{j['loss']:.4f}", f"{j['grad_norm']:.3f}"] if j else ["-", "-"]
    print(f"| {s} | " + " | ".join(cells) + " |")
for r, ls in runs.items():
    ev = [j for j in ls if j["type"] == "eval"]
    tr = [j for j in ls if j["type"] == "train"]
    if tr:
        last = tr[-1]
        extra = f", beta mean {last['beta_mean']:.3f}, beta > 1: {last['beta_gt1']:.3f}" if "beta_mean" in last else ""
        print(f"\n{r}: {last['step']} steps in {last.get('elapsed_s', 0):.0f} s{extra}")
    if ev: print(f"{r} eval: {json.dumps(ev[-1])}")
PY
