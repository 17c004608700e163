"""examples/python/torch_replay.py on runs the normlab program trains here: an f64 run replays in
PyTorch to 1e-9 (the script exits 0), a run without its initial checkpoint or batches is refused with
the missing file and how to make it (exit 2). The replay needs torch and safetensors: without them
the tests that replay skip by name (the `torch` fixture); the refusals need neither."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REPLAY = os.path.join(ROOT, "examples", "python", "torch_replay.py")
NORMLAB = os.environ.get("NORMLAB_BINARY", os.path.join(ROOT, "build", "normlab"))

CONFIG = {
    "seed": 3,
    "data": {"source": "synthetic", "task": "reverse", "length": 4, "symbols": 6, "eval_sequences": 8},
    "model": {"dim": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 8, "max_seq_len": 16,
              "norm_placement": "peri", "qk_norm": "full"},
    "optim": {"lr": 0.02, "min_lr": 0.002, "warmup_steps": 2, "decay": "matrices"},
    "train": {"steps": 6, "batch_size": 4, "eval_every": 0, "threads": 1, "dtype": "f64", "z_loss": 1e-3,
              "save_initial": True, "save_batches": True},
}


def train(tmp_path, config, name="run"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    run_dir = tmp_path / name
    subprocess.run([NORMLAB, "train", str(path), "--out", str(run_dir), "--quiet"], check=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return run_dir


def replay(run_dir, *args):
    return subprocess.run([sys.executable, REPLAY, str(run_dir), *args], capture_output=True, text=True)


def test_f64_run_replays_in_pytorch_to_1e9(torch, tmp_path):
    pytest.importorskip("safetensors", reason="test_f64_run_replays_in_pytorch_to_1e9 needs safetensors")
    run_dir = train(tmp_path, CONFIG)
    out = tmp_path / "replay.json"
    done = replay(run_dir, "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "within the tolerance 1e-09" in done.stdout
    result = json.loads(out.read_text())
    assert result["steps"] == 6 and len(result["records"]) == 6
    assert result["worst_loss_rel"] <= 1e-9 and result["worst_grad_norm_rel"] <= 1e-9
    assert result["final_weights_rel"] <= 1e-9
    # A tolerance below what f64 reaches is refused: the check can fail.
    strict = replay(run_dir, "--tol", "0")
    assert strict.returncode == 1 or result["worst_loss_rel"] == 0.0, strict.stdout


def test_replay_refuses_a_run_without_its_initial_weights_or_batches(tmp_path):
    config = json.loads(json.dumps(CONFIG))
    config["train"]["save_batches"] = False
    run_dir = train(tmp_path, config)
    done = replay(run_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "batches.safetensors: missing" in done.stderr and "train.save_batches=true" in done.stderr
    config["train"].update(save_batches=True, save_initial=False)
    run_dir = train(tmp_path, config, "no_initial")
    done = replay(run_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "step_00000000.safetensors: missing" in done.stderr and "train.save_initial=true" in done.stderr


def test_sharpness_columns_replay_against_the_whole_hessian(torch, tmp_path):
    pytest.importorskip("safetensors", reason="test_sharpness_columns_replay_against_the_whole_hessian needs "
                                              "safetensors")
    config = json.loads(json.dumps(CONFIG))
    config["model"].update(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, multiple_of=4)
    config["train"].update(sharpness_every=3, sharpness_iters=60)
    run_dir = train(tmp_path, config)
    out = tmp_path / "replay.json"
    done = replay(run_dir, "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert set(result["probe_families"]) == {"sharpness", "sharpness_adam", "sharpness_adam_threshold"}
    assert result["worst_probe_rel"] <= 1e-9
    exact = [r["torch_probes"]["sharpness"] for r in result["records"] if "torch_probes" in r]
    assert len(exact) == 2 and all(value > 0 for value in exact)


def test_replay_refuses_sharpness_of_a_model_too_large_for_its_hessian(torch, tmp_path):
    pytest.importorskip("safetensors", reason="test_replay_refuses_sharpness_of_a_model_too_large_for_its_hessian "
                                              "needs safetensors")
    config = json.loads(json.dumps(CONFIG))
    config["train"].update(sharpness_every=3, sharpness_iters=2)
    run_dir = train(tmp_path, config)
    done = replay(run_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "5000" in done.stderr and "sharpness_every" in done.stderr
