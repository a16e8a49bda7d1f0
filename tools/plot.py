#!/usr/bin/python3
"""Plots of lrnn runs with the spread over seeds: training curves and the metric by length.

    tools/plot.py PATH [PATH ...] [--out DIR] [--all-lrs] [--spread both|band|seeds]

Each PATH is a run directory (written by `lrnn train`: config.yaml, metrics.jsonl, eval.json) or
a sweep directory (written by `lrnn sweep`: grid.yaml and <config name>/lr<lr>_seed<seed>/ run
directories; any directory with run directories below it is taken as one).

Runs that differ only by their seed are one group: same config name (the sweep's <config name>
directory, for runs of a sweep) and the same config.yaml apart from training.seed and the keys
that do not change what a run computes (logging.*, training.num_threads, training.val_every,
training.checkpoint_every). A group is drawn as the median over its seeds (thick line), the
min-max band, and each seed as a thin line. Of a sweep, only the learning rate that results.csv
marks as chosen is drawn for each config, unless --all-lrs (configs that results.csv does not list
yet are drawn at every learning rate).

Runs are split by task (task.name, and the group and its options for word problems). For each
task, in --out DIR (default: the first PATH):
  <task>_training.png                training loss (metrics.jsonl's loss_avg) against step; the
                                     task's metric at each evaluation, on the test lengths (solid)
                                     and the training lengths (dashed); validation loss and
                                     perplexity where the eval lines have them (language models);
                                     the positions the loss covers, for runs with a curriculum
                                     (training.curriculum: `positions` on the train lines);
  <task>_<metric>_by_length.png      the metric at each length of eval.json (test lengths, and the
                                     training lengths shaded), from the runs that have finished;
  lm_loss_by_position.png            language models (task.name lm): the validation loss at each
                                     position of the window and its cumulative mean (P2's
                                     length-extrapolation curves), from the longest window evaluated
                                     (eval.json, or eval_context<T>.json of `lrnn eval --set
                                     task.eval_context=T`), the training context marked.
<task> is e.g. parity, word_problem_S5; <metric> is the task's metric:
  scaled_accuracy    the Chomsky tasks (parity, modular_arithmetic, ...): (acc - chance) / (1 - chance);
  sequence_accuracy  word problems: the fraction of sequences whose predictions are all right up to
                     length t (P2's metric); at each evaluation, that of the longest length.
Unknown keys in the files are ignored; absent ones are skipped. Exit code 2: a PATH that is not a
run or sweep directory (the message names it). Needs matplotlib (Debian's python3-matplotlib,
which scripts/setup.sh installs; the project's .venv sees it too).
"""
import argparse
import csv
import json
import math
import os
import re
import sys

try:
    import matplotlib
    import numpy as np
except ImportError as e:
    sys.exit(f"plot.py: error: {sys.executable} cannot import {e.name}; install python3-matplotlib and "
             f"python3-numpy (scripts/setup.sh) and run tools/plot.py with /usr/bin/python3 or .venv/bin/python")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

try:
    import yaml
except ImportError:  # config.yaml is simple enough for parse_config_yaml below
    yaml = None

# Display names of lrnn's model_type values; anything else is shown as written.
MODEL_NAMES = {
    "delta_net": "DeltaNet",
    "gated_deltanet": "Gated DeltaNet",
    "gated_deltaproduct": "DeltaProduct",
    "mamba": "Mamba",
    "llama": "Transformer",
    "lstm": "LSTM",
    "mlstm": "mLSTM",
    "slstm": "sLSTM",
}

# The Chomsky-hierarchy tasks: one answer per sequence, reported as scaled accuracy.
CHOMSKY_TASKS = {
    "parity": "Parity",
    "even_pairs": "Even pairs",
    "cycle_navigation": "Cycle navigation",
    "modular_arithmetic": "Modular arithmetic",
    "modular_arithmetic_with_brackets": "Modular arithmetic with brackets",
}
TASK_TITLES = {"lm": "Language modelling"}

# Config keys that do not change what a run computes (as `lrnn sweep` compares configs), and the seed.
IGNORED_KEYS = {("training", "seed"), ("training", "num_threads"), ("training", "val_every"),
                ("training", "checkpoint_every")}
IGNORED_SECTIONS = {"logging"}

# Eval-line keys of language-model runs: (key, panel title, log scale).
LM_KEYS = [("val_loss", "validation loss", False), ("perplexity", "validation perplexity", True)]

RUN_DIR_RE = re.compile(r"^lr(?P<lr>[^_]+)_seed(?P<seed>-?\d+)$")


class PlotError(Exception):
    pass


def warn(msg):
    print(f"plot.py: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Reading runs


def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(x) for x in inner.split(",")] if inner else []
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_config_yaml(text):
    """The subset of YAML that `lrnn train` writes to config.yaml: sections of `key: value` lines,
    flow lists `[a, b]`, comments. Used when PyYAML is not installed."""
    out, section = {}, None
    for raw in text.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        if not line.startswith((" ", "\t")):
            if value.strip():
                out[key.strip()] = _scalar(value)
                section = None
            else:
                section = out.setdefault(key.strip(), {})
        elif section is not None:
            section[key.strip()] = _scalar(value)
    return out


def read_config(path):
    with open(path) as f:
        text = f.read()
    if yaml is not None:
        try:
            cfg = yaml.safe_load(text)
            return cfg if isinstance(cfg, dict) else {}
        except yaml.YAMLError as e:
            warn(f"{path}: not valid YAML ({e}); reading it line by line")
    return parse_config_yaml(text)


def read_metrics(path):
    """metrics.jsonl -> {type: [line, ...]} sorted by step, one line per (type, step): the last,
    as after a resume the steps since the checkpoint are logged again, and the final evaluation
    repeats the periodic one at the same step."""
    by_type = {}
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill; lrnn drops those on resume
            if not isinstance(m, dict) or not isinstance(m.get("step"), (int, float)):
                continue
            by_type.setdefault(m.get("type", "train"), {})[m["step"]] = m
    return {t: [lines[s] for s in sorted(lines)] for t, lines in by_type.items()}


def fmt_lr(x):
    """0.005 -> '5e-3', 0.00025 -> '2.5e-4' (as `lrnn sweep` names run directories)."""
    if not isinstance(x, (int, float)) or x <= 0:
        return str(x)
    e = math.floor(math.log10(x))
    m = float(f"{x / 10 ** e:.12g}")
    if m >= 10:
        m, e = m / 10, e + 1
    return f"{m:g}e{e}"


class Run:
    """One run directory: its config, metrics and (once finished) eval.json."""

    def __init__(self, path, source=None, config_name=None):
        self.path = path
        self.source = source            # 'sweep NAME' or 'runs in DIR', for runs found below a PATH
        self.config_name = config_name  # the sweep's config name (the run's parent directory)
        cfg_path = os.path.join(path, "config.yaml")
        self.cfg = read_config(cfg_path) if os.path.exists(cfg_path) else {}
        self.metrics = read_metrics(os.path.join(path, "metrics.jsonl"))
        self.eval = None
        eval_path = os.path.join(path, "eval.json")
        if os.path.exists(eval_path):
            try:
                with open(eval_path) as f:
                    self.eval = json.load(f)
            except (json.JSONDecodeError, OSError) as e:
                warn(f"{eval_path}: unreadable ({e}); the run is left out of the by-length plot")
        m = RUN_DIR_RE.match(os.path.basename(os.path.normpath(path)))
        training = self.section("training")
        self.seed = training.get("seed", int(m.group("seed")) if m else None)
        self.lr = training.get("lr")
        self.lr_name = m.group("lr") if m else (fmt_lr(self.lr) if self.lr is not None else None)

    def section(self, name):
        s = self.cfg.get(name)
        return s if isinstance(s, dict) else {}

    def train_lines(self):
        return self.metrics.get("train", [])

    def eval_lines(self):
        return self.metrics.get("eval", [])


def is_run_dir(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in ("metrics.jsonl", "eval.json"))


def grid_name(sweep_dir):
    name = os.path.basename(os.path.normpath(os.path.abspath(sweep_dir)))
    grid = os.path.join(sweep_dir, "grid.yaml")
    if os.path.exists(grid):
        with open(grid) as f:
            for line in f:
                if line.startswith("name:"):
                    name = line.split(":", 1)[1].split("#")[0].strip().strip("'\"") or name
    return name


def chosen_lrs(sweep_dir):
    """{config name: lr directory name} from results.csv's selected rows; {} without the file."""
    path = os.path.join(sweep_dir, "results.csv")
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {r["config"]: r["lr"] for r in csv.DictReader(f) if r.get("selected") == "1" and r.get("config")}


def find_runs(path, all_lrs=False):
    """The runs of a run or sweep directory; raises PlotError naming the path otherwise."""
    if not os.path.exists(path):
        raise PlotError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise PlotError(f"{path}: not a directory (expected a run directory or a sweep directory)")
    if is_run_dir(path):
        parent = os.path.dirname(os.path.normpath(os.path.abspath(path)))
        sweep_dir = os.path.dirname(parent)
        if os.path.exists(os.path.join(sweep_dir, "grid.yaml")):  # one run of a sweep, named on its own
            return [Run(path, f"sweep {grid_name(sweep_dir)}", os.path.basename(parent))]
        return [Run(path)]
    run_dirs = []
    for root, dirs, _ in os.walk(path):
        dirs.sort()
        if root != path and is_run_dir(root):
            run_dirs.append(root)
            dirs[:] = []  # a run's own subdirectories are not runs
        elif os.path.relpath(root, path).count(os.sep) >= 3:
            dirs[:] = []
    is_sweep = os.path.exists(os.path.join(path, "grid.yaml"))
    if not run_dirs:
        if is_sweep:
            raise PlotError(f"{path}: a sweep directory (grid.yaml) with no run started yet")
        raise PlotError(f"{path}: neither a run directory (no metrics.jsonl or eval.json) nor a sweep directory "
                        f"(no grid.yaml, no run directories below it)")
    source = f"sweep {grid_name(path)}" if is_sweep else f"runs in {path}"
    chosen = {} if all_lrs else chosen_lrs(path)
    runs, left_out = [], 0
    for d in run_dirs:
        rel = os.path.relpath(d, path).split(os.sep)
        config_name = rel[-2] if len(rel) >= 2 else None
        m = RUN_DIR_RE.match(rel[-1])
        if config_name in chosen and m and m.group("lr") != chosen[config_name]:
            left_out += 1
            continue
        runs.append(Run(d, source, config_name))
    if left_out:
        print(f"{path}: drawing the learning rate results.csv chose for each config; "
              f"{left_out} runs at other rates left out (--all-lrs draws them)")
    return runs


# ---------------------------------------------------------------------------------------------
# Tasks and their metrics


def group_order(spec):
    """Order of a word-problem group such as S5, A5, Z60, S3xZ2 (S3_x_Z2); None if unknown."""
    order = 1
    for part in str(spec).replace("_x_", "x").split("x"):
        m = re.fullmatch(r"([SAZ])(\d+)", part)
        if not m:
            return None
        n = int(m.group(2))
        order *= {"S": math.factorial(n), "A": math.factorial(n) // 2, "Z": n}[m.group(1)]
    return order


class TaskInfo:
    """What a run's task is called and how its metric is named.

    metric: 'sequence' (word problems), 'scaled' (Chomsky tasks) or None (no accuracy metric
    known, e.g. a language model: only the loss curves and validation keys are drawn)."""

    def __init__(self, key, title, slug, metric):
        self.key, self.title, self.slug, self.metric = key, title, slug, metric

    @property
    def metric_label(self):
        return {"sequence": "sequence accuracy", "scaled": "scaled accuracy"}.get(self.metric)

    @property
    def metric_slug(self):
        return {"sequence": "sequence_accuracy", "scaled": "scaled_accuracy"}.get(self.metric)

    @property
    def metric_axis(self):
        if self.metric == "scaled":
            return "scaled accuracy  (acc − chance) / (1 − chance)"
        return self.metric_label


def task_info(run):
    task = run.section("task")
    name = task.get("name") or (run.eval or {}).get("task") or "unknown_task"
    ev_metric = (run.eval or {}).get("metric")
    if name == "word_problem":
        group = str(task.get("group", "?"))
        variants = []
        if task.get("only_swaps"):
            variants.append("only swaps")
        if task.get("max_moved"):
            variants.append(f"at most {task['max_moved']} points moved")
        k = task.get("tokens_per_element", 1)
        if k and k != 1:
            variants.append(f"{k} tokens per element")
        title = f"{group} word problem" + (f" ({', '.join(variants)})" if variants else "")
        slug = f"word_problem_{group}" + "".join(
            "_" + re.sub(r"[^A-Za-z0-9]+", "_", v).strip("_") for v in variants)
        return TaskInfo(("word_problem", group, tuple(variants)), title, slug, "sequence")
    title = CHOMSKY_TASKS.get(name) or TASK_TITLES.get(name) or str(name).replace("_", " ").capitalize()
    extra = []
    if name == "cycle_navigation" and task.get("cycle_length") not in (None, 5):
        extra.append(f"cycle length {task['cycle_length']}")
    if name == "modular_arithmetic_with_brackets" and task.get("mult"):
        extra.append("with *")
    if extra:
        title += f" ({', '.join(extra)})"
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name + "".join("_" + e for e in extra)).strip("_")
    if name in CHOMSKY_TASKS or ev_metric == "answer_accuracy":
        metric = "scaled"
    elif ev_metric == "sequence_accuracy_up_to_length":
        metric = "sequence"
    elif any("scaled_accuracy" in m for m in run.eval_lines()):
        metric = "scaled"
    else:
        metric = None
    return TaskInfo((name, tuple(extra)), title, slug, metric)


def model_label(run):
    """'DeltaNet [-1,1]', 'DeltaProduct n_h=2 [-1,1]' from config.yaml's model section."""
    model = run.section("model")
    mt = model.get("model_type")
    if mt is None:
        return None
    label = MODEL_NAMES.get(mt, mt)
    if mt == "gated_deltaproduct" and "num_householder" in model:
        label += f" n_h={model['num_householder']}"
    if "allow_neg_eigval" in model:
        label += " [-1,1]" if model["allow_neg_eigval"] else " [0,1]"
    return label


# ---------------------------------------------------------------------------------------------
# Grouping by seed


def flat_config(run):
    """config.yaml as {'section.key': value} without the seed and the keys that change nothing."""
    out = {}
    for sec, body in run.cfg.items():
        if sec in IGNORED_SECTIONS:
            continue
        if isinstance(body, dict):
            for k, v in body.items():
                if (sec, k) not in IGNORED_KEYS:
                    out[f"{sec}.{k}"] = v
        else:
            out[sec] = body
    return out


def group_key(run):
    cfg = json.dumps(flat_config(run), sort_keys=True, default=str) if run.cfg else f"path:{run.path}"
    return (run.config_name, cfg)


class Group:
    """Runs that differ only by their seed."""

    def __init__(self, runs):
        self.runs = sorted(runs, key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.path))
        self.label = ""

    @property
    def seeds(self):
        return [r.seed for r in self.runs]

    @property
    def task(self):
        return task_info(self.runs[0])


def seeds_text(seeds):
    if any(s is None for s in seeds):
        return f"{len(seeds)} runs"
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    s = sorted(seeds)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{len(s)} seeds ({s[0]}–{s[-1]})"
    return f"{len(s)} seeds ({', '.join(map(str, s))})"


def group_runs(runs):
    """[Group], in the order the runs came, each labelled (see label_groups)."""
    groups, index = [], {}
    for r in runs:
        k = group_key(r)
        if k not in index:
            index[k] = len(groups)
            groups.append([])
        groups[index[k]].append(r)
    groups = [Group(g) for g in groups]
    for g in groups:
        seeds = [s for s in g.seeds if s is not None]
        if len(seeds) != len(set(seeds)):
            warn(f"{len(g.runs)} runs of one config share a seed ({', '.join(r.path for r in g.runs)})")
    label_groups(groups)
    return groups


def label_groups(groups):
    """Sets each group's legend label: model, config name, lr, seeds; where two groups would read the
    same, the config keys that tell them apart, then the sweep or the run's path."""
    def base(g):
        r = g.runs[0]
        parts = [p for p in (model_label(r), r.config_name) if p]
        if not r.config_name and (len(g.runs) == 1 or not parts):  # a run of its own: its directory's name
            parts.append(os.path.basename(os.path.normpath(r.path)))
        if r.lr_name:
            parts.append(f"lr {r.lr_name}")
        return " · ".join(parts)

    labels = [base(g) for g in groups]
    for lab in set(labels):
        same = [i for i, x in enumerate(labels) if x == lab]
        if len(same) < 2:
            continue
        flats = [flat_config(groups[i].runs[0]) for i in same]
        keys = sorted({k for f in flats for k in f if any(f.get(k) != g.get(k) for g in flats)})
        for i, f in zip(same, flats):
            diff = ", ".join(f"{k}={f.get(k)}" for k in keys[:3])
            if diff:
                labels[i] += f" · {diff}"
        dup = [i for i in same if [labels[j] for j in same].count(labels[i]) > 1]
        for i in dup:
            r = groups[i].runs[0]
            labels[i] += f" · {r.source or os.path.dirname(os.path.normpath(r.path))}"
    for g, lab in zip(groups, labels):
        g.label = f"{lab} · {seeds_text(g.seeds)}"
    return groups


def split_by_task(groups):
    """[(TaskInfo, [Group])] in order of first appearance."""
    out, index = [], {}
    for g in groups:
        info = g.task
        if info.key not in index:
            index[info.key] = len(out)
            out.append((info, []))
        out[index[info.key]][1].append(g)
    return out


# ---------------------------------------------------------------------------------------------
# Series


def train_sequence_accuracy(run, scaled):
    """A word problem's eval line has the training lengths' *scaled* accuracy, (acc − c) / (1 − c)
    with c = (1/|G|)^(supervised positions); undone here (c is below 1e-9 from ~12 positions on)."""
    task = run.section("task")
    order = group_order(task.get("group", ""))
    train_len = task.get("train_len")
    k = task.get("tokens_per_element", 1) or 1
    if not order or not isinstance(train_len, list) or not train_len:
        return scaled
    c = (1.0 / order) ** max(1, int(train_len[-1]) // int(k))
    return scaled * (1.0 - c) + c


def metric_vs_step(run, info):
    """{'test': (steps, values), 'train': (steps, values)} of the task's metric at each evaluation."""
    ev = run.eval_lines()
    if info.metric == "scaled":
        test_key, train_key = "scaled_accuracy", "train_scaled_accuracy"
    elif info.metric == "sequence":
        test_key, train_key = "accuracy", "train_scaled_accuracy"
    else:
        return {}
    out = {}
    for part, key in (("test", test_key), ("train", train_key)):
        pts = [(m["step"], m[key]) for m in ev if isinstance(m.get(key), (int, float))]
        if part == "train" and info.metric == "sequence":
            pts = [(s, train_sequence_accuracy(run, v)) for s, v in pts]
        if pts:
            out[part] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def key_vs_step(lines, key):
    pts = [(m["step"], m[key]) for m in lines if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    return ([p[0] for p in pts], [p[1] for p in pts]) if pts else None


def loss_vs_step(run):
    lines = run.train_lines()
    key = "loss_avg" if any("loss_avg" in m for m in lines) else "loss"
    return key_vs_step(lines, key)


def metric_vs_length(run, info, min_samples=64):
    """(lengths, values, pooled) of the task's metric by length from eval.json, or None.

    Word problems: sequence accuracy up to each length t (the test evaluation, which covers the
    training lengths too). Chomsky tasks: scaled accuracy on the training and the test lengths (the
    test set wins where they meet), adjacent lengths pooled (weighted by sample count) into bins
    of about `min_samples` samples, never across the train/test boundary."""
    if run.eval is None or info.metric is None:
        return None
    if info.metric == "sequence":
        per = sorted((int(k), v) for k, v in run.eval.get("per_length", {}).items()
                     if isinstance(v, dict) and "accuracy" in v)
        if not per:
            curve = run.eval.get("curve", {})
            per = [(t, {"accuracy": a}) for t, a in zip(curve.get("length", []), curve.get("sequence_accuracy", []))]
        if not per:
            return None
        return [t for t, _ in per], [v["accuracy"] for _, v in per], 1
    xs, ys, width = [], [], 1
    blocks = [run.eval.get("train_range") or {}, run.eval]
    test_lengths = {int(k) for k in run.eval.get("per_length", {})}
    for bi, block in enumerate(blocks):
        per = sorted((int(k), v) for k, v in block.get("per_length", {}).items()
                     if isinstance(v, dict) and "scaled_accuracy" in v and (bi == 1 or int(k) not in test_lengths))
        if not per:
            continue
        counts = sorted(v.get("n", 1) for _, v in per)
        w = max(1, -(-min_samples // max(1, counts[len(counts) // 2])))  # ceil(min_samples / median n)
        width = max(width, w)
        for i in range(0, len(per), w):
            chunk = per[i:i + w]
            n = sum(v.get("n", 1) for _, v in chunk)
            xs.append(sum(length for length, _ in chunk) / len(chunk))
            ys.append(sum(v.get("n", 1) * v["scaled_accuracy"] for _, v in chunk) / max(n, 1))
    return (xs, ys, width) if xs else None


def lm_by_position(run):
    """(positions 1..T, mean loss at each, cumulative mean, evaluated context) of a language model's
    longest-window evaluation (eval.json or eval_context<T>.json), or None."""
    found = []
    if run.eval and isinstance(run.eval.get("loss_by_position"), list):
        found.append(run.eval)
    try:
        names = sorted(os.listdir(run.path))
    except OSError:
        names = []
    for name in names:
        if re.fullmatch(r"eval_context\d+\.json", name):
            try:
                with open(os.path.join(run.path, name)) as f:
                    e = json.load(f)
            except (OSError, ValueError) as err:
                warn(f"{os.path.join(run.path, name)}: unreadable ({err}); left out")
                continue
            if isinstance(e, dict) and isinstance(e.get("loss_by_position"), list):
                found.append(e)
    found = [e for e in found if e["loss_by_position"]]
    if not found:
        return None
    e = max(found, key=lambda j: len(j["loss_by_position"]))
    y = np.asarray(e["loss_by_position"], float)
    x = np.arange(1, len(y) + 1)
    return x, y, np.cumsum(y) / x, len(y)


def smooth(x, y, points=400):
    """Means over bins of equal width in log position, at most `points` of them (32k noisy points
    become a readable curve; the first positions keep their own bins)."""
    if len(x) <= points:
        return x, y
    edges = np.unique(np.round(np.geomspace(1, len(x) + 1, points + 1)).astype(int))
    xs, ys = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        xs.append(x[a - 1:b - 1].mean())
        ys.append(y[a - 1:b - 1].mean())
    return np.asarray(xs), np.asarray(ys)


def plot_lm_positions(groups, info, subtitle, out, spread="both"):
    """Loss at each position and its cumulative mean, per group of runs. Returns {'title', 'panels',
    'curves': {label: n runs}}, or None when no run has a loss by position."""
    data = []
    for g in groups:
        series = [(r, lm_by_position(r)) for r in g.runs]
        series = [(r, s) for r, s in series if s]
        if series:
            data.append((g, series))
    if not data:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), dpi=120)
    colors = {id(g): f"C{i % 10}" for i, g in enumerate(groups)}
    contexts, longest, curves, labels = set(), 1, {}, []
    for g, series in data:
        c = colors[id(g)]
        draw_group(axes[0], [smooth(s[0], s[1]) for _, s in series], c, spread)
        draw_group(axes[1], [(s[0], s[2]) for _, s in series], c, spread)
        for r, s in series:
            ctx = r.section("task").get("context")
            if isinstance(ctx, int):
                contexts.add(ctx)
            longest = max(longest, s[3])
        finals = [float(s[2][-1]) for _, s in series]
        labels.append((g, f"{g.label}: mean loss over {max(s[3] for _, s in series)} positions "
                          f"{float(np.median(finals)):.3f}"))
        curves[g.label] = len(series)
    for ax, title in zip(axes, ("loss at each position (binned)", "cumulative mean loss up to each position")):
        for ctx in sorted(contexts):
            ax.axvline(ctx, color="0.45", ls="--", lw=0.9)
        if longest > 64:
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("position in the window")
        ax.set_ylabel("cross-entropy (nats per token)")
        ax.grid(alpha=0.3, which="both")
    title = f"{info.title}: loss by position"
    note = f"dashed: training context {', '.join(map(str, sorted(contexts)))}" if contexts else ""
    fig.suptitle(f"{title}\n{subtitle}; {note}{'; ' if note else ''}{_spread_note([g for g, _ in data], spread)}",
                 fontsize=10.5)
    handles = [Line2D([], [], color=colors[id(g)], lw=2, label=lab) for g, lab in labels]
    bottom = _bottom_margin(fig, len(handles))
    fig.legend(handles=handles, loc="lower center", ncol=1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(out)
    plt.close(fig)
    return {"title": title, "panels": [(a.get_title(), a.get_ylabel()) for a in axes], "curves": curves}


def seed_spread(series):
    """series: [(xs, ys)] of one group's seeds -> (x, median, min, max) on the union of their x,
    each seed linearly interpolated within its own range; only where every seed has a value (a
    seed that stopped early ends the median, its thin line shows the rest). None if nowhere."""
    series = [(np.asarray(x, float), np.asarray(y, float)) for x, y in series if len(x)]
    if not series:
        return None
    lo = max(x.min() for x, _ in series)
    hi = min(x.max() for x, _ in series)
    if lo > hi:
        return None
    grid = np.unique(np.concatenate([x for x, _ in series]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    vals = np.stack([np.interp(grid, x[np.argsort(x)], y[np.argsort(x)]) for x, y in series])
    return grid, np.median(vals, axis=0), vals.min(axis=0), vals.max(axis=0)


def draw_group(ax, series, color, spread, ls="-", band=True, thin=True, label=None, marker=None):
    """Median line (+ min-max band, + each seed thin) of a group's seeds; returns the median's end."""
    series = [s for s in series if s and len(s[0])]
    if not series:
        return None
    res = seed_spread(series)
    many = len(series) > 1
    if many and thin and spread in ("both", "seeds"):
        for x, y in series:
            ax.plot(x, y, color=color, lw=0.6, alpha=0.45, ls=ls, zorder=2)
    if res is None:
        return None
    x, med, mn, mx = res
    if many and band and spread in ("both", "band"):
        ax.fill_between(x, mn, mx, color=color, alpha=0.16, lw=0, zorder=1)
    ax.plot(x, med, color=color, lw=1.8, ls=ls, label=label, zorder=3,
            marker=marker if len(x) <= 40 else None, ms=3)
    return med[-1]


# ---------------------------------------------------------------------------------------------
# Figures


def _spread_note(groups, spread):
    if all(len(g.runs) == 1 for g in groups):
        return "one run per curve"
    what = {"both": "min–max band and each seed (thin)", "band": "min–max band", "seeds": "each seed (thin)"}[spread]
    return f"median over seeds (thick), {what}"


def _legend_below(fig, groups, colors):
    handles = [Line2D([], [], color=c, lw=2, label=g.label) for g, c in zip(groups, colors)]
    fig.legend(handles=handles, loc="lower center", ncol=1 if len(handles) <= 6 else 2, fontsize=8, frameon=False)


def _bottom_margin(fig, n_entries):
    """Makes the figure taller by the height of a legend of n_entries below it; returns that fraction."""
    rows = n_entries if n_entries <= 6 else -(-n_entries // 2)
    inches = 0.12 + 0.18 * rows
    fig.set_figheight(fig.get_figheight() + inches)
    return inches / fig.get_figheight()


def _spans_decade(ax):
    """Log scale only pays where the drawn values are positive and cover a factor of 10 or more."""
    ys = [y for line in ax.lines for y in line.get_ydata()]
    return bool(ys) and min(ys) > 0 and max(ys) >= 10 * min(ys)


def _ranges(groups, part):
    """Distinct length ranges of the groups' configs: part 'eval_len' or 'train_len'."""
    out = []
    for g in groups:
        r = g.runs[0].section("task").get(part)
        if isinstance(r, list) and len(r) == 2 and tuple(r) not in out:
            out.append(tuple(r))
    return out


def _range_text(ranges):
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in ranges)


def plot_training(groups, info, subtitle, out, spread="both"):
    """Training loss, the metric at each evaluation, and the language-model keys, against step.
    Returns {'title', 'panels': [(title, ylabel)]} of what was drawn."""
    runs = [r for g in groups for r in g.runs]
    by_step = {r.path: metric_vs_step(r, info) for r in runs}
    has_metric = any(by_step.values())
    lm = [(k, t, log) for k, t, log in LM_KEYS if any(key_vs_step(r.eval_lines(), k) for r in runs)]
    # training.curriculum: the train lines carry the positions the loss covers at the time.
    curriculum = any(key_vs_step(r.train_lines(), "positions") for r in runs)
    n = 1 + int(has_metric) + len(lm) + int(curriculum)
    fig, axes = plt.subplots(1, n, figsize=(5.4 * n, 4.4), dpi=120, squeeze=False)
    axes = list(axes[0])
    colors = [f"C{i % 10}" for i in range(len(groups))]
    panels = []

    ax = axes[0]
    positive = True
    for g, c in zip(groups, colors):
        series = [loss_vs_step(r) for r in g.runs]
        positive = positive and all(v > 0 for s in series if s for v in s[1])
        draw_group(ax, series, c, spread)
    if positive and _spans_decade(ax):
        ax.set_yscale("log")
    ax.set_title("training loss over the supervised positions" if curriculum
                 else "training loss (mean over each logging interval)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    panels.append((ax.get_title(), ax.get_ylabel()))

    extra = []
    if has_metric:
        ax = axes[1]
        any_train = False
        for g, c in zip(groups, colors):
            parts = [by_step[r.path] for r in g.runs]
            draw_group(ax, [p.get("test") for p in parts], c, spread, marker="o")
            train = [p.get("train") for p in parts]
            if any(train):
                any_train = True
                draw_group(ax, train, c, spread, ls="--", band=False, thin=False, marker=".")
        ev, tr = _range_text(_ranges(groups, "eval_len")), _range_text(_ranges(groups, "train_len"))
        if info.metric == "sequence":
            ax.set_title(f"{info.metric_label} at the longest length, at each evaluation", fontsize=10)
            test_name, train_name = f"test length {ev}", f"training length {tr}"
        else:
            ax.set_title(f"{info.metric_label} at each evaluation", fontsize=10)
            test_name, train_name = f"test lengths {ev}", f"training lengths {tr}"
        ax.set_xlabel("step")
        ax.set_ylabel(info.metric_axis)
        lows = [y for line in ax.lines for y in line.get_ydata()]
        ax.set_ylim(min([-0.05] + [y - 0.05 for y in lows]), 1.05)
        extra = [Line2D([], [], color="0.3", marker="o", ms=3, label=test_name.strip())]
        if any_train:
            extra.append(Line2D([], [], color="0.3", ls="--", marker=".", ms=3, label=train_name.strip()))
        ax.legend(handles=extra, fontsize=8, loc="best")
        panels.append((ax.get_title(), ax.get_ylabel()))

    for (key, title, log), ax in zip(lm, axes[1 + int(has_metric):]):
        for g, c in zip(groups, colors):
            draw_group(ax, [key_vs_step(r.eval_lines(), key) for r in g.runs], c, spread, marker="o")
        if log and _spans_decade(ax):
            ax.set_yscale("log")
        ax.set_title(f"{title} at each evaluation", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(title)
        panels.append((ax.get_title(), ax.get_ylabel()))

    if curriculum:
        ax = axes[-1]
        for g, c in zip(groups, colors):
            draw_group(ax, [key_vs_step(r.train_lines(), "positions") for r in g.runs], c, spread)
        ax.set_title("target positions the loss covers (training.curriculum)", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("supervised positions")
        panels.append((ax.get_title(), ax.get_ylabel()))

    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    title = f"{info.title}: training curves"
    fig.suptitle(f"{title}\n{subtitle}; {_spread_note(groups, spread)}", fontsize=10.5)
    bottom = _bottom_margin(fig, len(groups))
    _legend_below(fig, groups, colors)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(out)
    plt.close(fig)
    return {"title": title, "panels": panels}


def plot_by_length(groups, info, subtitle, out, spread="both"):
    """The metric against length from eval.json, training lengths shaded. Returns {'title',
    'ylabel', 'xlabel', 'curves': {label: n runs}}, or None when no run has per-length results."""
    data = []
    for g in groups:
        series = [(r, metric_vs_length(r, info)) for r in g.runs]
        series = [(r, s) for r, s in series if s]
        if series:
            data.append((g, series))
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    shaded = []
    for g, series in data:
        tr = series[0][0].section("task").get("train_len") or (series[0][0].eval.get("train_range") or {}).get("lengths")
        if not (isinstance(tr, list) and len(tr) == 2):
            continue
        span = (min(series[0][1][0]), tr[1]) if info.metric == "sequence" else (tr[0], tr[1])
        if span not in shaded:
            ax.axvspan(span[0], span[1], color="0.87", zorder=0)
            shaded.append(span)
    colors = [f"C{i % 10}" for i in range(len(groups))]
    color_of = {id(g): c for g, c in zip(groups, colors)}
    curves, pooled = {}, 1
    labels = []
    for g, series in data:
        pooled = max([pooled] + [s[2] for _, s in series])
        draw_group(ax, [(s[0], s[1]) for _, s in series], color_of[id(g)], spread,
                   marker="." if len(series[0][1][0]) < 60 else None)
        finals = [r.eval.get("accuracy" if info.metric == "sequence" else "scaled_accuracy") for r, _ in series]
        finals = [f for f in finals if isinstance(f, (int, float))]
        lab = g.label if len(series) == len(g.runs) else f"{g.label} ({len(series)} finished)"
        if finals:
            ev = series[0][0].eval
            lengths = ev.get("lengths") if isinstance(ev.get("lengths"), list) else []
            if info.metric == "sequence":
                L = ev.get("eval_length") or (lengths[-1] if lengths else None)
                longest = f" at length {L}" if L else ""
            else:
                longest = f" on {_range_text([tuple(lengths)])}" if len(lengths) == 2 else ""
            if len(finals) > 1:
                lab += f": {info.metric_label}{longest} median {float(np.median(finals)):.3f} " \
                       f"(min {min(finals):.3f}, max {max(finals):.3f})"
            else:
                lab += f": {info.metric_label}{longest} {finals[0]:.3f}"
        labels.append((g, lab))
        curves[g.label] = len(series)
    if info.metric == "scaled":
        ax.axhline(0.0, color="0.4", lw=0.8, ls=":", zorder=1)
        title = f"{info.title}: scaled accuracy by sequence length"
        xlabel = "sequence length" + (f" (up to {pooled} adjacent lengths pooled per point)" if pooled > 1 else "")
        shade_label = f"training lengths {_range_text(shaded)}"
    else:
        title = f"{info.title}: sequence accuracy up to each length"
        xlabel = "length t (all predictions up to t correct)"
        shade_label = f"training lengths ≤ {', '.join(str(b) for _, b in shaded)}"
    ax.set_title(f"{title}\n{subtitle}; {_spread_note([g for g, _ in data], spread)}", fontsize=10.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(info.metric_axis)
    lows = [y for line in ax.lines for y in line.get_ydata()]
    ax.set_ylim(min([-0.05] + [y - 0.05 for y in lows]), 1.05)
    ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=color_of[id(g)], lw=2, label=lab) for g, lab in labels]
    if shaded:
        handles.append(Patch(color="0.87", label=shade_label))
    bottom = _bottom_margin(fig, len(handles))
    fig.legend(handles=handles, loc="lower center", ncol=1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(out)
    plt.close(fig)
    return {"title": title, "ylabel": ax.get_ylabel(), "xlabel": xlabel, "curves": curves}


# ---------------------------------------------------------------------------------------------


def describe_sources(paths, runs):
    sources = list(dict.fromkeys(r.source for r in runs if r.source))
    loose = sum(1 for r in runs if not r.source)
    parts = sources[:3] + ([f"{len(sources) - 3} more directories"] if len(sources) > 3 else [])
    if 0 < loose <= 3:
        parts += [f"run {r.path}" for r in runs if not r.source]
    elif loose:
        parts.append(f"{loose} runs")
    return ", ".join(parts) or ", ".join(paths)


def make_plots(paths, out_dir=None, all_lrs=False, spread="both"):
    """Reads the runs of `paths`, writes the figures into out_dir (default: the first path);
    returns [(png path, summary)]."""
    runs = []
    for p in paths:
        runs.extend(find_runs(p, all_lrs))
    seen, unique = set(), []
    for r in runs:  # a run named twice (on its own and in its sweep) is drawn once
        real = os.path.realpath(r.path)
        if real not in seen:
            seen.add(real)
            unique.append(r)
    runs = [r for r in unique if r.train_lines() or r.eval_lines() or r.eval]
    for r in unique:
        if r not in runs:
            warn(f"{r.path}: nothing logged yet; left out")
    if not runs:
        raise PlotError(f"{', '.join(paths)}: no run has logged anything yet")
    out_dir = out_dir or paths[0]
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def optional(name, plot_fn, groups, info, sub, missing):
        png = os.path.join(out_dir, f"{info.slug}_{name}.png")
        summary = plot_fn(groups, info, sub, png, spread)
        if summary:
            written.append((png, summary))
        else:
            print(f"{info.title}: {missing}")

    for info, groups in split_by_task(group_runs(runs)):
        sub = describe_sources(paths, [r for g in groups for r in g.runs])
        png = os.path.join(out_dir, f"{info.slug}_training.png")
        written.append((png, plot_training(groups, info, sub, png, spread)))
        if info.key[0] == "lm":
            optional("loss_by_position", plot_lm_positions, groups, info, sub,
                     "no evaluation with a loss by position yet; no by-position plot")
        if info.metric:
            optional(f"{info.metric_slug}_by_length", plot_by_length, groups, info, sub,
                     "no finished run (eval.json) yet; no by-length plot")
    return written


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="plot.py",
        description="Plot lrnn runs and sweeps with the spread over seeds: training loss and the task's metric "
                    "against step, and the metric against length. One pair of PNGs per task.",
        epilog="Files: <task>_training.png and <task>_<metric>_by_length.png, e.g. parity_training.png, "
               "parity_scaled_accuracy_by_length.png, word_problem_S5_sequence_accuracy_by_length.png.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run directory (metrics.jsonl, eval.json) or sweep directory (grid.yaml, run directories below)")
    p.add_argument("--out", metavar="DIR", help="directory for the PNGs (default: the first PATH)")
    p.add_argument("--all-lrs", action="store_true",
                   help="of a sweep, draw every learning rate (default: the one results.csv chose per config)")
    p.add_argument("--spread", choices=("both", "band", "seeds"), default="both",
                   help="how the seeds around the median are drawn: min-max band, each seed as a thin line, "
                        "or both (default)")
    a = p.parse_args(argv)
    try:
        written = make_plots(a.paths, a.out, a.all_lrs, a.spread)
    except PlotError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2
    for png, _ in written:
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
