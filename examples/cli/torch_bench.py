#!/usr/bin/env python3
"""PyTorch side of `normlab bench torch`: the same models as normlab, timed on CPU or a GPU (--device).

1. The stability experiment (the seed article's SimpleModel: Linear 100->256, norm, ReLU,
   Linear 256->256, norm, ReLU, Linear 256->10; MSE on x ~ N(0,1) (1000, 100), y ~ N(0,1) (1000, 10);
   Adam lr 1e-3; one full-batch step per epoch) with LayerNorm and with RMSNorm: seconds per epoch.
2. The toy transformer (LLaMA-style, as normlab's layers/transformer.h: token embedding, pre- or
   post-norm blocks with causal multi-head attention, grouped-query heads, interleaved RoPE and a
   SwiGLU feed-forward without biases, a final norm, an output head), trained with AdamW and global
   grad-norm clipping on random tokens: tokens per second (batch * seq_len / step time). Its attention
   is timed both ways PyTorch users write it (--attention both, the default): LLaMA's reference code
   (scores by matmul, an additive causal mask, softmax, matmul: "transformer" in the JSON) and
   F.scaled_dot_product_attention(is_causal=True), as nanoGPT calls it ("transformer_sdpa"), whose
   CPU kernel is a flash attention. Which is faster depends on the dtype and the machine.

`normlab bench torch` runs this with --json and the model sizes it resolved from
configs/toy_transformer.json, so both sides build the same model. Run alone, it prints a table.
With --device cuda[:N] the model, data and optimizer state live on that GPU (data drawn on the host,
then moved, like normlab) and each timed epoch/step is bracketed by torch.cuda.synchronize(), so the
time is the kernels', not their launches. CI never runs this script (it needs `pip install torch`).
"""
import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from torch_model import FeedForward  # noqa: E402  (LLaMA's SwiGLU, shared with the replay)


def summarize(samples):
    """Median, quartiles and extremes of per-call seconds (the same summary as normlab's)."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
    return {"median_s": statistics.median(s), "p25_s": q[0], "p75_s": q[2], "min_s": s[0], "max_s": s[-1],
            "samples": len(s)}


def synchronize(device):
    """Waits for the GPU's queued kernels (a no-op on the CPU), so a timed step is the kernels' time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_norm(kind, dim, eps):
    # The best each library offers: nn.LayerNorm (weight and bias) and nn.RMSNorm (weight only).
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps if eps is not None else 1e-5)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps if eps is not None else 1e-6)
    raise SystemExit(f"torch_bench.py: norm '{kind}' has no PyTorch twin here (layernorm, rmsnorm)")


# ---- 1. the stability experiment ----

class SimpleModel(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.fc1 = nn.Linear(100, 256)
        self.norm1 = make_norm(norm, 256, None)
        self.fc2 = nn.Linear(256, 256)
        self.norm2 = make_norm(norm, 256, None)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.norm1(self.fc1(x)))
        x = F.relu(self.norm2(self.fc2(x)))
        return self.fc3(x)


def bench_stability(norm, epochs, warmup, device):
    torch.manual_seed(0)
    model = SimpleModel(norm).to(device)  # before the optimizer, so its state is created on the device
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(1000, 100).to(device)
    y = torch.randn(1000, 10).to(device)
    times = []
    for epoch in range(warmup + epochs):
        synchronize(device)
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        synchronize(device)
        elapsed = time.perf_counter() - start
        if epoch >= warmup:
            times.append(elapsed)
    out = summarize(times)
    out["final_loss"] = loss.item()
    return out


# ---- 2. the toy transformer (LLaMA's model.py, as normlab's layers/transformer.h) ----

def rope_tables(head_dim, seq_len, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), freqs)  # (T, hd/2)
    return torch.polar(torch.ones_like(angles), angles)          # complex64


def apply_rope(x, freqs_cis):
    # x (B, T, H, hd): rotate interleaved pairs (x[2k], x[2k+1]) as LLaMA does with complex numbers.
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, qk_norm="none", norm="rmsnorm", norm_eps=None, sdpa=False):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.sdpa = sdpa  # F.scaled_dot_product_attention instead of LLaMA's matmul + mask + softmax
        self.head_dim = dim // n_heads
        # qk_norm "head" (Qwen3, Gemma 3): each head's q and k vectors normalized before RoPE, one
        # norm of head_dim shared by the heads, as normlab's Attention.
        if qk_norm not in ("none", "head"):
            raise SystemExit(f"torch_bench.py: qk_norm '{qk_norm}' has no PyTorch twin here (none, head)")
        self.qk_norm = qk_norm
        if qk_norm == "head":
            self.q_norm = make_norm(norm, self.head_dim, norm_eps)
            self.k_norm = make_norm(norm, self.head_dim, norm_eps)
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, freqs_cis, mask):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:  # repeat_kv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if self.sdpa:  # nanoGPT's call: causal, the default scale 1 / sqrt(head_dim)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(B, T, -1))
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = (probs @ v).transpose(1, 2).reshape(B, T, -1)
        return self.wo(out)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention = Attention(a.dim, a.n_heads, a.n_kv_heads or a.n_heads, getattr(a, "qk_norm", "none"), a.norm,
                                   a.norm_eps, getattr(a, "sdpa", False))
        self.feed_forward = FeedForward(a.dim, a.ffn_hidden_dim or 4 * a.dim, a.multiple_of)
        self.attention_norm = make_norm(a.norm, a.dim, a.norm_eps)
        self.ffn_norm = make_norm(a.norm, a.dim, a.norm_eps)
        self.pre_norm = a.pre_norm

    def forward(self, x, freqs_cis, mask):
        if self.pre_norm:
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
            return h + self.feed_forward(self.ffn_norm(h))
        h = self.attention_norm(x + self.attention(x, freqs_cis, mask))
        return self.ffn_norm(h + self.feed_forward(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = make_norm(a.norm, a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        # A buffer, so model.to(device) moves it too (not saved: it is recomputed).
        self.register_buffer("freqs_cis", rope_tables(a.dim // a.n_heads, a.seq_len, a.rope_theta), persistent=False)

    def forward(self, ids):
        T = ids.shape[1]
        h = self.tok_embeddings(ids)
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1)
        for layer in self.layers:
            h = layer(h, self.freqs_cis[:T], mask)
        return self.output(self.norm(h))


def gemm_flops_at_model_shapes(model, rows, device, dtype=torch.float32, reps=5):
    """torch.mm on every forward and backward GEMM shape of one training step (as normlab's
    gemm_flops_at_model_shapes): per Linear (out, in) at M rows, X W^T, dY W and dY^T X, in `dtype`
    (bf16 runs on oneDNN on the CPU)."""
    mats, flops = [], 0.0
    for name, p in model.named_parameters():
        if p.dim() != 2 or "embeddings" in name:
            continue
        out_f, in_f = p.shape
        for (m, n, k, ta, tb) in ((rows, out_f, in_f, False, True), (rows, in_f, out_f, False, False),
                                  (out_f, in_f, rows, True, False)):
            a_ = torch.randn(k, m, device=device, dtype=dtype).t() if ta else torch.randn(m, k, device=device, dtype=dtype)
            b_ = torch.randn(n, k, device=device, dtype=dtype).t() if tb else torch.randn(k, n, device=device, dtype=dtype)
            mats.append((a_, b_))
            flops += 2.0 * m * n * k
    times = []
    for rep in range(reps + 1):  # the first pass warms up
        synchronize(device)
        start = time.perf_counter()
        for a_, b_ in mats:
            torch.mm(a_, b_)
        synchronize(device)
        if rep > 0:
            times.append(time.perf_counter() - start)
    return flops / statistics.median(times)


def bench_transformer(a, device, gemm_flops=True):
    torch.manual_seed(a.seed)
    model = Transformer(a).to(device)  # before AdamW, so its moments are created on the device
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed)
    times = []
    # --profile: the timed steps under torch.profiler (normlab bench torch --profile prints its table
    # beside normlab's); a no-op context otherwise.
    profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if a.profile
                else contextlib.nullcontext())
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab_size, (a.batch, a.seq_len + 1), generator=gen).to(device)
        synchronize(device)
        if step == a.warmup:
            profiler.__enter__()
        start = time.perf_counter()
        opt.zero_grad()
        # --autocast bf16: the forward under torch.autocast, which keeps the loss in f32.
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, a.vocab_size), ids[:, 1:].reshape(-1))
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        synchronize(device)
        elapsed = time.perf_counter() - start
        if step >= a.warmup:
            times.append(elapsed)
    profiler.__exit__(None, None, None)
    out = summarize(times)
    if gemm_flops:
        out["gemm_flops_per_s"] = gemm_flops_at_model_shapes(
            model, a.batch * a.seq_len, device, torch.bfloat16 if a.autocast == "bf16" else torch.float32)
    if a.profile:
        out["profile_table"] = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    out["tokens_per_s"] = a.batch * a.seq_len / out["median_s"]
    out["parameters"] = sum(p.numel() for p in model.parameters())
    out["final_loss"] = loss.item()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object (what normlab bench torch reads)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the models, data and optimizers live")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--epochs", type=int, default=100, help="timed stability epochs per norm")
    p.add_argument("--warmup", type=int, default=3, help="untimed epochs/steps first")
    p.add_argument("--skip-stability", action="store_true")
    p.add_argument("--skip-transformer", action="store_true")
    # The toy transformer; normlab bench torch passes the values it resolved from the config.
    p.add_argument("--vocab-size", type=int, default=11)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=0)
    p.add_argument("--multiple-of", type=int, default=32)
    p.add_argument("--ffn-hidden-dim", type=int, default=0)
    p.add_argument("--norm", default="rmsnorm")
    p.add_argument("--norm-eps", type=float, default=None)
    p.add_argument("--post-norm", dest="pre_norm", action="store_false")
    p.add_argument("--qk-norm", choices=("none", "head"), default="none")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--seq-len", type=int, default=16, help="model input length T")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=50, help="timed transformer training steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="bf16: the forward under torch.autocast(dtype=torch.bfloat16); the GEMM timing in bf16")
    p.add_argument("--attention", choices=("llama", "sdpa", "both"), default="both",
                   help="the transformer's attention: LLaMA's matmul + mask + softmax (JSON key transformer), "
                        "F.scaled_dot_product_attention (transformer_sdpa), or both, timed one after the other")
    p.add_argument("--profile", action="store_true",
                   help="run the timed transformer steps under torch.profiler and report key_averages()")
    a = p.parse_args()

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"torch_bench.py: --device {a.device} asks for a GPU, but torch.cuda.is_available() is False "
                         f"(PyTorch {torch.__version__}, CUDA build {torch.version.cuda})")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SystemExit(f"torch_bench.py: --device {a.device} asks for GPU {device.index}, but PyTorch sees "
                         f"{torch.cuda.device_count()}")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    result = {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
              "python": sys.version.split()[0], "device": str(device)}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    if not a.skip_stability:
        result["stability"] = {norm: bench_stability(norm, a.epochs, a.warmup, device)
                               for norm in ("layernorm", "rmsnorm")}
    if not a.skip_transformer:
        if a.attention in ("llama", "both"):
            result["transformer"] = bench_transformer(argparse.Namespace(**vars(a), sdpa=False), device)
        if a.attention in ("sdpa", "both"):
            result["transformer_sdpa"] = bench_transformer(argparse.Namespace(**vars(a), sdpa=True), device,
                                                           gemm_flops="transformer" not in result)

    if a.json:
        print(json.dumps(result))
        return
    print(f"PyTorch {result['torch_version']} on {result['device']}, {result['threads']} threads")
    for norm, r in result.get("stability", {}).items():
        print(f"  stability {norm:<10} {r['median_s'] * 1e3:8.3f} ms/epoch  [{r['min_s'] * 1e3:.3f}, {r['max_s'] * 1e3:.3f}]")
    for key, label in (("transformer", "LLaMA's attention"), ("transformer_sdpa", "scaled_dot_product_attention")):
        if key in result:
            r = result[key]
            print(f"  transformer  {r['tokens_per_s']:10.0f} tokens/s  ({r['median_s'] * 1e3:.2f} ms/step, "
                  f"{r['parameters']} parameters; {label})")


if __name__ == "__main__":
    main()
