"""Text into nanoGPT token files with a byte-level BPE trained on it (Hugging Face tokenizers).

    python -m normlab.data.tokenize TEXT [TEXT ...] --vocab-size 4096 --out DIR [--val-fraction 0.1] [--force]

The UTF-8 files are joined (a newline between two files) and split by characters as nanoGPT's
shakespeare prepare.py splits: the first 1 - val_fraction of the text trains, the rest validates.
A byte-level BPE (GPT-2's pre-tokenizer and its 256-byte alphabet, no special tokens) is trained on
the training part only, so the validation text is never seen by the tokenizer, and both parts are
encoded with it. DIR then holds:

    train.bin, val.bin   the ids, raw little-endian uint16 (uint32 above 65,536 tokens), no header:
                         what `normlab train` reads with data.source "tokens"
    tokenizer.json       the tokenizer (tokenizers.Tokenizer.from_file), to decode ids into text
    meta.json            vocab_size, dtype, the token counts, the inputs and the options

The tokenizer may hold fewer tokens than asked where the text has fewer merges to make; meta.json's
vocab_size is the tokenizer's own. Byte-level BPE is lossless: decoding val.bin gives the validation
text back. Training is deterministic: the same text and options give the same files. The directory
is written beside DIR and renamed into place, so a failed run leaves nothing; --force replaces DIR.

Needs the tokenizers package (pip install tokenizers). Exit status 2 for a user mistake, with one
line naming it.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

MIN_VOCAB = 256  # the byte alphabet
MAX_VOCAB = 1 << 20


class TokenizeError(Exception):
    """A user mistake: the message names what was expected and what was found."""


def _read_texts(paths):
    parts = []
    for path in paths:
        if not os.path.isfile(path):
            raise TokenizeError(f"{path}: no such file (expected a UTF-8 text file)")
        try:
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
        except UnicodeDecodeError as e:
            raise TokenizeError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    text = "\n".join(parts)
    if not text:
        raise TokenizeError(f"{', '.join(paths)}: empty (expected text to tokenize)")
    return text


def _train_tokenizer(text, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def tokenize(texts, out, vocab_size=4096, val_fraction=0.1, force=False):
    """Writes DIR's train.bin, val.bin, tokenizer.json and meta.json (module docstring); returns the
    meta.json dict. Raises TokenizeError for a user mistake."""
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise TokenizeError(f"--vocab-size: expected an integer in [{MIN_VOCAB}, {MAX_VOCAB}] (the byte alphabet "
                            f"is 256 tokens), found {vocab_size}")
    if not 0.0 < val_fraction < 1.0:
        raise TokenizeError(f"--val-fraction: expected a fraction in (0, 1), found {val_fraction}")
    out = os.path.abspath(out)
    if os.path.exists(out) and not force:
        raise TokenizeError(f"{out}: already exists (pass --force to replace it)")
    try:
        import tokenizers
    except ImportError:
        raise TokenizeError("the tokenizers package is not installed (pip install tokenizers)") from None
    text = _read_texts(texts)
    split = int(len(text) * (1.0 - val_fraction))
    train_text, val_text = text[:split], text[split:]
    if not train_text or not val_text:
        raise TokenizeError(f"{', '.join(texts)}: {len(text)} characters leave no training or no validation text "
                            f"at --val-fraction {val_fraction}")
    tokenizer = _train_tokenizer(train_text, vocab_size)
    vocab = tokenizer.get_vocab_size()
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    ids = {name: np.array(tokenizer.encode(part).ids, dtype=dtype)
           for name, part in (("train", train_text), ("val", val_text))}
    meta = {"vocab_size": vocab, "dtype": np.dtype(dtype).name, "vocab_size_asked": vocab_size,
            "train_tokens": int(ids["train"].size), "val_tokens": int(ids["val"].size),
            "train_characters": len(train_text), "val_characters": len(val_text), "val_fraction": val_fraction,
            "texts": [os.path.basename(t) for t in texts], "tokenizer": "tokenizer.json",
            "tokenizers_version": tokenizers.__version__}
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".tokenize-", dir=parent)
    try:
        for name, values in ids.items():
            values.astype(np.dtype(dtype).newbyteorder("<")).tofile(os.path.join(scratch, name + ".bin"))
        tokenizer.save(os.path.join(scratch, "tokenizer.json"))
        with open(os.path.join(scratch, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(scratch, 0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(scratch, out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m normlab.data.tokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="UTF-8 text files (joined, a newline between two)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="tokens of the BPE to train (default 4096)")
    parser.add_argument("--out", required=True, help="the directory to write (train.bin, val.bin, tokenizer.json, meta.json)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="the last fraction of the text's characters that validates (default 0.1)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    try:
        meta = tokenize(args.texts, args.out, args.vocab_size, args.val_fraction, args.force)
    except TokenizeError as e:
        print(f"tokenize: error: {e}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    print(f"tokenize: {meta['vocab_size']} tokens, {meta['train_tokens']} train and {meta['val_tokens']} val "
          f"tokens ({meta['dtype']}) -> {out}")
    print(f"train on it: normlab train CONFIG --set data.source=tokens --set data.val_fraction=null "
          f"--set data.path={out} --set data.vocab_size={meta['vocab_size']}"
          + (" --set data.dtype=uint32" if meta["dtype"] == "uint32" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
