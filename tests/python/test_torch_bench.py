"""examples/cli/torch_bench.py, the PyTorch side of `normlab bench torch`, on a tiny transformer: it times
both attentions PyTorch users write (LLaMA's matmul + softmax, F.scaled_dot_product_attention) or one of
them, on the same model, and refuses an attention it does not know. Needs PyTorch (skips by name
without it)."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "examples", "cli", "torch_bench.py")
# The script's default toy transformer, 1 timed step after none: seconds, not a measurement.
QUICK = ["--json", "--skip-stability", "--threads", "1", "--steps", "1", "--warmup", "0"]


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def test_both_attentions_are_timed_on_the_same_model(torch):
    result = _run(*QUICK)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    llama, sdpa = out["transformer"], out["transformer_sdpa"]
    assert llama["median_s"] > 0 and sdpa["median_s"] > 0
    assert llama["parameters"] == sdpa["parameters"]
    # The same seed, data and math: the first step's loss agrees to rounding.
    assert abs(llama["final_loss"] - sdpa["final_loss"]) < 1e-4 * abs(llama["final_loss"])


def test_one_attention_alone(torch):
    result = _run(*QUICK, "--attention", "sdpa")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert "transformer_sdpa" in out and "transformer" not in out


def test_an_unknown_attention_is_refused_by_name(torch):
    result = _run(*QUICK, "--attention", "flash")
    assert result.returncode == 2
    assert "--attention" in result.stderr and "'flash'" in result.stderr and "'sdpa'" in result.stderr
