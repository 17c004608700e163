# normlab.analyze: the same fields as `normlab analyze`'s analysis.json, against the transformers
# fixtures (tests/reference/analyze/) and, where torch and transformers are installed, against
# transformers computed live by the fixture generator's own function.
import importlib.util
import json
import math
import pathlib

import pytest

import normlab

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "reference" / "analyze"


def close(ours, theirs, tolerance):
    return abs(ours - theirs) <= tolerance * max(1.0, abs(theirs))


def check_layers(ours, theirs):
    assert len(ours) == len(theirs)
    for a, e in zip(ours, theirs):
        assert close(a["act_max"], e["act_max"], 1e-5)
        assert a["act_max_channel"] == e["act_max_channel"]
        assert close(a["act_kurtosis"], e["act_kurtosis"], 1e-5)
        assert close(a["drop_delta_loss"], e["drop_delta_loss"], 1e-5)
        assert all(close(x, y, 1e-6) for x, y in zip(a["attn_sink"], e["attn_sink"]))
        assert all(close(x, y, 1e-6) for x, y in zip(a["attn_entropy"], e["attn_entropy"]))
        assert len(a["attn_sink"]) == len(e["attn_sink"]) == 4


def test_analyze_returns_what_analysis_json_holds(tmp_path):
    expected = json.loads((FIXTURES / "expected_qwen3_planted.json").read_text())
    a = normlab.analyze(FIXTURES / "qwen3_planted", tokens=FIXTURES / "tokens", windows=4, seq_len=16, dtype="f64",
                        out=tmp_path / "az")
    written = json.loads((tmp_path / "az" / "analysis.json").read_text())
    assert set(a) == set(written)
    timed = ("seconds", "timing")
    assert {k: v for k, v in a.items() if k not in timed} == {k: v for k, v in written.items() if k not in timed}
    assert a["architecture"]["head_dim"] == 16 and a["format"] == "hf"
    assert close(a["loss"], expected["loss"], 1e-6)
    check_layers(a["layers"], expected["layers"])
    assert [layer["act_max_channel"] for layer in a["layers"]][1:] == [13, 13]  # the planted channel
    assert [n["name"] for n in a["norms"]][:4] == ["layers.0.attention.q_norm", "layers.0.attention.k_norm",
                                                  "layers.0.attention_norm", "layers.0.ffn_norm"]
    # Without out nothing is written; an existing out needs force.
    assert normlab.analyze(FIXTURES / "llama", tokens=FIXTURES / "tokens", windows=1, seq_len=8)["windows"] == 1
    with pytest.raises(normlab.Error, match="exists"):
        normlab.analyze(FIXTURES / "llama", tokens=FIXTURES / "tokens", windows=1, seq_len=8, out=tmp_path / "az")
    with pytest.raises(normlab.Error, match="need 85 ids, the file holds 75"):
        normlab.analyze(FIXTURES / "llama", tokens=FIXTURES / "tokens", windows=5, seq_len=16)


def test_analyze_matches_transformers_live(torch, tmp_path):
    pytest.importorskip("transformers", reason="test_analyze_matches_transformers_live compares with transformers, "
                                               "which is not installed")
    spec = importlib.util.spec_from_file_location("make_analyze", REPO / "tests" / "reference" / "make_analyze.py")
    make_analyze = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_analyze)
    # Other windows than the fixture's: 2 windows of 24 tokens from the same file.
    ids = [int(i) for i in memoryview((FIXTURES / "tokens" / "val.bin").read_bytes()).cast("H")]
    for name in ("llama", "qwen3_planted"):
        theirs = make_analyze.compute_analysis(str(FIXTURES / name), ids, 24, 2)
        ours = normlab.analyze(FIXTURES / name, tokens=FIXTURES / "tokens", windows=2, seq_len=24)
        assert close(ours["loss"], theirs["loss"], 1e-6)
        check_layers(ours["layers"], theirs["layers"])
        assert all(math.isclose(a["weight_max_abs"], e["weight_max_abs"], rel_tol=1e-7)
                   for a, e in zip(ours["norms"], theirs["norms"]))
