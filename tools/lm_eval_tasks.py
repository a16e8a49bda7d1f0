#!/usr/bin/env python3
"""lm-evaluation-harness tasks made from the validation split of a tokenized corpus (`lrnn tokenize
--out DIR`), for evaluating an lrnn language model with the real harness through `lrnn serve`,
offline (the harness's own tasks download their datasets from a hub).

    .venv/bin/python tools/lm_eval_tasks.py --data data/shakespeare --tokenizer data/shakespeare.model \\
        --out runs/lm_eval_tasks [--seed 0] [--choice-docs 200] [--rolling-docs 100] [--generate-docs 30]

The validation documents (held out from training by `lrnn tokenize`) are read back from the val
shards and decoded with the tokenizer. Three tasks, each a JSON-lines file and a task YAML in --out
(data_files by absolute path; pass --out to lm_eval's --include_path):

  lrnn_next_line   multiple_choice: a document's lines but the last, then which of four lines ends
                   it (the true one and the last lines of three other documents, drawn by --seed);
                   acc and acc_norm. Documents of at least three lines (in a play: the speaker's
                   name, then two or more lines).
  lrnn_rolling     loglikelihood_rolling over whole documents (as the harness's wikitext):
                   word_perplexity, byte_perplexity, bits_per_byte.
  lrnn_generate    generate_until: a document's first two lines, then the model writes until a
                   newline; exact_match against the third line (small models score ~0: this
                   exercises the generation path).

A missing or malformed corpus or tokenizer is one line on stderr and exit code 2.
"""
import argparse
import json
import os
import random
import struct
import sys

import numpy as np

MAGIC = b"LRNNTOKS"
HEADER_BYTES = 128


class UserError(Exception):
    pass


def val_tokens(data_dir):
    """The val split's token stream (all its shards, in order)."""
    index_path = os.path.join(data_dir, "index.json")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{index_path}: cannot read the corpus index ({e}); make it with lrnn tokenize")
    split = index.get("splits", {}).get("val")
    if not split:
        raise UserError(f"{index_path}: no val split (tokenize with --val-fraction > 0)")
    parts = []
    for shard in split["shards"]:
        path = os.path.join(data_dir, shard["file"])
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            if len(head) != HEADER_BYTES or head[:8] != MAGIC:
                raise UserError(f"{path}: not an lrnn token shard")
            num_tokens, = struct.unpack_from("<Q", head, 16)
            width, = struct.unpack_from("<I", head, 32)
            dtype = {2: np.uint16, 4: np.uint32}.get(width)
            if dtype is None:
                raise UserError(f"{path}: token width {width}")
            toks = np.frombuffer(f.read(), dtype=dtype)
            if toks.size != num_tokens:
                raise UserError(f"{path}: {toks.size} tokens, the header says {num_tokens}")
            parts.append(toks.astype(np.int64))
    return np.concatenate(parts), index


def documents(tokens, sp):
    """The texts of the documents of a stream (BOS tokens EOS, or tokens EOS)."""
    bos, eos = sp.bos_id(), sp.eos_id()
    docs, cur = [], []
    for t in tokens.tolist():
        if t == bos:
            cur = []
        elif t == eos:
            docs.append(sp.decode(cur))
            cur = []
        else:
            cur.append(t)
    return [d for d in docs if d.strip()]


def write_task(out, name, rows, yaml_body):
    path = os.path.join(out, f"{name}.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out, f"{name}.yaml"), "w") as f:
        f.write(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(os.path.abspath(path))}\n"
                f"test_split: test\n{yaml_body}")
    return len(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="directory of `lrnn tokenize --out`")
    ap.add_argument("--tokenizer", required=True, help="the SentencePiece .model it was tokenized with")
    ap.add_argument("--out", required=True, help="directory for the task files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--choice-docs", type=int, default=200)
    ap.add_argument("--rolling-docs", type=int, default=100)
    ap.add_argument("--generate-docs", type=int, default=30)
    a = ap.parse_args(argv)
    try:
        import sentencepiece as spm
        if not os.path.isfile(a.tokenizer):
            raise UserError(f"{a.tokenizer}: no such tokenizer file")
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(a.tokenizer)
        except (OSError, RuntimeError) as e:
            raise UserError(f"{a.tokenizer}: not a SentencePiece model ({e})")
        tokens, _ = val_tokens(a.data)
        docs = documents(tokens, sp)
        if len(docs) < 4:
            raise UserError(f"{a.data}: only {len(docs)} validation documents; need at least 4")
        os.makedirs(a.out, exist_ok=True)
        rng = random.Random(a.seed)

        lined = [d.strip("\n").split("\n") for d in docs]
        lined = [ls for ls in lined if len(ls) >= 3 and ls[-1].strip()]
        choice_rows = []
        for i, ls in enumerate(lined[: a.choice_docs]):
            others = [o[-1] for j, o in enumerate(lined) if j != i and o[-1] != ls[-1]]
            choices = rng.sample(others, 3) + [ls[-1]]
            rng.shuffle(choices)
            choice_rows.append({"context": "\n".join(ls[:-1]) + "\n", "choices": choices, "label": choices.index(ls[-1])})
        n_mc = write_task(a.out, "lrnn_next_line", choice_rows,
                          'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
                          'doc_to_target: "{{label}}"\ntarget_delimiter: ""\nmetric_list:\n'
                          '  - {metric: acc, aggregation: mean, higher_is_better: true}\n'
                          '  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n')
        n_roll = write_task(a.out, "lrnn_rolling", [{"text": d} for d in docs[: a.rolling_docs]],
                            'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
                            'metric_list:\n'
                            '  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n'
                            '  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n'
                            '  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}\n')
        gen_rows = [{"context": "\n".join(ls[:2]) + "\n", "target": ls[2]} for ls in lined[: a.generate_docs]]
        n_gen = write_task(a.out, "lrnn_generate", gen_rows,
                           'output_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\n'
                           'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 32\n  do_sample: false\n'
                           'metric_list:\n  - {metric: exact_match, aggregation: mean, higher_is_better: true}\n')
    except UserError as e:
        print(f"lm_eval_tasks: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": a.out, "validation_documents": len(docs), "lrnn_next_line": n_mc,
                      "lrnn_rolling": n_roll, "lrnn_generate": n_gen}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
