#!/usr/bin/env bash
# Single training runs side by side on a host's GPUs, one per GPU (round-robin when there are more
# runs than GPUs), each stopped cleanly (SIGTERM: checkpoint written) after a time limit. What
# comes back is two files, however many runs (the device tool returns at most 8 files a call: with
# one archive per run, four runs' archives were left behind):
#   OUT/progress.tgz  every run's log and metrics.jsonl, rewritten every 30 s (so a call cut short
#                     still returns how far the runs got);
#   OUT/runs.tgz      at the end: every run directory (checkpoints included, so that a later call
#                     can continue it) and its log, as NAME/ and NAME.log. A returned file is at
#                     most 16 MiB: runs with larger checkpoints go fewer to a call.
# For runs a grid cannot express (e.g. a different learning-rate schedule per run). Keep SECONDS
# below the device call's limit (the reply's limit_s), or only progress.tgz comes back.
#   scripts/gpu-runs.sh PACK_DIR OUT_DIR SECONDS 'NAME: lrnn train arguments' ...
#   PACK_DIR: a pack of scripts/gpu-check.sh --pack (unpacked here if only pack.tar.xz is there;
#   its lib/ and lib-extra/ go on LD_LIBRARY_PATH), or any directory holding an lrnn binary.
#   RESUME_FROM=DIR: take NAME from DIR/runs.tgz (or an older DIR/run-NAME.tgz) and continue it
#   with `train --resume`.
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
BIN=$(realpath "$1") OUT=$2 LIMIT=$3
shift 3
if [[ ! -x "$BIN/lrnn" && -f "$BIN/pack.tar.xz" ]]; then xz -dc "$BIN/pack.tar.xz" | tar xf - -C "$BIN"; fi
[[ -x "$BIN/lrnn" ]] || { echo "gpu-runs.sh: no lrnn in $BIN (nor a pack.tar.xz to unpack)" >&2; exit 2; }
# A pack's binary needs the libraries packed beside it (yaml-cpp, fmt, ...): without them it
# cannot start on the device machine.
for d in lib-extra lib; do
  if [[ -d "$BIN/$d" ]]; then export LD_LIBRARY_PATH="$BIN/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
done
mkdir -p "$OUT"
runs=$(mktemp -d)
gpus=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
((gpus > 0)) || gpus=1
i=0
pids=()
names=()
for spec in "$@"; do
  name=${spec%%:*}
  args=${spec#*:}
  dir="$runs/$name"
  names+=("$name")
  if [[ -n "${RESUME_FROM:-}" && ( -f "$RESUME_FROM/runs.tgz" || -f "$RESUME_FROM/run-$name.tgz" ) ]]; then
    if [[ -f "$RESUME_FROM/run-$name.tgz" ]]; then tar xzf "$RESUME_FROM/run-$name.tgz" -C "$runs"
    else tar xzf "$RESUME_FROM/runs.tgz" -C "$runs" "$name"; fi
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
# The logs and metrics of all runs, as one archive (written aside, then moved: a call that ends
# mid-write still returns the previous one).
progress() {
  local files=() n
  for n in "${names[@]}"; do
    [[ -f "$runs/$n.log" ]] && files+=("$n.log")
    [[ -f "$runs/$n/metrics.jsonl" ]] && files+=("$n/metrics.jsonl")
  done
  ((${#files[@]})) || return 0
  tar czf "$OUT/.progress.tgz" -C "$runs" "${files[@]}" 2>/dev/null && mv "$OUT/.progress.tgz" "$OUT/progress.tgz"
}
(while sleep 30; do progress || true; done) &
copier=$!
for p in "${pids[@]}"; do wait "$p" || true; done
kill "$copier" 2>/dev/null || true
progress || true
keep=()
for name in "${names[@]}"; do
  echo "== $name"
  tail -n 25 "$runs/$name.log"
  keep+=("$name.log")
  [[ -d "$runs/$name" ]] && keep+=("$name")
done
tar czf "$OUT/runs.tgz" -C "$runs" "${keep[@]}"
