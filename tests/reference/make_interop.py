#!/usr/bin/env python3
"""Writes the fixtures of tests/test_interop.cpp with the real tools: Hugging Face transformers and
llama.cpp (through llama-cpp-python, which builds llama.cpp from source).

Run from anywhere, with a normlab binary built from this checkout:

    python3 -m venv .venv-interop        # from the repository root
    .venv-interop/bin/pip install torch transformers safetensors numpy llama-cpp-python
    .venv-interop/bin/python tests/reference/make_interop.py --normlab build/normlab

Outputs (all overwritten) in tests/reference/interop/:
    hf_tiny/, hf_tiny_sharded/, hf_tiny_tied/   a random LlamaForCausalLM saved by save_pretrained:
                                                grouped-query heads (4 heads, 2 key/value heads),
                                                rope_theta 5000, an odd intermediate_size (45),
                                                norm weights not all ones; one file, 3 shards, and a
                                                tied-embeddings variant
    hf_tiny_logits.safetensors                  ids (2, 12); transformers' logits (2, 12, 40) of
                                                hf_tiny and logits_tied of hf_tiny_tied; greedy (20,):
                                                generate(do_sample=False) from ids[0, :4]
    normlab_char.gguf                           `normlab export --to gguf` of a character model
                                                `normlab train` made here (its text: the first 400
                                                characters of examples/data/tinyshakespeare.txt)
    llamacpp_logits.safetensors                 llama.cpp on normlab_char.gguf: ids (2, 12), logits
                                                (2, 12, V) (each row evaluated on its own, f32 KV
                                                cache), greedy (20,) (argmax of llama.cpp's logits
                                                from ids[0, :4]); text_ids: llama.cpp's tokenizer on
                                                the metadata's "text"; hf_text_ids: transformers'
                                                AutoTokenizer on the same text from `normlab export
                                                --to hf` of the same model

Deterministic: torch is seeded and runs on one thread; the versions of torch, transformers and
llama_cpp are in each file's __metadata__.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "interop")

VOCAB = 40
IDS_SHAPE = (2, 12)


def fixed_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, IDS_SHAPE, generator=g, dtype=torch.int64)


def tiny_llama(seed, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=45, rope_theta=5000.0, rms_norm_eps=1e-6,
                         max_position_embeddings=64, tie_word_embeddings=tied, hidden_act="silu",
                         attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)  # not all ones, so a swapped or dropped norm shows
            else:
                p.normal_(0.0, 0.3)  # larger than the default init, so the logits are not all alike
    return model


def transformers_part(versions):
    import transformers

    for d in ("hf_tiny", "hf_tiny_sharded", "hf_tiny_tied"):
        shutil.rmtree(os.path.join(OUT, d), ignore_errors=True)
    model = tiny_llama(0, tied=False)
    model.save_pretrained(os.path.join(OUT, "hf_tiny"), safe_serialization=True)
    model.save_pretrained(os.path.join(OUT, "hf_tiny_sharded"), safe_serialization=True, max_shard_size="30KB")
    tied = tiny_llama(1, tied=True)
    tied.save_pretrained(os.path.join(OUT, "hf_tiny_tied"), safe_serialization=True)
    shards = [f for f in os.listdir(os.path.join(OUT, "hf_tiny_sharded")) if f.endswith(".safetensors")]
    assert len(shards) >= 2, shards

    ids = fixed_ids(VOCAB, 5)
    with torch.no_grad():
        logits = model(ids).logits.float()
        logits_tied = tied(ids).logits.float()
        greedy = model.generate(ids[:1, :4], max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                pad_token_id=None, eos_token_id=None, bos_token_id=None)[0]
    save_file({"ids": ids, "logits": logits.contiguous(), "logits_tied": logits_tied.contiguous(),
               "greedy": greedy.to(torch.int64).contiguous()},
              os.path.join(OUT, "hf_tiny_logits.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    versions["transformers"] = transformers.__version__
    print("hf_tiny: logits", tuple(logits.shape), "greedy", greedy.tolist())


def run(cmd, cwd):
    print("+", " ".join(cmd))
    subprocess.run(cmd, cwd=cwd, check=True)


def llama_cpp_logits(gguf, ids):
    """llama.cpp's logits of each row of ids evaluated on its own, and a greedy continuation."""
    import llama_cpp

    # type_k/type_v 0 = GGML_TYPE_F32: llama.cpp's KV cache defaults to f16, which rounds K and V.
    llm = llama_cpp.Llama(model_path=gguf, logits_all=True, verbose=False, n_ctx=64, type_k=0, type_v=0)
    rows = []
    for row in ids.tolist():
        llm.reset()
        llm.eval(row)
        rows.append(np.array(llm.scores[: len(row)], dtype=np.float32))
    llm.reset()
    seq = ids[0, :4].tolist()
    llm.eval(seq)
    while len(seq) < 20:
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        seq.append(nxt)
        llm.eval([nxt])
    return llm, np.stack(rows), seq


def llama_cpp_part(normlab, versions):
    import llama_cpp
    from transformers import AutoTokenizer

    normlab = os.path.abspath(normlab)
    with open(os.path.join(ROOT, "examples", "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:400]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "text.txt"), "w", encoding="utf-8") as f:
            f.write(text)
        config = {"seed": 3,
                  "data": {"source": "text", "path": "text.txt", "seq_len": 16, "eval_sequences": 4, "val_fraction": 0.2},
                  "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 16,
                            "rope_theta": 700.0, "max_seq_len": 32, "norm": {"type": "rmsnorm", "eps": 1e-5}},
                  "optim": {"warmup_steps": 5, "lr": 0.01},
                  "train": {"steps": 60, "batch_size": 8, "eval_every": 0, "threads": 1}}
        with open(os.path.join(tmp, "char.json"), "w") as f:
            json.dump(config, f)
        run([normlab, "train", "char.json", "--out", "run", "--quiet"], tmp)
        run([normlab, "export", "run", "--to", "gguf", "char.gguf"], tmp)
        run([normlab, "export", "run", "--to", "hf", "hf"], tmp)
        shutil.copyfile(os.path.join(tmp, "char.gguf"), os.path.join(OUT, "normlab_char.gguf"))
        hf_tok = AutoTokenizer.from_pretrained(os.path.join(tmp, "hf"))
        sample_text = "First Citizen:\nBefore we proceed any further, hear me speak."
        hf_ids = hf_tok(sample_text)["input_ids"]
        assert hf_tok.decode(hf_ids) == sample_text

    gguf = os.path.join(OUT, "normlab_char.gguf")
    vocab = len(hf_tok)
    ids = fixed_ids(vocab, 6)
    llm, logits, greedy = llama_cpp_logits(gguf, ids)
    text_ids = llm.tokenize(sample_text.encode("utf-8"), add_bos=False, special=False)
    assert llm.detokenize(text_ids).decode("utf-8") == sample_text
    save_file({"ids": ids, "logits": torch.from_numpy(logits), "greedy": torch.tensor(greedy, dtype=torch.int64),
               "text_ids": torch.tensor(text_ids, dtype=torch.int64),
               "hf_text_ids": torch.tensor(hf_ids, dtype=torch.int64)},
              os.path.join(OUT, "llamacpp_logits.safetensors"),
              metadata={"llama_cpp": llama_cpp.__version__, "text": sample_text,
                        "transformers": versions.get("transformers", "")})
    print("normlab_char.gguf: vocab", vocab, "logits", logits.shape, "greedy", greedy)
    print("text ids equal (llama.cpp, transformers):", list(text_ids) == list(hf_ids))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--normlab", required=True, help="the normlab binary (build/normlab)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    versions = {}
    transformers_part(versions)
    llama_cpp_part(args.normlab, versions)


if __name__ == "__main__":
    main()
