"""examples/cli/bench_sweep.py and torch_sweep.py on a tiny sweep: the benchmark's normlab side without
PyTorch (the reason printed), and, where torch is installed, the PyTorch sweep trains normlab's runs in
normlab's run order. Both need the normlab binary (NORMLAB_BINARY, set by CTest)."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CLI = os.path.join(ROOT, "examples", "cli")

# 2 qk_norm x 2 learning rates x 1 seed of a one-block model, 6 steps: seconds, not a measurement.
TINY_SWEEP = {
    "base": {
        "data": {"source": "synthetic", "task": "reverse", "length": 4, "symbols": 6, "eval_sequences": 32},
        "model": {"dim": 16, "n_layers": 1, "n_heads": 2, "multiple_of": 16, "max_seq_len": 16},
        "optim": {"warmup_steps": 2, "min_lr": 0.0001},
        "train": {"steps": 6, "batch_size": 8, "eval_every": 0},
    },
    "grid": {"model.qk_norm": ["none", "head"], "optim.lr": [0.001, 0.01]},
    "seeds": [0],
}


@pytest.fixture
def normlab():
    binary = os.environ.get("NORMLAB_BINARY")
    if not binary:
        pytest.skip("NORMLAB_BINARY is not set (CTest sets it to build/normlab)")
    return binary


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny_sweep.json"
    path.write_text(json.dumps(TINY_SWEEP))
    return str(path)


def test_bench_sweep_skip_torch_times_both_job_counts_and_says_why(normlab, tiny_config):
    result = subprocess.run([sys.executable, os.path.join(CLI, "bench_sweep.py"), "--normlab", normlab, "--config",
                             tiny_config, "--rounds", "2", "--skip-torch"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "round 1: normlab --jobs 2:" in out and "round 2: normlab --jobs 1:" in out  # the order rotates
    assert "normlab --jobs 1 / --jobs 2:" in out
    assert "PyTorch / normlab" not in out
    assert "PyTorch side skipped: --skip-torch was given" in out


def test_bench_sweep_rejects_one_job_before_any_work(normlab, tiny_config):
    result = subprocess.run([sys.executable, os.path.join(CLI, "bench_sweep.py"), "--normlab", normlab, "--config",
                             tiny_config, "--jobs", "1"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--jobs at least 2" in result.stderr


def test_torch_sweep_trains_normlabs_runs_in_normlabs_order(torch, normlab, tiny_config, tmp_path):
    ours = subprocess.run([normlab, "sweep", tiny_config, "--out", str(tmp_path / "sweep"), "--jobs", "2", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    with open(tmp_path / "sweep" / "runs.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    theirs = subprocess.run([sys.executable, os.path.join(CLI, "torch_sweep.py"), tiny_config, "--normlab", normlab,
                             "--jobs", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    result = json.loads(theirs.stdout.strip().splitlines()[-1])
    assert result["jobs"] == 2 and result["threads_per_run"] == 1
    runs = result["runs"]
    assert [r["index"] for r in runs] == list(range(4))
    for row, run in zip(rows, runs):
        # The same grid point and seed at the same index: normlab's runs.csv and PyTorch's label.
        assert run["label"] == f"model.qk_norm={row['model.qk_norm']} optim.lr={float(row['optim.lr'])} seed={row['seed']}"
        # Untrained, both predict about uniformly over the 7 tokens: the loss near ln 7 on both sides.
        assert abs(run["init_loss"] - math.log(7)) < 0.5, run
        assert abs(float(row["init_loss"]) - math.log(7)) < 0.5, row
        assert math.isfinite(run["final_val_loss"]) and not run["diverged"]


def test_bench_sweep_statistics_match_the_tables():
    """The Student-t quantile, the two-sided p-value and Welch's test against published values
    (t_{0.975, 10} = 2.228, t_{0.975, 1} = 12.706; scipy.stats.ttest_ind(..., equal_var=False))."""
    sys.path.insert(0, CLI)
    import bench_sweep
    assert abs(bench_sweep.t_quantile_975(10) - 2.2281) < 1e-4
    assert abs(bench_sweep.t_quantile_975(1) - 12.7062) < 1e-4
    assert abs(bench_sweep.t_two_sided_p(2.0, 5) - 0.10194) < 1e-5
    t, df, p = bench_sweep.welch([1, 2, 3, 4], [2, 3, 4, 5, 6])
    assert abs(t + 1.5667) < 1e-4 and abs(df - 6.9808) < 1e-4 and abs(p - 0.16129) < 1e-4
    mean, lo, hi = bench_sweep.mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and abs(hi - (2.0 + 4.3027 * 1.0 / math.sqrt(3))) < 1e-3 and abs(lo + hi - 4.0) < 1e-12


def test_bench_sweep_seeds_gives_per_point_intervals_and_tests(torch, normlab, tiny_config):
    result = subprocess.run([sys.executable, os.path.join(CLI, "bench_sweep.py"), "--normlab", normlab, "--config",
                             tiny_config, "--python", sys.executable, "--rounds", "1", "--seeds", "3"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for point in ("model.qk_norm=none optim.lr=0.001", "model.qk_norm=head optim.lr=0.01"):
        assert f"{point} normlab - PyTorch init:" in out and f"{point} normlab - PyTorch final:" in out, out
    assert " seed=2 " in out  # the seeds 0..2 replaced the config's one seed
