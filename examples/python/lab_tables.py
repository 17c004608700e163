"""Markdown tables for the paper reproductions in docs/stability.md ("Reproducing the papers").

Reads the sweep directories that `normlab sweep configs/sweep_<paper>.json --out runs/lab_<paper>`
writes (runs.csv, summary.json, runs/<i>/probes.csv, runs/<i>/checkpoints/*.safetensors for the
parameter shapes) and prints one table per paper. Python standard library only.

    python3 examples/python/lab_tables.py runs            # every runs/lab_* sweep that exists
    python3 examples/python/lab_tables.py runs xiong dyt  # only these
"""

import csv
import glob
import json
import math
import os
import struct
import sys


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(value):
    """A runs.csv / probes.csv cell as a float (nan when empty)."""
    return float(value) if value not in ("", None) else math.nan


def mean(values):
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def fmt(x, digits=3):
    if isinstance(x, str):
        return x
    if x is None or math.isnan(x):
        return "-"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def group(rows, keys):
    """rows grouped by the values of `keys` (grid columns), in first-seen order."""
    groups = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def shapes(run_dir):
    """Parameter name -> numel, from the run's last checkpoint's safetensors header."""
    files = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors")))
    if not files:
        return {}
    with open(files[-1], "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 header size, then JSON header
        header = json.loads(f.read(length))
    return {name: math.prod(info["shape"]) for name, info in header.items()
            if name != "__metadata__" and not name.startswith("optim.")}


def probes_rows(sweep, index):
    path = os.path.join(sweep, "runs", str(index), "probes.csv")
    return read_csv(path) if os.path.exists(path) else []


# 1. Xiong et al. 2020: per-block gradient norm at initialization, Post-LN vs Pre-LN, by depth.
def xiong(sweep):
    rows = read_csv(os.path.join(sweep, "runs.csv"))
    numel = shapes(os.path.join(sweep, "runs", rows[-1]["index"]))  # the deepest model holds every name
    out = []
    for (placement, depth), runs in group(rows, ["model.norm_placement", "model.n_layers"]).items():
        depth = int(depth)
        # Block i's gradient norm: sqrt(sum over its params of grad_rms^2 * numel), at step 1
        # (the probes' gradient is the batch's, before clipping and before the first update).
        per_block = [[] for _ in range(depth)]
        last_w2 = []
        for run in runs:
            for i in range(depth):
                prefix = f"grad_rms.layers.{i}."
                total = sum(num(v) ** 2 * numel[k[len("grad_rms."):]] for k, v in run.items()
                            if k.startswith(prefix) and v != "")
                per_block[i].append(math.sqrt(total))
            w2 = f"layers.{depth - 1}.feed_forward.w2.weight"
            last_w2.append(num(run["grad_rms." + w2]) * math.sqrt(numel[w2]))
        norms = [mean(b) for b in per_block]
        out.append([placement, str(depth), norms[0], norms[depth // 2], norms[-1], norms[-1] / norms[0],
                    mean(last_w2), str(len(runs))])
    print("Gradient norm at initialization per block (mean over seeds):\n")
    print(table(["placement", "blocks", "block 0", "block L/2", "block L-1", "last / first",
                 "last block's w2 grad norm", "seeds"], out))


# 2. Kim et al. 2025 (Peri-LN), Sun et al. 2025 (LayerNorm Scaling): residual RMS by block.
def peri_lns(sweep):
    rows = read_csv(os.path.join(sweep, "runs.csv"))
    keys = ["model.norm_placement", "model.norm_scaling", "optim.lr"]
    out = []
    for (placement, scaling, lr), runs in group(rows, keys).items():
        blocks = sorted(int(k.split("block")[1]) for k in runs[0] if k.startswith("residual_rms.block"))
        rms = [mean([num(r[f"residual_rms.block{i}"]) for r in runs]) for i in blocks]
        # The same at the first probed step, to show the growth during training.
        first = [mean([num(probes_rows(sweep, r["index"])[0][f"residual_rms.block{i}"]) for r in runs])
                 for i in blocks]
        picks = [0, len(blocks) // 4, len(blocks) // 2, 3 * len(blocks) // 4, len(blocks) - 1]
        out.append([placement, scaling, lr] + [rms[i] for i in picks] + [rms[-1] / rms[0], first[-1],
                    mean([num(r["final_val_loss"]) for r in runs]),
                    f"{sum(int(r['diverged']) for r in runs)}/{len(runs)}"])
        steps = [runs[0]["probe_step"], probes_rows(sweep, runs[0]["index"])[0]["step"]]
    print(f"Residual-stream RMS after block i at step {steps[0]} (mean over seeds); "
          f"last block's also at step {steps[1]}:\n")
    print(table(["placement", "scaling", "lr"] + [f"block {i}" for i in picks] +
                ["last / first", f"last @ step {steps[1]}", "val loss", "diverged"], out))


def variant_lr_table(sweep, variant_keys, extra):
    """Per variant and learning rate: val loss (mean over seeds; diverged runs counted), and `extra`
    columns (name, function of the runs)."""
    rows = read_csv(os.path.join(sweep, "runs.csv"))
    for row in rows:
        row["_sweep"] = sweep  # where peak_over_training finds the run's probes.csv
    out = []
    for key, runs in group(rows, variant_keys + ["optim.lr"]).items():
        done = [r for r in runs if r["diverged"] == "0"]
        out.append(list(key) + [mean([num(r["final_val_loss"]) for r in done]),
                                f"{len(runs) - len(done)}/{len(runs)}"] + [f(runs) for _, f in extra])
    return table([k.split(".")[-1] for k in variant_keys] + ["lr", "val loss", "diverged"] +
                 [name for name, _ in extra], out)


def sensitivity_table(sweeps):
    out = []
    for sweep in sweeps:
        summary = json.load(open(os.path.join(sweep, "summary.json")))
        for v in summary["variants"]:
            grid = {k: v["grid"][k] for k in v["grid"] if len(set(
                w["grid"][k] for w in summary["variants"])) > 1 or k in ("model.norm.type",)}
            out.append([" ".join(f"{k.split('.')[-1]}={grid[k]}" for k in sorted(grid)), v["lr_sensitivity"],
                        v["best_lr"], v["best_val_loss"], v["divergence_rate"], v["init_loss"]])
    return table(["variant", "lr_sensitivity", "best_lr", "best val loss", "divergence rate", "L_init"], out)


def max_over(prefix):
    """Mean over seeds of the largest `prefix<i>` column over blocks, in the run's last probes row."""
    def f(runs):
        return mean([max((num(v) for k, v in r.items() if k.startswith(prefix) and v != ""),
                         default=math.nan) for r in runs])
    return f


def column(name):
    return lambda runs: mean([num(r[name]) for r in runs])


def peak_over_training(prefix):
    """Mean over seeds of the largest `prefix<i>` over blocks and over every probed step."""
    def f(runs):
        peaks = []
        for r in runs:
            sweep = r["_sweep"]
            peaks.append(max((num(v) for row in probes_rows(sweep, r["index"]) for k, v in row.items()
                              if k.startswith(prefix) and v != ""), default=math.nan))
        return mean(peaks)
    return f


# 3. Wortsman et al. 2023: loss vs lr without/with QK-norm and z-loss; attention logits; log Z.
def wortsman(sweep):
    print("Final val loss per learning rate (mean over the seeds that did not diverge), the largest "
          "attention score over blocks and over all probed steps, and the last probed logsumexp_mean:\n")
    print(variant_lr_table(sweep, ["model.qk_norm", "train.z_loss"],
                           [("max attn score", peak_over_training("attn_score_max.block")),
                            ("logsumexp_mean", column("logsumexp_mean"))]))
    print("\nLearning-rate sensitivity (summary.json):\n")
    print(sensitivity_table([sweep]))


# 4. Zhu et al. 2025 (DyT): loss vs lr against RMSNorm / LayerNorm; alpha against 1/RMS of its input.
def dyt(sweep, baselines):
    print("Final val loss per learning rate (mean over seeds that did not diverge):\n")
    print(variant_lr_table(sweep, ["model.norm.alpha_init"], []))
    have_baselines = os.path.exists(os.path.join(baselines, "runs.csv"))
    if have_baselines:
        print()
        print(variant_lr_table(baselines, ["model.norm.type"], []))
    print("\nLearning-rate sensitivity (summary.json):\n")
    print(sensitivity_table([sweep] + ([baselines] if have_baselines else [])))
    # alpha of block i's attention norm against 1 / residual_rms.block<i-1> (the residual stream
    # entering block i; RMS, not std: the same when the features' mean is 0), and the final norm's
    # alpha against 1 / residual_rms of the last block. Pearson correlation over norms x probed steps.
    rows = read_csv(os.path.join(sweep, "runs.csv"))
    out = []
    for (alpha_init, lr), runs in group(rows, ["model.norm.alpha_init", "optim.lr"]).items():
        corr, ratio_first, ratio_last = [], [], []
        for r in runs:
            probes = probes_rows(sweep, r["index"])
            if not probes:
                continue
            blocks = sorted(int(k.split("block")[1]) for k in probes[0] if k.startswith("residual_rms.block"))
            pairs_by_step = []
            for row in probes:
                pairs = [(num(row[f"dyt_alpha.layers.{i}.attention_norm"]), 1 / num(row[f"residual_rms.block{i - 1}"]))
                         for i in blocks[1:]]
                pairs.append((num(row["dyt_alpha.norm"]), 1 / num(row[f"residual_rms.block{blocks[-1]}"])))
                pairs_by_step.append(pairs)
            flat = [p for pairs in pairs_by_step for p in pairs]
            corr.append(pearson([a for a, _ in flat], [b for _, b in flat]))
            ratio_first.append(mean([a / b for a, b in pairs_by_step[0]]))
            ratio_last.append(mean([a / b for a, b in pairs_by_step[-1]]))
        out.append([alpha_init, lr, mean(corr), mean(ratio_first), mean(ratio_last)])
    print("\nDyT alpha against 1/RMS of the norm's input (attention norms of blocks 1..L-1 and the final "
          "norm; Pearson r over norms x probed steps; alpha / (1/RMS) averaged over those norms at the "
          "first and the last probed step; mean over seeds):\n")
    print(table(["alpha_init", "lr", "r(alpha, 1/rms)", "alpha*rms first probe", "alpha*rms last probe"], out))


def pearson(x, y):
    mx, my = mean(x), mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


# 5. Wang et al. 2022 (DeepNet): Post-LN vs DeepNorm by depth: which diverge.
def deepnet(sweep):
    rows = read_csv(os.path.join(sweep, "runs.csv"))
    out = []
    for (placement, depth, lr), runs in group(rows, ["model.norm_placement", "model.n_layers", "optim.lr"]).items():
        done = [r for r in runs if r["diverged"] == "0"]
        at = [r["diverged_at_step"] for r in runs if r["diverged"] == "1"]
        # A run can fail without passing diverge_factor: its train loss climbs back and stalls.
        # metrics.csv per step: the lowest train loss (and its step) and the largest gradient norm.
        lowest, lowest_step, peak_grad = [], [], []
        for r in runs:
            metrics = read_csv(os.path.join(sweep, "runs", r["index"], "metrics.csv"))
            best = min(metrics, key=lambda m: num(m["train_loss"]))
            lowest.append(num(best["train_loss"]))
            lowest_step.append(num(best["step"]))
            peak_grad.append(max(num(m["grad_norm"]) for m in metrics))
        out.append([placement, depth, lr, mean([num(r["final_val_loss"]) for r in done]),
                    f"{len(runs) - len(done)}/{len(runs)}", ",".join(at) or "-",
                    mean([num(r["init_loss"]) for r in runs]), mean(lowest), mean(lowest_step), mean(peak_grad)])
    print("Post-LN vs DeepNorm by depth:\n")
    print(table(["placement", "blocks", "lr", "val loss", "diverged", "at step", "L_init", "lowest train loss",
                 "at step", "max grad norm"], out))


PAPERS = {
    "xiong": ("lab_xiong_grad_init", lambda root, d: xiong(d)),
    "peri_lns": ("lab_peri_lns", lambda root, d: peri_lns(d)),
    "wortsman": ("lab_wortsman_qk_zloss", lambda root, d: wortsman(d)),
    "dyt": ("lab_dyt", lambda root, d: dyt(d, os.path.join(root, "lab_dyt_baselines"))),
    "deepnet": ("lab_deepnet", lambda root, d: deepnet(d)),
}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "runs"
    wanted = sys.argv[2:] or list(PAPERS)
    for name in wanted:
        folder, show = PAPERS[name]
        sweep = os.path.join(root, folder)
        print(f"## {name} ({sweep})\n")
        if not os.path.exists(os.path.join(sweep, "runs.csv")):
            print("not run\n")
            continue
        show(root, sweep)
        print()


if __name__ == "__main__":
    main()
