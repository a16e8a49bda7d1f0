"""Token shards of uniformly random ids (lrnn's shard format, docs/DATA.md) for throughput
benchmarks at a language model's vocabulary, e.g. 32000, where no tokenizer of that size ships
with the project. The tokens carry no language: use them for speed, never for loss.

    python3 bench/random_shards.py --out DIR --vocab 32000 --tokens 20000000 [--seed 0]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from parquet_to_shards import VERSION, ShardWriter, token_bytes_for, write_file_atomic  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--doc-tokens", type=int, default=4096, help="tokens per document (BOS ... EOS)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    sha = b"\0" * 32  # no tokenizer: the index names none (generation needs --tokenizer)
    splits = {}
    for split, n in (("train", a.tokens), ("val", max(a.tokens // 100, 4 * a.doc_tokens))):
        w = ShardWriter(a.out, split, 50_000_000, a.vocab, sha)
        left = n
        while left > 0:
            k = min(a.doc_tokens, left)
            w.add_document(np.concatenate([[1], rng.integers(4, a.vocab, k - 2), [2]]) if k > 2 else [1, 2][:k])
            left -= k
        w.finish()
        splits[split] = w.summary()
    index = {"format": "lrnn token shards", "format_version": VERSION, "created_by": "bench/random_shards.py",
             "tokenizer": {"path": "", "sha256": sha.hex(), "vocab_size": a.vocab, "bos_id": 1, "eos_id": 2,
                           "pad_id": -1, "unk_id": 0},
             "token_bytes": token_bytes_for(a.vocab), "document_layout": "BOS tokens EOS", "splits": splits}
    write_file_atomic(os.path.join(a.out, "index.json"), (json.dumps(index, indent=2) + "\n").encode())
    print(f"random_shards: {a.tokens} + {splits['val']['tokens']} tokens of vocabulary {a.vocab} in {a.out}")


if __name__ == "__main__":
    main()
