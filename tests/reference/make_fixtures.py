#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures that normlab's C++ tests compare against.

Run from anywhere (needs `pip install torch safetensors`; takes about a minute on 2 cores):

    python3 tests/reference/make_fixtures.py [--normlab build/normlab] [--only FILE ...]

The training replays (train_replay_f64) run the normlab program (default build/normlab).

Outputs (all overwritten):
    tests/reference/python_sample.safetensors   a tiny file for the safetensors reader test
    tests/reference/fixtures/*.safetensors      layer, loss, optimizer and stability fixtures
    tests/reference/README.md                   everything after the GENERATED marker: one table
                                                per file (tensor name, shape, dtype, meaning)

Deterministic: each fixture seeds torch itself (torch.manual_seed) and torch runs on one CPU
thread, so a rerun with the same torch version writes the same values. Every file records the
torch version and its hyper-parameters in its safetensors __metadata__.

The modules below follow Meta's LLaMA reference code (facebookresearch/llama, llama/model.py):
RMSNorm, FeedForward (SwiGLU), Attention with complex-pair RoPE and grouped-query heads, and
TransformerBlock (pre-norm); DyT is the module of Zhu et al. 2025 (Transformers without
Normalization). Attention, TransformerBlock and Transformer take options beyond LLaMA, written from
the papers (their docstrings cite them), off by default: the norm placements post, peri, output,
deepnorm and none, Mix-LN, LayerNorm Scaling, QK-norm, any norm type, and attention and logit
soft-capping (the transformer_variants fixture). They live in examples/python/torch_model.py (shared with
the training replay, examples/python/torch_replay.py) so the fixtures do not depend on any model
library. The article's own modules (its RMSNorm, RMSNormWithBias, AdaptiveRMSNorm,
HybridNorm, StableRMSNorm, DebuggableRMSNorm, LLaMAFeedForward, migrate_layernorm_to_rmsnorm and
the stability experiment's SimpleModel) are in article.py, copied from the article's code; the
article_* and stability_* fixtures are made with them.
"""

import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import article  # noqa: E402  (the article's modules, copied from its code)

sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from torch_model import (  # noqa: E402  (the LLaMA-style PyTorch model, shared with the replay)
    Attention, DyT, FeedForward, RMSNorm, Transformer, TransformerBlock, causal_mask,
    norm_factory, precompute_freqs_cis, precompute_freqs_cis_f64, repeat_kv, swiglu_hidden_dim)

FIXTURES = os.path.join(HERE, "fixtures")
README = os.path.join(HERE, "README.md")
MARKER = "<!-- GENERATED BELOW BY make_fixtures.py: do not edit by hand -->"



# ---------------------------------------------------------------------------------------------
# Fixture bookkeeping: every tensor is written with a one-line meaning, which goes to the README.
# ---------------------------------------------------------------------------------------------


def sort_metadata_keys(path):
    """Rewrites the header with __metadata__'s keys sorted, in place.

    The Rust writer keeps metadata in a HashMap, so its key order (and the file's bytes) would change
    from run to run; sorted keys make reruns byte-identical and match normlab's writer. The header
    keeps its length (same keys, same compact JSON), so the data section does not move.
    """
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        ordered = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
        ordered.update(header)
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        text += b" " * (n - len(text))
        assert len(text) == n, path
        f.seek(8)
        f.write(text)


class Fixture:
    def __init__(self, filename, description, **metadata):
        self.filename = filename
        self.description = description
        self.metadata = {k: str(v) for k, v in metadata.items()}
        self.entries = []  # (name, tensor, meaning)
        self.table = None  # README rows (name pattern, shape, dtype, meaning) instead of one per tensor
        self.readme_extra = []  # README lines before the tensor table

    def add(self, name, tensor, meaning):
        assert all(name != n for n, _, _ in self.entries), name
        self.entries.append((name, tensor.detach().clone().contiguous(), meaning))

    def write(self, directory):
        metadata = {"torch_version": torch.__version__, "generator": "tests/reference/make_fixtures.py",
                    "fixture": self.filename.replace(".safetensors", "")}
        metadata.update(self.metadata)
        path = os.path.join(directory, self.filename)
        save_file({n: t for n, t, _ in self.entries}, path, metadata=metadata)
        sort_metadata_keys(path)

    def readme_section(self):
        lines = [f"### `fixtures/{self.filename}`", "", self.description, ""]
        shown = {k: v for k, v in self.metadata.items() if self.table is None or "." not in k}
        if shown:
            meta = ", ".join(f"`{k}={v}`" for k, v in shown.items())
            lines += [f"Metadata: {meta} (plus `torch_version`, `generator`, `fixture`).", ""]
        lines += self.readme_extra
        lines += ["| tensor | shape | dtype | meaning |", "|---|---|---|---|"]
        if self.table is not None:
            lines += [f"| `{name}` | {shape} | {dtype} | {meaning} |" for name, shape, dtype, meaning in self.table]
            return "\n".join(lines) + "\n"
        for name, tensor, meaning in self.entries:
            dtype = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16",
                     torch.float16: "F16", torch.int64: "I64"}[tensor.dtype]
            lines.append(f"| `{name}` | `{list(tensor.shape)}` | {dtype} | {meaning} |")
        return "\n".join(lines) + "\n"


def add_param_grads(fx, module, prefix_note=""):
    """Adds `<name>` and `grad.<name>` for every parameter, with PyTorch's dotted names."""
    for name, p in module.named_parameters():
        fx.add(name, p, f"parameter{prefix_note}")
    for name, p in module.named_parameters():
        fx.add(f"grad.{name}", p.grad, f"d(sum(output * grad_output)) / d({name})")


def run_layer(fx, module, x, forward=None):
    """Forward, backward with a random upstream gradient; stores input, params, output and grads."""
    x = x.clone().requires_grad_(True)
    out = forward(x) if forward else module(x)
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    fx.add("input", x, "layer input")
    add_param_grads(fx, module)
    fx.add("output", out, "layer output")
    fx.add("grad_output", grad_output, "upstream gradient fed to backward (random)")
    fx.add("grad_input", x.grad, "d(sum(output * grad_output)) / d(input)")
    return out


# ---------------------------------------------------------------------------------------------
# Layer fixtures
# ---------------------------------------------------------------------------------------------


def fixture_linear():
    torch.manual_seed(1)
    fx = Fixture("linear.safetensors",
                 "`nn.Linear(5, 4)` with bias (PyTorch default init) on a 3-D input: "
                 "`output = input @ weight.T + bias` over the last dim.",
                 in_features=5, out_features=4)
    layer = nn.Linear(5, 4)
    run_layer(fx, layer, torch.randn(2, 3, 5))
    return fx


def fixture_layernorm():
    torch.manual_seed(2)
    fx = Fixture("layernorm.safetensors",
                 "`nn.LayerNorm(8, eps=1e-5)` with random weight (1 + 0.5 N(0,1)) and bias (0.2 N(0,1)); "
                 "input is N(0,1) * 2 + 0.5 so centering matters.",
                 normalized_shape=8, eps=1e-5)
    layer = nn.LayerNorm(8, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(1 + 0.5 * torch.randn(8))
        layer.bias.copy_(0.2 * torch.randn(8))
    run_layer(fx, layer, torch.randn(3, 4, 8) * 2 + 0.5)
    return fx


def fixture_rmsnorm():
    torch.manual_seed(3)
    fx = Fixture("rmsnorm.safetensors",
                 "LLaMA RMSNorm(8, eps=1e-6): `x * rsqrt(mean(x^2, -1, keepdim) + eps)` in f32, "
                 "`type_as(x)`, times `weight` (random: 1 + 0.5 N(0,1)); input N(0,1) * 2 + 0.5.",
                 dim=8, eps=1e-6)
    layer = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        layer.weight.copy_(1 + 0.5 * torch.randn(8))
    run_layer(fx, layer, torch.randn(3, 4, 8) * 2 + 0.5)
    return fx


def fixture_rmsnorm_bf16():
    torch.manual_seed(4)
    fx = Fixture("rmsnorm_bf16.safetensors",
                 "The same LLaMA RMSNorm(8, eps=1e-6) with a BF16 input and BF16 weight: the norm is "
                 "computed in f32, cast back to bf16 (`type_as`), then multiplied by the bf16 weight "
                 "(a bf16 product). Gradients are what PyTorch's autograd gives in bf16; compare with "
                 "bf16 tolerances (a few bf16 ulps, e.g. rtol 2e-2).",
                 dim=8, eps=1e-6)
    layer = RMSNorm(8, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_((1 + 0.5 * torch.randn(8)).to(torch.bfloat16))
    run_layer(fx, layer, (torch.randn(3, 4, 8) * 2 + 0.5).to(torch.bfloat16))
    return fx


def fixture_dyt():
    torch.manual_seed(13)
    fx = Fixture("dyt.safetensors",
                 "DyT(8, alpha_init_value=0.5) (the paper's module) in F64: `torch.tanh(alpha * x) * weight + "
                 "bias`, alpha [1], weight [8] and bias [8] randomized (alpha 0.5 + 0.3 N(0,1), weight "
                 "1 + 0.5 N(0,1), bias 0.2 N(0,1)); input N(0,1) * 2 + 0.5 so tanh saturates in places. "
                 "Every tensor is F64.",
                 dim=8, alpha_init=0.5, dtype="f64")
    layer = DyT(8, alpha_init_value=0.5).double()
    with torch.no_grad():
        layer.alpha.copy_(0.5 + 0.3 * torch.randn(1))
        layer.weight.copy_(1 + 0.5 * torch.randn(8))
        layer.bias.copy_(0.2 * torch.randn(8))
    run_layer(fx, layer, (torch.randn(3, 4, 8) * 2 + 0.5).double())
    return fx


def fixture_swiglu():
    torch.manual_seed(5)
    dim, hidden_arg, multiple_of = 16, 64, 8
    hidden = swiglu_hidden_dim(hidden_arg, multiple_of)
    fx = Fixture("swiglu.safetensors",
                 f"LLaMA FeedForward(dim={dim}, hidden_dim={hidden_arg}, multiple_of={multiple_of}): hidden = "
                 f"{multiple_of} * ceil(int(2*{hidden_arg}/3) / {multiple_of}) = {hidden}; "
                 "`output = w2(silu(w1(x)) * w3(x))`, no biases, PyTorch default Linear init.",
                 dim=dim, hidden_dim_arg=hidden_arg, multiple_of=multiple_of, hidden=hidden)
    layer = FeedForward(dim, hidden_arg, multiple_of)
    run_layer(fx, layer, torch.randn(2, 3, dim))
    return fx


def add_rope(fx, freqs_cis):
    fx.add("rope.cos", freqs_cis.real, "cos(t * theta^(-2k/head_dim)) for position t, pair k (f32, as LLaMA)")
    fx.add("rope.sin", freqs_cis.imag, "sin(t * theta^(-2k/head_dim))")


ATTENTION_CONVENTIONS = (
    "RoPE: LLaMA's `apply_rotary_emb`: per head, the pairs `(x[..., 2k], x[..., 2k+1])` (interleaved, "
    "NOT the half-split GPT-NeoX/HF layout) are rotated as complex numbers by angle `t * theta^(-2k/head_dim)`, "
    "theta = 10000, positions t = 0..T-1. Grouped-query: query head h uses kv head `h // (n_heads / n_kv_heads)`. "
    "Scores `q k^T / sqrt(head_dim)` plus a causal mask (-inf above the diagonal), softmax in f32, "
    "`probs @ v`, heads concatenated back to `(B, T, n_heads * head_dim)`, then `wo`."
)


def fixture_attention():
    torch.manual_seed(6)
    dim, n_heads, n_kv_heads, B, T = 16, 4, 2, 2, 5
    fx = Fixture("attention.safetensors",
                 f"Causal self-attention as LLaMA's `Attention` (dim={dim}, n_heads={n_heads}, "
                 f"n_kv_heads={n_kv_heads}, head_dim={dim // n_heads}, no biases, PyTorch default Linear "
                 f"init) on input (B={B}, T={T}, dim). " + ATTENTION_CONVENTIONS,
                 dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=dim // n_heads, rope_theta=10000.0,
                 causal=True)
    layer = Attention(dim, n_heads, n_kv_heads)
    freqs_cis = precompute_freqs_cis(dim // n_heads, T, 10000.0)
    mask = causal_mask(T)
    run_layer(fx, layer, torch.randn(B, T, dim), forward=lambda x: layer(x, freqs_cis, mask))
    add_rope(fx, freqs_cis)
    fx.add("debug.q_rope", layer.debug["q_rope"], "queries after RoPE, (B, T, n_heads, head_dim)")
    fx.add("debug.k_rope", layer.debug["k_rope"], "keys after RoPE, (B, T, n_kv_heads, head_dim), before repeat_kv")
    fx.add("debug.probs", layer.debug["probs"], "softmax attention weights, (B, n_heads, T, T)")
    return fx


def fixture_llama_block():
    torch.manual_seed(7)
    dim, n_heads, n_kv_heads, hidden_arg, multiple_of, eps, B, T = 16, 4, 2, 64, 8, 1e-6, 2, 6
    hidden = swiglu_hidden_dim(hidden_arg, multiple_of)
    fx = Fixture("llama_block.safetensors",
                 f"LLaMA `TransformerBlock` (pre-norm): `h = x + attention(attention_norm(x))`, "
                 f"`output = h + feed_forward(ffn_norm(h))`. dim={dim}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, "
                 f"head_dim={dim // n_heads}, FFN hidden_dim arg {hidden_arg} with multiple_of {multiple_of} -> "
                 f"hidden {hidden}, RMSNorm eps {eps} with random weights (1 + 0.5 N(0,1)), input (B={B}, T={T}, dim). "
                 "Attention conventions as in attention.safetensors.",
                 dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=dim // n_heads, ffn_hidden_dim_arg=hidden_arg,
                 multiple_of=multiple_of, hidden=hidden, norm_eps=eps, rope_theta=10000.0, causal=True)
    block = TransformerBlock(dim, n_heads, n_kv_heads, hidden_arg, multiple_of, eps)
    with torch.no_grad():
        block.attention_norm.weight.copy_(1 + 0.5 * torch.randn(dim))
        block.ffn_norm.weight.copy_(1 + 0.5 * torch.randn(dim))
    freqs_cis = precompute_freqs_cis(dim // n_heads, T, 10000.0)
    mask = causal_mask(T)
    run_layer(fx, block, torch.randn(B, T, dim), forward=lambda x: block(x, freqs_cis, mask))
    add_rope(fx, freqs_cis)
    return fx



def fixture_llama_block_autocast_bf16():
    """One LLaMA block run three ways on the same weights and input: in f64 (the exact answer), in f32
    under torch.autocast("cpu", dtype=torch.bfloat16) (what PyTorch's mixed precision gives), so the
    C++ test can hold normlab's autocast to PyTorch's error, tensor by tensor."""
    torch.manual_seed(11)
    dim, n_heads, n_kv_heads, hidden_arg, multiple_of, eps, B, T = 64, 4, 2, 256, 32, 1e-6, 2, 32
    hidden = swiglu_hidden_dim(hidden_arg, multiple_of)
    fx = Fixture("llama_block_autocast_bf16.safetensors",
                 f"The LLaMA `TransformerBlock` of llama_block.safetensors at dim={dim}, n_heads={n_heads}, "
                 f"n_kv_heads={n_kv_heads}, FFN hidden_dim arg {hidden_arg} with multiple_of {multiple_of} -> hidden "
                 f"{hidden}, RMSNorm eps {eps} with weights 1 + 0.5 N(0,1), input (B={B}, T={T}, dim), run twice on "
                 "the same f32 parameters and input: under `torch.autocast(\"cpu\", dtype=torch.bfloat16)` "
                 "(`output`, `grad_input`, `grad.*`: PyTorch's mixed precision; every Linear and both attention "
                 "matmuls in bf16, softmax and the norms in f32, the residual stream f32) and as a float64 copy of "
                 "the block (`f64.*`: the exact answer to compare both against).",
                 dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=dim // n_heads, ffn_hidden_dim_arg=hidden_arg,
                 multiple_of=multiple_of, hidden=hidden, norm_eps=eps, rope_theta=10000.0, causal=True,
                 autocast="bf16")
    block = TransformerBlock(dim, n_heads, n_kv_heads, hidden_arg, multiple_of, eps)
    with torch.no_grad():
        block.attention_norm.weight.copy_(1 + 0.5 * torch.randn(dim))
        block.ffn_norm.weight.copy_(1 + 0.5 * torch.randn(dim))
    exact = copy.deepcopy(block).double()
    freqs_cis = precompute_freqs_cis(dim // n_heads, T, 10000.0)
    mask = causal_mask(T)
    x = torch.randn(B, T, dim).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(x, freqs_cis, mask)
    assert out.dtype == torch.float32  # the residual stream: f32 input plus bf16 branches
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    fx.add("input", x, "block input (f32)")
    add_param_grads(fx, block, " (f32)")
    fx.add("output", out, "block output under bf16 autocast (f32: the residual stream)")
    fx.add("grad_output", grad_output, "upstream gradient fed to backward (random)")
    fx.add("grad_input", x.grad, "d(sum(output * grad_output)) / d(input) under bf16 autocast")
    # The exact answer: the same parameters, input and upstream gradient in float64. RoPE's table is
    # widened from LLaMA's complex64 one, so both runs rotate by the same angles.
    x64 = x.detach().double().requires_grad_(True)
    out64 = exact(x64, freqs_cis.to(torch.complex128), mask.double())
    out64.backward(grad_output.double())
    fx.add("f64.output", out64, "the block's output in float64 (F64)")
    fx.add("f64.grad_input", x64.grad, "d(sum(output * grad_output)) / d(input) in float64 (F64)")
    for name, p in exact.named_parameters():
        fx.add(f"f64.grad.{name}", p.grad, f"d(sum(output * grad_output)) / d({name}) in float64 (F64)")
    return fx

def fixture_cross_entropy():
    torch.manual_seed(8)
    N, C = 8, 7
    fx = Fixture("cross_entropy.safetensors",
                 f"`F.cross_entropy(logits, target, ignore_index=-100, reduction='mean')` on logits ({N}, {C}); "
                 "targets 1 and 5 are -100 (ignored), so the mean is over the 6 other rows. The loss is a 0-d "
                 "tensor and `grad_output` a random 0-d upstream gradient.",
                 ignore_index=-100, reduction="mean")
    logits = (torch.randn(N, C) * 2).requires_grad_(True)
    target = torch.randint(0, C, (N,))
    target[1] = -100
    target[5] = -100
    out = F.cross_entropy(logits, target, ignore_index=-100, reduction="mean")
    grad_output = torch.randn(())
    out.backward(grad_output)
    fx.add("input", logits, "logits (N, C)")
    fx.add("target", target, "class indices (I64); -100 = ignored")
    fx.add("output", out, "mean loss over non-ignored rows (0-d)")
    fx.add("grad_output", grad_output, "upstream gradient (0-d, random)")
    fx.add("grad_input", logits.grad, "d(output * grad_output) / d(logits); ignored rows are 0")
    return fx


def fixture_cross_entropy_z_loss_f64():
    torch.manual_seed(20)
    N, C, z = 9, 11, 1e-2
    fx = Fixture("cross_entropy_z_loss_f64.safetensors",
                 f"Cross-entropy plus PaLM's z-loss in f64 on logits ({N}, {C}) (N(0,1) * 3 + 2, so lse is far from "
                 f"0): `F.cross_entropy(logits, target, ignore_index=-100, reduction='mean') + {z} * "
                 "(torch.logsumexp(logits, -1)[target != -100] ** 2).mean()`; targets 2 and 6 are -100. `z_term` is "
                 "the added term alone; the loss and `grad_output` are 0-d. `sum.*`: the same with "
                 "reduction='sum' (the z term summed), upstream gradient 1.",
                 ignore_index=-100, reduction="mean", z_loss=z)
    logits = (torch.randn(N, C, dtype=torch.float64) * 3 + 2).requires_grad_(True)
    target = torch.randint(0, C, (N,))
    target[2] = -100
    target[6] = -100
    keep = target != -100

    def terms(reduction):
        ce = F.cross_entropy(logits, target, ignore_index=-100, reduction=reduction)
        lse_sq = torch.logsumexp(logits, -1)[keep] ** 2
        z_term = z * (lse_sq.mean() if reduction == "mean" else lse_sq.sum())
        return ce + z_term, z_term

    out, z_term = terms("mean")
    grad_output = torch.randn((), dtype=torch.float64)
    out.backward(grad_output)
    fx.add("input", logits, "logits (N, C), F64")
    fx.add("target", target, "class indices (I64); -100 = ignored")
    fx.add("output", out, "cross-entropy + z_loss * mean(lse^2) over the non-ignored rows (0-d, F64)")
    fx.add("z_term", z_term, "z_loss * mean(lse^2) alone (0-d, F64)")
    fx.add("grad_output", grad_output, "upstream gradient (0-d, random, F64)")
    fx.add("grad_input", logits.grad, "d(output * grad_output) / d(logits); ignored rows are 0 (F64)")
    logits.grad = None
    out_sum, z_sum = terms("sum")
    out_sum.backward()
    fx.add("sum.output", out_sum, "reduction='sum': cross-entropy + z_loss * sum(lse^2) (0-d, F64)")
    fx.add("sum.z_term", z_sum, "z_loss * sum(lse^2) alone (0-d, F64)")
    fx.add("sum.grad_input", logits.grad, "d(sum.output) / d(logits) (F64)")
    return fx


def fixture_attention_softcap_f64():
    torch.manual_seed(21)
    B, T, L, H, KV, hd, cap = 2, 5, 9, 4, 2, 8, 2.0
    fx = Fixture("attention_softcap_f64.safetensors",
                 f"Causal attention with Gemma 2's score soft-capping in f64, at the kernel's level: q (B={B}, T={T}, "
                 f"H={H}, hd={hd}), k and v (B, L={L}, KV={KV}, hd) (grouped-query: query head h reads kv head "
                 f"`h // (H / KV)`; L > T: query row i sits at position L - T + i, as after a KV cache, and sees keys "
                 f"0..L - T + i). Scores `q k^T / sqrt(hd)` (q, k N(0,1) * 2, so the cap {cap} bites), then "
                 f"`{cap} * tanh(scores / {cap})`, then the causal mask (-inf), softmax, `probs @ v`; `output` is "
                 "(B, T, H, hd). Gradients are those of `sum(output * grad_output)`.",
                 softcap=cap, causal=True)
    q = (torch.randn(B, T, H, hd, dtype=torch.float64) * 2).requires_grad_(True)
    k = (torch.randn(B, L, KV, hd, dtype=torch.float64) * 2).requires_grad_(True)
    v = torch.randn(B, L, KV, hd, dtype=torch.float64).requires_grad_(True)
    keys = repeat_kv(k, H // KV).transpose(1, 2)     # (B, H, L, hd)
    values = repeat_kv(v, H // KV).transpose(1, 2)   # (B, H, L, hd)
    scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) / math.sqrt(hd)  # (B, H, T, L)
    scores = cap * torch.tanh(scores / cap)
    mask = torch.triu(torch.full((T, L), float("-inf"), dtype=torch.float64), diagonal=L - T + 1)
    probs = F.softmax(scores + mask, dim=-1)
    out = torch.matmul(probs, values).transpose(1, 2).contiguous()  # (B, T, H, hd)
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    fx.add("q", q, "queries (B, T, H, hd), F64")
    fx.add("k", k, "keys (B, L, KV, hd), F64")
    fx.add("v", v, "values (B, L, KV, hd), F64")
    fx.add("output", out, "attention output (B, T, H, hd), F64")
    fx.add("grad_output", grad_output, "upstream gradient (random), F64")
    fx.add("grad.q", q.grad, "d(sum(output * grad_output)) / d(q), F64")
    fx.add("grad.k", k.grad, "d(sum(output * grad_output)) / d(k), F64")
    fx.add("grad.v", v.grad, "d(sum(output * grad_output)) / d(v), F64")
    return fx


def fixture_mse():
    torch.manual_seed(9)
    fx = Fixture("mse.safetensors", "`F.mse_loss(input, target, reduction='mean')`; loss and upstream gradient are 0-d.",
                 reduction="mean")
    x = torch.randn(4, 5).requires_grad_(True)
    target = torch.randn(4, 5)
    out = F.mse_loss(x, target)
    grad_output = torch.randn(())
    out.backward(grad_output)
    fx.add("input", x, "prediction")
    fx.add("target", target, "target (no gradient)")
    fx.add("output", out, "mean((input - target)^2) (0-d)")
    fx.add("grad_output", grad_output, "upstream gradient (0-d, random)")
    fx.add("grad_input", x.grad, "d(output * grad_output) / d(input) = grad_output * 2 (input - target) / numel")
    return fx


# ---------------------------------------------------------------------------------------------
# The transformer's norm placements, QK-norm, DyT and the stabilizers, one small model per case
# ---------------------------------------------------------------------------------------------

# Each case is normlab's config keys (the /model object, plus /train/z_loss), which the C++ test
# reads through read_train_config. The shared sizes are in TRANSFORMER_VARIANT_MODEL.
TRANSFORMER_VARIANT_MODEL = {"dim": 16, "n_layers": 3, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 8,
                             "ffn_hidden_dim": 16, "max_seq_len": 8}
TRANSFORMER_VARIANT_CASES = [
    # (name, /model keys, /train/z_loss)
    ("pre", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "pre"}, 0.0),
    ("post", {"norm": {"type": "layernorm", "eps": 1e-5}, "norm_placement": "post"}, 0.0),
    ("peri", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "peri"}, 0.0),
    ("output", {"norm": {"type": "layernorm", "eps": 1e-5}, "norm_placement": "output"}, 0.0),
    ("mix", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "mix", "mix_fraction": 0.5}, 0.0),
    ("deepnorm", {"norm": {"type": "layernorm", "eps": 1e-5}, "norm_placement": "deepnorm"}, 0.0),
    ("none", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "none"}, 0.0),
    ("pre_depth", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "pre", "norm_scaling": "depth"}, 0.0),
    ("mix_depth", {"norm": {"type": "layernorm", "eps": 1e-5}, "norm_placement": "mix", "mix_fraction": 0.34,
                   "norm_scaling": "depth"}, 0.0),
    ("peri_depth", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "norm_placement": "peri", "norm_scaling": "depth"}, 0.0),
    ("qk_head_rmsnorm", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "qk_norm": "head"}, 0.0),
    ("qk_full_rmsnorm", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "qk_norm": "full"}, 0.0),
    ("qk_head_layernorm", {"norm": {"type": "layernorm", "eps": 1e-5}, "qk_norm": "head"}, 0.0),
    ("qk_full_layernorm", {"norm": {"type": "layernorm", "eps": 1e-5}, "qk_norm": "full"}, 0.0),
    ("dyt_pre", {"norm": {"type": "dyt", "alpha_init": 0.5, "alpha_init_attention": 0.8}, "norm_placement": "pre"}, 0.0),
    ("dyt_mix", {"norm": {"type": "dyt", "alpha_init": 0.2, "alpha_init_attention": 1.3}, "norm_placement": "mix",
                 "mix_fraction": 0.5}, 0.0),
    ("softcap_z_loss", {"norm": {"type": "rmsnorm", "eps": 1e-5}, "logit_softcap": 1.5, "attn_softcap": 0.5}, 1e-2),
    ("z_loss", {"norm": {"type": "rmsnorm", "eps": 1e-5}}, 1e-3),
]


def transformer_variant_model(model_keys):
    """The reference Transformer a case's /model keys describe (normlab's defaults for keys not given),
    its blocks' placements, and DeepNet's alpha and beta (None unless deepnorm)."""
    m = dict(TRANSFORMER_VARIANT_MODEL, **model_keys)
    n = m["n_layers"]
    norm = m["norm"]
    placement = m.get("norm_placement", "pre")
    if placement == "mix":  # Mix-LN: the first ceil(mix_fraction * n_layers) blocks post-norm, then pre-norm
        n_post = math.ceil(m["mix_fraction"] * n)
        placements = ["post"] * n_post + ["pre"] * (n - n_post)
    else:
        placements = [placement] * n
    # LayerNorm Scaling (Sun et al. 2025): the l-th block's (1-based) pre-norm outputs times 1 / sqrt(l).
    scales = [1 / math.sqrt(l) for l in range(1, n + 1)] if m.get("norm_scaling") == "depth" else None
    # DeepNet (Wang et al. 2022), decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4).
    alpha, beta = ((2 * n) ** 0.25, (8 * n) ** -0.25) if placement == "deepnorm" else (1.0, None)
    make_norm = norm_factory(norm["type"], norm.get("eps", 1e-5), norm.get("alpha_init", 0.5))
    model = Transformer(VARIANT_VOCAB, m["dim"], n, m["n_heads"], m["n_kv_heads"], m["ffn_hidden_dim"],
                        m["multiple_of"], norm.get("eps", 1e-5), placements=placements, make_norm=make_norm,
                        pre_norm_scales=scales, deepnorm_alpha=alpha,
                        alpha_init_attention=norm.get("alpha_init_attention"), qk_norm=m.get("qk_norm", "none"),
                        attn_softcap=m.get("attn_softcap", 0.0), logit_softcap=m.get("logit_softcap", 0.0))
    return model, placements, alpha, beta


VARIANT_VOCAB, VARIANT_B, VARIANT_T = 11, 2, 5


def variant_loss(logits, targets, z_loss):
    """Mean cross-entropy over the scored targets plus PaLM's z-loss, z_loss * mean(logsumexp^2) over them."""
    flat, t = logits.view(-1, VARIANT_VOCAB), targets.view(-1)
    keep = t != -100
    return F.cross_entropy(flat, t, ignore_index=-100) + z_loss * (torch.logsumexp(flat, -1)[keep] ** 2).mean()


def fixture_transformer_variants():
    torch.manual_seed(41)
    cases = [name for name, _, _ in TRANSFORMER_VARIANT_CASES]
    configs = {f"config.{name}": json.dumps({"model": dict(TRANSFORMER_VARIANT_MODEL, **keys), "train": {"z_loss": z}},
                                            sort_keys=True, separators=(",", ":"))
               for name, keys, z in TRANSFORMER_VARIANT_CASES}
    fx = Fixture("transformer_variants_f64.safetensors",
                 f"normlab's transformer variants against an independent PyTorch model in float64 (vocab "
                 f"{VARIANT_VOCAB}, dim 16, 3 blocks, 2 heads and 1 kv head, SwiGLU hidden_dim arg 16 with multiple_of 8 "
                 f"-> hidden 16, batch {VARIANT_B} x T {VARIANT_T}): `Transformer` above with its options, one case "
                 "per norm placement (pre, post, peri, output, mix with some blocks post, deepnorm, none), LayerNorm "
                 "Scaling (norm_scaling depth), QK-norm head and full with rmsnorm and layernorm, DyT with its own "
                 "alpha_init_attention, logit and attention soft-capping and the z-loss. Each case `<case>` is the "
                 "normlab config in the metadata's `config.<case>` (its /model object and /train/z_loss): PyTorch "
                 "default init (Embedding N(0,1), Linear kaiming-uniform; deepnorm multiplies wv, wo, w1, w2, w3 by "
                 "beta), then every norm parameter randomized (weights and DyT's alpha times 1 + 0.3 N(0,1), biases "
                 "0.2 N(0,1)). RoPE's table in float64. The loss is `F.cross_entropy(logits.view(-1, V), "
                 "targets.view(-1))` (mean; target [1, 2] is -100, ignored) plus `z_loss * mean(logsumexp(logits)^2)` "
                 "over the scored rows. Every float tensor is F64.",
                 cases=",".join(cases), vocab_size=VARIANT_VOCAB, batch=VARIANT_B, seq_len=VARIANT_T, **configs)
    ids = torch.randint(0, VARIANT_VOCAB, (VARIANT_B, VARIANT_T))
    targets = torch.randint(0, VARIANT_VOCAB, (VARIANT_B, VARIANT_T))
    targets[1, 2] = -100
    fx.add("ids", ids, "input token ids (B, T), I64, shared by every case")
    fx.add("targets", targets, "target ids (B, T), I64; -100 is ignored")
    freqs_cis = precompute_freqs_cis_f64(TRANSFORMER_VARIANT_MODEL["dim"] // TRANSFORMER_VARIANT_MODEL["n_heads"],
                                         VARIANT_T)
    mask = causal_mask(VARIANT_T).double()
    shared = {}  # the matrices' values, the same in every case but deepnorm
    for name, keys, z in TRANSFORMER_VARIANT_CASES:
        torch.manual_seed(42)  # the same matrices in every case (norms draw nothing at construction)
        model, placements, alpha, beta = transformer_variant_model(keys)
        model = model.double()
        with torch.no_grad():
            if beta is not None:  # DeepNet's init: the value, output and feed-forward projections times beta
                for layer in model.layers:
                    for lin in (layer.attention.wv, layer.attention.wo, layer.feed_forward.w1,
                                layer.feed_forward.w2, layer.feed_forward.w3):
                        lin.weight.mul_(beta)
            for pname, p in model.named_parameters():
                if pname.endswith(".alpha"):
                    fx.add(f"{name}.init.{pname}", p, "DyT's alpha as initialized (alpha_init or alpha_init_attention)")
            for pname, p in model.named_parameters():
                if "norm" in pname.split(".")[-2]:
                    p.copy_(0.2 * torch.randn(p.shape, dtype=torch.float64) if pname.endswith("bias")
                            else p * (1 + 0.3 * torch.randn(p.shape, dtype=torch.float64)))
        logits = model(ids, freqs_cis, mask)
        loss = variant_loss(logits, targets, z)
        loss.backward()
        if keys.get("logit_softcap") or keys.get("attn_softcap"):
            # The caps bite: the same model uncapped has another loss.
            caps = model.logit_softcap, [layer.attention.softcap for layer in model.layers]
            model.logit_softcap = 0.0
            for layer in model.layers:
                layer.attention.softcap = 0.0
            with torch.no_grad():
                assert abs(variant_loss(model(ids, freqs_cis, mask), targets, z).item() - loss.item()) > 1e-2
            model.logit_softcap = caps[0]
            for layer, cap in zip(model.layers, caps[1]):
                layer.attention.softcap = cap
        for pname, p in model.named_parameters():
            # The matrices every case shares are stored once, as weights.<name> (the first case's).
            if "norm" in pname.split(".")[-2]:
                fx.add(f"{name}.{pname}", p, "parameter (F64)")
            elif pname not in shared:
                shared[pname] = p.detach().clone()
                fx.add(f"weights.{pname}", p, "parameter (F64) of every case that has no <case>.<name> of its own")
            elif not torch.equal(shared[pname], p):
                fx.add(f"{name}.{pname}", p, "parameter (F64)")
        fx.add(f"{name}.logits", logits, "logits (B, T, V), F64")
        fx.add(f"{name}.loss", loss, "cross-entropy + z_loss * mean(lse^2) (0-d, F64)")
        for pname, p in model.named_parameters():
            fx.add(f"{name}.grad.{pname}", p.grad, f"d(loss) / d({pname}) (F64)")
        fx.metadata[f"placements.{name}"] = ",".join(placements)
        if beta is not None:
            fx.metadata[f"deepnorm_alpha.{name}"] = repr(alpha)
            fx.metadata[f"deepnorm_beta.{name}"] = repr(beta)
    fx.readme_extra = ["Metadata per case: `config.<case>` (the JSON config: /model and /train/z_loss), "
                       "`placements.<case>` (each block's placement), and for deepnorm `deepnorm_alpha.<case>`, "
                       "`deepnorm_beta.<case>`. The cases:", "",
                       "| case | blocks | /model keys besides the sizes | /train/z_loss |", "|---|---|---|---|"]
    for name, keys, z in TRANSFORMER_VARIANT_CASES:
        fx.readme_extra.append(f"| `{name}` | {fx.metadata['placements.' + name]} | "
                               f"`{json.dumps(keys, separators=(',', ':'))}` | {z} |")
    fx.readme_extra.append("")
    fx.table = [("ids", "`[2, 5]`", "I64", "input token ids, shared by every case"),
                ("targets", "`[2, 5]`", "I64", "target ids; -100 is ignored"),
                ("weights.<name>", "", "F64", "the embedding's, attention's, feed-forward's and output's matrices "
                 "(the same in every case), by their normlab / LLaMA names"),
                ("<case>.<name>", "", "F64", "the case's norm parameters (`...attention_norm.weight`, "
                 "`...attention.q_norm.weight`, `norm.alpha`, ...) and the matrices where they differ from "
                 "`weights.<name>` (deepnorm's beta-scaled ones)"),
                ("<case>.init.<name>", "`[1]`", "F64", "DyT cases: each alpha as initialized, before it was randomized"),
                ("<case>.logits", "`[2, 5, 11]`", "F64", "logits (B, T, V)"),
                ("<case>.loss", "`[]`", "F64", "the loss (0-d)"),
                ("<case>.grad.<name>", "", "F64", "d(loss) / d(parameter), for every parameter of the case")]
    return fx


# ---------------------------------------------------------------------------------------------
# Optimizer trajectories
# ---------------------------------------------------------------------------------------------


class SmallMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.norm(self.fc1(x))))


def fixture_optimizer(filename, opt_name, weight_decay):
    torch.manual_seed(10)
    lr, steps = 1e-2, 10
    x = torch.randn(32, 8)
    y = torch.randn(32, 4)
    model = SmallMLP()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    cls = torch.optim.Adam if opt_name == "Adam" else torch.optim.AdamW
    opt = cls(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    decay_kind = {"Adam": "L2 added to the gradient (coupled)", "AdamW": "decoupled: p -= lr * wd * p"}[opt_name]
    fx = Fixture(filename,
                 f"{steps} full-batch steps of `torch.optim.{opt_name}(lr={lr}, betas=(0.9, 0.999), eps=1e-8, "
                 f"weight_decay={weight_decay})` ({decay_kind if weight_decay else 'no weight decay'}) on "
                 "SmallMLP = fc1 Linear(8, 16) -> norm LayerNorm(16) -> ReLU -> fc2 Linear(16, 4), "
                 "loss `mse_loss(model(x), y)` (mean). Each step: zero_grad, loss, backward, step; "
                 "`losses[i]` is the loss computed at step i, before that step's update.",
                 optimizer=opt_name, lr=lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=weight_decay, steps=steps,
                 amsgrad=False)
    fx.add("x", x, "input data (32, 8)")
    fx.add("y", y, "target data (32, 4)")
    for n, t in init.items():
        fx.add(f"init.{n}", t, "parameter before step 1 (PyTorch default init)")
    fx.add("losses", torch.tensor(losses, dtype=torch.float32), "loss at steps 1..10, before each update")
    for n, p in model.named_parameters():
        fx.add(f"final.{n}", p, "parameter after 10 steps")
    for n, p in model.named_parameters():
        state = opt.state[p]
        fx.add(f"state.{n}.exp_avg", state["exp_avg"], "Adam first moment m after 10 steps")
        fx.add(f"state.{n}.exp_avg_sq", state["exp_avg_sq"], "Adam second moment v after 10 steps")
    return fx


SHARPNESS_ITERATIONS = 20


def fixture_sharpness():
    """The top Hessian eigenvalue (sharpness) of a small LLaMA model's training loss, by power iteration
    on Hessian-vector products (torch.autograd.functional.hvp) in float64, from a fixed start vector."""
    torch.manual_seed(31)
    vocab, dim, n_layers, n_heads, n_kv_heads, hidden_arg, multiple_of, eps, B, T = 11, 8, 2, 2, 1, 32, 4, 1e-5, 2, 6
    fx = Fixture("sharpness.safetensors",
                 f"Power iteration for the top Hessian eigenvalue of a LLaMA `Transformer`'s training loss (vocab "
                 f"{vocab}, dim {dim}, {n_layers} pre-norm blocks, n_heads {n_heads}, n_kv_heads {n_kv_heads}, FFN "
                 f"hidden_dim arg {hidden_arg} with multiple_of {multiple_of}, RMSNorm eps {eps} with weights "
                 "1 + 0.5 N(0,1), the final RMSNorm and a bias-free output head) in float64, after 100 SGD "
                 "steps (lr 0.1) on its batch: `F.cross_entropy(model(ids).view(-1, vocab), targets.view(-1))` "
                 "(mean). The parameters stored are those after training. RoPE's table in "
                 "float64 (complex128). From `v0.*` (normalized over all parameters), iteration i computes "
                 "`hv = H v` by `torch.autograd.functional.hvp` over the parameters (functional_call), "
                 "`eigenvalue[i] = <v, hv>` and `v = hv / ||hv||`.",
                 vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                 ffn_hidden_dim_arg=hidden_arg, multiple_of=multiple_of, norm_eps=eps, rope_theta=10000.0,
                 sgd_steps=100, sgd_lr=0.1, iterations=SHARPNESS_ITERATIONS)
    model = Transformer(vocab, dim, n_layers, n_heads, n_kv_heads, hidden_arg, multiple_of, eps).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(dim, dtype=torch.float64))
    ids = torch.randint(0, vocab, (B, T))
    targets = torch.randint(0, vocab, (B, T))
    freqs_cis = precompute_freqs_cis_f64(dim // n_heads, T)
    mask = causal_mask(T).double()
    # 100 SGD steps (lr 0.1) on the batch first: near a minimum, as sharpness is usually measured,
    # the top eigenvalue is positive and well separated (about 10 and 4.7), so power iteration
    # converges in a few steps; at the random init the largest |eigenvalue| is negative.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        F.cross_entropy(model(ids, freqs_cis, mask).view(-1, vocab), targets.view(-1)).backward()
        opt.step()
    names = [name for name, _ in model.named_parameters()]
    params = tuple(p.detach() for _, p in model.named_parameters())

    def loss_fn(*values):
        logits = torch.func.functional_call(model, dict(zip(names, values)), (ids, freqs_cis, mask))
        return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    v = [torch.randn(p.shape, dtype=torch.float64) for p in params]
    norm = torch.sqrt(sum((x * x).sum() for x in v))
    v = [x / norm for x in v]
    for name, p in zip(names, params):
        fx.add(name, p, "parameter (F64)")
    fx.add("ids", ids, "input token ids (I64)")
    fx.add("targets", targets, "target token ids (I64)")
    fx.add("loss", loss_fn(*params), "the loss at the parameters (F64, 0-d)")
    for name, x in zip(names, v):
        fx.add(f"v0.{name}", x, "the power iteration's start vector, this parameter's part (F64)")
    eigenvalues = []
    for _ in range(SHARPNESS_ITERATIONS):
        _, hv = torch.autograd.functional.hvp(loss_fn, params, tuple(v))
        eigenvalues.append(sum((a * b).sum() for a, b in zip(v, hv)))
        norm = torch.sqrt(sum((h * h).sum() for h in hv))
        v = [h / norm for h in hv]
    fx.add("eigenvalue", torch.stack(eigenvalues), "<v, H v> at each iteration (F64); the last is the sharpness")
    # The exact top eigenvalue (largest |lambda|) of the whole Hessian, for the README and the docs.
    flat = torch.cat([p.reshape(-1) for p in params])
    sizes = [p.numel() for p in params]

    def flat_loss(x):
        return loss_fn(*[c.view(p.shape) for c, p in zip(torch.split(x, sizes), params)])

    lambdas = torch.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, flat))
    fx.add("hessian_eigenvalue_extremes", torch.stack([lambdas[0], lambdas[-1]]),
           "the smallest and largest eigenvalue of the full Hessian (F64), by torch.linalg.eigvalsh")
    return fx


# ---------------------------------------------------------------------------------------------
# The article's modules, one fixture each, in f32 and in f64 (article.py)
# ---------------------------------------------------------------------------------------------

ARTICLE_DIM = 8


def randomize_affine(module):
    """Weights 1 + 0.5 N(0,1), biases 0.2 N(0,1), alpha 1 + 0.5 N(0,1): ones and zeros hide mistakes."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape))
            else:
                p.copy_(1 + 0.5 * torch.randn(p.shape))


def fixture_article_norm(filename, seed, module, description, warmup=0, **metadata):
    """The module (parameters randomized) in f32 and in f64: its state dict as the article's class
    writes it, one forward and backward on a (3, 4, 8) input; `warmup` forwards first (moves
    DebuggableRMSNorm's running_rms off its initial 1 before the state is taken)."""
    torch.manual_seed(seed)
    randomize_affine(module)
    warm = [torch.randn(3, 4, ARTICLE_DIM) for _ in range(warmup)]
    x = torch.randn(3, 4, ARTICLE_DIM) * 2 + 0.5
    grad_output = torch.randn(3, 4, ARTICLE_DIM)
    fx = Fixture(filename, description + " Both dtypes: `f32.*` is the module in f32, `f64.*` the same "
                 "module converted with `.double()` (the same parameter and input values).",
                 dim=ARTICLE_DIM, **metadata)
    for dtype, dname in ((torch.float32, "f32"), (torch.float64, "f64")):
        m = copy.deepcopy(module).to(dtype)
        for w in warm:
            m(w.to(dtype))
        for name, t in m.state_dict().items():
            fx.add(f"{dname}.state.{name}", t, "the module's state_dict entry (load it strictly)")
        xi = x.to(dtype).detach().clone().requires_grad_(True)
        out = m(xi)
        out.backward(grad_output.to(dtype))
        fx.add(f"{dname}.input", xi, "input")
        fx.add(f"{dname}.output", out, "output")
        fx.add(f"{dname}.grad_output", grad_output.to(dtype), "upstream gradient fed to backward (random)")
        fx.add(f"{dname}.grad_input", xi.grad, "d(sum(output * grad_output)) / d(input)")
        for name, p in m.named_parameters():
            fx.add(f"{dname}.grad.{name}", p.grad, f"d(sum(output * grad_output)) / d({name})")
        if isinstance(m, article.DebuggableRMSNorm):
            fx.add(f"{dname}.after.running_rms", m.running_rms, "running_rms after the forward")
            info = m.get_debug_info()
            fx.add(f"{dname}.debug_info", torch.tensor([info["running_rms"], info["weight_mean"], info["weight_std"]],
                                                       dtype=torch.float64),
                   "get_debug_info() after the forward: running_rms, weight_mean, weight_std (Python floats)")
    return fx


def fixtures_article():
    A = article
    d = ARTICLE_DIM
    src = "input N(0,1) * 2 + 0.5; parameters randomized (weights 1 + 0.5 N(0,1), biases 0.2 N(0,1), alpha 1 + 0.5 N(0,1))."
    out = [
        fixture_article_norm("article_rmsnorm.safetensors", 21, A.RMSNorm(d),
                             f"The article's `RMSNorm({d})` (4.2, default eps 1e-5): `x * rsqrt(mean(x^2) + eps)`, "
                             f"`type_as(x)`, times `weight`; {src}", eps=1e-5),
        fixture_article_norm("article_stable_rmsnorm.safetensors", 22, A.StableRMSNorm(d),
                             f"The article's `StableRMSNorm({d})` (7.1, eps 1e-5): `weight * (x * rsqrt(mean(x^2) + eps))`, "
                             f"without the upcast; {src}", eps=1e-5),
        fixture_article_norm("article_rmsnorm_with_bias.safetensors", 23, A.RMSNormWithBias(d),
                             f"The article's `RMSNormWithBias({d})` (8.2, eps 1e-5): `RMSNorm(x) + bias`; {src}", eps=1e-5),
        fixture_article_norm("article_adaptive_rmsnorm.safetensors", 24, A.AdaptiveRMSNorm(d),
                             f"The article's `AdaptiveRMSNorm({d})` (8.2, eps 1e-5): `RMSNorm(x) * sigmoid(alpha * "
                             f"x.std(dim=-1, keepdim=True))` (unbiased std, no eps), alpha shape [1]; {src}", eps=1e-5),
        fixture_article_norm("article_hybridnorm.safetensors", 25, A.HybridNorm(d, alpha=0.3),
                             f"The article's `HybridNorm({d}, alpha=0.3)` (6.3, eps 1e-5): `alpha * rms_norm(x) + "
                             f"(1 - alpha) * layer_norm(x)`, `rms_norm` an RMSNorm and `layer_norm` an nn.LayerNorm, "
                             f"each with its own parameters; alpha a plain float; {src}", eps=1e-5, alpha=0.3),
        fixture_article_norm("article_debuggable_rmsnorm.safetensors", 26, A.DebuggableRMSNorm(d),
                             f"The article's `DebuggableRMSNorm({d})` (7.3, eps 1e-5, momentum 0.1) after 2 warm-up "
                             "forwards on N(0,1) inputs (so `running_rms` starts the fixture's forward away from 1); "
                             f"{src}", warmup=2, eps=1e-5, momentum=0.1, warmup_forwards=2),
    ]
    out.append(fixture_article_migrate())
    out.append(fixture_article_feedforward())
    return out


class LayerNormModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(ARTICLE_DIM, eps=1e-4)


def fixture_article_migrate():
    torch.manual_seed(27)
    model = LayerNormModel()
    randomize_affine(model)
    replacements = article.migrate_layernorm_to_rmsnorm(model)
    assert [name for name, _ in replacements] == ["ln"]
    rms = replacements[0][1]
    x = torch.randn(3, ARTICLE_DIM) * 2 + 0.5
    fx = Fixture("article_migrate.safetensors",
                 f"The article's `migrate_layernorm_to_rmsnorm` (6.3) on a model whose child `ln` is "
                 f"`nn.LayerNorm({ARTICLE_DIM}, eps=1e-4)` with random weight and bias: it builds "
                 "`RMSNorm(normalized_shape[0], eps=module.eps)` and copies the weight only.",
                 dim=ARTICLE_DIM, eps=rms.eps, replaced="ln")
    for name, t in model.state_dict().items():
        fx.add(f"before.{name}", t, "the LayerNorm model's state_dict")
    for name, t in rms.state_dict().items():
        fx.add(f"after.ln.{name}", t, "the replacing RMSNorm's state_dict, under the LayerNorm's name")
    fx.add("input", x, "input")
    fx.add("output", rms(x), "the replacing RMSNorm's output")
    return fx


def fixture_article_feedforward():
    torch.manual_seed(28)
    dim, hidden_arg = ARTICLE_DIM, 4 * ARTICLE_DIM
    layer = article.LLaMAFeedForward(dim, hidden_arg)
    hidden = layer.w1.out_features
    fx = Fixture("article_llama_feedforward.safetensors",
                 f"The article's `LLaMAFeedForward({dim}, 4 * {dim})` (4.3) with its default multiple_of=256: "
                 f"hidden = 256 * ceil(int(2 * {hidden_arg} / 3) / 256) = {hidden}; `w2(silu(w1(x)) * w3(x))`, "
                 "PyTorch default Linear init.",
                 dim=dim, hidden_dim_arg=hidden_arg, multiple_of=256, hidden=hidden)
    run_layer(fx, layer, torch.randn(2, 3, dim))
    return fx


# ---------------------------------------------------------------------------------------------
# The stability experiment (the article's 5.2): SimpleModel, MSE, Adam lr 1e-3, 100 full-batch
# epochs, with the article's classes at their default eps (1e-5 for every one of them).
# ---------------------------------------------------------------------------------------------

STABILITY_SEED = 42
STABILITY_EPOCHS = 100
STABILITY_LR = 1e-3


def stability_setup(norm):
    """Data then model, drawn in f32 from one seed: the article's SimpleModel, whose norm1 and norm2
    are the article's class for `norm` (SimpleModel builds RMSNorm or nn.LayerNorm itself; the other
    norms replace them). Every norm gets identical fc weights: norm inits draw nothing."""
    torch.manual_seed(STABILITY_SEED)
    x = torch.randn(1000, 100)
    y = torch.randn(1000, 10)
    model = article.SimpleModel(100, 256, 10, use_rmsnorm=(norm != "layernorm"))
    if norm not in ("rmsnorm", "layernorm"):
        model.norm1 = article.STABILITY_NORMS[norm](256)
        model.norm2 = article.STABILITY_NORMS[norm](256)
    return x, y, model


def stability_run(norm, dtype, perturb=0.0):
    x, y, model = stability_setup(norm)
    model = model.to(dtype)
    x, y = x.to(dtype), y.to(dtype)
    if perturb:
        with torch.no_grad():
            model.fc1.weight.mul_(1 + perturb)
    opt = torch.optim.Adam(model.parameters(), lr=STABILITY_LR)
    losses = []
    for _ in range(STABILITY_EPOCHS):
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=dtype)


def fixtures_stability():
    out = []
    x, y, _ = stability_setup("rmsnorm")
    data = Fixture("stability_data.safetensors",
                   f"Data of the stability experiment: `torch.manual_seed({STABILITY_SEED}); x = torch.randn(1000, 100); "
                   "y = torch.randn(1000, 10)` (f32; the f64 runs use these values converted to f64, exactly).",
                   seed=STABILITY_SEED)
    data.add("x", x, "inputs, N(0, 1)")
    data.add("y", y, "targets, N(0, 1)")
    out.append(data)
    for norm in article.STABILITY_NORMS:
        _, _, model = stability_setup(norm)
        cls = type(model.norm1)
        eps = model.norm1.eps if hasattr(model.norm1, "eps") else model.norm1.rms_norm.eps
        init = Fixture(f"stability_init_{norm}.safetensors",
                       f"Initial SimpleModel state_dict with the article's `{cls.__name__}(256)` as norm1 and norm2 "
                       f"(eps {eps}): drawn in f32 right after the data from the same seed, PyTorch default init "
                       "(Linear: kaiming-uniform a=sqrt(5), bias U(+-1/sqrt(fan_in)); norm weights and alpha 1, "
                       "biases 0). Loadable as `init_from` with strict names; the fc weights are identical in "
                       "every init file.",
                       norm=norm, eps=eps, seed=STABILITY_SEED)
        for n, t in model.state_dict().items():
            init.add(n, t, "initial parameter")
        out.append(init)
        for dtype, dname in ((torch.float64, "f64"), (torch.float32, "f32")):
            losses = stability_run(norm, dtype)
            perturbed = stability_run(norm, dtype, perturb=1e-6)
            run = Fixture(f"stability_{norm}_{dname}.safetensors",
                          f"Loss curve of SimpleModel with {cls.__name__} (eps {eps}) trained in {dname}: init from "
                          f"`stability_init_{norm}.safetensors` and data from `stability_data.safetensors` "
                          f"(both converted to {dname}), `torch.optim.Adam(lr={STABILITY_LR})` (betas 0.9/0.999, "
                          f"eps 1e-8, no weight decay), {STABILITY_EPOCHS} full-batch epochs of zero_grad, "
                          "`nn.MSELoss()(model(x), y)`, backward, step. `losses[i]` is epoch i+1's loss before "
                          "its update (losses[0] is the loss at the initial weights).",
                          norm=norm, eps=eps, dtype=dname, lr=STABILITY_LR, epochs=STABILITY_EPOCHS,
                          seed=STABILITY_SEED, init_from=f"stability_init_{norm}.safetensors",
                          data_from="stability_data.safetensors")
            run.add("losses", losses, f"per-epoch loss ({dname})")
            run.add("losses_perturbed", perturbed,
                    "the same run with fc1.weight scaled by (1 + 1e-6) before training: the sensitivity probe "
                    "(late epochs leave `losses`; the run is chaotic)")
            out.append(run)
    return out


# ---------------------------------------------------------------------------------------------
# The safetensors reader's sample (tests/test_safetensors.cpp asserts these exact values).
# ---------------------------------------------------------------------------------------------


def write_python_sample():
    tensors = {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,
        "f64": torch.tensor([1.0 / 3.0, -2.5e-300, 1e300], dtype=torch.float64),
        "bf16": torch.tensor([1.0, -2.5, 3.140625, -0.0], dtype=torch.bfloat16),
        "f16": torch.tensor([0.5, -65504.0, 2.0 ** -14, 2.0 ** -24], dtype=torch.float16),
        "i64": torch.tensor([-1, 0, 2 ** 40, 2 ** 63 - 1], dtype=torch.int64),
        "scalar": torch.tensor(7.25),
        "empty": torch.zeros(0, 3),
    }
    # One metadata key only: the Rust writer stores metadata in a HashMap, so with several keys
    # their order in the header (and the file's bytes) would vary between runs.
    save_file(tensors, os.path.join(HERE, "python_sample.safetensors"), metadata={"format": "pt"})


def write_readme_tables(fixtures):
    with open(README) as f:
        text = f.read()
    if MARKER not in text:
        sys.exit(f"{README}: missing the marker line {MARKER!r}")
    head = text.split(MARKER)[0]
    total = sum(os.path.getsize(os.path.join(FIXTURES, fx.filename)) for fx in fixtures)
    body = [f"_{len(fixtures)} files, {total / 1e6:.2f} MB in all, written by torch {torch.__version__}._", ""]
    body += [fx.readme_section() for fx in fixtures]
    with open(README, "w") as f:
        f.write(head + MARKER + "\n\n" + "\n".join(body))


# ---------------------------------------------------------------------------------------------
# Training replays: normlab's f64 train job against the same run in PyTorch
# ---------------------------------------------------------------------------------------------

# Short f64 runs of the train job, one per case: together every norm type, every placement, QK-norm
# head and full, DyT with its own alpha_init_attention, both soft-caps, the z-loss, GQA, heads whose
# size is not dim / n_heads (model.head_dim), LayerNorm Scaling, clipping on and off, both
# optim.decay and weight_decay_mode choices, and the sharpness probes. Each case's keys are written over REPLAY_BASE.
REPLAY_BASE = {
    "seed": 0,
    "data": {"source": "synthetic", "task": "reverse", "length": 4, "symbols": 6, "eval_sequences": 8},
    "model": {"dim": 16, "n_layers": 2, "n_heads": 4, "multiple_of": 8, "max_seq_len": 16},
    "optim": {"lr": 0.02, "min_lr": 0.002, "warmup_steps": 3, "weight_decay": 0.1},
    "train": {"steps": 10, "batch_size": 4, "eval_every": 0, "log_every": 100, "threads": 1, "dtype": "f64",
              "save_initial": True, "save_batches": True, "probe_every": 3},
}
REPLAY_CASES = [
    ("pre_rmsnorm_gqa_z_loss", {"model": {"n_kv_heads": 2, "norm": {"type": "rmsnorm"}},
                                "optim": {"decay": "matrices"}, "train": {"z_loss": 1e-3}}),
    ("post_layernorm_independent", {"seed": 1, "model": {"norm": {"type": "layernorm"}, "norm_placement": "post"},
                                    "optim": {"weight_decay_mode": "independent"}}),
    ("peri_qk_head_softcaps", {"model": {"norm": {"type": "rmsnorm"}, "norm_placement": "peri", "qk_norm": "head",
                                         "attn_softcap": 2.0, "logit_softcap": 3.0}}),
    ("deepnorm_qk_full", {"data": {"task": "sort"}, "model": {"norm": {"type": "layernorm"},
                                                            "norm_placement": "deepnorm", "qk_norm": "full"}}),
    ("output_rmsnorm_bias_no_clip", {"model": {"norm": {"type": "rmsnorm_bias"}, "norm_placement": "output"},
                                     "optim": {"grad_clip": 0.0}}),
    ("mix_hybridnorm_depth", {"model": {"n_layers": 3, "norm": {"type": "hybridnorm", "alpha": 0.3},
                                        "norm_placement": "mix", "mix_fraction": 0.34, "norm_scaling": "depth"}}),
    ("pre_dyt", {"model": {"norm": {"type": "dyt", "alpha_init": 0.6, "alpha_init_attention": 0.9}},
                 "optim": {"decay": "matrices", "weight_decay_mode": "independent"}}),
    ("pre_prmsnorm", {"model": {"norm": {"type": "prmsnorm", "p": 0.25}}}),
    ("peri_adaptive_rmsnorm", {"model": {"norm": {"type": "adaptive_rmsnorm"}, "norm_placement": "peri"}}),
    ("post_scalenorm", {"model": {"norm": {"type": "scalenorm"}, "norm_placement": "post"}}),
    ("none", {"model": {"norm_placement": "none"}, "optim": {"lr": 0.005}}),
    ("pre_qk_head_head_dim", {"seed": 2, "model": {"n_heads": 3, "head_dim": 6, "qk_norm": "head"}}),
    # The sharpness (train.sharpness_every) against the eigenvalues of the whole Hessian, on models small
    # enough to build it (about 1,900 parameters): every 2 steps beside the probes' every 3, so rows hold
    # one family or both, with the z-loss in the objective; and post-LN with the sharpness alone.
    ("pre_rmsnorm_sharpness", {"model": {"dim": 8, "n_heads": 2, "multiple_of": 4},
                               "train": {"z_loss": 1e-3, "sharpness_every": 2, "sharpness_iters": 60}}),
    ("post_layernorm_sharpness_only", {"seed": 2, "model": {"dim": 8, "n_heads": 2, "multiple_of": 4,
                                                            "norm": {"type": "layernorm"}, "norm_placement": "post"},
                                       "train": {"probe_every": 0, "sharpness_every": 3, "sharpness_iters": 60}}),
]


def replay_case_config(keys):
    """REPLAY_BASE with a case's keys written over it, object by object."""
    def merged(base, over):
        out = copy.deepcopy(base)
        for key, value in over.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out
    return merged(REPLAY_BASE, keys)


def fixture_train_replay(normlab):
    """Trains each case with the normlab program, replays it with examples/python/torch_replay.py
    and keeps PyTorch's per-step losses and grad norms and its probes of the probed steps (the replay
    asserts 1e-9 on the way)."""
    import subprocess
    import tempfile

    import torch_replay

    cases = [name for name, _ in REPLAY_CASES]
    configs = {f"config.{name}": json.dumps(replay_case_config(keys), sort_keys=True, separators=(",", ":"))
               for name, keys in REPLAY_CASES}
    fx = Fixture("train_replay_f64.safetensors",
                 "normlab's f64 train job replayed in PyTorch float64 (examples/python/torch_replay.py): each case "
                 "`<case>` is the normlab config in the metadata's `config.<case>`, trained by `normlab train` "
                 "with train.save_initial and train.save_batches, then rebuilt by the replay (torch_model.py's "
                 "modules, torch.optim.AdamW, torch.nn.utils.clip_grad_norm_, the warmup-cosine schedule) from "
                 "the run's initial checkpoint and batches. The cases cover every norm type and placement, QK-norm "
                 "head and full, DyT, both soft-caps, the z-loss, GQA, LayerNorm Scaling, clipping on and off, "
                 "optim.decay matrices and weight_decay_mode independent, and the sharpness probes (train."
                 "sharpness_every) against the eigenvalues of the whole Hessian (torch.linalg.eigvalsh).",
                 cases=",".join(cases))
    fx.metadata.update(configs)
    with tempfile.TemporaryDirectory() as scratch:
        for name, keys in REPLAY_CASES:
            config_path = os.path.join(scratch, name + ".json")
            with open(config_path, "w") as f:
                json.dump(replay_case_config(keys), f)
            run_dir = os.path.join(scratch, name)
            subprocess.run([normlab, "train", config_path, "--out", run_dir, "--quiet"], check=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
            result = torch_replay.replay(run_dir, out=lambda line: None)
            assert result["ok"], f"{name}: the replay differs by {result['worst_loss_rel']:.3e}"
            print(f"train_replay_f64 {name}: worst relative loss difference {result['worst_loss_rel']:.2e}, "
                  f"grad norm {result['worst_grad_norm_rel']:.2e}, final weights {result['final_weights_rel']:.2e}, "
                  f"probes {result['worst_probe_rel']:.2e}")
            records = result["records"]
            fx.add(f"{name}.loss", torch.tensor([r["torch_loss"] for r in records], dtype=torch.float64),
                   "PyTorch's train loss per step")
            fx.add(f"{name}.grad_norm", torch.tensor([r["torch_grad_norm"] for r in records], dtype=torch.float64),
                   "PyTorch's global gradient norm per step, before clipping")
            probed = [r for r in records if "torch_probes" in r]
            columns = list(probed[0]["torch_probes"])
            fx.metadata[f"probes.{name}"] = ",".join(columns)
            fx.metadata[f"probe_steps.{name}"] = ",".join(str(r["step"]) for r in probed)
            fx.add(f"{name}.probes", torch.tensor([[r["torch_probes"][c] for c in columns] for r in probed],
                                                  dtype=torch.float64),
                   "PyTorch's probes of the probed steps, columns named by the metadata's probes.<case>")
    fx.table = [("<case>.loss", "`[10]`", "F64", "PyTorch's train loss (the cross-entropy, without the z-loss term) "
                 "of steps 1..10"),
                ("<case>.grad_norm", "`[10]`", "F64", "PyTorch's global gradient L2 norm of steps 1..10, before "
                 "clipping"),
                ("<case>.probes", "`[rows, columns]`", "F64", "PyTorch's probes (torch_model.py ActivationProbes and "
                 "parameter_probes; full_hessian and exact_sharpness for the sharpness columns) of the steps with "
                 "a probes.csv row (metadata `probe_steps.<case>`), one column per probes.csv column named in the "
                 "metadata's `probes.<case>`, NaN where that family was not measured at the step")]
    fx.readme_extra = ["| case | keys over the base config |", "|---|---|"]
    fx.readme_extra += [f"| `{name}` | `{json.dumps(keys, separators=(',', ':'))}` |" for name, keys in REPLAY_CASES]
    fx.readme_extra.append("")
    return fx


def main():
    import argparse
    parser = argparse.ArgumentParser(description="Writes the PyTorch reference fixtures (see the module docstring).")
    parser.add_argument("--normlab", default=os.path.join(HERE, "..", "..", "build", "normlab"),
                        help="the normlab program, for the training replays (default build/normlab)")
    parser.add_argument("--only", nargs="+", metavar="FILE",
                        help="write only these fixture files (e.g. train_replay_f64.safetensors); the README's "
                             "tables are written for all")
    args = parser.parse_args()
    if not os.access(args.normlab, os.X_OK):
        sys.exit(f"{args.normlab}: no normlab program there (build it: ./setup.sh run, or pass --normlab)")
    torch.set_num_threads(1)  # reductions and GEMMs give the same bits on every run
    os.makedirs(FIXTURES, exist_ok=True)
    if not args.only:
        write_python_sample()
    fixtures = [fixture_linear(), fixture_layernorm(), fixture_rmsnorm(), fixture_rmsnorm_bf16(), fixture_dyt(),
                fixture_swiglu(),
                fixture_attention(), fixture_attention_softcap_f64(), fixture_llama_block(),
                fixture_llama_block_autocast_bf16(),
                fixture_cross_entropy(), fixture_cross_entropy_z_loss_f64(), fixture_mse(), fixture_sharpness(),
                fixture_transformer_variants(),
                fixture_optimizer("adam_mlp.safetensors", "Adam", 0.0),
                fixture_optimizer("adam_l2_mlp.safetensors", "Adam", 0.1),
                fixture_optimizer("adamw_mlp.safetensors", "AdamW", 0.1)]
    fixtures += fixtures_article()
    fixtures += fixtures_stability()
    fixtures.append(fixture_train_replay(os.path.abspath(args.normlab)))
    unknown = set(args.only or []) - {fx.filename for fx in fixtures}
    if unknown:
        sys.exit(f"--only: no fixture named {', '.join(sorted(unknown))}")
    for fx in fixtures:
        if args.only and fx.filename not in args.only:
            continue
        fx.write(FIXTURES)
        print(f"wrote fixtures/{fx.filename}: {len(fx.entries)} tensors")
    write_readme_tables(fixtures)


if __name__ == "__main__":
    main()
