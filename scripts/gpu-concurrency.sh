#!/usr/bin/env bash
# How many small runs one GPU holds: the P1 parity model (DeltaNet [-1,1], batch 256) trained
# alone, as N processes at once (time-sliced, then under the CUDA MPS daemon), and alone at N x
# the batch (the most that stacking N runs into one launch could give). Prints one row per case:
# sequences per second summed over the processes, measured by each run's own log between step
# FROM and its last step (the start-up and the first steps left out).
#   scripts/gpu-concurrency.sh BIN_DIR OUT_DIR     (BIN_DIR holds lrnn: build-gpu or a pack)
# STEPS (default 6000) per run; DEVICE (default cuda; cpu to try the script out); CASES picks cases ("alone:1 batch:4 procs:4 mps:4 ...").
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-gpu}
OUT=${2:-gpu-concurrency-out}
STEPS=${STEPS:-6000}
FROM=${FROM:-1000}
mkdir -p "$OUT"
work=$(mktemp -d)
config=configs/chomsky/parity_delta_net_2.yaml

# run_many N BATCH TAG: N runs at once, each its own seed and directory; waits for all.
run_many() {
  local n=$1 batch=$2 tag=$3 pids=()
  for ((i = 0; i < n; ++i)); do
    "$BIN/lrnn" train --config "$config" --device "${DEVICE:-cuda}" --out "$work/$tag/$i" --set training.num_steps="$STEPS" \
      --set training.batch_size="$batch" --set training.seed="$i" --set training.val_every=0 \
      --set training.checkpoint_every=0 --set task.eval_samples=256 --set logging.log_every=250 \
      >"$work/$tag.$i.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [[ $rc == 0 ]] || { echo "$tag: a run failed"; tail -n 5 "$work/$tag".*.log; }
}

# rate TAG BATCH: summed sequences/s over the runs of TAG, from metrics.jsonl.
rate() {
  python3 - "$work/$1" "$2" "$FROM" <<'EOF'
import json, pathlib, sys
root, batch, start = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
total, per = 0.0, []
for m in sorted(root.glob("*/metrics.jsonl")):
    rows = [json.loads(l) for l in m.read_text().splitlines() if l.strip()]
    rows = [r for r in rows if r.get("type") == "train" and r["step"] >= start]
    a, b = rows[0], rows[-1]
    steps_s = (b["step"] - a["step"]) / (b["elapsed_s"] - a["elapsed_s"])
    per.append(steps_s)
    total += steps_s * batch
print(f"{len(per)} | {total:,.0f} | " + ", ".join(f"{x:.0f}" for x in per))
EOF
}

mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/lrnn-mps CUDA_MPS_LOG_DIRECTORY=/tmp/lrnn-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
}
mps_off() {
  echo quit | nvidia-cuda-mps-control || true
  sleep 1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

{
  echo "| case | runs | sequences/s (sum) | steps/s per run |"
  echo "|---|---|---|---|"
  for c in ${CASES:-alone:1 batch:4 batch:8 procs:4 procs:8 mps:4 mps:8}; do
    kind=${c%%:*}
    n=${c##*:}
    case $kind in
      alone) run_many 1 256 "$c" && r=$(rate "$c" 256) ;;
      batch) run_many 1 $((256 * n)) "$c" && r=$(rate "$c" $((256 * n))) ;;
      procs) run_many "$n" 256 "$c" && r=$(rate "$c" 256) ;;
      mps) mps_on && run_many "$n" 256 "$c" && r=$(rate "$c" 256); mps_off ;;
    esac
    echo "| $c | $r |"
  done
} | tee "$OUT/concurrency.md"
rm -rf "$work"
