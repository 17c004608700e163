"""Tests of the jobs as Python calls (normlab.train, TrainSession, stability, sweep, sample, checkpoints):
the same bits as the `normlab` program, Ctrl-C leaving a run that resume completes, exceptions from
callbacks and from the job, and the results matching the files the jobs write.

Run: NORMLAB_BINARY=build/normlab PYTHONPATH=build-py/python python -m pytest tests/python -q -rs
(the comparison with the program is skipped when NORMLAB_BINARY is unset).
"""
import csv
import json
import math
import os
import pathlib
import signal
import subprocess
import threading

import numpy as np
import pytest

import normlab

REPO = pathlib.Path(__file__).resolve().parents[2]
TOY = REPO / "configs" / "toy_transformer.json"
# 60 steps of the toy transformer, evaluated every 20 on 128 held-out sequences: a second or two.
OVERRIDES = ["train.steps=60", "optim.warmup_steps=10", "train.eval_every=20", "data.eval_sequences=128"]
# metrics.csv's columns that a run's bits decide (the others are timings).
LOSS_COLUMNS = ["step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy", "val_token_accuracy"]
SUMMARY_LOSSES = ["final_train_loss", "val_loss", "val_accuracy", "val_token_accuracy", "steps", "parameters"]


def read_csv(path):
    """{column: [cell text]} of a CSV file."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {name: [row[name] for row in rows] for name in rows[0]}


def read_json(path):
    with open(path) as f:
        return json.load(f)


def loss_columns(run_dir):
    table = read_csv(pathlib.Path(run_dir) / "metrics.csv")
    return {name: table[name] for name in LOSS_COLUMNS}


def as_floats(cells):
    return np.array([float(c) if c else math.nan for c in cells])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the toy config through Python."""
    out = tmp_path_factory.mktemp("reference") / "run"
    return normlab.train(TOY, OVERRIDES, out=out)


# ---- train ----

def test_train_result_matches_its_files(reference):
    run = pathlib.Path(reference.run_dir)
    assert reference.complete and reference.last_step == 60
    assert reference.summary == read_json(run / "summary.json")
    assert reference.profile is None
    table = read_csv(run / "metrics.csv")
    assert list(reference.metrics) == list(table)
    assert reference.metrics["step"].dtype == np.int64
    for name, cells in table.items():
        np.testing.assert_array_equal(reference.metrics[name], as_floats(cells), err_msg=name)
    assert np.isnan(reference.metrics["val_loss"][0]) and not np.isnan(reference.metrics["val_loss"][19])


def test_train_same_bits_as_the_program(reference, tmp_path):
    binary = os.environ.get("NORMLAB_BINARY")
    if not binary:
        pytest.skip("NORMLAB_BINARY is not set: the path of the normlab program to compare with")
    command = [binary, "train", str(TOY), "--out", str(tmp_path / "cli"), "--quiet"]
    for assignment in OVERRIDES:
        command += ["--set", assignment]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    assert loss_columns(tmp_path / "cli") == loss_columns(reference.run_dir)
    cli_summary = read_json(tmp_path / "cli" / "summary.json")
    for key in SUMMARY_LOSSES:
        assert cli_summary[key] == reference.summary[key], key


def test_session_with_a_dict_config_same_bits(reference, tmp_path):
    config = read_json(TOY)
    steps = []
    with normlab.TrainSession(config, {"train.steps": 60, "optim.warmup_steps": 10, "train.eval_every": 20,
                                       "data.eval_sequences": 128}, out=tmp_path / "run") as session:
        assert session.description.startswith("108224 parameters, reverse data")
        assert session.run_dir == str(tmp_path / "run")
        assert session.config["train"]["steps"] == 60
        names = [name for name, _ in session.named_parameters()]
        assert names[0] == "tok_embeddings.weight" and names[-1] == "output.weight"
        assert session.model(normlab.tensor([[1, 2, 3]])).shape == (1, 3, 11)
        while not session.done:
            steps.append(session.step())
        scores = session.evaluate()
        result = session.finish()
    assert [s["step"] for s in steps] == list(range(1, 61))
    assert scores["val_loss"] == result.summary["val_loss"]
    assert loss_columns(tmp_path / "run") == loss_columns(reference.run_dir)
    for key in SUMMARY_LOSSES:
        assert result.summary[key] == reference.summary[key], key
    np.testing.assert_array_equal(result.metrics["train_loss"], reference.metrics["train_loss"])


def check_stopped_then_resume(reference, run, step):
    """A run stopped after `step`: its checkpoint, no summary; resume completes it to the reference's bits."""
    assert (run / "checkpoints" / f"step_{step:08d}.safetensors").exists()
    assert not (run / "summary.json").exists()
    assert not (run / "error.txt").exists()
    result = normlab.train(TOY, OVERRIDES, out=run, resume=True)
    assert result.complete and result.metrics["step"][0] == step + 1
    assert loss_columns(run) == loss_columns(reference.run_dir)
    for key in SUMMARY_LOSSES:
        assert result.summary[key] == reference.summary[key], key


def test_keyboard_interrupt_in_a_callback_stops_with_a_checkpoint(reference, tmp_path):
    def progress(step):
        if step["step"] == 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        normlab.train(TOY, OVERRIDES, out=tmp_path / "run", progress=progress)
    check_stopped_then_resume(reference, tmp_path / "run", 20)


def test_ctrl_c_stops_with_a_checkpoint(reference, tmp_path):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")
    # A real SIGINT, sent by another thread once 10 steps ran. The progress callback is a builtin, so
    # no Python code runs between steps: the job's own signal check after a step sees it.
    steps = []
    interrupt = threading.Thread(target=lambda: (wait_for(lambda: len(steps) >= 10),
                                                 os.kill(os.getpid(), signal.SIGINT)))
    interrupt.start()
    with pytest.raises(KeyboardInterrupt):
        normlab.train(TOY, OVERRIDES, out=tmp_path / "run", progress=steps.append)
    interrupt.join()
    assert 10 <= len(steps) < 60
    check_stopped_then_resume(reference, tmp_path / "run", steps[-1]["step"])


def wait_for(condition):
    event = threading.Event()
    while not condition():
        event.wait(0.001)


def test_exception_in_a_callback_propagates_and_leaves_error_txt(tmp_path):
    def progress(step):
        if step["step"] == 5:
            raise ZeroDivisionError("boom at five")

    with pytest.raises(ZeroDivisionError, match="boom at five"):
        normlab.train(TOY, OVERRIDES, out=tmp_path / "run", progress=progress)
    error = (tmp_path / "run" / "error.txt").read_text()
    assert "progress callback raised ZeroDivisionError: boom at five (at step 5)" in error
    assert not (tmp_path / "run" / "summary.json").exists()


def test_bad_key_is_an_error_before_anything_is_written(tmp_path):
    with pytest.raises(normlab.Error, match=r"/train/stepz: unknown key \(did you mean 'steps'\?"):
        normlab.train(TOY, ["train.stepz=60"], out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="/model/dim"):  # normlab.Error is a ValueError
        normlab.TrainSession(TOY, {"model.dim": "wide"}, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_missing_files_are_errors(tmp_path):
    with pytest.raises(normlab.Error, match="nope.json: cannot open config file"):
        normlab.train(tmp_path / "nope.json", out=tmp_path / "run")
    config = read_json(TOY)
    config["data"] = {"source": "text", "path": str(tmp_path / "missing.txt"), "seq_len": 8}
    with pytest.raises(normlab.Error, match="missing.txt"):
        normlab.train(config, out=tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
    with pytest.raises(normlab.Error, match="resume=True needs out="):
        normlab.train(TOY, resume=True)
    with pytest.raises(normlab.Error, match="config: expected a path"):
        normlab.train(42)


def test_profile_returns_the_table(tmp_path):
    result = normlab.train(TOY, OVERRIDES + ["train.steps=12", "train.eval_every=0"], out=tmp_path / "run",
                           profile=True)
    assert result.profile == (tmp_path / "run" / "profile.txt").read_text()


def test_probes_are_probes_csv_with_every_instrument(tmp_path):
    result = normlab.train(TOY, OVERRIDES + ["train.steps=12", "train.eval_every=0", "train.probe_every=4"],
                           out=tmp_path / "run")
    table = read_csv(tmp_path / "run" / "probes.csv")
    assert list(result.probes) == list(table)
    np.testing.assert_array_equal(result.probes["step"], [4, 8, 12])
    for name, cells in table.items():
        np.testing.assert_allclose(result.probes[name], as_floats(cells), rtol=1e-6, err_msg=name)
    for probe in ("act_max", "act_kurtosis", "attn_entropy", "attn_sink"):
        assert f"{probe}.block0" in result.probes
    assert (result.probes["act_max.block0"] >= result.probes["residual_rms.block0"]).all()
    assert ((result.probes["attn_sink.block0"] > 0) & (result.probes["attn_sink.block0"] < 1)).all()
    assert "norm_input_rms.norm" in result.probes and "norm_input_rms.layers.0.ffn_norm" in result.probes


def test_sharpness_columns_are_nan_where_not_measured(tmp_path):
    result = normlab.train(TOY, OVERRIDES + ["train.steps=6", "optim.warmup_steps=2", "train.eval_every=0",
                                             "train.probe_every=3", "train.sharpness_every=2",
                                             "train.sharpness_iters=5"],
                           out=tmp_path / "run")
    table = read_csv(tmp_path / "run" / "probes.csv")
    assert list(result.probes) == list(table)
    assert list(result.probes)[-3:] == ["sharpness", "sharpness_adam", "sharpness_adam_threshold"]
    np.testing.assert_array_equal(result.probes["step"], [2, 3, 4, 6])
    sharpness = result.probes["sharpness"]
    assert np.isnan(sharpness[1]) and np.isfinite(sharpness[[0, 2, 3]]).all()
    assert np.isnan(result.probes["act_max.block0"][[0, 2]]).all()
    lr = result.metrics["lr"][result.probes["step"] - 1]
    np.testing.assert_allclose(result.probes["sharpness_adam_threshold"][[0, 2, 3]], 38.0 / lr[[0, 2, 3]], rtol=1e-12)


# ---- checkpoints and sample ----

def test_load_save_and_sample_a_checkpoint(reference, tmp_path):
    checkpoint = normlab.load_checkpoint(reference.run_dir)
    assert checkpoint.step == 60 and checkpoint.vocab is None and checkpoint.vocab_size == 11
    assert checkpoint.config == read_json(pathlib.Path(reference.run_dir) / "config.json")
    logits = checkpoint.model(normlab.tensor([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, 11)

    result = normlab.sample(reference.run_dir, num=4)
    assert result.step == 60 and len(result.problems) == 4
    assert set(result.problems[0]) == {"problem", "answer", "expected", "correct"}
    assert result.correct == sum(p["correct"] for p in result.problems)
    assert result.problems[0]["problem"].startswith("reverse ")
    assert result.new_tokens > 0 and result.tokens_per_s > 0

    normlab.save_checkpoint(tmp_path / "copy.safetensors", checkpoint)
    copy = normlab.load_checkpoint(tmp_path / "copy.safetensors")
    assert copy.step == 60
    for (name, a), (name_b, b) in zip(checkpoint.model.named_parameters(), copy.model.named_parameters()):
        assert name == name_b
        np.testing.assert_array_equal(np.asarray(a.detach()), np.asarray(b.detach()))
    assert normlab.sample(copy, num=4).problems == result.problems

    with pytest.raises(normlab.Error, match="nothing_here"):
        normlab.load_checkpoint(tmp_path / "nothing_here")


def test_sample_text(tmp_path):
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    config = {"data": {"source": "text", "path": str(tmp_path / "text.txt"), "seq_len": 16, "eval_sequences": 8},
              "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "multiple_of": 16, "max_seq_len": 32},
              "optim": {"warmup_steps": 2},
              "train": {"steps": 5, "batch_size": 4, "eval_every": 0}}
    normlab.train(config, out=tmp_path / "run")
    checkpoint = normlab.load_checkpoint(tmp_path / "run")
    assert sorted(checkpoint.vocab) == sorted(set((tmp_path / "text.txt").read_text()))
    result = normlab.sample(tmp_path / "run", max_new_tokens=20, prompt="the ", seed=1)
    assert result.text.startswith("the ") and len(result.text) == 24
    assert result.tokens.dtype == np.int64 and len(result.tokens) == 24
    assert checkpoint.decode(result.tokens.tolist()) == result.text
    assert result.problems == [] and result.temperature == 0.8


def test_export_to_transformers_and_gguf_and_read_back(tmp_path):
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    config = {"data": {"source": "text", "path": str(tmp_path / "text.txt"), "seq_len": 16, "eval_sequences": 8},
              "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "multiple_of": 16, "max_seq_len": 32},
              "optim": {"warmup_steps": 2},
              "train": {"steps": 3, "batch_size": 4, "eval_every": 0}}
    normlab.train(config, out=tmp_path / "run")
    hf = normlab.export(tmp_path / "run", "hf", tmp_path / "hf")
    assert hf["tokenizer"] and hf["step"] == 3 and (tmp_path / "hf" / "tokenizer.json").exists()
    assert hf["architecture"] == "LlamaForCausalLM"
    gguf = normlab.export(tmp_path / "hf", "gguf", tmp_path / "m.gguf", dtype="f32")
    assert gguf["parameters"] == hf["parameters"] and gguf["architecture"] == "llama"
    # The three are one model: the same greedy text.
    texts = {normlab.sample(p, max_new_tokens=12, prompt="the ", temperature=0).text
             for p in (tmp_path / "run", tmp_path / "hf", tmp_path / "m.gguf")}
    assert len(texts) == 1
    assert sorted(normlab.load_checkpoint(tmp_path / "m.gguf").vocab) == sorted(set("the quick brown fox jumps over the lazy dog. "))
    with pytest.raises(normlab.Error, match="already exists"):
        normlab.export(tmp_path / "run", "gguf", tmp_path / "m.gguf")
    with pytest.raises(normlab.Error, match="dtype must be f32, f16 or bf16"):
        normlab.export(tmp_path / "run", "gguf", tmp_path / "x.gguf", dtype="f64")


def test_convert_layernorm_to_rmsnorm_samples_the_same_text(tmp_path):
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    config = {"data": {"source": "text", "path": str(tmp_path / "text.txt"), "seq_len": 16, "eval_sequences": 8},
              "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 16, "max_seq_len": 32,
                        "norm": {"type": "layernorm", "bias": False}},
              "optim": {"warmup_steps": 2},
              "train": {"steps": 4, "batch_size": 4, "eval_every": 0}}
    normlab.train(config, out=tmp_path / "run")
    r = normlab.convert(tmp_path / "run", "rmsnorm", tmp_path / "rms.safetensors")
    assert r["step"] == 4 and r["norms"] == 5 and r["recentered"] == 5
    converted = normlab.load_checkpoint(tmp_path / "rms.safetensors")
    assert converted.config["model"]["norm"]["type"] == "rmsnorm"
    ln = normlab.load_checkpoint(tmp_path / "run")
    assert converted.vocab == ln.vocab and converted.context == ln.context
    texts = {normlab.sample(p, max_new_tokens=24, prompt="the ", temperature=0).text
             for p in (tmp_path / "run", tmp_path / "rms.safetensors")}
    assert len(texts) == 1
    with pytest.raises(normlab.Error, match="already exists"):
        normlab.convert(tmp_path / "run", "rmsnorm", tmp_path / "rms.safetensors")
    with pytest.raises(normlab.Error, match="already RMSNorm"):
        normlab.convert(tmp_path / "rms.safetensors", "rmsnorm", tmp_path / "again.safetensors")
    normlab.convert(ln, "rmsnorm", tmp_path / "rms.safetensors", force=True)


# ---- sweep ----

# 2 lrs (one diverging) x 2 seeds of a 1-block, dim-16 model, 10 steps each: well under a second.
TINY_SWEEP = {
    "base": {"data": {"source": "synthetic", "task": "reverse", "length": 4, "symbols": 6, "eval_sequences": 32},
             "model": {"dim": 16, "n_layers": 1, "n_heads": 2, "multiple_of": 16, "max_seq_len": 16},
             "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
             "train": {"steps": 10, "batch_size": 8, "eval_every": 0, "probe_every": 5}},
    "grid": {"optim.lr": [0.003, 10.0]},
    "seeds": [0, 1],
}


def test_sweep_returns_runs_csv_as_arrays(tmp_path):
    finished = []
    result = normlab.sweep(TINY_SWEEP, out=tmp_path / "sweep", jobs=2, progress=finished.append)
    table = read_csv(tmp_path / "sweep" / "runs.csv")
    assert list(result.runs) == list(table)
    np.testing.assert_array_equal(result.runs["index"], [0, 1, 2, 3])
    np.testing.assert_array_equal(result.runs["optim.lr"], [0.003, 0.003, 10.0, 10.0])
    np.testing.assert_array_equal(result.runs["diverged"], [0, 0, 1, 1])
    np.testing.assert_array_equal(result.runs["init_loss"], as_floats(table["init_loss"]))
    assert np.isnan(result.runs["final_val_loss"][2:]).all()
    assert sorted(r["index"] for r in finished) == [0, 1, 2, 3]
    (variant,) = result.summary["variants"]
    assert result.summary == read_json(tmp_path / "sweep" / "summary.json")
    # Wortsman et al.'s lr sensitivity from the arrays: a diverged run counts as the loss at init.
    init = result.runs["init_loss"].mean()
    loss = np.where(result.runs["diverged"] == 1, init, result.runs["final_val_loss"])
    per_lr = [loss[result.runs["optim.lr"] == lr].mean() for lr in (0.003, 10.0)]
    expected = np.mean([min(x, init) - min(per_lr) for x in per_lr])
    assert variant["lr_sensitivity"] == pytest.approx(expected, rel=1e-12)
    # The per-lr mean over the 2 seeds and its Student-t 95% interval: mean -+ t_{0.975,1} |a - b| / 2.
    for entry, lr in zip(variant["per_lr"], (0.003, 10.0), strict=True):
        a, b = loss[result.runs["optim.lr"] == lr]
        assert entry["lr"] == lr
        assert entry["final_val_loss_mean"] == pytest.approx((a + b) / 2, rel=1e-12)
        half = 12.706204736174707 * abs(a - b) / 2
        assert entry["final_val_loss_ci95"] == pytest.approx([(a + b) / 2 - half, (a + b) / 2 + half], rel=1e-9)
    assert result.summary["baseline"] is None
    # 10 steps fill no window: no spikes; the trained runs' largest gradient norm is a number.
    np.testing.assert_array_equal(result.runs["loss_spikes"], [0, 0, 0, 0])
    assert (result.runs["max_grad_norm"][:2] > 0).all()
    with pytest.raises(normlab.Error, match="/grid/optim.lr/1: expected a number"):
        normlab.sweep({**TINY_SWEEP, "grid": {"optim.lr": [0.1, "x"]}}, out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


# ---- stability ----

TINY_STABILITY = {"norms": ["rmsnorm", "layernorm"], "epochs": 4, "samples": 32, "in_features": 8, "hidden": 16,
                  "out_features": 2, "seeds": [1, 2], "plots": False}


def test_stability_returns_the_curves_it_writes(tmp_path):
    epochs = []
    result = normlab.stability(TINY_STABILITY, out=tmp_path / "run", progress=epochs.append)
    run = tmp_path / "run"
    assert result.summary == read_json(run / "summary.json")
    assert "rmsnorm" in result.table and "layernorm" in result.table
    assert result.notes and "plots" in result.plots
    assert len(epochs) == 4 * 2 * 4 and epochs[-1]["done"] == 32
    assert [r.id for r in result.runs] == ["rmsnorm_d2_lr0.001_s1", "rmsnorm_d2_lr0.001_s2",
                                           "layernorm_d2_lr0.001_s1", "layernorm_d2_lr0.001_s2"]
    for r in result.runs:
        curve = read_csv(run / "curves" / f"{r.id}.csv")
        np.testing.assert_array_equal(r.losses, as_floats(curve["loss"]))
        np.testing.assert_array_equal(r.perturbed_losses, as_floats(curve["loss_perturbed"]))
        np.testing.assert_array_equal(r.grad_norms, as_floats(curve["grad_norm_total"]))
        assert r.losses.shape == (4,)


def test_stability_callback_exception_cancels_with_error_txt(tmp_path):
    def progress(epoch):
        raise RuntimeError("stop the sweep")

    with pytest.raises(RuntimeError, match="stop the sweep"):
        normlab.stability(TINY_STABILITY, out=tmp_path / "run", progress=progress)
    assert "RuntimeError: stop the sweep" in (tmp_path / "run" / "error.txt").read_text()
    assert not (tmp_path / "run" / "summary.json").exists()
    with pytest.raises(normlab.Error, match="epochz"):
        normlab.stability(TINY_STABILITY, {"epochz": 3}, out=tmp_path / "other")


def test_stability_resume_runs_only_the_runs_without_a_record(tmp_path):
    run = tmp_path / "run"
    first = normlab.stability(TINY_STABILITY, out=run, jobs=2)
    assert all((run / "runs" / str(i) / "result.json").exists() for i in range(4))
    (run / "runs" / "3" / "result.json").unlink()  # as if killed during run 3
    epochs = []
    again = normlab.stability(TINY_STABILITY, out=run, resume=True, jobs=2, progress=epochs.append)
    assert {e["run_id"] for e in epochs} == {"layernorm_d2_lr0.001_s2"}
    for a, b in zip(first.runs, again.runs, strict=True):
        assert a.id == b.id
        np.testing.assert_array_equal(a.losses, b.losses)
        np.testing.assert_array_equal(a.perturbed_losses, b.perturbed_losses)
        np.testing.assert_array_equal(a.grad_norms, b.grad_norms)
    assert [r["final_loss"] for r in again.summary["runs"]] == [r["final_loss"] for r in first.summary["runs"]]
    with pytest.raises(normlab.Error, match="this config differs"):
        normlab.stability(TINY_STABILITY, {"epochs": 5}, out=run, resume=True)
