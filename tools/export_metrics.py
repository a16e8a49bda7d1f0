#!/usr/bin/env python3
"""Exports lrnn runs' metrics.jsonl to TensorBoard event files and to Weights & Biases.

    .venv/bin/python tools/export_metrics.py RUN                    # -> RUN/tensorboard/
    .venv/bin/python tools/export_metrics.py RUN --follow           # ... and keep watching
    .venv/bin/python tools/export_metrics.py SWEEP --wandb          # every run of a sweep, + wandb offline
    tensorboard --logdir RUN                                        # (or --logdir SWEEP)

PATH is a run directory of `lrnn train` (holding metrics.jsonl), a metrics.jsonl file, or a
directory holding runs (an `lrnn sweep` directory, say): every metrics.jsonl below it is a run.

What is exported. Every line of metrics.jsonl is one point per numeric key, tagged
"<type>/<key>" (train/loss, eval/scaled_accuracy, skip/skipped, ...; nested objects give
"<type>/<key>/<subkey>"; "step" is the step; strings, booleans and nulls are left out), so keys
that future runs add (val_loss, perplexity) come through without changes here. TensorBoard
stores scalars as float32. Wall times: a train line's is its trainer process's start plus its
elapsed_s, the start being config.yaml's modification time (lrnn writes config.yaml as training
starts; the lines of an earlier process, before a resume, are placed to end where the next
process starts); an eval or skip line takes the wall time of the train line before it; with no
elapsed_s anywhere, the time of export. wandb keeps its own clock (the time of export) but gets
train/elapsed_s like every key; its x-axis is the step.

The exporter's own state. TensorBoard's directory gets .export_metrics_state.json, a digest of
each line exported, so running the exporter again (or --follow after a Ctrl-C) writes only lines
not yet exported. When metrics.jsonl was rewritten (`lrnn train --resume` drops the lines after
its checkpoint, then appends), the lines still there are not written again; if lines were
dropped, a SessionLog START event at the first dropped step s marks the points from s on as
stale, then the new lines follow. TensorBoard's Python loader (--load_fast=false) drops every
stale point at that mark; its default Rust data server does not act on the mark (tensorboard 2.21) but replaces a tag's
points at steps >= t when a point of that tag at step t comes after them, which covers a
resumed lrnn run (it logs the same keys at the same steps again); a stale point of a tag that
the new lines never log again stays there until --overwrite rewrites the event files and
TensorBoard is restarted. wandb's history only grows: a line whose step is below the last step
sent to that wandb run is not sent (the count is printed), so after a resume wandb keeps the
pre-resume values of earlier steps (a line at the step it holds last is merged into that row).
Each invocation with --wandb makes a new wandb run, unless --wandb-id names one to continue.
"""
import argparse
import glob
import hashlib
import json
import os
import signal
import sys
import time

PROG = "export_metrics.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_FILE = ".export_metrics_state.json"
EVENT_PREFIX = "events.out.tfevents."

END_HELP = """\
--follow: how it ends.
  Each run is watched (its metrics.jsonl read every --poll seconds; a last line without its
  newline yet is left until the newline comes; a rewritten file (resume) is read again as
  described above). A run counts as finished when its eval.json exists, eval.json is not older
  than metrics.jsonl, the last line is complete, and metrics.jsonl has not changed for
  --idle-exit seconds. The exporter exits (status 0) when every run it watches has finished and,
  for a PATH that is a sweep directory (grid.yaml in it), the sweep has written results.csv
  after grid.yaml; a directory of runs is searched again for new runs every poll. It also exits
  (status 0, everything written so far flushed) on Ctrl-C (SIGINT) or SIGTERM. A run that dies
  without eval.json is watched until then (a resume would append to it).

Exit status: 0 done; 2 bad arguments, a PATH that does not exist or is not a run directory (no
metrics.jsonl in or below it); 1 other errors (a package missing, a file that cannot be written).
"""


class UsageError(Exception):
    """Exit status 2: a bad argument or path."""


def warn(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Reading metrics.jsonl

def line_digest(line):
    return hashlib.blake2b(line, digest_size=8).hexdigest()


def numeric_items(obj, prefix=""):
    """(key, float) for every number in obj, nested objects flattened as "a/b"."""
    for k, v in obj.items():
        if not prefix and k in ("type", "step"):
            continue
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            yield prefix + str(k), float(v)
        elif isinstance(v, dict):
            yield from numeric_items(v, prefix + str(k) + "/")


class Line:
    """One complete line of metrics.jsonl."""

    __slots__ = ("raw", "digest", "step", "values", "elapsed", "problem")

    def __init__(self, raw):
        self.raw = raw
        self.digest = line_digest(raw)
        self.step = None
        self.values = {}
        self.elapsed = None
        self.problem = None
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            self.problem = f"not valid JSON ({e})"
            return
        if not isinstance(obj, dict):
            self.problem = "not a JSON object"
            return
        step = obj.get("step")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            self.problem = "no integer \"step\" >= 0"
            return
        self.step = step
        kind = obj.get("type")
        prefix = (kind if isinstance(kind, str) and kind else "metrics") + "/"
        self.values = {prefix + k: v for k, v in numeric_items(obj)}
        e = obj.get("elapsed_s")
        if isinstance(e, (int, float)) and not isinstance(e, bool) and e == e:
            self.elapsed = float(e)

    @property
    def ok(self):
        return self.problem is None


# ---------------------------------------------------------------------------------------------
# Sinks: each keeps the digests of the lines it has taken, in file order, so that a rewritten
# file is compared line by line with what it already has.

class Sink:
    def __init__(self, run):
        self.run = run
        self.taken = []   # [digest, step or None] per line taken, in order
        self.points = 0
        self.lines = 0

    def take(self, lines, resync):
        """lines: the new complete lines; with resync, every line of the file, to be compared with
        the lines taken before (the file was rewritten, or this is the first read)."""
        if resync:
            p = 0
            while p < len(self.taken) and p < len(lines) and self.taken[p][0] == lines[p].digest:
                p += 1
            steps = [s for _, s in self.taken[p:] if s is not None]
            first = min(steps) if steps else None
            if first is not None:
                # TensorBoard will drop every point from the first dropped step on: lines kept at
                # or after that step are dropped too, and exported again.
                p = next((i for i in range(p) if self.taken[i][1] is not None and self.taken[i][1] >= first), p)
            dropped = self.taken[p:]
            del self.taken[p:]
            lines = lines[p:]
            if dropped:
                self.dropped(len(dropped), first)
        if lines:
            self.export(lines)
            self.taken.extend([ln.digest, ln.step] for ln in lines)

    def dropped(self, n, first_step):
        pass

    def flush(self):
        pass

    def export(self, lines):
        raise NotImplementedError

    def close(self):
        pass


class TensorBoardSink(Sink):
    def __init__(self, run, logdir, overwrite, tb):
        super().__init__(run)
        self.logdir = logdir
        self.tb = tb
        self.writer = None
        self.anchor = None         # wall time of elapsed_s == 0 in the current trainer process
        self.last_elapsed = None
        self.last_wall = None
        self.purges = 0
        if overwrite:
            for f in self.event_files() + [os.path.join(logdir, STATE_FILE)]:
                os.remove(f)
        self.load_state()

    def event_files(self):
        return sorted(glob.glob(os.path.join(glob.escape(self.logdir), EVENT_PREFIX + "*")))

    def load_state(self):
        path = os.path.join(self.logdir, STATE_FILE)
        if not os.path.exists(path) or not self.event_files():
            return  # nothing exported yet (or its event files were deleted): start over
        try:
            with open(path) as f:
                st = json.load(f)
            self.taken = [[str(d), s] for d, s in st["lines"]]
            self.anchor, self.last_elapsed, self.last_wall = st.get("anchor"), st.get("last_elapsed"), st.get("last_wall")
        except (ValueError, KeyError, TypeError) as e:
            warn(f"{path}: unreadable ({e}); exporting every line again")
            self.taken = []

    def save_state(self):
        path = os.path.join(self.logdir, STATE_FILE)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"version": 1, "source": self.run.metrics, "anchor": self.anchor,
                       "last_elapsed": self.last_elapsed, "last_wall": self.last_wall,
                       "lines": self.taken}, f, separators=(",", ":"))
        os.replace(tmp, path)

    def get_writer(self):
        if self.writer is None:
            os.makedirs(self.logdir, exist_ok=True)
            # TensorBoard reads a directory's event files in name order, and the name starts with
            # the second of creation: a new file must not share its second with an older one.
            newest = 0
            for f in self.event_files():
                try:
                    newest = max(newest, int(os.path.basename(f)[len(EVENT_PREFIX):].split(".")[0]))
                except ValueError:
                    pass
            while int(time.time()) <= newest:
                time.sleep(0.05)
            self.writer = self.tb.EventFileWriter(self.logdir, max_queue_size=1000, flush_secs=5)
        return self.writer

    def dropped(self, n, first_step):
        self.anchor = self.last_elapsed = None  # what comes next is a new trainer process
        if first_step is None:
            return
        ev = self.tb.event_pb2.Event(step=first_step, wall_time=time.time(),
                                     session_log=self.tb.event_pb2.SessionLog(status=self.tb.event_pb2.SessionLog.START))
        self.get_writer().add_event(ev)
        self.purges += 1

    def fresh_anchor(self, last_e):
        """Wall time of elapsed_s == 0 for the newest trainer process whose lines end at last_e."""
        now = time.time()
        try:
            m_metrics = os.stat(self.run.metrics).st_mtime
        except OSError:
            m_metrics = now
        try:
            start = os.stat(os.path.join(self.run.dir, "config.yaml")).st_mtime
            if start + last_e <= max(now, m_metrics) + 5:
                return start
        except OSError:
            pass
        return m_metrics - last_e

    def walls(self, lines):
        """Wall time per line (see the module's doc)."""
        n = len(lines)
        seg = [None] * n            # segment index per train line; -1: continues the known one
        segs = []                   # [last elapsed, anchor]
        cur, prev = (-1, self.last_elapsed) if self.anchor is not None else (None, None)
        for i, ln in enumerate(lines):
            e = ln.elapsed
            if e is None:
                continue
            if cur is None or e < prev:
                segs.append([e, None])
                cur = len(segs) - 1
            elif cur >= 0:
                segs[cur][0] = e
            seg[i], prev = cur, e
        for k in range(len(segs) - 1, -1, -1):
            segs[k][1] = self.fresh_anchor(segs[k][0]) if k == len(segs) - 1 else segs[k + 1][1] - segs[k][0]
        wall = [None] * n
        for i, ln in enumerate(lines):
            if seg[i] is not None:
                wall[i] = (self.anchor if seg[i] < 0 else segs[seg[i]][1]) + ln.elapsed
        if segs:
            self.anchor = segs[-1][1]
        last = self.last_wall
        for i in range(n):
            if wall[i] is None and last is None:
                last = next((w for w in wall[i:] if w is not None), None)
            if wall[i] is None:
                wall[i] = last if last is not None else time.time()
            last = wall[i]
        for ln in lines:
            if ln.elapsed is not None:
                self.last_elapsed = ln.elapsed
        self.last_wall = last
        return wall

    def export(self, lines):
        good = [ln for ln in lines if ln.ok]
        if good:
            w = self.get_writer()
            ev, sm = self.tb.event_pb2, self.tb.summary_pb2
            for ln, wall in zip(good, self.walls(good)):
                if not ln.values:
                    continue
                vals = [sm.Summary.Value(tag=t, simple_value=v) for t, v in ln.values.items()]
                w.add_event(ev.Event(step=ln.step, wall_time=wall, summary=sm.Summary(value=vals)))
                self.points += len(vals)
        self.lines += len(lines)

    def flush(self):
        if self.writer is not None:
            self.writer.flush()
        if self.writer is not None or self.taken:
            os.makedirs(self.logdir, exist_ok=True)
            self.save_state()

    def close(self):
        self.flush()
        if self.writer is not None:
            self.writer.close()

    def describe(self):
        s = f"{self.lines} lines ({self.points} points) to {self.logdir}"
        if self.purges:
            s += f" (+{self.purges} resume mark{'s' if self.purges > 1 else ''})"
        return s


class WandbSink(Sink):
    def __init__(self, run, wandb, args, name, group):
        super().__init__(run)
        self.last_step = None
        self.not_sent = 0
        config = run.read_config()
        kw = dict(project=args.wandb_project, entity=args.wandb_entity, name=name, group=group,
                  config=config, notes=f"lrnn run {run.dir}", mode=args.wandb_mode,
                  dir=args.wandb_dir or os.environ.get("WANDB_DIR") or run.dir, reinit="create_new",
                  settings=wandb.Settings(console="off", x_disable_stats=True, save_code=False,
                                          x_save_requirements=False))
        if args.wandb_id:
            kw.update(id=args.wandb_id, resume="allow")
        os.makedirs(kw["dir"], exist_ok=True)
        self.wb = wandb.init(**kw)
        if args.wandb_id and self.wb.starting_step:
            self.last_step = self.wb.starting_step   # a continued run: wandb drops steps below this

    def export(self, lines):
        for ln in lines:
            if not ln.ok or not ln.values:
                continue
            if self.last_step is not None and ln.step < self.last_step:
                self.not_sent += 1
                continue
            self.wb.log(dict(ln.values), step=ln.step)
            self.last_step = ln.step
            self.points += len(ln.values)
        self.lines += len(lines)

    def close(self):
        self.wb.finish()

    def describe(self):
        mode = self.wb.settings.mode
        s = f"wandb {mode} run {self.wb.id} ({self.points} points)"
        if mode == "offline":
            s += f" in {self.wb.settings.sync_dir} (upload: wandb sync {self.wb.settings.sync_dir})"
        if self.not_sent:
            s += f"; {self.not_sent} lines below the run's last step not sent (rewritten by a resume)"
        return s


# ---------------------------------------------------------------------------------------------
# A run: one metrics.jsonl, read incrementally.

def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    # YAML 1.2 floats: PyYAML's YAML 1.1 rules read lrnn's "1e-08" (no dot) as a string.
    import re
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    return yaml, Loader


class Run:
    def __init__(self, metrics, name, group):
        self.metrics = metrics
        self.dir = os.path.dirname(metrics)
        self.name = name
        self.group = group
        self.sinks = []
        self.ident = None        # (st_dev, st_ino) of the file read
        self.offset = 0          # bytes of complete lines read
        self.last_line = b""     # the last complete line read, with its newline
        self.partial = False     # bytes after the last newline
        self.line_no = 0
        self.seen = None         # (ident, size, mtime) at the last poll
        self.last_change = None  # when the file last changed (its mtime at first)
        self.rewrites = 0
        self.warned = set()      # digests of bad lines already reported

    def read_config(self):
        path = os.path.join(self.dir, "config.yaml")
        if not os.path.exists(path):
            return {}
        try:
            yaml, Loader = _yaml_loader()
            with open(path) as f:
                cfg = yaml.load(f, Loader=Loader)
            return cfg if isinstance(cfg, dict) else {}
        except Exception as e:  # a config the exporter cannot read is no reason to stop
            warn(f"{path}: not read as the wandb config ({e})")
            return {}

    def _tail_matches(self, f):
        if not self.last_line:
            return True
        f.seek(self.offset - len(self.last_line))
        return f.read(len(self.last_line)) == self.last_line

    def poll(self):
        """Reads what is new and hands it to the sinks; returns the number of new complete lines."""
        try:
            f = open(self.metrics, "rb")
        except FileNotFoundError:
            return 0   # between `lrnn train` removing an old run's file and writing its first line
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            seen = (ident, st.st_size, st.st_mtime_ns)
            if self.seen is None:
                self.last_change = st.st_mtime
            elif seen != self.seen:
                self.last_change = time.time()
            self.seen = seen
            first = self.ident is None
            resync = first or ident != self.ident or st.st_size < self.offset or not self._tail_matches(f)
            if not resync and st.st_size == self.offset:
                self.partial = False
                return 0
            start = 0 if resync else self.offset
            f.seek(start)
            data = f.read()
        if resync and not first:
            self.rewrites += 1
            warn(f"{self.metrics}: rewritten (a resume?); comparing it with what was exported")
        end = data.rfind(b"\n") + 1
        raw_lines = data[:end].split(b"\n")[:-1]
        self.ident = ident
        self.partial = end < len(data)
        self.offset = start + end
        if resync:
            self.line_no, self.last_line = 0, b""
        if raw_lines:
            self.last_line = raw_lines[-1] + b"\n"
        lines = []
        for raw in raw_lines:
            self.line_no += 1
            if not raw.strip():
                continue
            ln = Line(raw)
            if not ln.ok and ln.digest not in self.warned:
                self.warned.add(ln.digest)
                warn(f"{self.metrics}:{self.line_no}: skipped: {ln.problem}")
            lines.append(ln)
        if lines or resync:
            for s in self.sinks:
                s.take(lines, resync)
                s.flush()
        return len(lines)

    def finished(self, idle_exit):
        try:
            m = os.stat(self.metrics).st_mtime
            e = os.stat(os.path.join(self.dir, "eval.json")).st_mtime
        except OSError:
            return False
        return e >= m and not self.partial and self.last_change is not None \
            and time.time() - self.last_change >= idle_exit

    def close(self):
        for s in self.sinks:
            s.close()


# ---------------------------------------------------------------------------------------------
# Finding runs

SKIP_DIRS = {"tensorboard", "wandb", "__pycache__", ".git"}


def find_metrics(root):
    """metrics.jsonl files at or below root; run directories are not searched further."""
    found = []
    for d, subdirs, files in os.walk(root):
        if "metrics.jsonl" in files:
            found.append(os.path.join(d, "metrics.jsonl"))
            subdirs[:] = []
        else:
            subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS)
    return sorted(found)


class Target:
    """One PATH of the command line: a run (a run directory or a metrics file) or a directory of runs."""

    def __init__(self, path, follow):
        self.path = path
        self.abs = os.path.abspath(path)
        self.sweep = False
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or directory")
        if os.path.isfile(path):
            if not path.endswith(".jsonl"):
                raise UsageError(f"{path}: not a metrics.jsonl file (nor a run directory)")
            self.kind, self.metrics = "run", self.abs
        elif os.path.isfile(os.path.join(path, "metrics.jsonl")) or (follow and os.path.isfile(os.path.join(path, "config.yaml"))):
            # (following, a run directory that lrnn has just made: config.yaml comes first)
            self.kind, self.metrics = "run", os.path.join(self.abs, "metrics.jsonl")
        elif os.path.isdir(path):
            self.kind, self.metrics = "dir", None
            self.sweep = os.path.isfile(os.path.join(path, "grid.yaml"))
            if not find_metrics(self.abs) and not (follow and self.sweep):
                raise UsageError(f"{path}: not a run directory (no metrics.jsonl in it or below it)")
        else:
            raise UsageError(f"{path}: not a file or directory")

    def runs(self):
        """[(metrics path, name, group)]"""
        if self.kind == "run":
            return [(self.metrics, os.path.basename(os.path.dirname(self.metrics)) or "run", None)]
        base = os.path.dirname(self.abs.rstrip(os.sep))
        group = os.path.basename(self.abs.rstrip(os.sep))
        return [(m, os.path.relpath(os.path.dirname(m), base), group) for m in find_metrics(self.abs)]

    def complete(self):
        """A sweep directory is complete once results.csv is newer than grid.yaml."""
        if not self.sweep:
            return True
        try:
            return os.stat(os.path.join(self.abs, "results.csv")).st_mtime >= os.stat(os.path.join(self.abs, "grid.yaml")).st_mtime
        except OSError:
            return False


# ---------------------------------------------------------------------------------------------

class TB:
    """The tensorboard package's event writer and protos."""

    def __init__(self):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.compat.proto import event_pb2, summary_pb2
        self.EventFileWriter, self.event_pb2, self.summary_pb2 = EventFileWriter, event_pb2, summary_pb2


def import_or_reexec(what):
    """Imports the packages; from an interpreter without them, re-runs this script with the
    repository's .venv (scripts/setup.sh makes it)."""
    try:
        if what == "tensorboard":
            return TB()
        import wandb
        return wandb
    except ImportError as e:
        venv = os.path.join(REPO, ".venv")
        py = os.path.join(venv, "bin", "python")
        if os.path.exists(py) and os.path.realpath(sys.prefix) != os.path.realpath(venv) \
                and not os.environ.get("LRNN_EXPORT_METRICS_REEXEC"):
            os.environ["LRNN_EXPORT_METRICS_REEXEC"] = "1"
            os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
        raise RuntimeError(f"{sys.executable} cannot import {what} ({e}); run `bash scripts/setup.sh` "
                           f"and use {py} {os.path.relpath(os.path.abspath(__file__))}")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[0] + "\n\n" + __doc__.split("\n\n", 1)[1],
        epilog=END_HELP)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a run directory, a metrics.jsonl file, or a directory holding runs (a sweep)")
    g = p.add_argument_group("TensorBoard")
    g.add_argument("--logdir", metavar="DIR",
                   help="where the event files go: for one run PATH, DIR itself; otherwise DIR/<run name> "
                        "(e.g. DIR/<sweep>/<config>/lr1e-3_seed0). Default: RUN/tensorboard of each run")
    g.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard export (with --wandb)")
    g.add_argument("--overwrite", action="store_true",
                   help="first delete the event files (events.out.tfevents.*) and the exporter's state in the "
                        "log directory, then export every line again")
    g = p.add_argument_group("Weights & Biases")
    g.add_argument("--wandb", action="store_true", help="also export to wandb (one wandb run per lrnn run)")
    g.add_argument("--wandb-mode", choices=["offline", "online"], default="offline",
                   help="offline (default: no account needed; upload later with `wandb sync DIR`) or online")
    g.add_argument("--wandb-project", default="lrnn", help="wandb project (default: lrnn)")
    g.add_argument("--wandb-entity", default=None, help="wandb entity (team or user; default: yours)")
    g.add_argument("--wandb-name", default=None, help="wandb run name, for one run only (default: the run "
                   "directory's name; in a sweep, <sweep>/<config>/<lr_seed>)")
    g.add_argument("--wandb-group", default=None, help="wandb group (default: the sweep directory's name for "
                   "runs found in a directory of runs)")
    g.add_argument("--wandb-dir", default=None, help="where wandb keeps its files (default: $WANDB_DIR, "
                   "else the run directory: RUN/wandb/offline-run-*)")
    g.add_argument("--wandb-id", default=None, help="continue this wandb run (resume=allow) instead of "
                   "starting a new one; one run only")
    g = p.add_argument_group("Following")
    g.add_argument("--follow", "-f", action="store_true", help="keep watching and export new lines as they "
                   "come (see below for what ends it)")
    g.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="how often to read the files (default 1)")
    g.add_argument("--idle-exit", type=float, default=5.0, metavar="SECONDS",
                   help="a run with eval.json counts as finished after metrics.jsonl has not changed for this "
                        "long (default 5)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only warnings and errors")
    a = p.parse_args(argv)
    if a.no_tensorboard and not a.wandb:
        p.error("--no-tensorboard without --wandb exports nothing")
    if a.poll <= 0 or a.idle_exit < 0:
        p.error("--poll must be > 0 and --idle-exit >= 0")
    return a


STOP = []


def _stop(signum, frame):
    STOP.append(signum)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    say = (lambda m: None) if args.quiet else (lambda m: print(f"{PROG}: {m}", file=sys.stderr, flush=True))
    try:
        targets = [Target(p, args.follow) for p in args.paths]
        single = len(targets) == 1 and targets[0].kind == "run"
        if (args.wandb_name or args.wandb_id) and not single:
            raise UsageError("--wandb-name and --wandb-id need exactly one run PATH")
    except UsageError as e:
        warn(f"error: {e}")
        return 2

    try:
        tb = None if args.no_tensorboard else import_or_reexec("tensorboard")
        wandb = import_or_reexec("wandb") if args.wandb else None
    except RuntimeError as e:
        warn(f"error: {e}")
        return 1

    if args.follow:
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)

    runs = {}
    names = {}

    def add_runs():
        for t in targets:
            for metrics, name, group in t.runs():
                if metrics in runs:
                    continue
                if name in names:
                    raise UsageError(f"two runs named {name}: {names[name]} and {metrics}")
                names[name] = metrics
                r = Run(metrics, name, group)
                if tb is not None:
                    logdir = (args.logdir if single else os.path.join(args.logdir, name)) if args.logdir \
                        else os.path.join(r.dir, "tensorboard")
                    r.sinks.append(TensorBoardSink(r, os.path.abspath(logdir), args.overwrite, tb))
                if wandb is not None:
                    try:
                        r.sinks.append(WandbSink(r, wandb, args, args.wandb_name or name, args.wandb_group or group))
                    except Exception as e:  # wandb's own errors (no account for online, ...) are many
                        raise RuntimeError(f"wandb.init for {metrics}: {e}")
                runs[metrics] = r
                if args.follow:
                    say(f"watching {metrics}")

    status = 0
    try:
        add_runs()
        if not args.follow:
            for r in runs.values():
                if not os.path.exists(r.metrics):
                    raise UsageError(f"{r.metrics}: no such file")
                r.poll()
                if r.partial:
                    warn(f"{r.metrics}: its last line has no newline yet (being written?): not exported")
        else:
            while not STOP:
                for r in list(runs.values()):
                    r.poll()
                add_runs()
                if runs and all(r.finished(args.idle_exit) for r in runs.values()) and all(t.complete() for t in targets):
                    say("every run has finished")
                    break
                t_end = time.time() + args.poll
                while not STOP and time.time() < t_end:
                    time.sleep(min(0.05, args.poll))
            if STOP:
                say(f"stopped by {signal.Signals(STOP[0]).name}")
    except UsageError as e:
        warn(f"error: {e}")
        status = 2
    except (OSError, RuntimeError) as e:
        warn(f"error: {e}")
        status = 1
    finally:
        for r in runs.values():
            try:
                r.close()
            except Exception as e:  # finish every sink that can be finished
                warn(f"error: {r.metrics}: {e}")
                status = status or 1
            for s in r.sinks:
                say(f"{r.name}: {s.describe()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
