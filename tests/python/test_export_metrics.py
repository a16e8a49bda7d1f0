"""tools/export_metrics.py: metrics.jsonl -> TensorBoard event files and wandb (offline).

Reads what the exporter wrote back with tensorboard's own readers (EventAccumulator for what
TensorBoard shows, the raw event loader for what was written) and wandb's own reader of an
offline run's .wandb log (`wandb leet inspect --json`), and checks tags, steps and values
exactly (TensorBoard keeps scalars as float32). Follow mode is driven in a subprocess: lines
appended, a line written in two halves, a resume that rewrites the file, the end by eval.json and
by Ctrl-C. A real `lrnn train` run (killed after step 15, resumed from its step-10 checkpoint) is
followed with wandb on. No network: wandb runs offline with its directories in a temporary one.

Environment (set by ctest): LRNN_BINARY (lrnn), LRNN_SOURCE_DIR (the repository).
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import logging

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

REPO = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "export_metrics.py")
LRNN = os.environ.get("LRNN_BINARY") or os.path.join(REPO, "build", "lrnn")
WANDB_CLI = os.path.join(os.path.dirname(sys.executable), "wandb")
logging.getLogger("tensorboard").setLevel(logging.ERROR)  # not "Purging expired events" at each resume
T0 = 1700000000.0   # config.yaml's mtime in hand-made runs: the run's start


def jl(obj):
    return json.dumps(obj, separators=(",", ":")) + "\n"


TRAIN5 = {"type": "train", "step": 5, "loss": 2.5, "loss_avg": 2.75, "lr": 0.001, "grad_norm": 1.5,
          "skipped": 1, "tokens_per_s": 1000.0, "elapsed_s": 1.25}
EVAL5 = {"type": "eval", "step": 5, "accuracy": 0.5, "scaled_accuracy": 0.0, "train_scaled_accuracy": 0.125,
         "val_loss": 3.0, "perplexity": 20.085536923187668, "per_len": {"40": 0.25},
         "note": "text", "flag": True, "missing": None}
SKIP3 = {"type": "skip", "step": 3, "skipped": 1}


def train(step, loss, elapsed):
    return {"type": "train", "step": step, "loss": loss, "loss_avg": loss + 0.5, "lr": 0.001 * step,
            "grad_norm": 0.1 * step, "skipped": 1, "tokens_per_s": 1000.0 + step, "elapsed_s": elapsed}


def expected_points(lines):
    """{tag: [(step, float32 value)]} as the exporter's doc says: every number, "<type>/<key>"."""
    out = {}

    def walk(obj, prefix, step):
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(v, prefix + k + "/", step)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(prefix + k, []).append((step, np.float32(v)))

    for obj in lines:
        walk({k: v for k, v in obj.items() if k not in ("type", "step")}, obj["type"] + "/", obj["step"])
    return out


def scalars(logdir):
    """What TensorBoard shows: {tag: [(step, value, wall_time)]}."""
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    got = {t: [(e.step, np.float32(e.value), e.wall_time) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    return {t: p for t, p in got.items() if p}   # (a tag whose points were all dropped stays, empty)


def raw_events(logdir):
    """Every event written, file by file in name order."""
    evs = []
    for f in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        evs.extend(LegacyEventFileLoader(f).Load())
    return evs


def writes(logdir):
    """{(tag, step): times written}, and the steps of SessionLog START events."""
    count, starts = {}, []
    for e in raw_events(logdir):
        if e.HasField("session_log") and e.session_log.status == e.session_log.START:
            starts.append(e.step)
        for v in e.summary.value:
            count[(v.tag, e.step)] = count.get((v.tag, e.step), 0) + 1
    return count, starts


def steps_values(points):
    return {t: [(s, v) for s, v, _ in p] for t, p in points.items()}


class ExportMetricsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lrnn_export_")
        self.env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false",
                        WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true", WANDB_CONSOLE="off",
                        WANDB_DIR=os.path.join(self.tmp, "wandb_dir"),
                        WANDB_CONFIG_DIR=os.path.join(self.tmp, "wandb_config"),
                        WANDB_CACHE_DIR=os.path.join(self.tmp, "wandb_cache"),
                        WANDB_DATA_DIR=os.path.join(self.tmp, "wandb_data"))
        self.env.pop("WANDB_API_KEY", None)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def export(self, *args, rc=0):
        r = subprocess.run([sys.executable, TOOL, *args], env=self.env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, rc, f"export_metrics {args}: rc {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def follow(self, *args):
        p = subprocess.Popen([sys.executable, TOOL, "--follow", "--poll", "0.1", *args], env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def wait_for(self, what, cond, proc=None, timeout=20):
        t, last = time.time() + timeout, None
        while time.time() < t:
            try:
                if cond():
                    return
            except Exception as e:   # e.g. nothing written yet: no directory, no tag
                last = e
            if proc is not None and proc.poll() is not None:
                self.fail(f"exporter exited (rc {proc.returncode}) while waiting for {what}:\n{proc.communicate()[1]}")
            time.sleep(0.1)
        self.fail(f"timed out waiting for {what} (last: {last!r})")

    def run_dir(self, name, lines=(), tail=""):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.yaml"), "w") as f:
            f.write("training:\n  num_steps: 20\n  adam_eps: 1e-08\nmodel:\n  model_type: delta_net\n")
        os.utime(os.path.join(d, "config.yaml"), (T0, T0))
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write("".join(jl(o) for o in lines) + tail)
        return d

    def append(self, d, text):
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write(text)

    # -----------------------------------------------------------------------------------------

    def test_help_and_errors(self):
        r = self.export("--help")
        for word in ("--follow", "--logdir", "--wandb", "--wandb-mode", "eval.json", "--idle-exit", "Ctrl-C"):
            self.assertIn(word, r.stdout)
        missing = os.path.join(self.tmp, "no_such_run")
        r = self.export(missing, rc=2)
        self.assertIn(missing, r.stderr)
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(os.path.join(empty, "sub"))
        r = self.export(empty, rc=2)
        self.assertIn(empty, r.stderr)
        self.assertIn("not a run directory", r.stderr)
        r = self.export(empty, "--follow", rc=2)   # following needs a run (or sweep) directory too
        self.assertIn(empty, r.stderr)
        self.export(rc=2)                          # no PATH

    def test_one_shot_then_incremental(self):
        cut = jl(train(15, 1.0, 3.75))
        d = self.run_dir("hand", [SKIP3, TRAIN5, EVAL5], "this is not JSON\n" + jl(train(10, 2.0, 2.5)) + cut[:40])
        r = self.export(d)
        self.assertIn("metrics.jsonl:4: skipped", r.stderr)     # the bad line, by number
        self.assertIn("no newline yet", r.stderr)               # the cut last line
        logdir = os.path.join(d, "tensorboard")
        got = scalars(logdir)
        want = expected_points([SKIP3, TRAIN5, EVAL5, train(10, 2.0, 2.5)])
        self.assertEqual(sorted(want), sorted(got))
        self.assertEqual(sorted(got), sorted(
            ["skip/skipped", "eval/accuracy", "eval/scaled_accuracy", "eval/train_scaled_accuracy", "eval/val_loss",
             "eval/perplexity", "eval/per_len/40"] + ["train/" + k for k in TRAIN5 if k not in ("type", "step")]))
        self.assertEqual(want, steps_values(got))
        # wall times: config.yaml's mtime + elapsed_s; eval and skip lines take a train line's
        self.assertEqual([w for _, _, w in got["train/loss"]], [T0 + 1.25, T0 + 2.5])
        self.assertEqual([w for _, _, w in got["eval/accuracy"]], [T0 + 1.25])
        self.assertEqual([w for _, _, w in got["skip/skipped"]], [T0 + 1.25])

        # Again: nothing new, nothing written.
        files = sorted(os.listdir(logdir))
        self.export(d)
        self.assertEqual(files, sorted(os.listdir(logdir)))
        # The cut line completed, one more line: only those two are written (in a new event file).
        self.append(d, cut[40:] + jl({"type": "eval", "step": 15, "accuracy": 0.75}))
        self.export(d)
        self.assertEqual(len(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))), 2)
        want = expected_points([SKIP3, TRAIN5, EVAL5, train(10, 2.0, 2.5), train(15, 1.0, 3.75),
                                {"type": "eval", "step": 15, "accuracy": 0.75}])
        self.assertEqual(want, steps_values(scalars(logdir)))
        count, starts = writes(logdir)
        self.assertEqual(set(count.values()), {1})              # every point written once
        self.assertEqual(starts, [])

        # --logdir and --overwrite: everything again, in the given directory.
        other = os.path.join(self.tmp, "tb_other")
        self.export(d, "--logdir", other)
        self.export(d, "--logdir", other, "--overwrite")
        self.assertEqual(len(glob.glob(os.path.join(other, "events.out.tfevents.*"))), 1)
        self.assertEqual(want, steps_values(scalars(other)))

    def test_follow_append_cut_line_resume_end(self):
        old = [TRAIN5, train(10, 2.0, 2.5)]
        d = self.run_dir("live", old)
        logdir = os.path.join(self.tmp, "tb_live")
        p = self.follow(d, "--logdir", logdir, "--idle-exit", "1")
        steps = lambda tag: [s for s, _, _ in scalars(logdir)[tag]]  # noqa: E731
        self.wait_for("the first lines", lambda: steps("train/loss") == [5, 10], p)

        line15 = jl(train(15, 1.0, 3.75))
        self.append(d, line15[:30])                              # the trainer is writing a line...
        time.sleep(0.8)
        self.assertEqual(steps("train/loss"), [5, 10])           # ... not exported before its newline
        self.append(d, line15[30:])
        self.wait_for("the completed line", lambda: steps("train/loss") == [5, 10, 15], p)
        self.append(d, jl({"type": "eval", "step": 15, "accuracy": 0.75}) + jl(train(20, 0.5, 5.0)))
        self.wait_for("two more lines", lambda: steps("train/loss") == [5, 10, 15, 20], p)

        # A resume from the step-10 checkpoint: lrnn rewrites the file (atomically) without the
        # lines after step 10, rewrites config.yaml, then appends what it trains again.
        T1 = T0 + 100.0
        new = old + [train(15, 1.5, 1.0), train(20, 0.25, 2.0), train(25, 0.125, 3.0)]
        tmp = os.path.join(d, "metrics.jsonl.tmp")
        with open(tmp, "w") as f:
            f.write("".join(jl(o) for o in old))
        os.replace(tmp, os.path.join(d, "metrics.jsonl"))
        os.utime(os.path.join(d, "config.yaml"), (T1, T1))
        self.append(d, "".join(jl(o) for o in new[2:]))
        self.wait_for("the resumed lines", lambda: steps("train/loss") == [5, 10, 15, 20, 25], p)
        got = scalars(logdir)
        self.assertEqual(expected_points(new), steps_values(got))  # eval/accuracy at 15 is gone
        self.assertEqual([w for _, _, w in got["train/loss"]], [T0 + 1.25, T0 + 2.5, T1 + 1.0, T1 + 2.0, T1 + 3.0])
        count, starts = writes(logdir)
        self.assertEqual(starts, [15])                           # "drop what you have from step 15"
        self.assertEqual(count[("train/loss", 5)], 1)            # kept lines are not written again
        self.assertEqual(count[("train/loss", 10)], 1)
        self.assertEqual(count[("train/loss", 15)], 2)

        # The run finishes: eval.json, then no change for --idle-exit seconds.
        with open(os.path.join(d, "eval.json"), "w") as f:
            f.write("{}\n")
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("every run has finished", err)
        self.assertNotIn("skipped:", err)                        # the half line was never read as a line
        self.assertIn("rewritten", err)

    def test_follow_sweep_and_ctrl_c(self):
        sweep = os.path.join(self.tmp, "sweep")
        a = self.run_dir("sweep/cfg/lr1e-3_seed0", [TRAIN5])
        p = self.follow(sweep)
        self.wait_for("run a", lambda: [s for s, _, _ in scalars(os.path.join(a, "tensorboard"))["train/loss"]] == [5], p)
        b = self.run_dir("sweep/cfg/lr1e-3_seed1", [TRAIN5, train(10, 2.0, 2.5)])   # a run that starts later
        self.wait_for("run b", lambda: [s for s, _, _ in scalars(os.path.join(b, "tensorboard"))["train/loss"]] == [5, 10], p)
        time.sleep(0.3)
        self.assertIsNone(p.poll())                              # no eval.json: still watching
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("stopped by SIGINT", err)
        self.assertIn("sweep/cfg/lr1e-3_seed1", err)
        # Its state survives: a one-shot export afterwards writes nothing new.
        files = sorted(os.listdir(os.path.join(b, "tensorboard")))
        self.export(sweep)
        self.assertEqual(files, sorted(os.listdir(os.path.join(b, "tensorboard"))))

    def read_wandb(self, wandb_root):
        """(run record, {step: history item}) of the one offline run under wandb_root."""
        runs = glob.glob(os.path.join(wandb_root, "wandb", "offline-run-*", "run-*.wandb"))
        self.assertEqual(len(runs), 1, runs)
        r = subprocess.run([WANDB_CLI, "leet", "inspect", "--json", runs[0]], env=self.env, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        run = [x["run"] for x in recs if x.get("type") == "run"]
        hist = {}
        for x in recs:
            if x.get("type") == "history":
                item = x["history"]["item"]
                self.assertNotIn(item["_step"], hist)           # one row per step
                hist[item["_step"]] = {k: v for k, v in item.items() if not k.startswith("_")}
        self.assertTrue(any(x.get("type") == "exit" for x in recs), "the run was not finished")
        return run[0], hist

    def test_real_run_killed_resumed_followed_with_wandb(self):
        if not os.path.exists(LRNN):
            if os.environ.get("LRNN_BINARY"):
                self.fail(f"LRNN_BINARY={LRNN} does not exist")
            self.skipTest(f"no lrnn binary at {LRNN} (set LRNN_BINARY)")
        d = os.path.join(self.tmp, "real")
        sets = ["training.num_steps=20", "training.val_every=10", "logging.log_every=5", "task.eval_samples=64",
                "task.eval_len=[40,64]", "training.warmup_steps=5", "training.checkpoint_every=10", "logging.progress=none"]
        args = [LRNN, "train", "--config", os.path.join(REPO, "configs", "demo", "parity_delta_net_2.yaml"), "--out", d]
        for s in sets:
            args += ["--set", s]
        r = subprocess.run(args, cwd=REPO, env=dict(os.environ, LRNN_FAULT_KILL_AFTER_STEP="15"),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, -signal.SIGKILL, r.stderr)
        p = self.follow(d, "--wandb", "--idle-exit", "1")
        logdir = os.path.join(d, "tensorboard")
        self.wait_for("the killed run's lines", lambda: [s for s, _, _ in scalars(logdir)["train/loss"]] == [5, 10, 15], p)
        r = subprocess.run([LRNN, "train", "--resume", d, "--set", "logging.progress=none"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        out, err = p.communicate(timeout=30)                     # ends by itself: eval.json is there
        self.assertEqual(p.returncode, 0, err)

        with open(os.path.join(d, "metrics.jsonl")) as f:
            final = [json.loads(x) for x in f]
        self.assertEqual([o["step"] for o in final if o["type"] == "train"], [5, 10, 15, 20])
        want = expected_points(final)
        self.assertIn("eval/scaled_accuracy", want)
        self.assertEqual(want, steps_values(scalars(logdir)))
        count, starts = writes(logdir)
        self.assertEqual(starts, [15])

        # wandb: one row per step holding the final file's values (the resumed step-15 line was
        # merged into the row of step 15, which wandb had not closed), and config.yaml as config.
        run, hist = self.read_wandb(self.env["WANDB_DIR"])
        rows = {}
        for o in final:
            for k, v in o.items():
                if k not in ("type", "step"):
                    rows.setdefault(o["step"], {})[o["type"] + "/" + k] = v
        self.assertEqual(rows, hist)
        self.assertEqual(run["display_name"], "real")
        self.assertEqual(run["project"], "lrnn")
        cfg = run["config"]["update"]
        self.assertEqual(cfg["model"]["model_type"], "delta_net")
        self.assertEqual(cfg["training"]["num_steps"], 20)
        self.assertEqual(cfg["training"]["adam_eps"], 1e-08)     # a number, not the string "1e-08"
        self.assertEqual(cfg["task"]["eval_len"], [40, 64])


if __name__ == "__main__":
    unittest.main(verbosity=2)
