#!/usr/bin/env python3
"""Sweep benchmark: `normlab sweep` against the same sweep in PyTorch, side by side in one run.

For a sweep config (default configs/bench_sweep.json: 2 qk_norm x 2 learning rates x 2 seeds of the toy
transformer on the reversal task), each round times, as whole commands (start-up included):
  normlab  --jobs N     build/normlab sweep CONFIG --jobs N   (N runs at once, threads, one OpenMP thread each)
  PyTorch  --jobs N     examples/cli/torch_sweep.py CONFIG --jobs N   (N processes, one torch thread each)
  normlab  --jobs 1
  PyTorch  --jobs 1     (with --torch-jobs1: PyTorch's own scaling, to tell the machine from the runner)
The order rotates from round to round, so a load that comes and goes on a shared machine lands on every
side. Each round gives the ratios PyTorch / normlab (above 1: normlab is faster) and normlab --jobs 1 /
--jobs N; the medians over the rounds are printed with their [min, max], beside each command's CPU
seconds (CPU / wall: the cores it got from a shared machine). --skip-torch times normlab alone; where
--python cannot import torch, the PyTorch side is skipped and the reason printed. The first round also checks that
both sides trained the same thing: per run, the held-out loss before training and after it, normlab's
(runs.csv) next to PyTorch's (different initial weights: close, not equal). Needs torch (--python); CI
does not run it.

    python3 examples/cli/bench_sweep.py [--normlab build/normlab] [--python python3] [--jobs 2] [--rounds 5]
"""
import argparse
import csv
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


CPU = {}  # command line -> CPU seconds (user + system) of its last run, for run()'s caller


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(command):
    """Runs a command; returns its wall seconds and stdout, and leaves its CPU seconds in CPU. A failure ends
    the benchmark with its output."""
    cpu = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    CPU[" ".join(command)] = children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"bench_sweep.py: {' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return seconds, done.stdout


def cell(values, fmt="{:.2f}"):
    """"median [min, max]" of per-round values."""
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def normlab_losses(sweep_dir):
    """runs.csv's losses per run index: (init, final val)."""
    with open(os.path.join(sweep_dir, "runs.csv"), encoding="utf-8") as f:
        return {int(r["index"]): (float(r["init_loss"]), float(r["final_val_loss"] or "nan")) for r in csv.DictReader(f)}


def print_losses(normlab_dir, torch_json):
    ours = normlab_losses(normlab_dir)
    print("the same runs, trained by both (held-out loss before and after training; different initial weights):")
    print(f"  {'run':<44} {'init normlab':>12} {'init torch':>11} {'final normlab':>14} {'final torch':>12}")
    for r in torch_json["runs"]:
        init, final = ours[r["index"]]
        print(f"  {r['index']:>2} {r['label']:<41} {init:12.4f} {r['init_loss']:11.4f} {final:14.4f} "
              f"{r['final_val_loss']:12.4f}")
    finals = [(ours[r["index"]][1], r["final_val_loss"]) for r in torch_json["runs"]]
    finals = [(a, b) for a, b in finals if math.isfinite(a) and math.isfinite(b)]
    if finals:
        mean_ours = statistics.mean(a for a, _ in finals)
        mean_torch = statistics.mean(b for _, b in finals)
        print(f"  mean final held-out loss over the {len(finals)} runs that finished on both sides: normlab "
              f"{mean_ours:.4f}, PyTorch {mean_torch:.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/bench_sweep.json", help="a normlab sweep config")
    p.add_argument("--normlab", default="build/normlab")
    p.add_argument("--python", default="python3", help="a Python with torch, for torch_sweep.py")
    p.add_argument("--jobs", type=int, default=2, help="runs at once on both sides (compared with --jobs 1)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--torch-jobs1", action="store_true", help="also time PyTorch with --jobs 1 each round")
    p.add_argument("--skip-torch", action="store_true", help="time normlab only (--jobs N against --jobs 1)")
    a = p.parse_args()
    if a.rounds < 1 or a.jobs < 2:
        raise SystemExit(f"bench_sweep.py: --rounds must be at least 1 and --jobs at least 2, found {a.rounds}, {a.jobs}")

    work = tempfile.mkdtemp(prefix="normlab-bench-sweep-")
    defaults = os.path.join(work, "defaults.json")
    with open(defaults, "w", encoding="utf-8") as f:
        f.write(run([a.normlab, "config", "--defaults", "train"])[1])
    torch_script = os.path.join(HERE, "torch_sweep.py")
    why = "--skip-torch was given" if a.skip_torch else None  # why the PyTorch side is skipped
    if why is None:
        probe = subprocess.run([a.python, "-c", "import torch"], capture_output=True, text=True)
        if probe.returncode != 0:
            why = f"`{a.python} -c 'import torch'` failed: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"

    cpu = {}  # side -> (rounds,) CPU seconds of its command: over the wall seconds, the cores it kept busy

    def normlab(jobs):
        out = os.path.join(work, f"normlab-jobs{jobs}")
        command = [a.normlab, "sweep", a.config, "--out", out, "--force", "--jobs", str(jobs), "--quiet"]
        seconds = run(command)[0]
        cpu.setdefault(("normlab", jobs), []).append(CPU[" ".join(command)])
        return seconds, out

    def torch(jobs):
        command = [a.python, torch_script, a.config, "--defaults", defaults, "--jobs", str(jobs), "--json"]
        seconds, stdout = run(command)
        cpu.setdefault(("torch", jobs), []).append(CPU[" ".join(command)])
        return seconds, json.loads(stdout.strip().splitlines()[-1])

    sides = [("normlab", a.jobs), ("torch", a.jobs), ("normlab", 1)] + ([("torch", 1)] if a.torch_jobs1 else [])
    if why is not None:
        sides = [side for side in sides if side[0] == "normlab"]
    times = {side: [] for side in sides}  # (rounds,) wall seconds per side
    torch_inner = []                      # (rounds,) PyTorch --jobs N's own time, without its start-up
    print(f"bench_sweep: {a.config}, {a.rounds} rounds of {', '.join(f'{n} --jobs {j}' for n, j in sides)} "
          f"(the order rotates each round); wall seconds of each command; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    for r in range(a.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        line = []
        for side in order:
            name, jobs = side
            if name == "normlab":
                seconds, out = normlab(jobs)
                if r == 0 and jobs == a.jobs:
                    first_normlab_dir = out
            else:
                seconds, result = torch(jobs)
                if jobs == a.jobs:
                    torch_inner.append(result["seconds"])
                    if r == 0:
                        first_torch = result
                        torch_version = result["torch_version"]
            times[side].append(seconds)
            line.append(f"{name} --jobs {jobs}: {seconds:6.2f} s ({cpu[side][-1] / seconds:.2f} cores)")
        print(f"  round {r + 1}: " + "   ".join(line), flush=True)
        if r == 0 and why is None:
            print_losses(first_normlab_dir, first_torch)

    N = a.jobs
    scaling = [one / many for one, many in zip(times[("normlab", 1)], times[("normlab", N)])]
    print(f"\nmedian [min, max] over {a.rounds} rounds ({'PyTorch ' + torch_version if why is None else 'normlab only'}; "
          f"load average {os.getloadavg()[0]:.1f} at the end):")
    for side in sides:
        busy = [c / t for c, t in zip(cpu[side], times[side])]
        print(f"  {side[0]:<8} --jobs {side[1]}: {cell(times[side])} s, CPU {cell(cpu[side])} s, "
              f"cores busy (CPU / wall) {cell(busy)}")
    if why is None:
        vs_torch = [t / n for t, n in zip(times[("torch", N)], times[("normlab", N)])]
        print(f"  PyTorch's --jobs {N} inside its script (without Python's and torch's start-up): {cell(torch_inner)} s")
        print(f"  PyTorch / normlab, --jobs {N} each:     {cell(vs_torch)}   (target >= 1.5)")
    print(f"  normlab --jobs 1 / --jobs {N}:          {cell(scaling)}   (target >= 1.8 for --jobs 2 on 2 free cores)")
    # CPU seconds do not depend on how much of the machine the other tenants leave: the work each side did.
    if why is None:
        cpu_vs_torch = [t / n for t, n in zip(cpu[("torch", N)], cpu[("normlab", N)])]
        print(f"  CPU seconds, PyTorch / normlab, --jobs {N} each: {cell(cpu_vs_torch)}")
    cpu_overhead = [many / one for many, one in zip(cpu[("normlab", N)], cpu[("normlab", 1)])]
    print(f"  CPU seconds, normlab --jobs {N} / --jobs 1: {cell(cpu_overhead)}   (1: running side by side costs "
          f"no extra work)")
    if a.torch_jobs1 and why is None:
        torch_scaling = [one / many for one, many in zip(times[("torch", 1)], times[("torch", N)])]
        print(f"  PyTorch --jobs 1 / --jobs {N}:          {cell(torch_scaling)}   (the machine's own scaling)")
    if why is not None:
        print(f"PyTorch side skipped: {why}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
