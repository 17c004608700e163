"""normlab from Python against PyTorch on the same CPU threads, side by side in one run:
(1) normlab.torch's fused norms against torch.nn.LayerNorm / torch.nn.RMSNorm, forward and
forward + backward, on PyTorch tensors at (4096, 4096) and at the norm inputs of the shipped
transformer configs; (2) the per-call cost of eager ops from Python (tiny adds, a 64x64 matmul
with its backward), normlab's Tensor against torch.Tensor.

    python examples/python/bench_vs_torch.py [--threads N] [--rounds R]

Each case is timed in R rounds that alternate between the two sides; a round's figure is the
median of its calls. Printed: the median over rounds and the spread (min-max), and the ratio
torch / normlab of the medians (> 1: normlab is faster). A memory copy of x (torch.clone) at each
norm shape shows how close each side runs to memory speed.
"""
import argparse
import os
import statistics
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads on both sides")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per case")
    parser.add_argument("--quick", action="store_true", help="one small shape and few calls (a smoke test)")
    return parser.parse_args()


ARGS = parse_args()
# Both libraries read the thread count at start-up: set it before either is imported. Each brings
# its own OpenMP runtime (PyTorch bundles one), so the process has two thread pools; a pool whose
# idle threads spin holds the cores the other pool needs (calls then wait a scheduler tick), so
# idle threads sleep unless the environment says otherwise.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402

import normlab  # noqa: E402
import normlab.torch as nlt  # noqa: E402

torch.set_num_threads(ARGS.threads)

# (rows, dim) of each norm input: batch_size * seq_len rows of the model's dim.
NORM_SHAPES = [
    ("4096 x 4096", 4096, 4096),
    ("configs/char_text.json", 32 * 64, 128),          # batch 32, seq_len 64, dim 128
    ("configs/shakespeare_char.json", 12 * 64, 128),  # batch 12, seq_len 64, dim 128
    ("configs/toy_transformer.json", 64 * 16, 64),     # batch 64, T 16 (reverse, length 8), dim 64
    ("nanoGPT size", 8 * 256, 384),                    # batch 8, T 256, dim 384
]
if ARGS.quick:
    NORM_SHAPES = [("256 x 512", 256, 512)]


def time_calls(fn, seconds):
    """Median seconds per call of fn over about `seconds` (at least 3 calls, after one warm-up)."""
    fn()
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def side_by_side(cases, seconds):
    """{name: [per-round median]} for each (name, fn), the rounds alternating between the cases."""
    figures = {name: [] for name, _ in cases}
    for _ in range(ARGS.rounds):
        for name, fn in cases:
            figures[name].append(time_calls(fn, seconds))
    return figures


def fmt_time(seconds):
    return f"{seconds * 1e6:9.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def summary(rounds):
    return statistics.median(rounds), min(rounds), max(rounds)


def norm_cases(kind, rows, dim):
    """(name, fn) pairs: forward and forward + backward of torch's module and normlab.torch's."""
    x = torch.randn(rows, dim)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(rows, dim)
    if kind == "LayerNorm":
        modules = {"torch": torch.nn.LayerNorm(dim), "normlab": nlt.LayerNorm(dim)}
    else:
        modules = {"torch": torch.nn.RMSNorm(dim, eps=1e-6), "normlab": nlt.RMSNorm(dim, eps=1e-6)}

    def forward(module):
        def run():
            with torch.no_grad():
                module(x)
        return run

    def forward_backward(module):
        def run():
            xg.grad = None
            module.zero_grad(set_to_none=True)
            module(xg).backward(dy)
        return run

    cases = [("copy", lambda: x.clone())]
    for side, module in modules.items():
        cases.append((f"{side} fwd", forward(module)))
        cases.append((f"{side} fwd+bwd", forward_backward(module)))
    return cases


def bench_norms():
    seconds = 0.05 if ARGS.quick else 0.3
    print(f"== norms on PyTorch CPU tensors (f32), {ARGS.threads} threads, {ARGS.rounds} rounds: "
          "median (min-max) per call; ratio = torch / normlab ==")
    print(f"{'shape':32} {'norm':9} {'pass':8} {'torch':>26} {'normlab':>26} {'ratio':>6} {'copy x':>12}")
    for label, rows, dim in NORM_SHAPES:
        for kind in ("LayerNorm", "RMSNorm"):
            figures = side_by_side(norm_cases(kind, rows, dim), seconds)
            copy = summary(figures["copy"])[0]
            for part in ("fwd", "fwd+bwd"):
                t_med, t_lo, t_hi = summary(figures[f"torch {part}"])
                n_med, n_lo, n_hi = summary(figures[f"normlab {part}"])
                print(f"{label + f' ({rows}, {dim})':32} {kind:9} {part:8} "
                      f"{fmt_time(t_med)} ({t_lo / t_med:4.2f}-{t_hi / t_med:4.2f}) "
                      f"{fmt_time(n_med)} ({n_lo / n_med:4.2f}-{n_hi / n_med:4.2f}) "
                      f"{t_med / n_med:6.2f} {fmt_time(copy)}")


def overhead_cases():
    """(name, fn): 10,000 adds of 16-element tensors, and one 64x64 matmul + sum + backward."""
    adds = 200 if ARGS.quick else 10_000
    pairs = {"torch": (torch.randn(16), torch.randn(16)),
             "normlab": (normlab.randn(16), normlab.randn(16))}
    mats = {"torch": (torch.randn(64, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)),
            "normlab": (normlab.randn(64, 64, requires_grad=True), normlab.randn(64, 64, requires_grad=True))}

    def add_loop(a, b):
        def run():
            for _ in range(adds):
                a + b
        return run

    def matmul_backward(a, b):
        def run():
            a.grad = None
            b.grad = None
            (a @ b).sum().backward()
        return run

    cases = []
    for side in ("torch", "normlab"):
        cases.append((f"{side} add", add_loop(*pairs[side])))
        cases.append((f"{side} matmul", matmul_backward(*mats[side])))
    return cases, adds


def bench_overhead():
    seconds = 0.05 if ARGS.quick else 0.5
    cases, adds = overhead_cases()
    figures = side_by_side(cases, seconds)
    print(f"== eager ops from Python, {ARGS.threads} threads: median (min-max); ratio = torch / normlab ==")
    for case, label in (("add", f"{adds} x (a + b), 16 elements, per add"),
                        ("matmul", "(a @ b).sum().backward(), 64x64, per call")):
        t_med, t_lo, t_hi = summary(figures[f"torch {case}"])
        n_med, n_lo, n_hi = summary(figures[f"normlab {case}"])
        per = adds if case == "add" else 1
        print(f"{label:45} torch {fmt_time(t_med / per)} ({t_lo / t_med:4.2f}-{t_hi / t_med:4.2f})  "
              f"normlab {fmt_time(n_med / per)} ({n_lo / n_med:4.2f}-{n_hi / n_med:4.2f})  ratio {t_med / n_med:5.2f}")


def main():
    print(f"torch {torch.__version__}, normlab {normlab.__version__}, Python {sys.version.split()[0]}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    bench_norms()
    bench_overhead()


if __name__ == "__main__":
    main()
