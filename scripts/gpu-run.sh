#!/usr/bin/env bash
# The command of one device call (the GPU machine of this workplace's device tool; see
# scripts/gpu-check.sh): installs the peer's wheels carried in .whl/ (flash-linear-attention and
# fla-core; .whl/hf/ holds transformers, huggingface_hub and tokenizers for images whose
# transformers is older than fla needs), then runs gpu-check from the pack in .gpu/ with the checks
# named in SECTIONS. summary.md and lm_runs.tar.gz go to $OUT as each check ends (a call cut short
# keeps what finished); the logs are tarred into $OUT/logs.tgz at the end.
#   carry: .gpu (scripts/gpu-check.sh --pack .gpu; PACK=DIR names another), .whl, data (scripts/demo_lm.sh)
#   SECTIONS="tests lm-train lm-speed lm-gen" TEST_FILTER=... CHECK_TIMEOUT=450 bash scripts/gpu-run.sh
#   on several GPUs: PACK=.gpu-dist SECTIONS="dist dist-speed" bash scripts/gpu-run.sh
# The peer's Triton kernels (compiled and autotuned: minutes, which cut several side-by-sides
# short) are kept between machines: the cache comes back as $OUT/triton-cache.tar.xz, or in parts
# of 15 MB (triton-cache.tar.xz.part00, ...: a returned file may have 16 MiB); those files copied
# into .triton-cache/ in the tree and carried, it is unpacked before the checks (an older single
# .triton-cache.tgz too).
set -o pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
: "${OUT:=$PWD/gpu-check-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  if ! python3 -c "import transformers as t, sys; v=tuple(int(x) for x in t.__version__.split('.')[:2]); sys.exit(0 if v >= (5, 6) else 1)"; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hf/*.whl
  fi
  export PYTHONPATH=/tmp/site
fi
export TRITON_CACHE_AUTOTUNING=1
TRITON_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if compgen -G ".triton-cache/triton-cache.tar.xz*" >/dev/null; then
  mkdir -p "$TRITON_DIR" && cat .triton-cache/triton-cache.tar.xz* | tar xJf - -C "$TRITON_DIR" &&
    echo "Triton cache: $(du -sh "$TRITON_DIR" | cut -f1) restored"
elif [[ -f .triton-cache.tgz ]]; then
  mkdir -p "$TRITON_DIR" && tar xzf .triton-cache.tgz -C "$TRITON_DIR" && echo "Triton cache: $(du -sh "$TRITON_DIR" | cut -f1) restored"
fi
python3 -c "import torch, triton, fla, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
LOGS=/tmp/gpu-check-logs
mkdir -p "$LOGS"
OUT="$OUT" LOGS="$LOGS" SECTIONS="${SECTIONS:-tests lm-train lm-speed lm-gen}" \
  TEST_FILTER="${TEST_FILTER:-*}" TEST_TIMEOUT="${TEST_TIMEOUT:-400}" LM_STEPS="${LM_STEPS:-2000}" \
  LM_SHAPES="${LM_SHAPES:-delta_net:24:1024:8:8 delta_net:4:1024:8:8}" \
  GEN_TOKENS="${GEN_TOKENS:-1024 8192 32768}" FLA_GEN_MAX="${FLA_GEN_MAX:-1024}" \
  timeout "${CHECK_TIMEOUT:-540}" bash scripts/gpu-check.sh --prebuilt "${PACK:-.gpu}"
rc=$?
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
if [[ -d "$TRITON_DIR" ]] && tar cf - -C "$TRITON_DIR" . 2>/dev/null | xz -T0 -6 > /tmp/triton-cache.tar.xz; then
  size=$(stat -c %s /tmp/triton-cache.tar.xz)
  if (( size < 15000000 )); then cp /tmp/triton-cache.tar.xz "$OUT/"
  elif (( size < 45000000 )); then split -b 15000000 -d /tmp/triton-cache.tar.xz "$OUT/triton-cache.tar.xz.part"
  else echo "Triton cache $size bytes compressed: too large to bring back"; fi
fi
exit $rc
