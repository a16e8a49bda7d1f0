"""A run directory must load in Hugging Face transformers as the model lrnn trained, never silently
as another one. Trains three tiny Mamba parity runs with `lrnn train` (a second each) and checks:

  always (no torch needed):
    - Mamba [-1,1]: config.json is a custom architecture (model_type lrnn_mamba, architectures
      LrnnMambaForCausalLM, auto_map, every MambaConfig key, allow_neg_eigval true) and
      modeling_lrnn_mamba.py lies beside it, equal to src/models/hf/modeling_lrnn_mamba.py, compiles
      (py_compile) and imports nothing but the standard library, torch and transformers;
    - Mamba [0,1]: config.json says mamba / MambaForCausalLM, no auto_map, no modeling file;
  where transformers imports (torch or not): AutoConfig refuses the [-1,1] run without
    trust_remote_code (None, stdin empty, and False) and reads the [0,1] run as MambaConfig;
  where torch and transformers import:
    - AutoModelForCausalLM.from_pretrained([-1,1] run) refuses without trust_remote_code; with
      trust_remote_code=True it is LrnnMambaForCausalLM and its logits equal `lrnn predict --logits`
      (relative 1e-4), and the same weights read as [0,1] do not (the check can tell the ranges
      apart); loss and greedy generate run;
    - the [0,1] run loads with AutoModelForCausalLM as transformers' MambaForCausalLM, logits equal
      `lrnn predict`.

CI's .venv has no torch (CUDA torch from PyPI is several GB): there the torch part is skipped,
and the script says so on stderr. A developer runs it fully with a venv that has torch and
transformers (4.40 or later):
    LRNN_BINARY=build/lrnn LRNN_SOURCE_DIR=. /path/to/venv/bin/python tests/python/test_hf_export.py
transformers' module cache (HF_HOME) goes to a temporary folder; nothing is downloaded."""
import ast
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("LRNN_BINARY") or os.path.join(SOURCE, "build", "lrnn")
MODELING = "modeling_lrnn_mamba.py"
MODELING_SRC = os.path.join(SOURCE, "src", "models", "hf", MODELING)
TOKENS = "1 2 2 1 1 2 1 2 2 2 1 2 1 1 2 2 2 1 1 1 2 1 2 2 1 2 1 2 2 2 1 1"
REL_TOL = 1e-4

# transformers MambaConfig's keys, as lrnn writes them for the [0,1] model.
MAMBA_KEYS = {"vocab_size", "hidden_size", "state_size", "num_hidden_layers", "layer_norm_epsilon", "pad_token_id",
              "bos_token_id", "eos_token_id", "expand", "intermediate_size", "conv_kernel", "use_bias", "use_conv_bias",
              "hidden_act", "initializer_range", "residual_in_fp32", "time_step_rank", "time_step_scale",
              "time_step_min", "time_step_max", "time_step_init_scheme", "time_step_floor",
              "rescale_prenorm_residual", "use_cache", "use_mambapy", "tie_word_embeddings"}

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
NO_TRANSFORMERS = "transformers is not installed in this Python"
NO_TORCH = "torch and transformers are not both installed in this Python"

TMP = None
RUNS = {}


def lrnn(*args):
    r = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"lrnn {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def train(name, **sets):
    """A tiny Mamba parity run (CPU, 20 steps at a high learning rate, so the weights move)."""
    out = os.path.join(TMP, name)
    s = {"training.num_steps": 20, "training.batch_size": 8, "training.lr": 0.01, "training.warmup_steps": 2,
         "training.num_threads": 1, "training.device": "cpu", "model.hidden_size": 32, "task.eval_samples": 16,
         "task.eval_len": "[40,42]", "logging.progress": "none"}
    s.update(sets)
    args = ["train", "--config", os.path.join(SOURCE, "configs", "chomsky", "parity_mamba_2.yaml"), "--out", out]
    for k, v in s.items():
        args += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    lrnn(*args)
    return out


def setUpModule():
    global TMP
    if not os.path.exists(BINARY):
        raise RuntimeError(f"no lrnn binary at {BINARY}: set LRNN_BINARY")
    TMP = tempfile.mkdtemp(prefix="lrnn_hf_export_")
    # transformers copies remote code into HF_HOME/modules: keep it in the temporary folder.
    os.environ["HF_HOME"] = os.path.join(TMP, "hf_home")
    os.environ["HF_MODULES_CACHE"] = os.path.join(TMP, "hf_home", "modules")
    os.environ["HF_HUB_OFFLINE"] = "1"
    # [-1,1] with the P1 config's options (no in/out-proj bias, conv bias, dt_rank 8 given).
    RUNS["neg"] = train("neg", **{"model.allow_neg_eigval": True})
    # [-1,1] and [0,1] with the other options: biases, no conv bias, dt_rank auto, another kernel.
    other = {"model.use_bias": True, "model.use_conv_bias": False, "model.time_step_rank": 0,
             "model.conv_kernel": 3, "model.state_size": 8, "model.num_hidden_layers": 1}
    RUNS["neg_bias"] = train("neg_bias", **{"model.allow_neg_eigval": True}, **other)
    RUNS["pos_bias"] = train("pos_bias", **{"model.allow_neg_eigval": False}, **other)


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def predict_logits(run):
    out = json.loads(lrnn("predict", "--run", run, "--tokens", TOKENS, "--logits"))
    return [p["token"] for p in out["positions"]], [p["logits"] for p in out["positions"]]


@contextlib.contextmanager
def empty_stdin():
    """transformers asks on stdin whether to run remote code when trust_remote_code is not given:
    an empty stdin answers at once (EOF), as a non-interactive run would."""
    old = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.stdin = old


class ConfigJson(unittest.TestCase):
    """No torch, no transformers: what lrnn writes."""

    def test_signed_mamba_is_a_custom_architecture(self):
        for name in ("neg", "neg_bias"):
            run = RUNS[name]
            cfg = read_json(os.path.join(run, "config.json"))
            self.assertEqual(cfg["model_type"], "lrnn_mamba", name)
            self.assertEqual(cfg["architectures"], ["LrnnMambaForCausalLM"], name)
            self.assertEqual(cfg["auto_map"], {"AutoConfig": "modeling_lrnn_mamba.LrnnMambaConfig",
                                               "AutoModelForCausalLM": "modeling_lrnn_mamba.LrnnMambaForCausalLM"})
            self.assertIs(cfg["allow_neg_eigval"], True)
            self.assertEqual(MAMBA_KEYS - set(cfg), set(), name)
            self.assertTrue(os.path.isfile(os.path.join(run, MODELING)), name)
        cfg = read_json(os.path.join(RUNS["neg_bias"], "config.json"))
        self.assertEqual((cfg["use_bias"], cfg["use_conv_bias"], cfg["time_step_rank"]), (True, False, 2))

    def test_unit_mamba_stays_mamba_for_causal_lm(self):
        run = RUNS["pos_bias"]
        cfg = read_json(os.path.join(run, "config.json"))
        self.assertEqual(cfg["model_type"], "mamba")
        self.assertEqual(cfg["architectures"], ["MambaForCausalLM"])
        self.assertNotIn("auto_map", cfg)
        self.assertIs(cfg["allow_neg_eigval"], False)
        self.assertEqual(MAMBA_KEYS - set(cfg), set())
        self.assertFalse(os.path.exists(os.path.join(run, MODELING)))

    def test_modeling_file_is_the_repository_file_and_self_contained(self):
        with open(MODELING_SRC, "rb") as f:
            src = f.read()
        with open(os.path.join(RUNS["neg"], MODELING), "rb") as f:
            self.assertEqual(f.read(), src, "the run's modeling file differs from src/models/hf/" + MODELING)
        py_compile.compile(os.path.join(RUNS["neg"], MODELING), cfile=os.path.join(TMP, "m.pyc"), doraise=True)
        # transformers requires every module the file imports to be installed: only these.
        roots = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                self.assertEqual(node.level, 0, "no relative imports")
                roots.add(node.module.split(".")[0])
        self.assertLessEqual(roots, {"math", "typing", "torch", "transformers"})


@unittest.skipUnless(HAVE_TRANSFORMERS, NO_TRANSFORMERS)
class AutoConfigLoading(unittest.TestCase):
    """transformers without torch suffices: AutoConfig reads config.json only."""

    def test_signed_run_refuses_without_trust_remote_code(self):
        from transformers import AutoConfig
        for kw in ({}, {"trust_remote_code": False}):
            with self.subTest(**kw), empty_stdin(), self.assertRaises(Exception) as e:
                AutoConfig.from_pretrained(RUNS["neg"], **kw)
            self.assertIn("trust_remote_code", str(e.exception))

    def test_unit_run_is_mamba_config(self):
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(RUNS["pos_bias"])
        self.assertEqual(type(cfg).__name__, "MambaConfig")
        self.assertEqual((cfg.use_bias, cfg.use_conv_bias, cfg.time_step_rank), (True, False, 2))


@unittest.skipUnless(HAVE_TORCH and HAVE_TRANSFORMERS, NO_TORCH)
class ModelLoading(unittest.TestCase):
    def logits(self, model, tokens):
        import torch
        with torch.no_grad():
            return model(torch.tensor([tokens])).logits[0].double()

    def rel_diff(self, a, b):
        return ((a - b).abs().max() / b.abs().max().clamp(min=1.0)).item()

    def test_signed_run_refuses_without_trust_remote_code(self):
        from transformers import AutoModelForCausalLM
        for kw in ({}, {"trust_remote_code": False}):
            with self.subTest(**kw), empty_stdin(), self.assertRaises(Exception) as e:
                AutoModelForCausalLM.from_pretrained(RUNS["neg"], **kw)
            self.assertIn("trust_remote_code", str(e.exception))

    def test_signed_run_with_trust_remote_code_computes_lrnn_logits(self):
        import torch
        from transformers import AutoModelForCausalLM
        for name in ("neg", "neg_bias"):
            run = RUNS[name]
            model = AutoModelForCausalLM.from_pretrained(run, trust_remote_code=True).eval()
            self.assertEqual(type(model).__name__, "LrnnMambaForCausalLM")
            self.assertTrue(model.config.allow_neg_eigval)
            tokens, ref = predict_logits(run)
            ref = torch.tensor(ref, dtype=torch.float64)
            got = self.logits(model, tokens)
            err = self.rel_diff(got, ref)
            # The same weights as the [0,1] model: what stock MambaForCausalLM would compute.
            for layer in model.backbone.layers:
                layer.mixer.allow_neg_eigval = False
            other = self.rel_diff(self.logits(model, tokens), ref)
            for layer in model.backbone.layers:
                layer.mixer.allow_neg_eigval = True
            print(f"\n  {name}: LrnnMambaForCausalLM vs lrnn predict over {len(tokens)} tokens: max|diff| = "
                  f"{(got - ref).abs().max().item():.3e}, relative {err:.3e} (max|logit| "
                  f"{ref.abs().max().item():.3f}); read as [0,1] instead: relative {other:.3e}", file=sys.stderr)
            self.assertLess(err, REL_TOL, name)
            self.assertGreater(other, 10 * REL_TOL, f"{name}: the check cannot tell [-1,1] from [0,1]")
            # Loss (transformers' causal-LM convention: predict token t+1 at t) and generation run.
            ids = torch.tensor([tokens])
            out = model(ids, labels=ids)
            want = torch.nn.functional.cross_entropy(got[:-1].float(), ids[0, 1:])
            self.assertAlmostEqual(out.loss.item(), want.item(), places=4)
            gen = model.generate(ids[:, :8], max_new_tokens=3, do_sample=False)
            self.assertEqual(gen.shape, (1, 11))
            self.assertEqual(gen[0, 8].item(), int(got[7].argmax()))

    def test_modeling_file_matches_the_float64_goldens(self):
        """The module on its own (no lrnn) in float64 against tools/golden_mamba.py's independent
        twin, both ranges (tests/data/golden_mamba_*.safetensors)."""
        import torch
        from safetensors.torch import load_file
        from safetensors import safe_open
        spec = importlib.util.spec_from_file_location("modeling_lrnn_mamba_under_test", MODELING_SRC)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name in ("golden_mamba_neg.safetensors", "golden_mamba_pos_bias.safetensors"):
            path = os.path.join(SOURCE, "tests", "data", name)
            with safe_open(path, framework="pt") as f:
                c = json.loads(f.metadata()["config"])
            t = load_file(path)
            cfg = mod.LrnnMambaConfig(**c)
            model = mod.LrnnMambaForCausalLM(cfg).double().eval()
            params = {k[len("param."):]: v for k, v in t.items() if k.startswith("param.")}
            model.load_state_dict(params, strict=True)
            with torch.no_grad():
                got = model(t["inputs"]).logits.double()
            err = ((got - t["logits"]).abs().max() / t["logits"].abs().max()).item()
            print(f"\n  {name}: modeling file (float64 weights) vs golden logits: relative {err:.3e}", file=sys.stderr)
            self.assertLess(err, 1e-10, name)

    def test_unit_run_loads_as_mamba_for_causal_lm(self):
        import torch
        from transformers import AutoModelForCausalLM
        run = RUNS["pos_bias"]
        model = AutoModelForCausalLM.from_pretrained(run).eval()
        self.assertEqual(type(model).__name__, "MambaForCausalLM")
        self.assertEqual(type(model).__module__.split(".")[0], "transformers")
        tokens, ref = predict_logits(run)
        ref = torch.tensor(ref, dtype=torch.float64)
        got = self.logits(model, tokens)
        err = self.rel_diff(got, ref)
        print(f"\n  pos_bias: transformers MambaForCausalLM vs lrnn predict over {len(tokens)} tokens: max|diff| = "
              f"{(got - ref).abs().max().item():.3e}, relative {err:.3e}", file=sys.stderr)
        self.assertLess(err, REL_TOL)


def main():
    versions = []
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is not None:  # the version without importing (HF_HOME is set later)
            versions.append(f"{mod} {importlib.metadata.version(mod)}")
    ran = ["config.json and modeling file checks"]
    if HAVE_TRANSFORMERS:
        ran.append("AutoConfig loading")
    if HAVE_TORCH and HAVE_TRANSFORMERS:
        ran.append("model loading and logits against lrnn predict")
    print(f"test_hf_export: {sys.executable} ({', '.join(versions) or 'no torch, no transformers'}): runs "
          f"{'; '.join(ran)}" + ("" if HAVE_TORCH and HAVE_TRANSFORMERS else
                                 f"; SKIPS the loading checks that need torch and transformers"), file=sys.stderr)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
