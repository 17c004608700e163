"""One norm's autograd end to end from Python: RMSNorm's forward, its Jacobian from autograd against
the closed form, the bytes its graph saves in the fused and the composed form, gradcheck and
gradgradcheck in float64, its gradient against PyTorch's where torch is installed, and a short
stability run (RMSNorm vs LayerNorm) with a plot where matplotlib is installed.

    python examples/python/norm_autograd.py [--out DIR] [--epochs N]

Each step checks what it shows and the script exits non-zero when a check fails (the tests run it).
"""
import argparse
import math
import os
import sys

import numpy as np

import normlab as nl
import normlab.nn.functional as F

EPS = 1e-6
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def rms_norm_jacobian(x, w, eps):
    """The closed form: y_i = w_i x_i r with r = (mean(x^2) + eps)^-1/2 over d elements, so
    dy_i / dx_j = w_i r (delta_ij - x_i x_j r^2 / d)."""
    d = x.shape[0]
    r = 1.0 / math.sqrt(float(np.mean(x * x)) + eps)
    return (w * r)[:, None] * (np.eye(d) - np.outer(x, x) * r * r / d)


def check(name, ok, detail):
    print(f"  {'ok' if ok else 'FAILED'}: {name} ({detail})")
    if not ok:
        sys.exit(f"norm_autograd.py: the check '{name}' failed: {detail}")


def forward_and_jacobian():
    print("1. RMSNorm's forward and its Jacobian (one row of 8, float64)")
    nl.manual_seed(0)
    x = nl.randn(8, dtype=nl.float64, requires_grad=True)
    w = nl.rand(8, dtype=nl.float64) + 0.5
    y = F.rms_norm(x, (8,), w, EPS, fused=False)  # composed: differentiable twice
    print("  x =", x)
    print("  y =", y)
    # Row i of the Jacobian is the gradient of y[i] with respect to x.
    rows = [nl.autograd.grad(y[i], x, retain_graph=True)[0].numpy() for i in range(8)]
    jacobian = np.stack(rows)
    expected = rms_norm_jacobian(x.detach().numpy(), w.numpy(), EPS)
    error = float(np.max(np.abs(jacobian - expected)))
    check("autograd Jacobian = closed form", error < 1e-12, f"max |difference| {error:.2e}")
    # Without eps the norm is scale-invariant (y(c x) = y(x)), so the derivative along x vanishes.
    scale_change = float(np.max(np.abs(rms_norm_jacobian(x.detach().numpy(), np.ones(8), 0.0) @ x.detach().numpy())))
    check("J x = 0 without eps (scaling x does not move y)", scale_change < 1e-12, f"max |J x| {scale_change:.2e}")


def saved_bytes():
    print("2. What the graph saves for backward: fused kernel vs composed ops (64 x 512, float32)")
    x = nl.randn(64, 512, requires_grad=True)
    saved = {}
    for fused in (True, False):
        norm = nl.nn.RMSNorm(512, eps=EPS, fused=fused)
        y = norm(x)
        saved[fused] = nl.autograd.graph_saved_bytes(y)
        print(f"  fused={fused}: {saved[fused]:,} bytes saved, nodes: "
              + ", ".join(node.name for node in nl.autograd.graph_nodes(y)))
    x_bytes = 64 * 512 * 4
    check("fused saves x and one rstd per row", saved[True] == x_bytes + 64 * 4,
          f"{saved[True]:,} bytes = x {x_bytes:,} + rstd {64 * 4}")
    check("composed saves more", saved[False] > saved[True], f"{saved[False] / saved[True]:.2f}x the fused form")


def gradient_checks():
    print("3. gradcheck against central differences (float64)")
    nl.manual_seed(1)
    x = nl.randn(3, 16, dtype=nl.float64, requires_grad=True)
    w = nl.randn(16, dtype=nl.float64, requires_grad=True)
    for fused in (True, False):
        result = nl.autograd.gradcheck(lambda a, b: F.rms_norm(a, (16,), b, EPS, fused=fused), [x, w])
        check(f"gradcheck, fused={fused}", bool(result), repr(result))
    for fused in (True, False):  # second order: a fused node's backward under create_graph is the composed one's
        result = nl.autograd.gradgradcheck(lambda a, b: F.rms_norm(a, (16,), b, EPS, fused=fused), [x, w])
        check(f"gradgradcheck, fused={fused}", bool(result), repr(result))


def against_torch():
    print("4. The gradient against PyTorch's (float64)")
    try:
        import torch
    except ImportError:
        print("  skipped: torch is not installed (pip install torch)")
        return
    nl.manual_seed(2)
    x = nl.randn(4, 32, dtype=nl.float64, requires_grad=True)
    w = nl.randn(32, dtype=nl.float64, requires_grad=True)
    dy = nl.randn(4, 32, dtype=nl.float64)
    F.rms_norm(x, (32,), w, EPS).backward(dy)  # the fused kernel pair
    xt = torch.from_dlpack(x.detach()).clone().requires_grad_(True)
    wt = torch.from_dlpack(w.detach()).clone().requires_grad_(True)
    torch.nn.functional.rms_norm(xt, (32,), wt, EPS).backward(torch.from_dlpack(dy))
    for name, ours, theirs in (("dx", x.grad, xt.grad), ("dweight", w.grad, wt.grad)):
        error = float(np.max(np.abs(ours.numpy() - theirs.numpy())))
        check(f"{name} = torch's", error < 1e-10, f"max |difference| {error:.2e}")


def stability(out, epochs):
    print(f"5. The stability experiment, RMSNorm vs LayerNorm ({epochs} epochs)")
    result = nl.stability(os.path.join(REPO, "configs", "stability.json"), overrides={"epochs": epochs, "plots": False},
                          out=os.path.join(out, "stability"), force=True)
    for run in result.runs:
        print(f"  {run.norm:10} loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}, "
              f"perturbed {run.perturbed_losses[-1]:.4f}, diverged at epoch: {run.diverged_epoch or 'never'}")
        check(f"{run.norm} trains", run.losses[-1] < run.losses[0], "the last loss is below the first")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  no plot: matplotlib is not installed")
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    for run in result.runs:
        axis.plot(run.losses, label=run.norm)
    axis.set(xlabel="epoch", ylabel="loss", yscale="log", title="RMSNorm vs LayerNorm")
    axis.legend()
    path = os.path.join(out, "stability.png")
    figure.savefig(path, dpi=100)
    print(f"  plot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/norm_autograd", help="where the stability run and plot go")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the stability run")
    args = parser.parse_args()
    forward_and_jacobian()
    saved_bytes()
    gradient_checks()
    against_torch()
    stability(args.out, args.epochs)
    print("norm_autograd.py: every check passed")


if __name__ == "__main__":
    main()
