"""The Python examples run as a user runs them: examples/python/norm_autograd.py and sharpness.py (their
own checks decide the exit status), bench_vs_torch.py's and torch_plain_loop.py's smoke runs (torch only)."""
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")


def run_example(name, *args):
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_norm_autograd_example_passes_its_checks(tmp_path):
    result = run_example("norm_autograd.py", "--out", str(tmp_path), "--epochs", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every check passed" in result.stdout
    assert "FAILED" not in result.stdout
    assert (tmp_path / "stability").is_dir()  # the stability run's directory, where --out said


def test_sharpness_example_matches_pytorchs_power_iteration():
    result = run_example("sharpness.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "matches PyTorch's to 1e-10 relative at every iteration" in result.stdout


def test_bench_vs_torch_smoke_run_prints_every_ratio(torch):
    result = run_example("bench_vs_torch.py", "--quick", "--threads", "1", "--rounds", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "LayerNorm" in line or "RMSNorm" in line]
    assert len(rows) == 4, result.stdout  # two norms x (fwd, fwd+bwd) at the quick shape
    assert "per add" in result.stdout and "per call" in result.stdout


def test_torch_plain_loop_times_a_few_steps(torch):
    result = run_example("torch_plain_loop.py", "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--seq-len", "8",
                         "--batch", "2", "--steps", "2", "--warmup", "1", "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tokens/s over 2 steps after 1" in result.stdout
