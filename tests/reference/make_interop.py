#!/usr/bin/env python3
"""Writes the fixtures of tests/test_interop.cpp with the real tools: Hugging Face transformers and
llama.cpp (through llama-cpp-python, which builds llama.cpp from source).

Run from anywhere. Everything, with a normlab binary built from this checkout:

    python3 -m venv .venv-interop        # from the repository root
    .venv-interop/bin/pip install torch transformers safetensors numpy llama-cpp-python gguf
    .venv-interop/bin/python tests/reference/make_interop.py --normlab build/normlab

Other modes (each writes only what it names; --dir DIR writes into DIR instead of
tests/reference/interop/, e.g. to compare a rerun with the committed files):

    make_interop.py                          the transformers fixtures only (no normlab, no llama.cpp)
    make_interop.py --head-dim               hf_tiny_qwen3_head_dim/ and its logits only
    make_interop.py --normlab-gguf FILE      llamacpp_logits.safetensors from a GGUF that
                                             `normlab export RUN --to gguf FILE` wrote (f32 tensors)
    make_interop.py --check-llamacpp         writes no fixture: converts hf_tiny and hf_tiny_tied to
                                             GGUF here (the `gguf` package, convert_hf_to_gguf.py's
                                             names and q/k row permutation) and checks that
                                             llama.cpp's logits and greedy tokens are transformers'
    make_interop.py --check-normlab-hf NORMLAB
                                             writes no fixture: trains character models with NORMLAB
                                             as LLaMA, Qwen3 (qk_norm head) and OLMo 2 (output
                                             norms, qk_norm full), exports each with `--to hf`, and
                                             checks that transformers loads the class it names and
                                             greedy-decodes the text `normlab sample --temperature 0`
                                             gives (also part of --normlab)

Outputs (all overwritten) in tests/reference/interop/:
    hf_tiny/, hf_tiny_sharded/, hf_tiny_tied/   a random LlamaForCausalLM saved by save_pretrained:
                                                grouped-query heads (4 heads, 2 key/value heads),
                                                rope_theta 5000, an odd intermediate_size (45),
                                                norm weights not all ones; one file, 3 shards, and a
                                                tied-embeddings variant
    hf_tiny_qwen3/, hf_tiny_olmo2/              a random Qwen3ForCausalLM (QK-norm per head, pre-norm)
                                                and Olmo2ForCausalLM (QK-norm over the whole q and k,
                                                norms on the sublayers' outputs) of the same sizes,
                                                every norm weight (q_norm and k_norm too) not all ones
    hf_tiny_logits.safetensors                  ids (2, 12); transformers' logits (2, 12, 40) of
                                                hf_tiny and logits_tied of hf_tiny_tied; greedy (20,):
                                                generate(do_sample=False) from ids[0, :4]
    hf_tiny_qwen3_olmo2_logits.safetensors      the same ids; logits_qwen3 and logits_olmo2 (2, 12,
                                                40); greedy_qwen3 and greedy_olmo2 (20,) as greedy
    hf_tiny_qwen3_head_dim/                     a random Qwen3ForCausalLM whose head_dim (16) is not
                                                hidden_size / num_attention_heads (8), as Qwen3-0.6B's
    hf_tiny_qwen3_head_dim_logits.safetensors   the same ids; its logits (2, 12, 40) and greedy (20,)
    normlab_char.gguf                           `normlab export --to gguf` of a character model
                                                `normlab train` made here (its text: the first 400
                                                characters of examples/data/tinyshakespeare.txt)
    llamacpp_logits.safetensors                 llama.cpp on normlab_char.gguf: ids (2, 12), logits
                                                (2, 12, V) (each row evaluated on its own, f32 KV
                                                cache), greedy (20,) (argmax of llama.cpp's logits
                                                from ids[0, :4]); text_ids: llama.cpp's tokenizer on
                                                the metadata's "text"; hf_text_ids: transformers'
                                                AutoTokenizer on the same text from `normlab export
                                                --to hf` of the same model (--normlab only)

Deterministic: torch is seeded and runs on one thread, llama.cpp on one thread; the versions of
torch, transformers and llama_cpp are in each file's __metadata__.

What llama.cpp needs of a character vocabulary (found with llama-cpp-python 0.3.x): see
gguf_from_hf below. tokenizer.ggml.model "llama" with the tokens is enough to load; llama.cpp then
takes bos 1 and eos 2 (and unk 0) by default, so set add_bos_token and add_space_prefix false or
its tokenizer adds a BOS and a leading space. A character outside the vocabulary makes its
tokenizer abort the process (std::out_of_range: it looks for a <0xXX> byte token), so text is
checked against the vocabulary before it is tokenized here.
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
FIXTURES = os.path.join(HERE, "interop")

VOCAB = 40
IDS_SHAPE = (2, 12)
SAMPLE_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak."
SPM_SPACE = "\u2581"  # SentencePiece's space, as llama.cpp's "llama" vocabulary writes it


def fixed_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, IDS_SHAPE, generator=g, dtype=torch.int64)


# The sizes every tiny model shares: grouped-query heads (4 heads, 2 key/value heads of 8 dims), an
# odd intermediate_size.
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=45, rope_theta=5000.0, rms_norm_eps=1e-6, max_position_embeddings=64,
            hidden_act="silu", attention_bias=False, attn_implementation="eager")


def tiny_llama(seed, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return randomized(LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=tied, mlp_bias=False)).eval())


def tiny_qwen3(seed):
    """Qwen3: pre-norm LLaMA plus an RMSNorm on each head's q and k (q_norm, k_norm over head_dim)
    before RoPE; head_dim explicit; full attention in every layer (no sliding window)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**TINY, head_dim=8, tie_word_embeddings=False, use_sliding_window=False)
    return randomized(Qwen3ForCausalLM(config).eval())


def tiny_qwen3_head_dim(seed):
    """Qwen3 with heads wider than hidden_size / num_attention_heads (16 against 8): q, k and v
    project to heads x 16 and o_proj back to 32, as Qwen3-0.6B's 16 heads of 128 at hidden 1024."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=False, use_sliding_window=False)
    return randomized(Qwen3ForCausalLM(config).eval())


def head_dim_part(out, versions):
    """hf_tiny_qwen3_head_dim/ and its logits (written by every mode that writes the transformers
    fixtures, and alone with --head-dim)."""
    import transformers

    shutil.rmtree(os.path.join(out, "hf_tiny_qwen3_head_dim"), ignore_errors=True)
    model = tiny_qwen3_head_dim(6)
    model.save_pretrained(os.path.join(out, "hf_tiny_qwen3_head_dim"), safe_serialization=True)
    ids = fixed_ids(VOCAB, 5)
    with torch.no_grad():
        fixture = {"ids": ids, "logits": model(ids).logits.float().contiguous(),
                   "greedy": greedy_hf(model, ids[:1, :4], 16).to(torch.int64).contiguous()}
    metadata = {"torch": torch.__version__, "transformers": transformers.__version__}
    save_file(fixture, os.path.join(out, "hf_tiny_qwen3_head_dim_logits.safetensors"), metadata=metadata)
    versions["transformers"] = transformers.__version__
    print("hf_tiny_qwen3_head_dim: greedy", fixture["greedy"].tolist())


def tiny_olmo2(seed):
    """OLMo 2: no input norms; post_attention_layernorm and post_feedforward_layernorm on the
    sublayers' outputs before the residual sum; q_norm over the whole q (heads * head_dim) and
    k_norm over the whole k (key/value heads * head_dim) before RoPE."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    config = Olmo2Config(**TINY, tie_word_embeddings=False, pad_token_id=None, eos_token_id=None)
    return randomized(Olmo2ForCausalLM(config).eval())


def randomized(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)  # not all ones, so a swapped or dropped norm shows
            else:
                p.normal_(0.0, 0.3)  # larger than the default init, so the logits are not all alike
    return model


def greedy_hf(model, prompt, n):
    # min_new_tokens and no eos: config.json carries LlamaConfig's default eos_token_id 2, at which
    # generate would otherwise stop.
    return model.generate(prompt, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                          pad_token_id=None, eos_token_id=None, bos_token_id=None)[0]


def transformers_part(out, versions):
    import transformers

    for d in ("hf_tiny", "hf_tiny_sharded", "hf_tiny_tied", "hf_tiny_qwen3", "hf_tiny_olmo2"):
        shutil.rmtree(os.path.join(out, d), ignore_errors=True)
    model = tiny_llama(0, tied=False)
    model.save_pretrained(os.path.join(out, "hf_tiny"), safe_serialization=True)
    model.save_pretrained(os.path.join(out, "hf_tiny_sharded"), safe_serialization=True, max_shard_size="30KB")
    tied = tiny_llama(1, tied=True)
    tied.save_pretrained(os.path.join(out, "hf_tiny_tied"), safe_serialization=True)
    # Seeds whose greedy continuations do not settle on one repeated token.
    qwen3 = tiny_qwen3(4)
    qwen3.save_pretrained(os.path.join(out, "hf_tiny_qwen3"), safe_serialization=True)
    olmo2 = tiny_olmo2(8)
    olmo2.save_pretrained(os.path.join(out, "hf_tiny_olmo2"), safe_serialization=True)
    shards = [f for f in os.listdir(os.path.join(out, "hf_tiny_sharded")) if f.endswith(".safetensors")]
    assert len(shards) >= 2, shards

    ids = fixed_ids(VOCAB, 5)
    with torch.no_grad():
        logits = model(ids).logits.float()
        logits_tied = tied(ids).logits.float()
        greedy = greedy_hf(model, ids[:1, :4], 16)
        architectures = {"ids": ids}
        for name, m in (("qwen3", qwen3), ("olmo2", olmo2)):
            architectures["logits_" + name] = m(ids).logits.float().contiguous()
            architectures["greedy_" + name] = greedy_hf(m, ids[:1, :4], 16).to(torch.int64).contiguous()
            print(f"hf_tiny_{name}: greedy", architectures["greedy_" + name].tolist())
    metadata = {"torch": torch.__version__, "transformers": transformers.__version__}
    save_file({"ids": ids, "logits": logits.contiguous(), "logits_tied": logits_tied.contiguous(),
               "greedy": greedy.to(torch.int64).contiguous()},
              os.path.join(out, "hf_tiny_logits.safetensors"), metadata=metadata)
    save_file(architectures, os.path.join(out, "hf_tiny_qwen3_olmo2_logits.safetensors"), metadata=metadata)
    versions["transformers"] = transformers.__version__
    print("hf_tiny: logits", tuple(logits.shape), "greedy", greedy.tolist())


def run(cmd, cwd):
    print("+", " ".join(cmd))
    subprocess.run(cmd, cwd=cwd, check=True)


# ---------------------------------------------------------------------------------------------
# llama.cpp
# ---------------------------------------------------------------------------------------------


def open_llama_cpp(gguf_path):
    import llama_cpp

    # type_k/type_v 0 = GGML_TYPE_F32: llama.cpp's KV cache defaults to f16, which rounds K and V
    # (about 1e-3 of the largest logit here). llama.cpp pads n_ctx to 256 and prints
    # "n_ctx_seq (256) > n_ctx_train (64)" even with verbose=False; harmless.
    return llama_cpp.Llama(model_path=gguf_path, logits_all=True, verbose=False, n_ctx=64, type_k=0, type_v=0,
                           n_threads=1, n_threads_batch=1)


def llama_cpp_logits(llm, ids, greedy_prompt=4, greedy_len=20):
    """llama.cpp's logits of each row of ids evaluated on its own (from an empty cache), and a
    greedy continuation of ids[0, :greedy_prompt]: argmax of llama.cpp's own logits, one token
    evaluated at a time. Llama.generate is not used: it stops at the vocabulary's eos (2 by
    default) and samples."""
    rows = []
    for row in ids.tolist():
        llm.reset()
        llm.eval(row)
        rows.append(np.array(llm.scores[: len(row)], dtype=np.float32))
    llm.reset()
    seq = ids[0, :greedy_prompt].tolist()
    llm.eval(seq)
    while len(seq) < greedy_len:
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        seq.append(nxt)
        llm.eval([nxt])
    return np.stack(rows), seq


def gguf_vocab(gguf_path):
    """The vocabulary of a GGUF as text (U+2581 read as a space), or None if it has none."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    field = reader.get_field("tokenizer.ggml.tokens")
    if field is None:
        return None
    return [bytes(field.parts[i]).decode("utf-8").replace(SPM_SPACE, " ") for i in field.data]


def llama_cpp_tokenize(llm, vocab, text):
    """llama.cpp's ids of text, or None where a character is not in vocab (llama.cpp's tokenizer
    would abort the process)."""
    if vocab is None or not set(text) <= set(vocab):
        return None
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    assert llm.detokenize(ids).decode("utf-8") == text
    return ids


def llamacpp_fixture(gguf_path, out_file, hf_text_ids=None, extra_metadata=None):
    """llamacpp_logits.safetensors of a GGUF normlab exported: ids from llama.cpp's vocabulary size."""
    import llama_cpp

    llm = open_llama_cpp(gguf_path)
    vocab = llm.n_vocab()
    ids = fixed_ids(vocab, 6)
    logits, greedy = llama_cpp_logits(llm, ids)
    tensors = {"ids": ids, "logits": torch.from_numpy(logits), "greedy": torch.tensor(greedy, dtype=torch.int64)}
    metadata = {"llama_cpp": llama_cpp.__version__, "text": SAMPLE_TEXT, **(extra_metadata or {})}
    text_ids = llama_cpp_tokenize(llm, gguf_vocab(gguf_path), SAMPLE_TEXT)
    if text_ids is None:
        print(f"warning: {gguf_path}: the text has characters outside the vocabulary; no text_ids written")
        del metadata["text"]
    else:
        tensors["text_ids"] = torch.tensor(text_ids, dtype=torch.int64)
        if hf_text_ids is not None:
            tensors["hf_text_ids"] = torch.tensor(hf_text_ids, dtype=torch.int64)
    save_file(tensors, out_file, metadata=metadata)
    print(f"{os.path.basename(gguf_path)}: vocab {vocab} logits {logits.shape} greedy {greedy}")
    if text_ids is not None and hf_text_ids is not None:
        print("text ids equal (llama.cpp, transformers):", list(text_ids) == list(hf_text_ids))
    print("wrote", out_file)


def llama_cpp_part(normlab, out, versions):
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
        shutil.copyfile(os.path.join(tmp, "char.gguf"), os.path.join(out, "normlab_char.gguf"))
        hf_tok = AutoTokenizer.from_pretrained(os.path.join(tmp, "hf"))
        hf_ids = hf_tok(SAMPLE_TEXT)["input_ids"]
        assert hf_tok.decode(hf_ids) == SAMPLE_TEXT

    gguf_path = os.path.join(out, "normlab_char.gguf")
    llamacpp_fixture(gguf_path, os.path.join(out, "llamacpp_logits.safetensors"), hf_text_ids=hf_ids,
                     extra_metadata={"transformers": versions.get("transformers", "")})


# ---------------------------------------------------------------------------------------------
# normlab -> transformers (--check-normlab-hf)
# ---------------------------------------------------------------------------------------------

# The model keys of each architecture `normlab export --to hf` writes, and the class it names.
NORMLAB_HF_ARCHITECTURES = {
    "LlamaForCausalLM": {},
    "Qwen3ForCausalLM": {"qk_norm": "head"},
    "Olmo2ForCausalLM": {"qk_norm": "full", "norm_placement": "output"},
}


def check_normlab_hf(normlab):
    """normlab's `export --to hf` of a character model of each architecture, loaded by transformers'
    AutoModelForCausalLM: the class config.json names, and greedy text equal to `normlab sample
    --temperature 0` on the export (whose window is the model's context, as generate's is)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    normlab = os.path.abspath(normlab)
    with open(os.path.join(ROOT, "examples", "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:400]
    prompt, new_tokens = "First", 24
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "text.txt"), "w", encoding="utf-8") as f:
            f.write(text)
        for name, keys in NORMLAB_HF_ARCHITECTURES.items():
            config = {"seed": 3,
                      "data": {"source": "text", "path": "text.txt", "seq_len": 16, "eval_sequences": 4,
                               "val_fraction": 0.2},
                      "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 16,
                                "rope_theta": 700.0, "max_seq_len": 32, "norm": {"type": "rmsnorm", "eps": 1e-5},
                                **keys},
                      "optim": {"warmup_steps": 5, "lr": 0.01},
                      "train": {"steps": 60, "batch_size": 8, "eval_every": 0, "threads": 1}}
            with open(os.path.join(tmp, name + ".json"), "w") as f:
                json.dump(config, f)
            run([normlab, "train", name + ".json", "--out", name, "--quiet"], tmp)
            run([normlab, "export", name, "--to", "hf", name + "-hf"], tmp)
            hf_dir = os.path.join(tmp, name + "-hf")
            ours = subprocess.run([normlab, "sample", hf_dir, "--prompt", prompt, "--max-new-tokens", str(new_tokens),
                                   "--temperature", "0"], cwd=tmp, check=True, capture_output=True,
                                  text=True).stdout
            tok = AutoTokenizer.from_pretrained(hf_dir)
            model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
            assert type(model).__name__ == name, (type(model).__name__, name)
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                theirs = tok.decode(greedy_hf(model, ids, new_tokens))
            print(f"{name}: transformers {theirs!r}, normlab sample {ours!r}")
            assert ours == theirs + "\n", (ours, theirs)  # sample ends the text with a newline
    print("transformers agrees with normlab on its Qwen3, OLMo 2 and LLaMA exports")


# ---------------------------------------------------------------------------------------------
# transformers -> GGUF -> llama.cpp (--check-llamacpp)
# ---------------------------------------------------------------------------------------------


def permute_qk(w, n_head, n_head_kv=None):
    """convert_hf_to_gguf.py's LlamaModel.permute: transformers' q/k rows are in the half-split RoPE
    layout; llama.cpp (like Meta's checkpoints) wants the interleaved pairs back. k uses the
    key/value head count."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_from_hf(hf_dir, gguf_path, chars):
    """A GGUF (architecture llama, f32 tensors) of a LlamaForCausalLM directory written by
    save_pretrained (one file), with a character vocabulary: token i is chars[i].

    The vocabulary is llama.cpp's SentencePiece form: tokenizer.ggml.model "llama", the tokens
    (space as U+2581), scores 0 and token types 1 (normal; both optional for llama.cpp), and
    add_bos_token, add_eos_token and add_space_prefix false. No bos/eos ids are written: llama.cpp
    then uses 1 and 2, which matters only to its own generate (it stops at eos) and to add_bos."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = load_file(os.path.join(hf_dir, "model.safetensors"))
    n_vocab, n_head, n_kv = cfg["vocab_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    rope_theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]  # transformers 5 nests it
    assert len(chars) == n_vocab and SPM_SPACE not in chars

    w = gguf.GGUFWriter(gguf_path, "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(cfg["hidden_size"] // n_head)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rope_theta)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all f32
    w.add_tokenizer_model("llama")
    w.add_token_list([SPM_SPACE if c == " " else c for c in chars])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([1] * n_vocab)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    tensors = {"token_embd.weight": weights["model.embed_tokens.weight"],
               "output_norm.weight": weights["model.norm.weight"]}
    if "lm_head.weight" in weights:  # tied: llama.cpp uses token_embd when output is absent
        tensors["output.weight"] = weights["lm_head.weight"]
    names = {"attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[f"blk.{i}.attn_q.weight"] = permute_qk(weights[p + "self_attn.q_proj.weight"], n_head, n_head)
        tensors[f"blk.{i}.attn_k.weight"] = permute_qk(weights[p + "self_attn.k_proj.weight"], n_head, n_kv)
        for ours, theirs in names.items():
            tensors[f"blk.{i}.{ours}.weight"] = weights[p + theirs + ".weight"]
    for name, a in tensors.items():  # numpy (rows, cols) is ggml's {cols, rows}, as llama.cpp wants
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_llamacpp(out):
    """llama.cpp on GGUFs converted here from hf_tiny and hf_tiny_tied against transformers'
    logits and greedy tokens in hf_tiny_logits.safetensors."""
    from safetensors.numpy import load_file

    fixture = load_file(os.path.join(out, "hf_tiny_logits.safetensors"))
    ids = torch.from_numpy(fixture["ids"])
    chars = [chr(ord("a") + i) for i in range(26)] + list(" \n.,:;!?'-ABCD")
    with tempfile.TemporaryDirectory() as tmp:
        for d, key in (("hf_tiny", "logits"), ("hf_tiny_tied", "logits_tied")):
            path = os.path.join(tmp, d + ".gguf")
            gguf_from_hf(os.path.join(out, d), path, chars)
            llm = open_llama_cpp(path)
            logits, greedy = llama_cpp_logits(llm, ids)
            ref = fixture[key]
            diff = float(np.abs(logits - ref).max() / np.abs(ref).max())
            print(f"{d}: llama.cpp vs transformers: max |diff| / max |logit| = {diff:.3e}")
            assert diff < 1e-5, diff
            if key == "logits":
                print(f"{d}: greedy equal: {greedy == fixture['greedy'].tolist()} {greedy}")
                assert greedy == fixture["greedy"].tolist()
            text = "hello world\nab c"
            got = llama_cpp_tokenize(llm, chars, text)
            assert got == [chars.index(c) for c in text], got
            del llm
    print("llama.cpp agrees with transformers")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--normlab", help="the normlab binary (build/normlab): write every fixture")
    mode.add_argument("--normlab-gguf", metavar="FILE",
                      help="write only llamacpp_logits.safetensors, from FILE (`normlab export --to gguf`)")
    mode.add_argument("--check-llamacpp", action="store_true",
                      help="write nothing; check llama.cpp against transformers on hf_tiny converted to GGUF")
    mode.add_argument("--head-dim", action="store_true",
                      help="write only hf_tiny_qwen3_head_dim/ and its logits (a Qwen3 with its own head_dim)")
    mode.add_argument("--check-normlab-hf", metavar="NORMLAB",
                      help="write nothing; check transformers on NORMLAB's LLaMA, Qwen3 and OLMo 2 exports")
    parser.add_argument("--dir", default=FIXTURES, help="where the fixtures are (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = os.path.abspath(args.dir)
    os.makedirs(out, exist_ok=True)
    versions = {}
    if args.normlab_gguf:
        llamacpp_fixture(os.path.abspath(args.normlab_gguf), os.path.join(out, "llamacpp_logits.safetensors"))
    elif args.check_llamacpp:
        check_llamacpp(out)
    elif args.check_normlab_hf:
        check_normlab_hf(args.check_normlab_hf)
    elif args.head_dim:
        head_dim_part(out, versions)
    else:
        transformers_part(out, versions)
        head_dim_part(out, versions)
        if args.normlab:
            check_normlab_hf(args.normlab)
            llama_cpp_part(args.normlab, out, versions)


if __name__ == "__main__":
    main()
