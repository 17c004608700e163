"""The jobs of the ``normlab`` program as Python calls: ``train``, ``TrainSession`` (the train job a
step at a time), ``stability``, ``sample``, ``export``, ``convert``, ``load_checkpoint`` and
``save_checkpoint``.

Each call runs the same C++ job as the program (``normlab._normlab.jobs``, python/src/jobs.cpp),
so a config trains to the same bits from Python as from the command line, and writes the same run
directory (config.json, metrics.csv, checkpoints/, summary.json; error.txt when a run fails).

Conventions:

* Configs: a path (``str`` or ``os.PathLike``) to a JSON file, or a ``dict`` holding the same
  object. ``overrides`` are the program's ``--set`` assignments: a list of ``"train.steps=60"``
  strings, or a dict ``{"train.steps": 60}`` (values written as JSON).
* Progress: quiet by default, as a library call in a script should be. ``progress=True`` prints a
  header and a line every ``train.log_every`` steps (a line per run for ``stability``) to stderr,
  through a ``tqdm`` bar when tqdm is installed (``tqdm.auto``: a widget in a notebook).
  ``progress=<callable>`` calls it with each step (each epoch for ``stability``) as a dict and prints
  nothing.
* Ctrl-C: the job runs with the GIL released and checks for Python's signals after every step. A
  KeyboardInterrupt (Ctrl-C, or raised by a progress callback) stops the run after that step with a
  checkpoint, then is raised; ``resume=True`` with the same ``out`` continues the run bit for bit.
  Any other exception a callback raises ends the run (error.txt) and reaches the caller unchanged.
* Errors: a bad config key, value, shape or file is ``normlab.Error`` (a ``ValueError``) with the
  job's message; it is raised before the run directory is written, and a run directory is complete
  only once summary.json exists.
"""
import dataclasses
import json
import math
import os
import sys

import numpy as np

from . import _normlab
from ._normlab import Error

_ext = _normlab.jobs

Model = _ext.Model
Checkpoint = _ext.Checkpoint

# metrics.csv's columns, the keys of TrainResult.metrics, as the train job declares them.
METRICS_COLUMNS = tuple(_ext.metrics_columns())


# ---- the config schema ----

def config_schema(job):
    """The JSON Schema (draft 2020-12, a dict) of a job's config files, as ``normlab config --schema JOB``
    prints it: every key with its type, bounds or choices, default and description. job: "train",
    "stability" or "bench_norms" (``config_jobs()``)."""
    return json.loads(_ext.config_schema(str(job)))


def config_defaults(job):
    """A config of the job (a dict) holding every fixed default, as ``normlab config --defaults JOB``
    prints it; keys whose default is computed (``model.n_kv_heads``: ``n_heads``) or required are absent."""
    return json.loads(_ext.config_defaults(str(job)))


def config_jobs():
    """The jobs that read a config file: ["train", "stability", "sweep", "bench_norms"]."""
    return list(_ext.config_jobs())


# ---- arguments ----

def _path(value, what):
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        raise Error(f"{what}: expected a path (str or os.PathLike), found {type(value).__name__}") from None


def _json_default(value):
    """NumPy scalars and arrays in a config dict, as JSON numbers and lists."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} is not a JSON value")


def _json_text(value, what):
    try:
        return json.dumps(value, allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as e:
        raise Error(f"{what}: {e}") from None


def _config_args(config):
    """(config_path, config_json, config_name) as the extension takes them."""
    if isinstance(config, dict):
        return "", _json_text(config, "config"), "config"
    if isinstance(config, (str, bytes, os.PathLike)):
        return _path(config, "config"), "", "config"
    raise Error(f"config: expected a path (str or os.PathLike) or a dict, found {type(config).__name__}")


def _overrides(overrides):
    """The --set assignments: None, one "a.b=value" string, a list of them, or a dict {"a.b": value}."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, dict):
        return [f"{key}={_json_text(value, f'overrides[{key!r}]')}" for key, value in overrides.items()]
    items = list(overrides)
    for item in items:
        if not isinstance(item, str):
            raise Error(f"overrides: expected \"key=value\" strings or a dict, found {item!r}")
    return items


def _out(out):
    return "" if out is None else _path(out, "out")


# ---- progress ----

def _bar(total, initial, desc):
    """A tqdm bar on stderr when tqdm is installed, else None."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, dynamic_ncols=True)


def _say(line):
    print(line, file=sys.stderr, flush=True)


class _TrainProgress:
    """progress=True for train: the header, then a tqdm bar or a line every log_every steps."""

    def __init__(self):
        self.bar = None
        self.end_step = 0
        self.log_every = 1
        self.last = None  # the latest step dict
        self.val = None   # the latest evaluated step dict

    def start(self, info):
        _say(f"train: {info['description']}")
        self.end_step = info["end_step"]
        self.log_every = max(1, info["log_every"])
        self.bar = _bar(info["end_step"], info["start_step"], "train")

    def fields(self, t):
        text = f"loss {t['train_loss']:.4f} lr {t['lr']:.2e} | {t['tokens_per_s']:.0f} tok/s"
        if self.val is not None:
            v = self.val
            text += f" | val {v['val_loss']:.4f}"
            if not math.isnan(v["val_accuracy"]):
                text += f" acc {100 * v['val_accuracy']:.2f}%"
        return text

    def step(self, t):
        self.last = t
        if t["evaluated"]:
            self.val = t
        if self.bar is not None:
            self.bar.set_postfix_str(self.fields(t), refresh=False)
            self.bar.update(1)
        elif t["step"] % self.log_every == 0 or t["step"] >= self.end_step:
            _say(f"train: step {t['step']}/{t['steps']} {self.fields(t)}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def report(self, result):
        if result.complete:
            s = result.summary
            accuracy = f", exact-sequence accuracy {100 * s['val_accuracy']:.2f}%" if "val_accuracy" in s else ""
            _say(f"train: step {s['steps']}: train loss {s['final_train_loss']:.4f}, val loss {s['val_loss']:.4f}"
                 f"{accuracy}, {s['tokens_per_s']:.0f} tokens/s, {s['wall_seconds']:.1f} s -> {result.run_dir}")
        else:
            _say(f"train: stopped after step {result.last_step}; continue with resume=True, out={result.run_dir!r}")


class _StabilityProgress:
    """progress=True for stability: the header, then a tqdm bar or a line per run (and perturbed copy)."""

    def __init__(self):
        self.bar = None
        self.epochs = 1
        self.total = 0

    def start(self, info):
        done = f" ({info['resumed']} runs already done)" if info["resumed"] else ""
        _say(f"stability: {info['description']}{done}")
        self.epochs = max(1, info["epochs"])
        self.total = info["total"]
        self.bar = _bar(info["total"], 0, "stability")

    def epoch(self, e):
        label = e["run_id"] + (" (perturbed)" if e["perturbed"] else "")
        if e["diverged_epoch"] > 0:
            text = f"{label} diverged at epoch {e['diverged_epoch']}"
        else:
            text = f"{label} loss {e['loss']:.6g}"
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.n = e["done"]
            self.bar.refresh()
        elif e["done"] % self.epochs == 0 or e["diverged_epoch"] > 0:
            _say(f"stability: {e['done']}/{self.total} {text}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _callbacks(progress, printer_type, per_item):
    """(printer or None, on_start, on_item) for a progress argument."""
    if progress is None or progress is False:
        return None, None, None
    if progress is True:
        printer = printer_type()
        return printer, printer.start, getattr(printer, per_item)
    if callable(progress):
        return None, None, progress
    raise Error(f"progress: expected True, False or a callable, found {progress!r}")


# ---- train ----

@dataclasses.dataclass(repr=False)
class TrainResult:
    """What a train run returns.

    run_dir: the run directory. complete: every step has run (summary.json exists). last_step: the
    step the run is at (its latest checkpoint's). summary: what summary.json holds, None when the run
    stopped early. metrics: the steps this call ran, by metrics.csv's column (step, lr, train_loss,
    grad_norm, val_loss, val_accuracy, val_token_accuracy, tokens_per_s, elapsed_s, z_loss), each a NumPy
    array; the val_* columns are NaN at steps without an evaluation. probes: the probed steps this call
    ran (train.probe_every, train.sharpness_every), by probes.csv's column (step, attn_score_max.block0,
    residual_rms.block0, act_max.block0, act_kurtosis.block0, attn_entropy.block0, attn_sink.block0, ...,
    logsumexp_mean, logsumexp_max, grad_rms.<param>, update_ratio.<param>, dyt_alpha.<norm>,
    norm_input_rms.<norm>, then sharpness, sharpness_adam, sharpness_adam_threshold), each a NumPy array,
    NaN where a family was not measured at that step; empty without probes. profile: the kernel table with profile=True (also
    profile.txt), else None.
    """
    run_dir: str
    complete: bool
    last_step: int
    summary: dict
    metrics: dict
    profile: str
    probes: dict = dataclasses.field(default_factory=dict)

    def __repr__(self):
        return (f"TrainResult(run_dir={self.run_dir!r}, complete={self.complete}, last_step={self.last_step}, "
                f"steps_run={len(self.metrics['step'])})")


def _metrics(steps):
    columns = {name: np.array([s[name] for s in steps], dtype=np.float64) for name in METRICS_COLUMNS}
    columns["step"] = columns["step"].astype(np.int64)
    return columns


def _probes(steps):
    probed = [s for s in steps if s["probes"]]
    if not probed:
        return {}
    columns = {"step": np.array([s["step"] for s in probed], dtype=np.int64)}
    for name in probed[0]["probes"]:
        columns[name] = np.array([s["probes"][name] for s in probed], dtype=np.float64)
    return columns


def _train_result(r, steps):
    return TrainResult(run_dir=r["run_dir"], complete=r["complete"], last_step=r["last_step"], summary=r["summary"],
                       metrics=_metrics(steps), profile=r["profile"] or None, probes=_probes(steps))


def train(config, overrides=None, out=None, force=False, resume=False, stop_after=0, profile=False, progress=False):
    """Runs the train job (``normlab train CONFIG``) and returns a TrainResult.

    config: a JSON config path or a dict. overrides: ``--set`` assignments (a list of "a.b=value", or a
    dict). out: the run directory (None: runs/<config name>-<timestamp>). force: replace an existing
    run directory. resume: continue the run in ``out`` from its latest checkpoint. stop_after: > 0
    stops after that step as if interrupted. profile: time the kernels (TrainResult.profile).
    progress: False (quiet), True (lines or a tqdm bar on stderr) or a callable given each step's dict
    (metrics.csv's columns plus steps, evaluated, threads, max_threads, world_size).

    Ctrl-C stops the run after the current step with a checkpoint and raises KeyboardInterrupt;
    ``train(config, out=run_dir, resume=True)`` continues it. normlab.Error for a bad config or file.
    """
    printer, on_start, on_step = _callbacks(progress, _TrainProgress, "step")
    try:
        r = _ext.train(*_config_args(config), _overrides(overrides), _out(out), bool(force), bool(resume),
                       int(stop_after), bool(profile), on_start, on_step)
    except KeyboardInterrupt:
        if printer is not None and printer.last is not None:
            printer.close()
            _say(f"train: interrupted after step {printer.last['step']}; continue with resume=True")
        raise
    finally:
        if printer is not None:
            printer.close()
    result = _train_result(r, r["steps"])
    if printer is not None:
        printer.report(result)
    return result


class TrainSession:
    """The train job a step at a time, for a notebook or a loop of your own.

    ``TrainSession(config, overrides=None, out=None, force=False, resume=False, stop_after=0,
    profile=False)`` reads and checks the config, reads the data, creates the run directory (or
    reopens it with resume) and builds the model and AdamW, as ``train`` does. Then ``step()`` runs
    one optimizer step (with the evaluation, metrics row and checkpoint when due) and returns it as
    a dict; ``evaluate()`` scores the held-out set now; ``stop()`` ends the session at the current
    step with a checkpoint; ``finish()`` writes summary.json when every step has run and returns the
    TrainResult of the steps this session ran. ``model`` is the model being trained (a normlab Model:
    forward(ids), named_parameters(), ...; its parameters are the live tensors).

    Each call releases the GIL while it computes; a Ctrl-C during a step raises KeyboardInterrupt
    once the step is done, and the session stays usable (``stop()`` then ``finish()`` leave a run
    that ``resume=True`` continues). Used as a context manager, the session is finished on leaving
    (stopped first when the block ended early or by KeyboardInterrupt; left as it is, with error.txt
    where a step failed, on another exception) and closed. The run directory stays locked until
    ``close()`` or until the session and every model taken from it are gone.
    """

    def __init__(self, config, overrides=None, out=None, force=False, resume=False, stop_after=0, profile=False):
        self._session = _ext.TrainSession(*_config_args(config), _overrides(overrides), _out(out), bool(force),
                                          bool(resume), int(stop_after), bool(profile))
        self._steps = []
        self._result = None

    @property
    def description(self):
        """"108224 parameters, reverse data, vocab 11, T = 16, on cpu, 1 process, run directory runs/..."."""
        return self._session.description

    @property
    def run_dir(self):
        """The run directory."""
        return self._session.run_dir

    @property
    def config(self):
        """The resolved config (every default filled in, as config.json holds it), a dict."""
        return self._session.config

    @property
    def last_step(self):
        """Steps done (the checkpoint's step right after a resume)."""
        return self._session.step

    @property
    def end_step(self):
        """Where the session stops: train.steps, or stop_after."""
        return self._session.end_step

    @property
    def done(self):
        """True once last_step == end_step."""
        return self._session.done

    @property
    def model(self):
        """The model being trained (normlab Model); its parameters are the live tensors."""
        return self._session.model

    def named_parameters(self):
        """The model's parameters as [(name, Tensor)], LLaMA's names in PyTorch's order."""
        return self._session.model.named_parameters()

    def parameters(self):
        """The model's parameters, in named_parameters' order."""
        return self._session.model.parameters()

    @property
    def metrics(self):
        """The steps run so far by metrics.csv's column, NumPy arrays (as TrainResult.metrics)."""
        return _metrics(self._steps)

    def step(self):
        """One optimizer step; returns it as a dict with metrics.csv's columns (val_* NaN when it did not
        evaluate) plus steps, evaluated, threads, max_threads, world_size. normlab.Error when done."""
        t = self._session.run_step()
        self._steps.append(t)
        return t

    def evaluate(self):
        """The held-out set's scores now: {val_loss, val_accuracy (NaN for text), val_token_accuracy}."""
        return self._session.evaluate()

    def stop(self):
        """Ends the session at the current step, writing its checkpoint (unless it has one)."""
        self._session.stop_here()

    def finish(self):
        """Ends the session: the profile, then summary.json when every step has run. Returns the
        TrainResult of the steps this session ran (summary None when it stopped early). Call once."""
        self._result = _train_result(self._session.finish(), self._steps)
        return self._result

    def close(self):
        """Lets go of the session and its run directory's lock (once no model taken from it is alive)."""
        self._session.close()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if self._result is None and (kind is None or issubclass(kind, KeyboardInterrupt)):
                if not self.done:
                    self.stop()
                self.finish()
        finally:
            self.close()
        return False

    def __repr__(self):
        try:
            return f"TrainSession(step {self.last_step}/{self.end_step}, run_dir={self.run_dir!r})"
        except Error:
            return "TrainSession(closed)"


# ---- stability ----

@dataclasses.dataclass(repr=False)
class StabilityRun:
    """One run of the stability sweep: its id ("rmsnorm_d2_lr0.001_s42"), norm, depth, lr and seed, and
    its curves as NumPy arrays: losses (epochs run,) the loss before each epoch's update,
    perturbed_losses the perturbed copy's (empty when perturb is 0), grad_norms the gradient's L2 norm
    over all parameters; diverged_epoch (0: did not diverge) and seconds."""
    id: str
    norm: str
    depth: int
    lr: float
    seed: int
    losses: np.ndarray
    perturbed_losses: np.ndarray
    grad_norms: np.ndarray
    diverged_epoch: int
    seconds: float

    def __repr__(self):
        return f"StabilityRun({self.id!r}, epochs={len(self.losses)}, diverged_epoch={self.diverged_epoch})"


@dataclasses.dataclass(repr=False)
class StabilityResult:
    """What a stability run returns: run_dir, summary (what summary.json holds), table (the summary
    table, one row per norm, depth and lr), notes (how to read it), plots (which plots were drawn, or
    why none) and runs (a StabilityRun per run, in sweep order, the curves of curves/<id>.csv)."""
    run_dir: str
    summary: dict
    table: str
    notes: list
    plots: str
    runs: list

    def __repr__(self):
        return f"StabilityResult(run_dir={self.run_dir!r}, runs={len(self.runs)})"


def stability(config, overrides=None, out=None, force=False, resume=False, jobs=0, progress=False):
    """Runs the stability job (``normlab stability CONFIG``: RMSNorm vs LayerNorm, swept over norms,
    depths, learning rates and seeds) and returns a StabilityResult.

    config: a JSON config path or a dict; overrides: ``--set`` assignments (a list of "a.b=value", or a
    dict); out: the run directory (None: runs/<config name>-<timestamp>); force: replace it; resume:
    continue the job in `out` (the runs without runs/<i>/result.json); jobs: runs at once (0: one per
    core, at most the runs, each on one thread). progress: False (quiet), True (lines or a tqdm bar on
    stderr) or a callable given each epoch's dict (run_id, perturbed, epoch, loss, done,
    diverged_epoch), called from the runs' threads. Ctrl-C, or an exception from the callback, cancels
    the job between epochs (the run directory gets error.txt; finished runs keep their result.json, so
    resume=True continues) and is raised.
    """
    printer, on_start, on_epoch = _callbacks(progress, _StabilityProgress, "epoch")
    try:
        r = _ext.stability(*_config_args(config), _overrides(overrides), _out(out), bool(force), bool(resume),
                           int(jobs), on_start, on_epoch)
    finally:
        if printer is not None:
            printer.close()
    runs = [StabilityRun(id=run["id"], norm=run["norm"], depth=run["depth"], lr=run["lr"], seed=run["seed"],
                         losses=np.array(run["losses"], dtype=np.float64),
                         perturbed_losses=np.array(run["perturbed_losses"], dtype=np.float64),
                         grad_norms=np.array(run["grad_norms"], dtype=np.float64),
                         diverged_epoch=run["diverged_epoch"], seconds=run["seconds"]) for run in r["runs"]]
    return StabilityResult(run_dir=r["run_dir"], summary=r["summary"], table=r["table"], notes=list(r["notes"]),
                           plots=r["plots"], runs=runs)


# ---- sweep ----

class _SweepProgress:
    """progress=True for sweep: the header, then a line per finished run."""

    def start(self, info):
        done = f" ({info['resumed']} runs already done)" if info["resumed"] else ""
        _say(f"sweep: {info['description']}{done}")

    def run(self, r):
        outcome = (f"diverged at step {r['diverged_at_step']}" if r["diverged"]
                   else f"val loss {r['final_val_loss']:.4f}")
        _say(f"sweep: run {r['index']} ({r['done']}/{r['mine']}) {r['label']}: {outcome} ({r['seconds']:.2f} s)")

    def close(self):
        pass


@dataclasses.dataclass(repr=False)
class SweepResult:
    """What a sweep returns: run_dir (the sweep directory), summary (what summary.json holds: per variant
    lr_sensitivity, best_lr, divergence_rate, the val loss per lr, per_lr with its 95% interval and the
    paired differences to a baseline), table (one line per variant), plots (which PNGs were drawn, or
    why none) and runs: runs.csv by column (index, one column per grid key, seed, init_loss,
    final_train_loss, final_val_loss, diverged, diverged_at_step, loss_spikes, max_grad_norm, seconds,
    probe_step, then the last probes row's columns), each a NumPy array: float64 where every cell is a
    number (an empty cell is NaN), else str."""
    run_dir: str
    summary: dict
    table: str
    plots: str
    runs: dict

    def __repr__(self):
        return f"SweepResult(run_dir={self.run_dir!r}, runs={len(self.runs.get('index', []))})"


def _column_array(cells):
    """A runs.csv column as float64 (empty cells NaN) when every cell is a number, else as str."""
    try:
        return np.array([float(c) if c != "" else np.nan for c in cells], dtype=np.float64)
    except ValueError:
        return np.array(cells, dtype=str)


def sweep(config, overrides=None, out=None, force=False, resume=False, jobs=0, progress=False):
    """Runs the sweep job (``normlab sweep CONFIG``: a grid of train runs, base config x grid x seeds,
    with the learning-rate sensitivity per variant) and returns a SweepResult.

    config: a JSON sweep config path or a dict; overrides: ``--set`` assignments on the sweep config (a
    list of "a.b=value", or a dict); out: the sweep directory (None: runs/<config name>-<timestamp>);
    force: replace it; resume: continue the sweep in `out` (the runs without result.json); jobs: runs
    at once (0: one per core, each on one thread). progress: False, True (a line per finished run on
    stderr) or a callable given each finished run's dict (index, label, diverged, diverged_at_step,
    final_val_loss, seconds, done, mine), called from the runs' threads. An exception from the callback
    stops the sweep after the runs in flight (finished runs keep their result.json, so resume=True
    continues) and is raised; so does Ctrl-C, seen when a run on the calling thread finishes.
    """
    printer, on_start, on_run = _callbacks(progress, _SweepProgress, "run")
    try:
        r = _ext.sweep(*_config_args(config), _overrides(overrides), _out(out), bool(force), bool(resume),
                       int(jobs), on_start, on_run)
    finally:
        if printer is not None:
            printer.close()
    columns = list(r["columns"])
    rows = r["rows"]
    runs = {name: _column_array([row[i] for row in rows]) for i, name in enumerate(columns)}
    return SweepResult(run_dir=r["run_dir"], summary=r["summary"], table=r["table"], plots=r["plots"], runs=runs)


# ---- sample ----

@dataclasses.dataclass(repr=False)
class SampleResult:
    """What sample returns. checkpoint: the file read; step: its training step. A synthetic task:
    problems, a dict each (problem, answer, expected, correct), and correct (how many). A text model:
    text (the prompt and its continuation) and tokens (their ids, an int64 NumPy array). The speed:
    new_tokens, seconds, tokens_per_s; as used: context (the window), temperature, kv_cache; note: a
    remark on the checkpoint ("" for none)."""
    checkpoint: str
    step: int
    problems: list
    correct: int
    text: str
    tokens: np.ndarray
    new_tokens: int
    seconds: float
    tokens_per_s: float
    context: int
    temperature: float
    kv_cache: bool
    note: str

    def __repr__(self):
        if self.problems:
            what = f"{self.correct}/{len(self.problems)} correct"
        else:
            what = f"text={self.text[:40]!r}"
        return f"SampleResult(step {self.step}, {what}, {self.tokens_per_s:.0f} tokens/s)"


def sample(checkpoint, num=10, max_new_tokens=200, prompt="", temperature=None, seed=0, kv_cache=True):
    """Generates from a train checkpoint (``normlab sample CHECKPOINT``) and returns a SampleResult.

    checkpoint: a checkpoint file, a run directory (its latest checkpoint) or a Checkpoint. A synthetic
    task answers ``num`` random problems, checked against the right answers; a text model continues
    ``prompt`` ("": the vocab's first character) by ``max_new_tokens`` characters. temperature: None
    (greedy for tasks, 0.8 for text), 0 (greedy) or > 0 (sampled from softmax(logits / temperature)),
    drawn with ``seed``. kv_cache=False recomputes the whole window for every token (same tokens).
    """
    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else _path(checkpoint, "checkpoint")
    r = _ext.sample(path, int(num), int(max_new_tokens), str(prompt),
                    None if temperature is None else float(temperature), int(seed), bool(kv_cache))
    return SampleResult(checkpoint=r["checkpoint"], step=r["step"], problems=list(r["problems"]),
                        correct=r["correct"], text=r["text"], tokens=np.array(r["tokens"], dtype=np.int64),
                        new_tokens=r["new_tokens"], seconds=r["seconds"], tokens_per_s=r["tokens_per_s"],
                        context=r["context"], temperature=r["temperature"], kv_cache=r["kv_cache"], note=r["note"])


def export(checkpoint, to, out, dtype="f32", force=False):
    """Writes a model for transformers or llama.cpp (``normlab export CHECKPOINT --to TO OUT``) and
    returns a dict (source, step, parameters, tokenizer, architecture: the transformers class or "llama"
    for GGUF, out).

    checkpoint: a checkpoint file, a run directory, a Checkpoint, a transformers LLaMA, Qwen3 or OLMo 2
    directory or a GGUF file. to: "hf" (``out`` a directory AutoModelForCausalLM.from_pretrained loads,
    with a text model's character tokenizer) or "gguf" (``out`` a GGUF v3 file). dtype: "f32",
    "f16" or "bf16". An existing ``out`` is replaced only with force=True. docs/interop.md.
    """
    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else _path(checkpoint, "checkpoint")
    return dict(_ext.export_model(path, str(to), _path(out, "out"), str(dtype), bool(force)))


def convert(checkpoint, to, out, force=False):
    """Writes a pre-norm LayerNorm model as the pre-norm RMSNorm model with the same function
    (``normlab convert CHECKPOINT --to rmsnorm OUT``, Jiang et al. 2023) and returns a dict (source,
    step, norms, recentered, parameters, out).

    checkpoint: a checkpoint file, a run directory (its latest checkpoint) or a Checkpoint. to:
    "rmsnorm". out: the train checkpoint to write, which load_checkpoint, sample and export read. An
    existing ``out`` is replaced only with force=True. A post-norm model, a norm type other than
    "layernorm" or a nonzero LayerNorm bias is normlab.Error naming it. docs/norms.md.
    """
    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else _path(checkpoint, "checkpoint")
    return dict(_ext.convert_model(path, str(to), _path(out, "out"), bool(force)))


def analyze(model, tokens=None, text=None, windows=8, seq_len=0, out=None, force=False, dtype="f32",
            convert_check=False, token_dtype=None):
    """A trained model under the microscope (``normlab analyze MODEL --tokens DIR``): forward passes
    over the first ``windows`` windows of ``seq_len`` tokens, returning analysis.json's fields as a
    dict (docs/analyze.md): loss; layers (per block act_max, act_max_channel, act_kurtosis,
    attn_sink and attn_entropy per query head, drop_delta_loss); norms (each norm weight's
    weight_max_abs, weight_mean_abs, weight_top_channels); convert_check with convert_check=True.

    model: a checkpoint file, a run directory, a Checkpoint, a transformers LLaMA, Qwen3 or OLMo 2
    directory or a GGUF file. tokens: a directory holding val.bin (its ids ``token_dtype``, "uint16"
    or "uint32"; None: meta.json's, else by the vocabulary's size); or text: a UTF-8 file for a model
    with a character tokenizer. seq_len 0: the model's context, at most 512. dtype: "f32", "bf16" or
    "f64". out: a directory to write analysis.json, plots.gp and the PNGs into (None: nothing
    written); an existing one is replaced only with force=True.
    """
    path = model.path if isinstance(model, Checkpoint) else _path(model, "model")
    return _ext.analyze(path, "" if tokens is None else _path(tokens, "tokens"),
                        "" if text is None else _path(text, "text"), "" if token_dtype is None else str(token_dtype),
                        int(windows), int(seq_len), str(dtype), bool(convert_check),
                        "" if out is None else _path(out, "out"), bool(force))


# ---- checkpoints ----

def load_checkpoint(path):
    """Loads a train checkpoint, or a run directory's latest one: a Checkpoint with ``model`` (a normlab
    Model on the CPU: forward(ids), named_parameters(), ...), ``config`` (the resolved config it was
    trained with, a dict), ``step``, ``vocab`` (a text model's characters in token order; None for a
    synthetic task), ``vocab_size``, ``context`` (the trained sequence length), ``path`` and
    ``decode(ids)``. normlab.Error naming the path when it is missing or not a train checkpoint."""
    return _ext.load_checkpoint(_path(path, "load_checkpoint"))


def save_checkpoint(path, model, step=None, metadata=None):
    """Writes a model's weights as a train checkpoint at ``path`` (safetensors, written atomically),
    which load_checkpoint and sample read.

    model: a Checkpoint, a TrainSession, or the Model of either; the file carries the config, trained
    sequence length and vocab the model came with. step: the step recorded (None: the checkpoint's or
    session's step, 0 for a bare Model). metadata: extra str -> str entries. No optimizer state is
    written, so the file cannot be resumed with ``train(resume=True)``.
    """
    if step is None:
        step = model.step if isinstance(model, Checkpoint) else model.last_step if isinstance(model, TrainSession) else 0
    if isinstance(model, (Checkpoint, TrainSession)):
        model = model.model
    if not isinstance(model, Model):
        raise Error(f"save_checkpoint: expected a Model, Checkpoint or TrainSession, found {type(model).__name__}")
    extra = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise Error(f"save_checkpoint: metadata must map str to str, found {key!r}: {value!r}")
        extra[key] = value
    _ext.save_checkpoint(_path(path, "save_checkpoint"), model, int(step), extra)
