"""tools/plot.py on hand-made run and sweep directories (the shapes of lrnn's own files: config.yaml,
metrics.jsonl, eval.json, grid.yaml, results.csv): runs grouped by seed, the metric named after the
task, the PNGs written, and exit code 2 with the path named for what is not a run or a sweep.
Needs matplotlib and numpy (Debian's, seen by .venv). Runs in a few seconds."""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(SOURCE, "tools", "plot.py")
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import plot  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def config_yaml(task, model, lr=0.005, seed=0, num_steps=300, num_threads=2, val_every=100):
    """As `lrnn train` writes config.yaml (sections, all keys, flow lists)."""
    t = {"name": "parity", "train_len": [3, 40], "eval_len": [40, 256], "eval_samples": 2048, "eval_batch_size": 256,
         "mult": False, "cycle_length": 5, "group": "S3", "bos": False, "only_swaps": False, "max_moved": 0,
         "tokens_per_element": 1}
    t.update(task)
    m = {"model_type": "delta_net", "vocab_size": 3, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2,
         "allow_neg_eigval": True, "use_short_conv": False, "conv_size": 4}
    m.update(model)

    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(map(str, v)) + "]"
        return str(v)

    lines = ["training:", f"  num_steps: {num_steps}", "  batch_size: 64", f"  lr: {lr!r}", "  min_lr: 9.9999999999999995e-07",
             "  warmup_steps: 200", "  weight_decay: 0.10000000000000001", "  grad_clip: 0", f"  val_every: {val_every}",
             "  stop_at: 0", "  checkpoint_every: 500", f"  seed: {seed}", "  device: cpu", "  precision: bf16",
             f"  num_threads: {num_threads}", "model:"]
    lines += [f"  {k}: {val(v)}" for k, v in m.items()]
    lines.append("task:")
    lines += [f"  {k}: {val(v)}" for k, v in t.items()]
    lines += ["logging:", "  log_every: 50", "  progress: auto"]
    return "\n".join(lines) + "\n"


def write_run(d, cfg_text, train, evals, eval_json):
    """train: [(step, loss)]; evals: [dict of eval-line keys with step]; eval_json: dict or None."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        f.write(cfg_text)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, loss in train:
            f.write(json.dumps({"elapsed_s": step * 0.03, "grad_norm": 0.3, "loss": loss, "loss_avg": loss * 1.01,
                                "lr": 0.0025, "skipped": 0, "step": step, "tokens_per_s": 9.4e4, "type": "train"}) + "\n")
        for e in evals:
            f.write(json.dumps(dict(e, type="eval")) + "\n")
        if evals:  # the final evaluation repeats the last periodic one at the same step, as lrnn logs it
            f.write(json.dumps(dict(evals[-1], type="eval")) + "\n")
        f.write('{"step": 999, "type": "tra')  # a line cut by a kill
    if eval_json is not None:
        with open(os.path.join(d, "eval.json"), "w") as f:
            json.dump(eval_json, f, indent=2)


def parity_eval(level, step=300):
    """eval.json of an answer task: per-length n/accuracy/scaled_accuracy on test and training lengths."""
    def block(lo, hi, n, acc):
        per = {str(L): {"accuracy": acc, "n": n, "scaled_accuracy": 2 * acc - 1} for L in range(lo, hi + 1)}
        return {"accuracy": acc, "lengths": [lo, hi], "metric": "answer_accuracy", "per_length": per,
                "samples": n * (hi - lo + 1), "scaled_accuracy": 2 * acc - 1}
    ev = block(40, 256, 10, 0.5 + level / 2)
    ev.update(step=step, stopped_early=False, task="parity", train_range=block(3, 40, 14, min(1.0, 0.5 + level)))
    return ev


def word_problem_eval(decay, L=64, train_L=16, order=120, n=128, step=100):
    """eval.json of a word problem: sequence accuracy up to each length t (prefix metric)."""
    def block(L):
        accs = [max(0.0, 1.0 - decay * t) for t in range(1, L + 1)]
        per = {str(t): {"accuracy": a, "n": n, "scaled_accuracy": (a - order ** -t) / (1 - order ** -t)}
               for t, a in zip(range(1, L + 1), accs)}
        return {"accuracy": accs[-1], "curve": {"length": list(range(1, L + 1)), "sequence_accuracy": accs},
                "eval_length": L, "lengths": [L, L], "metric": "sequence_accuracy_up_to_length", "per_length": per,
                "samples": n, "scaled_accuracy": per[str(L)]["scaled_accuracy"], "token_accuracy": 0.9}
    ev = block(L)
    ev.update(step=step, stopped_early=False, task="word_problem", train_range=block(train_L))
    return ev


PARITY = {"name": "parity"}
S5 = {"name": "word_problem", "group": "S5", "bos": True, "train_len": [16, 16], "eval_len": [64, 64],
      "eval_samples": 128, "eval_batch_size": 64}
DN_NEG, DN_POS = {"allow_neg_eigval": True}, {"allow_neg_eigval": False}
DP2 = {"model_type": "gated_deltaproduct", "vocab_size": 122, "hidden_size": 128, "num_heads": 8,
       "num_householder": 2, "allow_neg_eigval": True}


def make_parity_sweep(root, lrs=(0.005,), chosen=None):
    """<root>/grid.yaml, results.csv and <config>/lr<lr>_seed<s>/ for two DeltaNet configs x lrs x 3 seeds."""
    with open(os.path.join(root, "grid.yaml"), "w") as f:
        f.write("name: tinyparity\nconfigs:\n  - configs/demo/parity_delta_net.yaml\n"
                "  - configs/demo/parity_delta_net_2.yaml\nlr: [%s]\nseeds: [0, 1, 2]\n"
                'set: ["training.num_steps=300", "training.val_every=100"]\n' % ", ".join(map(repr, lrs)))
    rows = []
    for name, model, level in (("parity_delta_net", DN_POS, 0.0), ("parity_delta_net_2", DN_NEG, 0.8)):
        for lr in lrs:
            lr_name = plot.fmt_lr(lr)
            for seed in (0, 1, 2):
                lv = level * (0.5 + 0.25 * seed)
                train = [(s, 0.7 * (1 - lv) ** (s / 100) + 1e-3) for s in (50, 100, 150, 200, 250, 300)]
                evals = [{"accuracy": 0.5 + lv * s / 600, "scaled_accuracy": lv * s / 300, "step": s,
                          "train_scaled_accuracy": min(1.0, 2 * lv * s / 300)} for s in (100, 200, 300)]
                write_run(os.path.join(root, name, f"lr{lr_name}_seed{seed}"),
                          config_yaml(PARITY, model, lr=lr, seed=seed), train, evals, parity_eval(lv))
            sel = "1" if (chosen or plot.fmt_lr(lrs[0])) == lr_name else "0"
            rows.append(f"{name},\"delta_net\",{lr_name},{sel},3,3,0.5,0,0.6,1,{name}/lr{lr_name}_seed1,1,0,0.4,0.5,0.6")
    with open(os.path.join(root, "results.csv"), "w") as f:
        f.write("config,model,lr,selected,finished,seeds,median,mad,best,best_seed,best_run,train_median,train_mad,"
                "seed0,seed1,seed2\n" + "\n".join(rows) + "\n")


def make_s5_run(d, seed, decay):
    evals = [{"accuracy": 0.0, "scaled_accuracy": 0.0, "step": 50, "train_scaled_accuracy": 0.2},
             {"accuracy": max(0.0, 1 - 64 * decay), "scaled_accuracy": max(0.0, 1 - 64 * decay), "step": 100,
              "train_scaled_accuracy": max(0.0, 1 - 16 * decay)}]
    write_run(d, config_yaml(S5, DP2, lr=0.001, seed=seed, num_steps=100), [(50, 4.6), (100, 3.0 + seed)], evals,
              word_problem_eval(decay))


def quiet(fn, *args, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = fn(*args, **kwargs)
    return result, out.getvalue(), err.getvalue()


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def assert_png(self, path):
        self.assertTrue(os.path.isfile(path), path)
        with open(path, "rb") as f:
            self.assertEqual(f.read(8), PNG_MAGIC, path)
        self.assertGreater(os.path.getsize(path), 10_000, path)

    def test_config_yaml_fallback_parser_reads_lrnn_files(self):
        text = config_yaml(S5, DP2, lr=0.001, seed=2)
        cfg = plot.parse_config_yaml(text)
        self.assertEqual(cfg["training"]["seed"], 2)
        self.assertEqual(cfg["training"]["lr"], 0.001)
        self.assertEqual(cfg["task"]["train_len"], [16, 16])
        self.assertIs(cfg["task"]["bos"], True)
        self.assertEqual(cfg["model"]["model_type"], "gated_deltaproduct")
        if plot.yaml is not None:
            self.assertEqual(cfg, plot.yaml.safe_load(text))

    def test_fmt_lr_matches_sweep_directory_names(self):
        for x, name in ((0.01, "1e-2"), (0.005, "5e-3"), (0.00025, "2.5e-4"), (0.001, "1e-3"), (0.0050000000000000001, "5e-3")):
            self.assertEqual(plot.fmt_lr(x), name)

    def test_sweep_runs_grouped_by_seed(self):
        make_parity_sweep(self.dir)
        runs = plot.find_runs(self.dir)
        self.assertEqual(len(runs), 6)
        self.assertTrue(all(r.source == "sweep tinyparity" for r in runs))
        groups = plot.group_runs(runs)
        self.assertEqual(len(groups), 2)
        self.assertEqual([g.seeds for g in groups], [[0, 1, 2], [0, 1, 2]])
        self.assertEqual({g.runs[0].config_name for g in groups}, {"parity_delta_net", "parity_delta_net_2"})
        labels = [g.label for g in groups]
        self.assertEqual(len(set(labels)), 2)
        self.assertIn("DeltaNet [0,1]", labels[0])
        self.assertIn("DeltaNet [-1,1]", labels[1])
        self.assertIn("lr 5e-3", labels[0])
        self.assertIn("3 seeds", labels[0])
        # A run of the sweep named on its own is found with its config name, and joins its group.
        one = plot.find_runs(self.path("parity_delta_net_2", "lr5e-3_seed1"))
        self.assertEqual(one[0].config_name, "parity_delta_net_2")
        self.assertEqual(plot.group_key(one[0]), plot.group_key(groups[1].runs[0]))

    def test_learning_rates_are_groups_and_results_csv_chooses(self):
        make_parity_sweep(self.dir, lrs=(0.01, 0.001), chosen="1e-3")
        runs, out, _ = quiet(plot.find_runs, self.dir)
        self.assertEqual(len(runs), 6)
        self.assertEqual({r.lr_name for r in runs}, {"1e-3"})
        self.assertIn("--all-lrs", out)
        groups = plot.group_runs(plot.find_runs(self.dir, all_lrs=True))
        self.assertEqual(len(groups), 4)
        self.assertTrue(all(g.seeds == [0, 1, 2] for g in groups))
        self.assertEqual(len({g.label for g in groups}), 4)

    def test_standalone_runs_grouped_by_resolved_config(self):
        # Same config apart from the seed and keys that change nothing (threads, val_every): one group.
        write_run(self.path("a"), config_yaml(PARITY, DN_NEG, seed=0), [(50, 0.7)], [], parity_eval(1.0))
        write_run(self.path("b"), config_yaml(PARITY, DN_NEG, seed=1, num_threads=4, val_every=50), [(50, 0.6)], [],
                  parity_eval(0.5))
        # Another lr, another step count: groups of their own, told apart in the legend.
        write_run(self.path("c"), config_yaml(PARITY, DN_NEG, seed=0, lr=0.001), [(50, 0.7)], [], parity_eval(0.1))
        for seed in (1, 0):
            write_run(self.path(f"d{seed}"), config_yaml(PARITY, DN_NEG, seed=seed, num_steps=500), [(50, 0.7)], [],
                      parity_eval(0.1))
        runs = [r for p in ("a", "b", "c", "d1", "d0") for r in plot.find_runs(self.path(p))]
        groups = plot.group_runs(runs)
        self.assertEqual([[os.path.basename(r.path) for r in g.runs] for g in groups], [["a", "b"], ["c"], ["d0", "d1"]])
        self.assertEqual([g.seeds for g in groups], [[0, 1], [0], [0, 1]])
        self.assertIn("lr 1e-3", groups[1].label)
        self.assertIn(" c ", groups[1].label)  # a run of its own is named by its directory
        self.assertIn("training.num_steps=300", groups[0].label)  # the key that tells two groups apart
        self.assertIn("training.num_steps=500", groups[2].label)
        self.assertEqual(len({g.label for g in groups}), 3)

    def test_metric_names(self):
        make_s5_run(self.path("s5"), 0, 0.01)
        os.makedirs(self.path("sw"))
        make_parity_sweep(self.path("sw"))
        s5 = plot.task_info(plot.find_runs(self.path("s5"))[0])
        self.assertEqual(s5.metric_label, "sequence accuracy")
        self.assertEqual(s5.title, "S5 word problem")
        self.assertEqual(s5.slug, "word_problem_S5")
        par = plot.task_info(plot.find_runs(self.path("sw"))[0])
        self.assertEqual(par.metric_label, "scaled accuracy")
        self.assertEqual(par.title, "Parity")
        write_run(self.path("a5"), config_yaml(dict(S5, group="A5", only_swaps=False, max_moved=3), DP2), [], [], None)
        a5 = plot.task_info(plot.find_runs(self.path("a5"))[0])
        self.assertTrue(a5.title.startswith("A5 word problem"), a5.title)
        self.assertNotEqual(a5.key, s5.key)
        write_run(self.path("ma"), config_yaml({"name": "modular_arithmetic"}, DN_NEG), [], [], None)
        self.assertEqual(plot.task_info(plot.find_runs(self.path("ma"))[0]).metric_label, "scaled accuracy")

    def test_word_problem_series(self):
        make_s5_run(self.path("s5"), 0, 0.01)
        run = plot.find_runs(self.path("s5"))[0]
        info = plot.task_info(run)
        xs, ys, pooled = plot.metric_vs_length(run, info)
        self.assertEqual(xs[:3], [1, 2, 3])
        self.assertAlmostEqual(ys[0], 0.99)  # per_length accuracy (sequence accuracy), not scaled
        self.assertEqual(pooled, 1)
        steps = plot.metric_vs_step(run, info)
        self.assertEqual(steps["test"][0], [50, 100])  # the final eval line repeats step 100: counted once
        self.assertAlmostEqual(steps["train"][1][1], 1 - 16 * 0.01, places=9)
        self.assertEqual(plot.loss_vs_step(run)[0], [50, 100])  # the cut line is skipped

    def test_curriculum_runs_get_a_positions_panel(self):
        # A run with training.curriculum: its train lines carry `positions`; the training figure adds
        # a panel of them and says the loss is the curriculum's.
        d = self.path("cur")
        make_s5_run(d, 0, 0.01)
        with open(os.path.join(d, "metrics.jsonl")) as f:
            lines = [json.loads(x) for x in f if x.strip().endswith("}")]
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for j in lines:
                if j["type"] == "train":
                    j["positions"] = 2 + j["step"] // 50
                f.write(json.dumps(j) + "\n")
            f.write(json.dumps({"type": "curriculum", "step": 50, "epoch_loss": 0.2, "positions": 3}) + "\n")
        run = plot.find_runs(d)[0]
        self.assertEqual(plot.key_vs_step(run.train_lines(), "positions"), ([50, 100], [3, 4]))
        written, _, _ = quiet(plot.make_plots, [d], self.path("plots"))
        train = dict((os.path.basename(p), s) for p, s in written)["word_problem_S5_training.png"]
        self.assertEqual([p[1] for p in train["panels"]], ["cross-entropy", "sequence accuracy", "supervised positions"])
        self.assertIn("supervised positions", train["panels"][0][0])
        # Without a curriculum, no such panel (test_main_writes_pngs_with_task_metric_labels).

    def test_seed_spread(self):
        x, med, lo, hi = plot.seed_spread([([0, 1, 2], [1, 2, 3]), ([0, 1, 2], [3, 4, 5]), ([0, 1], [2, 2])])
        self.assertEqual(list(x), [0, 1])  # the median ends where the shortest seed ends
        self.assertEqual(list(med), [2, 2])
        self.assertEqual(list(lo), [1, 2])
        self.assertEqual(list(hi), [3, 4])

    def test_main_writes_pngs_with_task_metric_labels(self):
        sweep = self.path("sweep")
        os.makedirs(sweep)
        make_parity_sweep(sweep)
        for seed, decay in ((0, 0.005), (1, 0.01), (2, 0.02)):
            make_s5_run(self.path("s5", f"seed{seed}"), seed, decay)
        out = self.path("plots")
        written, stdout, _ = quiet(plot.make_plots, [sweep, self.path("s5")], out)
        names = {os.path.basename(p): s for p, s in written}
        self.assertEqual(set(names), {"parity_training.png", "parity_scaled_accuracy_by_length.png",
                                      "word_problem_S5_training.png", "word_problem_S5_sequence_accuracy_by_length.png"})
        for p, _ in written:
            self.assert_png(p)
        s5 = names["word_problem_S5_sequence_accuracy_by_length.png"]
        self.assertIn("S5 word problem", s5["title"])
        self.assertIn("sequence accuracy", s5["title"])
        self.assertEqual(s5["ylabel"], "sequence accuracy")
        self.assertEqual(list(s5["curves"].values()), [3])
        par = names["parity_scaled_accuracy_by_length.png"]
        self.assertTrue(par["ylabel"].startswith("scaled accuracy"))
        self.assertIn("scaled accuracy", par["title"])
        self.assertEqual(sorted(par["curves"].values()), [3, 3])
        train = names["word_problem_S5_training.png"]
        self.assertIn("S5 word problem", train["title"])
        self.assertEqual([p[1] for p in train["panels"]], ["cross-entropy", "sequence accuracy"])
        for summary in names.values():  # never a bare "accuracy" where the metric has a name
            labels = [summary.get("ylabel")] + [p[1] for p in summary.get("panels", [])]
            self.assertNotIn("accuracy", labels)
        # The default --out is the first path.
        code, stdout, _ = quiet(plot.main, [sweep])
        self.assertEqual(code, 0)
        self.assert_png(os.path.join(sweep, "parity_training.png"))
        self.assertIn(os.path.join(sweep, "parity_scaled_accuracy_by_length.png"), stdout)

    def test_language_model_keys_and_unfinished_runs(self):
        # An LM-like run: eval lines with val_loss / perplexity and keys plot.py does not know, no eval.json.
        d = self.path("lm")
        write_run(d, config_yaml({"name": "language_model"}, {"model_type": "some_new_model"}),
                  [(50, 5.0), (100, 4.0)],
                  [{"step": 50, "val_loss": 4.5, "perplexity": 90.0, "tokens_seen": 1e6, "bits_per_byte": 1.2},
                   {"step": 100, "val_loss": 3.9, "perplexity": 49.4, "tokens_seen": 2e6}], None)
        written, stdout, _ = quiet(plot.make_plots, [d], None)
        self.assertEqual([os.path.basename(p) for p, _ in written], ["language_model_training.png"])
        self.assert_png(written[0][0])
        self.assertEqual([p[1] for p in written[0][1]["panels"]],
                         ["cross-entropy", "validation loss", "validation perplexity"])
        # A sweep run still training (no eval.json): in the training curves, not in the by-length plot.
        sweep = self.path("sweep")
        os.makedirs(sweep)
        make_parity_sweep(sweep)
        os.remove(os.path.join(sweep, "parity_delta_net_2", "lr5e-3_seed2", "eval.json"))
        written, _, _ = quiet(plot.make_plots, [sweep], self.path("out"))
        by_len = dict((os.path.basename(p), s) for p, s in written)["parity_scaled_accuracy_by_length.png"]
        self.assertEqual(sorted(by_len["curves"].values()), [2, 3])

    def test_language_model_loss_by_position(self):
        # Two lm runs ([0,1] and [-1,1]) with eval.json (the training context, 64) and a longer
        # evaluation (eval_context256.json): the by-position plot takes the longest window of each.
        lm_task = {"name": "lm", "data": "/data/x", "context": 64, "eval_context": 0, "eval_tokens": 0}
        for neg in (False, True):
            d = self.path(f"lm_{neg}")
            curve = [4.0 - 0.5 * min(t, 64) / 64 + (0.002 * max(0, t - 64) if not neg else 0.0) for t in range(64)]
            ev = {"metric": "val_loss", "val_loss": sum(curve) / 64, "perplexity": 40.0, "tokens": 6400,
                  "windows": 100, "context": 64, "loss_by_position": curve, "task": "lm"}
            write_run(d, config_yaml(lm_task, {"allow_neg_eigval": neg}), [(50, 5.0), (100, 4.0)],
                      [{"step": 100, "val_loss": ev["val_loss"], "perplexity": 40.0, "tokens": 6400}], ev)
            longer = [4.0 - 0.5 * min(t, 64) / 64 + (0.002 * max(0, t - 64) if not neg else 0.0) for t in range(256)]
            with open(os.path.join(d, "eval_context256.json"), "w") as f:
                json.dump(dict(ev, context=256, loss_by_position=longer), f)
        xs, ys, cum, T = plot.lm_by_position(plot.find_runs(self.path("lm_False"))[0])
        self.assertEqual(T, 256)
        self.assertAlmostEqual(cum[-1], sum(ys) / 256)
        written, _, _ = quiet(plot.make_plots, [self.path("lm_False"), self.path("lm_True")], self.path("out"))
        names = {os.path.basename(p): s for p, s in written}
        self.assertIn("lm_loss_by_position.png", names)
        self.assert_png(self.path("out", "lm_loss_by_position.png"))
        self.assertEqual(sorted(names["lm_loss_by_position.png"]["curves"].values()), [1, 1])
        self.assertEqual([t for t, _ in names["lm_loss_by_position.png"]["panels"]],
                         ["loss at each position (binned)", "cumulative mean loss up to each position"])
        # Binning keeps the mean of what it bins.
        x = plot.np.arange(1, 10001, dtype=float)
        bx, by = plot.smooth(x, x * 0 + 2.0)
        self.assertLessEqual(len(bx), 400)
        self.assertTrue(all(abs(v - 2.0) < 1e-12 for v in by))

    def test_errors_exit_2_naming_the_path(self):
        empty = self.path("empty")
        os.makedirs(empty)
        os.makedirs(self.path("grid_only"))
        open(self.path("grid_only", "grid.yaml"), "w").close()
        open(self.path("file.txt"), "w").close()
        for bad, words in ((self.path("missing"), "no such"), (empty, "neither a run directory"),
                           (self.path("file.txt"), "not a directory"), (self.path("grid_only"), "no run started")):
            code, _, err = quiet(plot.main, [bad])
            self.assertEqual(code, 2, bad)
            self.assertIn(bad, err)
            self.assertIn(words, err)

    def test_command_line(self):
        r = subprocess.run([sys.executable, PLOT, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0)
        self.assertIn("--out", r.stdout)
        self.assertIn("sweep", r.stdout)
        r = subprocess.run([sys.executable, PLOT, self.path("nothing_here")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn(self.path("nothing_here"), r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
