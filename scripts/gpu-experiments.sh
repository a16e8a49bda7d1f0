#!/usr/bin/env bash
# The GPU experiments behind docs/RESULTS.md ("GPU learning runs and grids"): the parity grid (DeltaNet [0,1] vs [-1,1],
# P1 model, 3 lrs x 3 seeds, stop at 0.99) and the modular-arithmetic grid (public protocol,
# 20k steps, 3 seeds), each as `lrnn sweep` with all runs side by side on the host's GPUs; then the
# results tables and a tarball of every run's config, metrics and eval (for tools/plot.py).
#   scripts/gpu-experiments.sh BIN_DIR OUT_DIR      (BIN_DIR holds lrnn: build-gpu or a pack)
#   CHECKPOINTS=1 ... then RESUME_FROM=DIR ...       (one grid over several device calls; below)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-gpu}
OUT=${2:-gpu-experiments-out}
mkdir -p "$OUT"
runs=${RUNS_DIR:-$(mktemp -d)}  # RUNS_DIR: continue earlier sweeps (finished runs are skipped)
mkdir -p "$runs"
# Grids longer than one device call: CHECKPOINTS=1 also writes one run-<grid>_<config>_<run>.tgz
# per run, checkpoints included (small models stay under what a returned file may weigh), and a
# later call continues them from those files with RESUME_FROM=DIR (interrupted runs resume, the
# finished ones are skipped).
if [[ -n "${RESUME_FROM:-}" ]]; then
  for f in "$RESUME_FROM"/run-*.tgz; do if [[ -f "$f" ]]; then tar xzf "$f" -C "$runs"; fi; done
  echo "resumed from $RESUME_FROM: $(find "$runs" -name config.yaml | wc -l) run(s)"
fi
# GRIDS: name:jobs pairs (default: the two grids above). With MPS=1 the runs share the GPU
# through the CUDA MPS daemon (kernels of different processes overlap) instead of time slices.
if [[ "${MPS:-0}" == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/lrnn-mps CUDA_MPS_LOG_DIRECTORY=/tmp/lrnn-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "MPS unavailable: time-sliced"
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
for grid in ${GRIDS:-gpu_parity_p1:18 gpu_mod_arith_public:6}; do
  name=${grid%%:*}
  jobs=${grid##*:}
  echo "== $name ($jobs jobs)"
  t0=$(date +%s)
  timeout "${SWEEP_TIMEOUT:-300}" "$BIN/lrnn" sweep --grid "configs/grids/$name.yaml" --jobs "$jobs" \
    --out "$runs/$name" 2>&1 | tail -n 5 || echo "(sweep $name stopped: exit $?)"
  echo "$name: $(($(date +%s) - t0)) s wall for the whole grid"
  "$BIN/lrnn" sweep --grid "configs/grids/$name.yaml" --out "$runs/$name" --report >/dev/null 2>&1 || true
  cp "$runs/$name/results.md" "$OUT/$name.md" 2>/dev/null || true
done
(cd "$runs" && find . -name config.yaml -o -name metrics.jsonl -o -name eval.json -o -name results.csv -o -name results.md |
  tar czf - -T -) >"$OUT/runs.tar.gz"
if [[ "${CHECKPOINTS:-0}" == 1 ]]; then
  (cd "$runs" && for d in */*/*/; do
    if [[ -f "$d/config.yaml" ]]; then tar czf "$OUT/run-$(echo "${d%/}" | tr / _).tgz" "$d"; fi
  done)
fi
ls -la "$OUT"
