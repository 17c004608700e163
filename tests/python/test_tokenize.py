"""python -m normlab.data.tokenize: a byte-level BPE trained on the shipped text into nanoGPT token
files the train job reads; lossless, deterministic, refusing bad input with one line and exit 2.
Needs the tokenizers package (setup.sh installs it into .venv); without it the tests that tokenize
skip by name."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import normlab

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXT = REPO / "examples" / "data" / "tinyshakespeare.txt"


@pytest.fixture
def tokenizers(request):
    return pytest.importorskip("tokenizers", reason=f"{request.node.name} needs the tokenizers package, which is "
                                                    "not installed")


def run(*args):
    return subprocess.run([sys.executable, "-m", "normlab.data.tokenize", *map(str, args)], capture_output=True,
                          text=True, env=dict(os.environ))


def test_tokenize_writes_token_files_that_decode_to_the_text_and_train(tokenizers, tmp_path):
    done = run(TEXT, "--vocab-size", 512, "--out", tmp_path / "tok")
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "tok" / "meta.json").read_text())
    assert meta["vocab_size"] == 512 and meta["dtype"] == "uint16"
    train = np.fromfile(tmp_path / "tok" / "train.bin", dtype="<u2")
    val = np.fromfile(tmp_path / "tok" / "val.bin", dtype="<u2")
    assert train.size == meta["train_tokens"] and val.size == meta["val_tokens"]
    assert train.max() < 512 and val.max() < 512
    # Fewer tokens than characters: merges happened (a BPE, not a byte copy).
    assert train.size < 0.6 * meta["train_characters"]
    # Lossless: the validation ids decode to the last tenth of the text, character for character.
    text = TEXT.read_text(encoding="utf-8")
    tokenizer = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    assert tokenizer.decode(val.tolist()) == text[int(len(text) * 0.9):]
    # Deterministic: the same files again.
    again = run(TEXT, "--vocab-size", 512, "--out", tmp_path / "again")
    assert again.returncode == 0, again.stderr
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "tok" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    # The train job reads them as printed.
    assert f"--set data.vocab_size=512" in done.stdout
    result = normlab.train(REPO / "configs" / "char_text.json",
                           ["data.source=tokens", "data.val_fraction=null", f"data.path={tmp_path / 'tok'}",
                            "data.vocab_size=512", "train.steps=3", "optim.warmup_steps=1", "train.eval_every=0",
                            "data.eval_sequences=2"], out=tmp_path / "run")
    assert result.complete and result.summary["val_loss"] < 8.0


def test_tokenize_refuses_bad_input_with_one_line_and_exit_2(tokenizers, tmp_path):
    cases = [
        ((tmp_path / "none.txt", "--out", tmp_path / "a"), "none.txt: no such file"),
        ((TEXT, "--vocab-size", 100, "--out", tmp_path / "b"), "--vocab-size: expected an integer in [256, 1048576]"),
        ((TEXT, "--val-fraction", 1.5, "--out", tmp_path / "c"), "--val-fraction: expected a fraction in (0, 1)"),
    ]
    (tmp_path / "empty.txt").write_text("")
    cases.append(((tmp_path / "empty.txt", "--out", tmp_path / "d"), "empty"))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    cases.append(((tmp_path / "latin1.txt", "--out", tmp_path / "e"), "not UTF-8 text"))
    (tmp_path / "taken").mkdir()
    cases.append(((TEXT, "--out", tmp_path / "taken"), "already exists (pass --force"))
    for args, message in cases:
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and message in done.stderr, (args, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "latin1.txt", "taken"]  # nothing written
