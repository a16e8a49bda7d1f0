#!/usr/bin/env bash
# Single training runs side by side on a host's GPUs, one per GPU (round-robin when there are more
# runs than GPUs), each stopped cleanly (SIGTERM: checkpoint written) after a time limit; every
# run directory comes back as OUT/run-NAME.tgz, checkpoints included, so that a later call can
# continue it. For runs a grid cannot express (e.g. a different learning-rate schedule per run).
# Keep SECONDS below the device call's limit (the reply's limit_s), or only the 30-second copies
# of the logs and metrics come back.
#   scripts/gpu-runs.sh BIN_DIR OUT_DIR SECONDS 'NAME: lrnn train arguments' ...
#   RESUME_FROM=DIR: unpack DIR/run-NAME.tgz first and continue NAME with `train --resume`.
#   DEVICE=cpu: try it without a GPU.
# Next to other work in one device call, start it with `scripts/gpu-runs.sh ... & runs=$!` and end
# with `wait $runs`: a loop on `pgrep -f gpu-runs.sh` never ends, since the call's own command line
# matches too (two calls ran to their time limit that way).
# Example:
#   scripts/gpu-runs.sh .gpu-pack "$OUT" 540 \
#     'a: --config configs/state_tracking/s5_deltaproduct_nh4_neg_curriculum.yaml' \
#     'b: --config configs/state_tracking/s5_deltaproduct_nh4_neg_curriculum.yaml --set training.lr=1e-4 training.min_lr=1e-4'
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$1 OUT=$2 LIMIT=$3
shift 3
mkdir -p "$OUT"
runs=$(mktemp -d)
gpus=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
((gpus > 0)) || gpus=1
i=0
pids=()
for spec in "$@"; do
  name=${spec%%:*}
  args=${spec#*:}
  dir="$runs/$name"
  if [[ -n "${RESUME_FROM:-}" && -f "$RESUME_FROM/run-$name.tgz" ]]; then
    tar xzf "$RESUME_FROM/run-$name.tgz" -C "$runs"
    cmd="train --resume $dir"
  else
    # shellcheck disable=SC2086  # the arguments are words of a command line
    cmd="train $args --out $dir --set training.device=${DEVICE:-cuda}"
  fi
  echo "== $name on GPU $((i % gpus)): lrnn $cmd"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout -s TERM "$LIMIT" "$BIN/lrnn" $cmd >"$runs/$name.log" 2>&1 &
  pids+=($!)
  i=$((i + 1))
done
# Every 30 s each run's log and metrics.jsonl are copied to OUT, so a call the device tool cuts
# short (its own limit can be below SECONDS when the session's GPU time runs low) still returns
# how far the runs got.
(while sleep 30; do
  for spec in "$@"; do
    name=${spec%%:*}
    cp "$runs/$name.log" "$OUT/$name.log" 2>/dev/null || true
    cp "$runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null || true
  done
done) &
copier=$!
for p in "${pids[@]}"; do wait "$p" || true; done
kill "$copier" 2>/dev/null || true
for spec in "$@"; do
  name=${spec%%:*}
  echo "== $name"
  tail -n 25 "$runs/$name.log"
  cp "$runs/$name.log" "$OUT/$name.log"
  if [[ -d "$runs/$name" ]]; then (cd "$runs" && tar czf "$OUT/run-$name.tgz" "$name"); fi
done
