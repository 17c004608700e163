#!/usr/bin/env python3
"""Data-parallel benchmark: normlab over MPI ranks vs PyTorch DDP, same model and global batch, one run.

For each config (the toy transformer, configs/char_text.json's model), on this machine:
  normlab  1 rank  x 1 thread      build/normlab train CONFIG
  normlab  1 rank  x 2 threads
  normlab  2 ranks x 1 thread      mpirun -np 2 build/normlab train CONFIG  (buckets overlapped with backward)
  normlab  2 ranks x 1 thread      the same with train.overlap_comm=false (all buckets sent after backward)
  PyTorch  1 process x 2 threads   examples/cli/torch_ddp_bench.py
  PyTorch  2 processes x 1 thread  torchrun ... DDP, gloo
and prints the median step times, the ratio PyTorch DDP / normlab DDP (above 1: normlab is faster),
the scaling efficiency of 2 ranks (the 1-thread step time over twice the 2-rank step time) and the
share of normlab's step spent blocked on communication after backward, with and without overlap.
normlab's steps are timed by `normlab train` itself (summary.json: median_step_seconds, comm_wait_seconds);
PyTorch runs the same Transformer class as `normlab bench torch` (torch_bench.py) on random tokens of the
same vocabulary and shape. Needs mpirun, torch and torchrun; CI does not run it.

    python3 examples/cli/bench_ddp.py [--normlab build/normlab] [--steps 30]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model_args(config, config_path):
    """torch_ddp_bench.py's arguments for the model, batch and sequence length of a normlab train config
    (a relative data.path is read from the config file's folder, as normlab does)."""
    model, data, train = config.get("model", {}), config.get("data", {}), config.get("train", {})
    if data.get("source", "synthetic") == "text":
        with open(os.path.join(os.path.dirname(config_path), data["path"]), encoding="utf-8") as f:
            vocab = len(set(f.read()))
        seq_len = data.get("seq_len", 64)
    else:
        task, length = data.get("task", "reverse"), data.get("length", 8)
        vocab = 12 if task == "add" else data.get("symbols", 10) + 1
        seq_len = 3 * length + 2 if task == "add" else 2 * length  # normlab's data_seq_len
    args = {"vocab-size": vocab, "dim": model.get("dim", 64), "n-layers": model.get("n_layers", 2),
            "n-heads": model.get("n_heads", 4), "n-kv-heads": model.get("n_kv_heads", 0),
            "multiple-of": model.get("multiple_of", 256), "ffn-hidden-dim": model.get("ffn_hidden_dim", 0),
            "norm": model.get("norm", {}).get("type", "rmsnorm"), "seq-len": seq_len,
            "batch": train.get("batch_size", 64)}
    return [f"--{k}={v}" for k, v in args.items()]


def run(command, env_extra):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", **env_extra)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_ddp.py: {' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def normlab(binary, config_path, ranks, threads, steps, workdir, extra=()):
    out = os.path.join(workdir, f"r{ranks}t{threads}{'-'.join(extra).replace('=', '')}")
    cmd = [binary, "train", config_path, "--quiet", "--force", "--out", out, f"--set=train.steps={steps}",
           "--set=optim.warmup_steps=1", "--set=train.eval_every=0", "--set=train.checkpoint_every=0",
           "--set=data.eval_sequences=8"] + [f"--set={e}" for e in extra]
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS",
               "-x", "OMP_WAIT_POLICY", "--bind-to", "none"] + cmd
    run(cmd, {"OMP_NUM_THREADS": str(threads)})
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {"step_s": s["median_step_seconds"], "comm_share": s["comm_wait_seconds"] / s["train_seconds"]}


def torch_ddp(args, processes, threads, steps):
    script = os.path.join(HERE, "torch_ddp_bench.py")
    tail = [f"--threads={threads}", f"--steps={steps}"] + args
    if processes == 1:
        cmd = [sys.executable, script] + tail
    else:
        cmd = [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc_per_node={processes}", script] + tail
    lines = [l for l in run(cmd, {"OMP_NUM_THREADS": str(threads)}).splitlines() if l.startswith("{")]
    r = json.loads(lines[-1])
    return {"step_s": r["median_step_s"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--normlab", default=os.path.join(ROOT, "build", "normlab"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--configs", nargs="+",
                   default=[os.path.join(ROOT, "configs", c) for c in ("toy_transformer.json", "char_text.json")])
    a = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="normlab-bench-ddp-")
    for config_path in a.configs:
        with open(config_path) as f:
            config = json.load(f)
        args = model_args(config, config_path)
        r = {
            "normlab 1 rank x 1 thread": normlab(a.normlab, config_path, 1, 1, a.steps, workdir),
            "normlab 1 rank x 2 threads": normlab(a.normlab, config_path, 1, 2, a.steps, workdir),
            "normlab 2 ranks x 1 thread": normlab(a.normlab, config_path, 2, 1, a.steps, workdir),
            "normlab 2 ranks x 1 thread, no overlap": normlab(a.normlab, config_path, 2, 1, a.steps, workdir,
                                                               ("train.overlap_comm=false",)),
            "PyTorch 1 process x 2 threads": torch_ddp(args, 1, 2, a.steps),
            "PyTorch DDP 2 processes x 1 thread": torch_ddp(args, 2, 1, a.steps),
        }
        print(f"\n{os.path.basename(config_path)}: global batch {config.get('train', {}).get('batch_size', 64)}, "
              f"{a.steps} steps, median step time")
        for name, v in r.items():
            share = f"   blocked on communication {100 * v['comm_share']:.1f}% of the step" if "comm_share" in v and "2 ranks" in name else ""
            print(f"  {name:<40} {1e3 * v['step_s']:9.2f} ms{share}")
        ddp = r["normlab 2 ranks x 1 thread"]["step_s"]
        print(f"  PyTorch DDP / normlab DDP step time: {r['PyTorch DDP 2 processes x 1 thread']['step_s'] / ddp:.2f}"
              f" (above 1: normlab faster)")
        print(f"  scaling efficiency, 2 ranks vs 1 rank x 1 thread: {r['normlab 1 rank x 1 thread']['step_s'] / (2 * ddp):.2f}"
              f"; 2 ranks x 1 thread vs 1 rank x 2 threads: {r['normlab 1 rank x 2 threads']['step_s'] / ddp:.2f}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
