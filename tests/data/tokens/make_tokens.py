"""Writes train.bin, val.bin and meta.pkl here exactly as nanoGPT's data/shakespeare_char/prepare.py
does, from the first 400 characters of examples/data/tinyshakespeare.txt (nanoGPT reads the whole
file). tests/test_token_data.cpp checks that normlab reads these files as the same ids, which it
computes itself from the same text. Needs NumPy; run from anywhere: python3 tests/data/tokens/make_tokens.py
"""
import os
import pickle

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "..", "..", "examples", "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
    data = f.read()[:400]

# From here on, prepare.py's lines (its prints left out).
chars = sorted(list(set(data)))
vocab_size = len(chars)
stoi = {ch: i for i, ch in enumerate(chars)}
itos = {i: ch for i, ch in enumerate(chars)}
def encode(s):
    return [stoi[c] for c in s]

n = len(data)
train_data = data[: int(n * 0.9)]
val_data = data[int(n * 0.9) :]
train_ids = encode(train_data)
val_ids = encode(val_data)
train_ids = np.array(train_ids, dtype=np.uint16)
val_ids = np.array(val_ids, dtype=np.uint16)
train_ids.tofile(os.path.join(here, "train.bin"))
val_ids.tofile(os.path.join(here, "val.bin"))
meta = {"vocab_size": vocab_size, "itos": itos, "stoi": stoi}
with open(os.path.join(here, "meta.pkl"), "wb") as f:
    pickle.dump(meta, f)
