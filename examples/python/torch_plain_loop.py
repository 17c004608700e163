#!/usr/bin/env python3
"""PyTorch's training step timed as a user times it: a plain loop over the model of
examples/cli/torch_bench.py (LLaMA-style, AdamW, grad-norm clipping, random tokens), tokens per second
as the mean over the timed steps. The check that `normlab bench torch` reports what PyTorch does
outside it (docs/benchmarks.md, "Fair to PyTorch").

    python3 examples/python/torch_plain_loop.py --threads 2 --sdpa          # nanoGPT's size, f32
    python3 examples/python/torch_plain_loop.py --threads 2 --autocast bf16
"""
import argparse
import importlib.util
import os
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_torch_bench():
    spec = importlib.util.spec_from_file_location("torch_bench", os.path.join(HERE, "..", "cli", "torch_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention (nanoGPT's), else LLaMA's")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none")
    # configs/char_text.json at nanoGPT's size, as docs/benchmarks.md's `bench torch --set` line.
    p.add_argument("--vocab-size", type=int, default=65)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=6)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    bench = load_torch_bench()
    model_args = argparse.Namespace(vocab_size=a.vocab_size, dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
                                    n_kv_heads=a.n_heads, multiple_of=32, ffn_hidden_dim=0, norm="rmsnorm",
                                    norm_eps=1e-6, pre_norm=True, qk_norm="none", rope_theta=10000.0,
                                    seq_len=a.seq_len, sdpa=a.sdpa)
    torch.manual_seed(0)
    model = bench.Transformer(model_args)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    start = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            start = time.perf_counter()
        ids = torch.randint(0, a.vocab_size, (a.batch, a.seq_len + 1))
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, a.vocab_size), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - start
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'SDPA' if a.sdpa else 'LLaMA attention'}, autocast {a.autocast}: "
          f"{a.batch * a.seq_len * a.steps / seconds:.0f} tokens/s over {a.steps} steps after {a.warmup}")


if __name__ == "__main__":
    main()
