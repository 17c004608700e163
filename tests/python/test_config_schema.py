"""The config schema from Python: normlab.config_schema and config_defaults read the C++ schema (no
default restated here), the shipped JSON Schemas (docs/schema/) are what it prints, an editor's
validator (the jsonschema package, draft 2020-12) accepts every shipped config and refuses what the
jobs refuse, and ``overrides={"key": None}`` removes a key as ``--set key=null`` does.

The validator tests need the jsonschema package (setup.sh puts it in .venv); where it is absent they
skip, each by name.
"""
import json
import pathlib

import pytest

import normlab

REPO = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schema"


@pytest.fixture
def jsonschema(request):
    return pytest.importorskip("jsonschema", reason=f"{request.node.name} needs the jsonschema package")


def shipped_configs():
    """(path, job) of every configs/*.json, the job from the schema it names."""
    out = []
    for path in sorted((REPO / "configs").glob("*.json")):
        config = json.loads(path.read_text())
        out.append((path, pathlib.Path(config["$schema"]).name.split(".")[0]))
    return out


def test_the_schema_and_defaults_come_from_cxx():
    assert normlab.config_jobs() == ["train", "stability", "sweep", "bench_norms"]
    for job in normlab.config_jobs():
        assert normlab.config_schema(job) == json.loads((SCHEMAS / f"{job}.schema.json").read_text())
    train = normlab.config_schema("train")
    dim = train["properties"]["model"]["properties"]["dim"]
    assert (dim["type"], dim["minimum"], dim["default"]) == ("integer", 2, 64)
    defaults = normlab.config_defaults("train")
    assert defaults["model"]["dim"] == 64
    assert defaults["model"]["norm"]["type"] == "rmsnorm"
    assert "n_kv_heads" not in defaults["model"]  # computed: n_heads
    assert "path" not in defaults["data"]  # the default source is synthetic
    with pytest.raises(normlab.Error, match="no config schema for job 'sweeep'"):
        normlab.config_schema("sweeep")


def test_an_override_of_none_removes_the_key(tmp_path):
    tokens = REPO / "tests" / "data" / "tokens"
    overrides = {"data.source": "tokens", "data.path": str(tokens), "data.vocab_size": 42, "data.seq_len": 16,
                 "data.eval_sequences": 2, "model.dim": 16, "model.n_layers": 1, "model.n_heads": 2,
                 "model.max_seq_len": 16, "train.steps": 2, "train.batch_size": 2, "optim.warmup_steps": 0,
                 "train.eval_every": 0, "train.checkpoint_every": 0}
    with pytest.raises(normlab.Error, match=r"/data/val_fraction: applies to source \"text\" only"):
        normlab.train(REPO / "configs" / "char_text.json", overrides=overrides, out=tmp_path / "refused")
    result = normlab.train(REPO / "configs" / "char_text.json", overrides={**overrides, "data.val_fraction": None},
                           out=tmp_path / "run")
    assert result.complete
    config = json.loads(pathlib.Path(result.run_dir, "config.json").read_text())
    assert config["data"]["source"] == "tokens"
    assert "val_fraction" not in config["data"]


@pytest.mark.parametrize("path,job", shipped_configs(), ids=lambda v: getattr(v, "name", v))
def test_every_shipped_config_validates_against_its_schema(jsonschema, path, job):
    schema = json.loads((SCHEMAS / f"{job}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(path.read_text()))


def errors(jsonschema, job, config):
    validator = jsonschema.Draft202012Validator(normlab.config_schema(job))
    return [e.message for e in validator.iter_errors(config)]


def test_the_schema_refuses_what_the_jobs_refuse(jsonschema):
    assert errors(jsonschema, "train", {}) == []
    assert errors(jsonschema, "train", {"data": {"source": "text", "path": "a.txt"}}) == []
    assert any("dimm" in e for e in errors(jsonschema, "train", {"model": {"dimm": 64}}))
    assert errors(jsonschema, "train", {"model": {"dim": 1}})
    assert errors(jsonschema, "train", {"model": {"norm": {"type": "batchnorm"}}})
    assert errors(jsonschema, "train", {"model": {"norm": {"p": 0}}})
    assert errors(jsonschema, "train", {"train": {"steps": "ten"}})
    # Source-specific keys: refused for another source, required where they apply.
    assert errors(jsonschema, "train", {"data": {"val_fraction": 0.2}})
    assert errors(jsonschema, "train", {"data": {"source": "text", "path": "a", "task": "copy"}})
    assert errors(jsonschema, "train", {"data": {"source": "text"}})
    assert errors(jsonschema, "train", {"data": {"source": "tokens", "path": "d"}})
    assert errors(jsonschema, "train", {"data": {"source": "tokens", "path": "d", "vocab_size": 65}}) == []
    # A list key takes one value or a non-empty list; the moved stability keys are unknown.
    assert errors(jsonschema, "stability", {"lrs": 0.01, "seeds": [1, 2]}) == []
    assert errors(jsonschema, "stability", {"lrs": []})
    assert errors(jsonschema, "stability", {"fused": True})
    assert errors(jsonschema, "stability", {"norm": {"type": "rmsnorm"}})
    assert errors(jsonschema, "stability", {"norm": {"eps": 1e-6, "fused": False}}) == []
