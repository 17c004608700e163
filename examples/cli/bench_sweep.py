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


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method;
    Press et al., Numerical Recipes, 3rd ed., section 6.4)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile_975(df):
    """The 97.5% quantile of Student's t with df degrees of freedom (bisection on t_two_sided_p = 0.05)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 0.05 else (lo, mid)
    return 0.5 * (lo + hi)


def mean_ci95(values):
    """(mean, lo, hi): the mean and its Student-t 95% interval (nan interval for fewer than 2 values)."""
    n = len(values)
    mean = statistics.mean(values)
    if n < 2:
        return mean, math.nan, math.nan
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def welch(a, b):
    """Welch's two-sample t-test (unequal variances): (t, Welch-Satterthwaite df, two-sided p)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:
        return 0.0, math.inf, 1.0
    t = (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return t, df, t_two_sided_p(t, df)


def print_losses(normlab_dir, torch_json):
    """Per run, both sides' held-out losses; then per grid point (the runs that differ only by seed) the
    mean held-out loss at initialization and at the end with Student-t 95% intervals, and Welch's test of
    the final losses (normlab against PyTorch). Diverged runs (no final loss) are counted and left out."""
    ours = normlab_losses(normlab_dir)
    print("the same runs, trained by both (held-out loss before and after training; different initial weights):")
    print(f"  {'run':<44} {'init normlab':>12} {'init torch':>11} {'final normlab':>14} {'final torch':>12}")
    points = {}  # grid point label -> {"normlab": [(init, final)], "torch": [...]}
    for r in torch_json["runs"]:
        init, final = ours[r["index"]]
        print(f"  {r['index']:>2} {r['label']:<41} {init:12.4f} {r['init_loss']:11.4f} {final:14.4f} "
              f"{r['final_val_loss']:12.4f}")
        point = points.setdefault(r["label"].rsplit(" seed=", 1)[0], {"normlab": [], "torch": []})
        point["normlab"].append((init, final))
        point["torch"].append((r["init_loss"], r["final_val_loss"]))
    finals = [(ours[r["index"]][1], r["final_val_loss"]) for r in torch_json["runs"]]
    finals = [(a, b) for a, b in finals if math.isfinite(a) and math.isfinite(b)]
    if finals:
        mean_ours = statistics.mean(a for a, _ in finals)
        mean_torch = statistics.mean(b for _, b in finals)
        print(f"  mean final held-out loss over the {len(finals)} runs that finished on both sides: normlab "
              f"{mean_ours:.4f}, PyTorch {mean_torch:.4f}")
    print("per grid point: mean held-out loss [95% interval, Student t over the seeds]; Welch's t-test of the "
          "initial and final losses, normlab against PyTorch (p < 0.05: the two differ at the 5% level)")
    print(f"  {'grid point':<32} {'side':<8} {'seeds':>5} {'init':>26} {'final':>26} {'diverged':>8}")

    def interval(values):
        mean, lo, hi = mean_ci95(values)
        return f"{mean:.4f} [{lo:.4f}, {hi:.4f}]"

    for label, sides in points.items():
        finished = {}
        for side in ("normlab", "torch"):
            runs = sides[side]
            inits = [i for i, _ in runs]
            finished[side] = [f for _, f in runs if math.isfinite(f)]
            print(f"  {label:<32} {side:<8} {len(runs):>5} {interval(inits):>26} "
                  f"{interval(finished[side]) if len(finished[side]) > 1 else 'n/a':>26} "
                  f"{len(runs) - len(finished[side]):>8}")
        tests = [("init", [i for i, _ in sides["normlab"]], [i for i, _ in sides["torch"]]),
                 ("final", finished["normlab"], finished["torch"])]
        for name, ours_side, torch_side in tests:
            if min(len(ours_side), len(torch_side)) < 2:
                continue
            t, df, p = welch(ours_side, torch_side)
            diff = statistics.mean(ours_side) - statistics.mean(torch_side)
            print(f"  {label:<32} normlab - PyTorch {name}: {diff:+.4f}; Welch t = {t:.2f}, df = {df:.1f}, "
                  f"p = {p:.3f} ({'differ' if p < 0.05 else 'no difference'} at the 5% level)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/bench_sweep.json", help="a normlab sweep config")
    p.add_argument("--normlab", default="build/normlab")
    p.add_argument("--python", default="python3", help="a Python with torch, for torch_sweep.py")
    p.add_argument("--jobs", type=int, default=2, help="runs at once on both sides (compared with --jobs 1)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--torch-jobs1", action="store_true", help="also time PyTorch with --jobs 1 each round")
    p.add_argument("--skip-torch", action="store_true", help="time normlab only (--jobs N against --jobs 1)")
    p.add_argument("--seeds", type=int, default=0,
                   help="train seeds 0..N-1 instead of the config's (per grid point statistics need several)")
    a = p.parse_args()
    if a.rounds < 1 or a.jobs < 2:
        raise SystemExit(f"bench_sweep.py: --rounds must be at least 1 and --jobs at least 2, found {a.rounds}, {a.jobs}")

    work = tempfile.mkdtemp(prefix="normlab-bench-sweep-")
    if a.seeds > 0:  # the config with its seeds replaced, beside the original so a relative /base still resolves
        with open(a.config, encoding="utf-8") as f:
            sweep = json.load(f)
        if isinstance(sweep.get("base"), str):
            sweep["base"] = os.path.abspath(os.path.join(os.path.dirname(a.config), sweep["base"]))
        sweep["seeds"] = list(range(a.seeds))
        sweep.pop("$schema", None)
        a.config = os.path.join(work, "sweep.json")
        with open(a.config, "w", encoding="utf-8") as f:
            json.dump(sweep, f)
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
