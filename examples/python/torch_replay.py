#!/usr/bin/env python3
"""Replays a normlab train run in PyTorch float64, step for step, and says how far the two differ.

A run made with `train.save_initial: true` and `train.save_batches: true` holds everything the
training loop consumed: config.json (every key resolved), the initial weights
(checkpoints/step_00000000.safetensors), every step's batch (batches.safetensors: int64 inputs and
targets [steps, batch, T], targets -100 where the loss ignores a position) and what normlab measured
(metrics.csv: lr, train_loss, grad_norm and z_loss of every step). This script rebuilds the model in
PyTorch (torch_model.py: its own LLaMA-style modules, every norm type, placement, QK-norm, DyT,
soft-cap and GQA the train job builds), loads the initial weights, and trains it on the same batches
with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and the schedule of docs/configs.md (linear
warmup from lr / warmup_steps, cosine to min_lr at train.steps):

    loss = F.cross_entropy(logits, targets, ignore_index=-100) + z_loss * mean(logsumexp(logits)^2)

over the scored positions; optim.decay "matrices" puts the parameters of fewer than two dimensions
in a group with weight_decay 0, and weight_decay_mode "independent" gives the decayed group
weight_decay / lr (so torch's p *= 1 - lr_t * wd is p *= 1 - wd * lr_t / lr).

It prints, per step, normlab's and PyTorch's lr, train loss and grad norm, with the relative
differences of the last two, then the worst relative difference of each, and the final weights' largest difference
(against the run's last checkpoint, relative to each tensor's largest |value|). Where the run wrote
probes.csv (train.probe_every), every probed step's probes are recomputed in PyTorch (torch_model.py's
ActivationProbes and parameter_probes: forward hooks, the gradient before clipping, the weights around
the update) and the worst relative difference of each probe is printed. Where probes.csv has the
sharpness columns (train.sharpness_every), the Hessian of each such step's objective (the loss above,
weights before the update) is built whole, one double backward per row (models of at most 5,000
parameters), and its largest eigenvalue, plain and preconditioned by AdamW's second moments after
the step (P = sqrt(v_hat) + eps), is taken by torch.linalg.eigvalsh: exact values that normlab's
Lanczos estimates are held to. It exits 1 when the
worst relative loss or probe difference exceeds --tol (default 1e-9 for an f64 run, where both sides compute
in float64; an f32 run replayed in float64 shows the f32 run's drift, so give it a --tol of your
own), 2 for a run directory it cannot replay.

    python3 examples/python/torch_replay.py RUN_DIR [--steps N] [--tol X] [--every K] [--json OUT]

Needs torch and safetensors (pip install torch safetensors). Runs on one CPU thread.
"""
import argparse
import csv
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

IGNORE_INDEX = -100  # jobs/data.h kIgnoreIndex, PyTorch's cross_entropy default
OPTIM_PREFIX = "optim."  # layers/checkpoint.h kCheckpointOptimPrefix: the optimizer's tensors


class ReplayError(Exception):
    """A run directory that cannot be replayed: the message says what is missing and how to make it."""


def lr_at(optim, steps, step):
    """optim/schedule.cpp LrSchedule::lr_at for warmup_cosine: step counts from 0."""
    lr, warmup, min_lr = optim["lr"], optim["warmup_steps"], optim["min_lr"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= steps:
        return min_lr
    ratio = (step - warmup) / (steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def param_groups(model, optim):
    """torch.optim.AdamW's groups for optim.decay and optim.weight_decay_mode (jobs/train_config.cpp
    parameter_weight_decay): the decayed parameters, and with decay "matrices" the others at 0."""
    decay = optim["weight_decay"]
    if optim.get("weight_decay_mode", "lr") == "independent":
        decay = decay / optim["lr"] if optim["lr"] > 0 else 0.0
    if optim.get("decay", "all") == "all":
        return [{"params": list(model.parameters()), "weight_decay": decay}]
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": decay}, {"params": others, "weight_decay": 0.0}]


def read_metrics(path):
    with open(path, newline="") as f:
        return {int(row["step"]): row for row in csv.DictReader(f)}


def required_file(run_dir, name, how):
    path = os.path.join(run_dir, name)
    if not os.path.isfile(path):
        raise ReplayError(f"{path}: missing; {how}")
    return path


def relative(a, b):
    """|a - b| / |b| (0 when both are 0, or both NaN: a probe normlab writes NaN for, as PyTorch does)."""
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def read_probes(run_dir):
    """probes.csv's rows by step ({} when the run has no probes: train.probe_every 0)."""
    path = os.path.join(run_dir, "probes.csv")
    if not os.path.isfile(path):
        return {}
    with open(path, newline="") as f:
        # An empty cell is a probe not measured at that step (probe_every and sharpness_every differ): NaN.
        return {int(row["step"]): {k: float(v) if v != "" else math.nan for k, v in row.items() if k != "step"}
                for row in csv.DictReader(f)}


# probes.csv's sharpness columns (jobs/sharpness.h), exact here: the eigenvalues of the whole Hessian.
SHARPNESS_COLUMNS = ("sharpness", "sharpness_adam", "sharpness_adam_threshold")

# A parameter whose gradient RMS is below this fraction of the step's largest has a gradient that is
# rounding noise, 0 in exact arithmetic (a post-norm ScaleNorm's g in front of the final ScaleNorm,
# whose output does not depend on it), which no two programs round alike: its grad_rms is compared
# against the floor rather than itself, and its update_ratio (AdamW's weight decay plus that noise
# divided by eps) is not compared. The replay says which it set aside.
GRAD_RMS_FLOOR = 1e-6


def compare_probes(normlab_row, torch_probes, step):
    """({column: relative difference} over probes.csv's columns, [noise-gradient parameters]); a
    column PyTorch has no formula for is an error (the replay would otherwise pass by skipping it)."""
    missing = sorted(set(normlab_row) - set(torch_probes))
    if missing:
        raise ReplayError(f"probes.csv step {step}: no PyTorch formula for the columns {missing[:4]}")
    floor = GRAD_RMS_FLOOR * max([v for c, v in torch_probes.items() if c.startswith("grad_rms.")] or [0.0])
    noise = [c[len("grad_rms."):] for c, v in torch_probes.items() if c.startswith("grad_rms.") and abs(v) < floor]
    out = {}
    for column, value in normlab_row.items():
        reference = torch_probes[column]
        if column.startswith("grad_rms.") and abs(reference) < floor:
            out[column] = abs(value - reference) / floor
        elif not (column.startswith("update_ratio.") and column[len("update_ratio."):] in noise):
            out[column] = relative(value, reference)
    return out, noise


def replay(run_dir, steps=None, tol=None, every=1, out=print):
    """Replays the run; returns a dict with per-step records and the worst differences."""
    config_path = required_file(run_dir, "config.json", "not a normlab train run directory")
    with open(config_path) as f:
        config = json.load(f)
    initial_path = required_file(run_dir, os.path.join("checkpoints", "step_00000000.safetensors"),
                                 "train the run again with --set train.save_initial=true")
    batches_path = required_file(run_dir, "batches.safetensors", "train the run again with --set train.save_batches=true")
    metrics = read_metrics(required_file(run_dir, "metrics.csv", "the run has not trained a step"))
    probes = read_probes(run_dir)
    train, optim, model_keys = config["train"], config["optim"], config["model"]
    if train.get("grad_shards", 0) > 1:
        raise ReplayError(f"{config_path}: /train/grad_shards {train['grad_shards']}: the replay computes one "
                          "gradient over the whole batch; replay a run with one shard")

    import torch  # after the checks: a run that cannot be replayed is refused without torch
    import torch.nn.functional as F
    from safetensors.torch import load_file

    import torch_model

    torch.set_num_threads(1)

    initial = {name: t for name, t in load_file(initial_path).items() if not name.startswith(OPTIM_PREFIX)}
    batches = load_file(batches_path)
    inputs, targets = batches["inputs"], batches["targets"]  # (steps, B, T) int64
    total = inputs.shape[0]
    steps = total if steps is None else min(steps, total)
    steps = min(steps, max(metrics))
    vocab = initial["tok_embeddings.weight"].shape[0]
    model, freqs_cis, _ = torch_model.model_from_config(model_keys, vocab)
    model = model.double()
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in initial.items()}, strict=False)
    if missing or unexpected:
        raise ReplayError(f"{initial_path}: its weights do not fit the model config.json describes (missing "
                          f"{missing[:4]}, unexpected {unexpected[:4]})")
    z_loss = train.get("z_loss", 0.0)
    optimizer = torch.optim.AdamW(param_groups(model, optim), lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]),
                                  eps=optim["eps"])
    T = inputs.shape[2]
    mask = torch_model.causal_mask(T).double()
    freqs = freqs_cis[:T]

    def objective(m, x, y):
        """The loss a step differentiates: cross-entropy plus the z-loss term over the scored positions."""
        logits = m(x, freqs, mask).reshape(-1, vocab)
        loss = F.cross_entropy(logits, y.reshape(-1), ignore_index=IGNORE_INDEX)
        if z_loss > 0:
            loss = loss + z_loss * (torch.logsumexp(logits, -1)[y.reshape(-1) != IGNORE_INDEX] ** 2).mean()
        return loss

    if any("sharpness" in row for row in probes.values()):
        n = sum(p.numel() for p in model.parameters())
        if n > torch_model.HESSIAN_MAX_PARAMETERS:
            raise ReplayError(f"{run_dir}/probes.csv has sharpness columns, and the model has {n} parameters, above "
                              f"the {torch_model.HESSIAN_MAX_PARAMETERS} whose Hessian the replay builds whole; replay "
                              "a smaller model, or a run without train.sharpness_every")
    clip = optim["grad_clip"]
    params = list(model.parameters())
    records = []
    out(f"{'step':>5} {'normlab lr':>12} {'torch lr':>12} {'normlab loss':>22} {'torch loss':>22} {'rel diff':>9} "
        f"{'normlab |g|':>14} {'torch |g|':>14} {'rel diff':>9}")
    for step in range(1, steps + 1):
        lr = lr_at(optim, train["steps"], step - 1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        probed = step in probes
        with torch_model.ActivationProbes(model) as activations:
            logits = model(inputs[step - 1], freqs, mask)  # (B, T, V)
        flat, y = logits.reshape(-1, logits.shape[-1]), targets[step - 1].reshape(-1)
        cross_entropy = F.cross_entropy(flat, y, ignore_index=IGNORE_INDEX)
        z_term = z_loss * (torch.logsumexp(flat, -1)[y != IGNORE_INDEX] ** 2).mean() if z_loss > 0 else 0.0
        (cross_entropy + z_term).backward()
        # A row holds the probes (train.probe_every) and the sharpness (train.sharpness_every); a family
        # not due at this step is NaN in it (an empty cell).
        probes_due = probed and train.get("probe_every", 0) > 0 and step % train["probe_every"] == 0
        sharpness_step = probed and train.get("sharpness_every", 0) > 0 and step % train["sharpness_every"] == 0
        if sharpness_step:  # the Hessian of the step's objective, weights before the update
            hessian = torch_model.full_hessian(model, lambda m: objective(m, inputs[step - 1], targets[step - 1]))
        if probed:  # the probes of normlab's row: activations of this forward, gradients before clipping
            torch_probes = {**activations.values(logits), **torch_model.parameter_probes(model, None)}
            before = {name: p.detach().clone() for name, p in model.named_parameters()}
        if clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip).item()
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
        optimizer.step()
        row = metrics[step]
        record = {"step": step, "lr": lr, "torch_loss": cross_entropy.item(), "torch_grad_norm": grad_norm,
                  "normlab_loss": float(row["train_loss"]), "normlab_grad_norm": float(row["grad_norm"]),
                  "normlab_lr": float(row["lr"])}
        record["loss_rel"] = relative(record["normlab_loss"], record["torch_loss"])
        record["grad_norm_rel"] = relative(record["normlab_grad_norm"], grad_norm)
        record["lr_rel"] = relative(record["normlab_lr"], lr)
        if probed:
            torch_probes.update(torch_model.parameter_probes(model, before))
            if not probes_due:
                torch_probes = {c: math.nan for c in probes[step] if c not in SHARPNESS_COLUMNS}
            if "sharpness" in probes[step]:
                torch_probes.update({c: math.nan for c in SHARPNESS_COLUMNS})
            if sharpness_step:  # P from the moments this step's update used
                scale = torch_model.adam_inverse_sqrt_preconditioner(model, optimizer)
                torch_probes["sharpness"] = torch_model.exact_sharpness(hessian)
                torch_probes["sharpness_adam"] = torch_model.exact_sharpness(hessian, scale)
                torch_probes["sharpness_adam_threshold"] = torch_model.adam_sharpness_threshold(optim["beta1"], lr)
            record["probe_rel"], record["probe_noise_params"] = compare_probes(probes[step], torch_probes, step)
            record["torch_probes"] = torch_probes
        records.append(record)
        if step % every == 0 or step == steps or step == 1:
            out(f"{step:>5} {record['normlab_lr']:>12.6g} {lr:>12.6g} {record['normlab_loss']:>22.17g} {record['torch_loss']:>22.17g} "
                f"{record['loss_rel']:>9.2e} {record['normlab_grad_norm']:>14.8g} {grad_norm:>14.8g} "
                f"{record['grad_norm_rel']:>9.2e}")
    result = {"run_dir": run_dir, "dtype": train.get("dtype", "f32"), "steps": steps, "records": records,
              "worst_loss_rel": max(r["loss_rel"] for r in records),
              "worst_grad_norm_rel": max(r["grad_norm_rel"] for r in records),
              "worst_lr_rel": max(r["lr_rel"] for r in records)}
    out(f"worst relative difference over {steps} steps: loss {result['worst_loss_rel']:.3e}, grad norm "
        f"{result['worst_grad_norm_rel']:.3e}, lr {result['worst_lr_rel']:.3e}")
    probed = [r for r in records if "probe_rel" in r]
    if probed:
        # Per probe (the column's name up to its first dot): the worst relative difference over steps and columns.
        worst = {}
        for r in probed:
            for column, rel in r["probe_rel"].items():
                family = column.split(".")[0]
                if rel >= worst.get(family, (-1.0, ""))[0]:
                    worst[family] = (rel, f"{column} at step {r['step']}")
        result["worst_probe_rel"] = max(rel for rel, _ in worst.values())
        result["probe_families"] = {family: rel for family, (rel, _) in worst.items()}
        out(f"probes.csv, {len(probed)} probed steps, worst relative difference per probe:")
        for family, (rel, where) in sorted(worst.items()):
            out(f"  {family:<16} {rel:.3e}  ({where})")
        noise = sorted({name for r in probed for name in r["probe_noise_params"]})
        if noise:
            out(f"  gradients of rounding noise (RMS < {GRAD_RMS_FLOOR:g} of the step's largest; grad_rms against "
                f"that floor, update_ratio not compared): {', '.join(noise)}")
    final_path = os.path.join(run_dir, "checkpoints", f"step_{steps:08d}.safetensors")
    if os.path.isfile(final_path):
        final = {k: v for k, v in load_file(final_path).items() if not k.startswith(OPTIM_PREFIX)}
        worst, worst_name = 0.0, ""
        for name, p in model.state_dict().items():
            ref = final[name].double()
            diff = (p - ref).abs().max().item() / max(ref.abs().max().item(), 1e-300)
            if diff >= worst:
                worst, worst_name = diff, name
        result["final_weights_rel"] = worst
        out(f"final weights (step {steps}): largest difference {worst:.3e} of the tensor's largest |value| "
            f"({worst_name})")
    else:
        out(f"final weights: no checkpoint at step {steps} to compare with ({final_path})")
    if tol is None:
        tol = 1e-9 if result["dtype"] == "f64" else math.inf
    result["tol"] = tol
    result["ok"] = result["worst_loss_rel"] <= tol and result.get("worst_probe_rel", 0.0) <= tol
    out(f"{'within' if result['ok'] else 'ABOVE'} the tolerance {tol:g} (relative, train loss"
        f"{' and probes' if probed else ''})")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a normlab train run directory (train.save_initial and train.save_batches on)")
    parser.add_argument("--steps", type=int, default=None, help="replay only the first N steps")
    parser.add_argument("--tol", type=float, default=None,
                        help="largest relative train-loss difference accepted (default 1e-9 for f64 runs, none for f32)")
    parser.add_argument("--every", type=int, default=1, help="print every K-th step (default 1)")
    parser.add_argument("--json", help="write the per-step records and the worst differences to this JSON file")
    args = parser.parse_args()
    try:
        result = replay(args.run_dir, args.steps, args.tol, max(1, args.every))
    except ReplayError as e:
        print(f"torch_replay: {e}", file=sys.stderr)
        return 2
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
