#!/usr/bin/env python3
"""PyTorch side of examples/cli/bench_sweep.py: a normlab sweep config's runs, trained in PyTorch.

Reads the sweep config as `normlab sweep` does (base, grid, seeds, diverge_factor; docs/stability.md,
"Transformer sweeps"), the keys a config leaves out taken from `normlab config --defaults train`
(--normlab or --defaults), and trains every run of the grid: the Transformer of torch_bench.py (the
same model as normlab's layers/transformer.h, qk_norm none or head), the synthetic copy/reverse/sort
task of jobs/data.cpp (held-out prompts never drawn for training, the loss on the answer tokens
only), AdamW with linear warmup and cosine decay to min_lr (optim/schedule.cpp), global grad-norm
clipping and train.z_loss (PaLM's z * mean(logsumexp(logits)^2)). As normlab's sweep runs each run
(jobs/sweep.cpp, run_one): the held-out loss before any update, then steps until the end or until the
train loss is not finite or above diverge_factor x that loss, then the held-out loss again.

The runs go over --jobs worker processes (fork), each on one torch thread, like `normlab sweep --jobs N`
(threads, one OpenMP thread each). The weights come from torch's generator seeded with the run's seed,
so a run's losses are close to normlab's same run, not equal. CI never runs this script.

    python3 examples/cli/torch_sweep.py configs/bench_sweep.json --normlab build/normlab --jobs 2
"""
import argparse
import copy
import itertools
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402  (the same Transformer as `normlab bench torch`)

IGNORE_INDEX = -100  # jobs/data.h kIgnoreIndex, PyTorch's cross_entropy default


# ---- the sweep config, as jobs/sweep.cpp reads it ----

def merged(base, over):
    """`over` written onto a copy of `base`, objects key by key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def set_key(config, dotted, value):
    *parents, last = dotted.split(".")
    for name in parents:
        config = config.setdefault(name, {})
    config[last] = value


def read_sweep(path, defaults):
    """Every run's train config (defaults, then the base, then the run's grid values and seed) and its
    label, in normlab's run order: the seeds vary fastest, then the last grid key; and diverge_factor."""
    with open(path, encoding="utf-8") as f:
        sweep = json.load(f)  # Python keeps the file's key order: the grid's order, as normlab's
    base = sweep.get("base")
    if isinstance(base, str):
        with open(os.path.join(os.path.dirname(path), base), encoding="utf-8") as f:
            base = json.load(f)
    if not isinstance(base, dict):
        raise SystemExit(f"torch_sweep.py: {path}: /base: expected a train config object or file, found {base!r}")
    grid = sweep.get("grid", {})
    seeds = sweep.get("seeds", [0])
    runs = []
    for values in itertools.product(*grid.values()):
        for seed in seeds:
            config = merged(defaults, base)
            for key, value in zip(grid, values):
                set_key(config, key, value)
            config["seed"] = seed
            label = " ".join([f"{k}={v}" for k, v in zip(grid, values)] + [f"seed={seed}"])
            runs.append((label, config))
    return runs, sweep.get("diverge_factor", 3.0)


def model_args(config, where):
    """torch_bench.Transformer's arguments for a train config; what it cannot build is an error."""
    m, d = config["model"], config["data"]
    if d.get("source") != "synthetic" or d.get("task") not in ("copy", "reverse", "sort"):
        raise SystemExit(f"torch_sweep.py: {where}: /data: only the synthetic copy, reverse and sort tasks have a "
                         f"PyTorch twin here, found source {d.get('source')!r}, task {d.get('task')!r}")
    unsupported = {"norm_placement": ("pre", "post"), "norm_scaling": ("none",), "qk_norm": ("none", "head"),
                   "logit_softcap": (0.0,), "attn_softcap": (0.0,), "init_from": ("",)}
    for key, allowed in unsupported.items():
        if m.get(key, allowed[0]) not in allowed:
            raise SystemExit(f"torch_sweep.py: {where}: /model/{key}: expected one of {list(allowed)}, found "
                             f"{m.get(key)!r}")
    if config["train"].get("autocast", "none") != "none":
        raise SystemExit(f"torch_sweep.py: {where}: /train/autocast: only \"none\" is built here")
    norm = m.get("norm", {})  # eps: normlab's default for rmsnorm and layernorm (layers/norm_registry.cpp)
    return SimpleNamespace(vocab_size=d["symbols"] + 1, dim=m["dim"], n_layers=m["n_layers"], n_heads=m["n_heads"],
                           n_kv_heads=m.get("n_kv_heads", 0), multiple_of=m["multiple_of"],
                           ffn_hidden_dim=m.get("ffn_hidden_dim", 0), norm=norm.get("type", "rmsnorm"),
                           norm_eps=norm.get("eps", 1e-5), pre_norm=m.get("norm_placement", "pre") == "pre",
                           rope_theta=m.get("rope_theta", 10000.0), seq_len=2 * d["length"],
                           qk_norm=m.get("qk_norm", "none"))


# ---- the synthetic task (jobs/data.cpp SyntheticTask) ----

class SyntheticTask:
    def __init__(self, d, seed):
        self.task, self.length, self.symbols = d["task"], d["length"], d["symbols"]
        gen = torch.Generator().manual_seed(seed ^ 0x5EED)  # the held-out stream, apart from training's
        self.held_out, seen = [], set()
        while len(self.held_out) < d["eval_sequences"]:
            x = tuple(torch.randint(0, self.symbols, (self.length,), generator=gen).tolist())
            if x not in seen:
                seen.add(x)
                self.held_out.append(x)
        self.held_out_set = seen

    def batch(self, prompts):
        """inputs, targets (B, 2L): x1..xL SEP answer, shifted; only the answer's positions carry a loss."""
        rows = []
        for x in prompts:
            answer = list(reversed(x)) if self.task == "reverse" else sorted(x) if self.task == "sort" else list(x)
            rows.append(list(x) + [self.symbols] + answer)
        seq = torch.tensor(rows)  # (B, 2L + 1)
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        targets[:, :self.length] = IGNORE_INDEX  # position t predicts seq[t + 1]: scored from t + 1 >= L + 1
        return inputs, targets

    def train_batch(self, batch_size, gen):
        prompts = []
        while len(prompts) < batch_size:
            x = tuple(torch.randint(0, self.symbols, (self.length,), generator=gen).tolist())
            if x not in self.held_out_set:
                prompts.append(x)
        return self.batch(prompts)

    def eval_batches(self, batch_size):
        return [self.batch(self.held_out[i:i + batch_size]) for i in range(0, len(self.held_out), batch_size)]


# ---- one run (jobs/sweep.cpp run_one) ----

def lr_at(o, steps, step):
    """optim/schedule.cpp warmup_cosine at 0-based `step`."""
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    if step >= steps:
        return o["min_lr"]
    ratio = (step - o["warmup_steps"]) / (steps - o["warmup_steps"])
    return o["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (o["lr"] - o["min_lr"])


def losses(model, inputs, targets, vocab, z_loss):
    """The mean cross-entropy over the scored targets, and the PaLM z term over the same positions."""
    logits = model(inputs).reshape(-1, vocab)  # (B * T, V)
    flat = targets.reshape(-1)
    ce = F.cross_entropy(logits, flat, ignore_index=IGNORE_INDEX)
    if z_loss == 0:
        return ce, None
    z = torch.logsumexp(logits[flat != IGNORE_INDEX], dim=-1)
    return ce, z_loss * (z * z).mean()


@torch.no_grad()
def evaluate(model, eval_set, vocab):
    """The held-out loss: the mean over every scored target."""
    total, count = 0.0, 0
    for inputs, targets in eval_set:
        n = int((targets != IGNORE_INDEX).sum())
        total += F.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1),
                                 ignore_index=IGNORE_INDEX).item() * n
        count += n
    return total / count


def run_one(job):
    index, label, config, diverge_factor = job
    start = time.perf_counter()
    a = model_args(config, f"run {index} ({label})")
    o, t = config["optim"], config["train"]
    seed = config["seed"]
    torch.manual_seed(seed)
    model = torch_bench.Transformer(a)
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    data = SyntheticTask(config["data"], seed)
    eval_set = data.eval_batches(t["batch_size"])
    gen = torch.Generator().manual_seed(seed)
    init_loss = evaluate(model, eval_set, a.vocab_size)
    final_train, final_val, diverged_at = math.nan, math.nan, 0
    for step in range(1, t["steps"] + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(o, t["steps"], step - 1)
        inputs, targets = data.train_batch(t["batch_size"], gen)
        opt.zero_grad()
        ce, z = losses(model, inputs, targets, a.vocab_size, t["z_loss"])
        (ce if z is None else ce + z).backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        final_train = ce.item()
        if not math.isfinite(final_train) or final_train > diverge_factor * init_loss:
            diverged_at = step
            break
        if t["eval_every"] > 0 and step % t["eval_every"] == 0 and step < t["steps"]:
            evaluate(model, eval_set, a.vocab_size)  # the same work as normlab's periodic evaluation
    if diverged_at == 0:
        final_val = evaluate(model, eval_set, a.vocab_size)
    return {"index": index, "label": label, "init_loss": init_loss, "final_train_loss": final_train,
            "final_val_loss": final_val, "diverged": diverged_at > 0, "diverged_at_step": diverged_at,
            "seconds": time.perf_counter() - start}


def one_thread():
    torch.set_num_threads(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a normlab sweep config (configs/sweep.json's format)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, one process each on one torch thread")
    p.add_argument("--normlab", default="build/normlab", help="normlab, for `normlab config --defaults train`")
    p.add_argument("--defaults", help="a file with `normlab config --defaults train`'s output (instead of --normlab)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()
    if a.jobs < 1:
        raise SystemExit(f"torch_sweep.py: --jobs must be at least 1, found {a.jobs}")
    if a.defaults:
        with open(a.defaults, encoding="utf-8") as f:
            defaults = json.load(f)
    else:
        defaults = json.loads(subprocess.run([a.normlab, "config", "--defaults", "train"], check=True,
                                             capture_output=True, text=True).stdout)
    runs, diverge_factor = read_sweep(a.config, defaults)
    for i, (label, config) in enumerate(runs):
        model_args(config, f"run {i} ({label})")  # every run checked before any trains
    jobs = [(i, label, config, diverge_factor) for i, (label, config) in enumerate(runs)]
    one_thread()  # the parent too, so the forked workers start from one thread
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(a.jobs, initializer=one_thread) as pool:
        records = pool.map(run_one, jobs, chunksize=1)
    seconds = time.perf_counter() - start
    result = {"torch_version": torch.__version__, "jobs": a.jobs, "threads_per_run": 1, "seconds": seconds,
              "runs": records}
    if a.json:
        print(json.dumps(result))
        return
    print(f"PyTorch {torch.__version__}: {len(records)} runs, {a.jobs} at once, {seconds:.2f} s")
    for r in records:
        print(f"  {r['index']:3d}  {r['label']:<40} init {r['init_loss']:.4f}  train {r['final_train_loss']:.4f}  "
              f"val {r['final_val_loss']:.4f}{'  diverged at ' + str(r['diverged_at_step']) if r['diverged'] else ''}")


if __name__ == "__main__":
    main()
