#!/usr/bin/env python3
"""PyTorch DDP side of examples/cli/bench_ddp.py: the toy transformer of torch_bench.py trained with
DistributedDataParallel (gloo, CPU) on a global batch split over the processes, as normlab's
`mpirun -np N normlab train` does. Launch with torchrun:

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 examples/cli/torch_ddp_bench.py --threads 1 ...

Rank 0 prints one JSON object: the median step time and what part of it backward + the gradient
all-reduce took. Run with one process (plain python3) it trains without DDP, for the 1-process figure.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402  (the same Transformer as `normlab bench torch`)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--vocab-size", type=int, default=11)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=0)
    p.add_argument("--multiple-of", type=int, default=32)
    p.add_argument("--ffn-hidden-dim", type=int, default=0)
    p.add_argument("--norm", default="rmsnorm")
    p.add_argument("--norm-eps", type=float, default=None)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--seq-len", type=int, default=16, help="model input length T")
    p.add_argument("--batch", type=int, default=64, help="the global batch (split over the processes)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.pre_norm = True

    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    if a.batch % world != 0:
        raise SystemExit(f"torch_ddp_bench.py: --batch {a.batch} is not a multiple of the {world} processes")
    local = a.batch // world

    torch.manual_seed(a.seed)  # the same initial weights on every process (DDP also broadcasts them)
    model = torch_bench.Transformer(a)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed)
    times, backward_times = [], []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab_size, (a.batch, a.seq_len + 1), generator=gen)  # the global batch
        ids = ids[rank * local:(rank + 1) * local]
        start = time.perf_counter()
        opt.zero_grad()
        logits = ddp(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab_size), ids[:, 1:].reshape(-1))
        before_backward = time.perf_counter()
        loss.backward()  # DDP's bucketed all-reduce overlaps this and is complete when it returns
        after_backward = time.perf_counter()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= a.warmup:
            times.append(elapsed)
            backward_times.append(after_backward - before_backward)
    times.sort()
    backward_times.sort()
    if rank == 0:
        print(json.dumps({"torch_version": torch.__version__, "processes": world, "threads": torch.get_num_threads(),
                          "median_step_s": times[len(times) // 2],
                          "median_backward_s": backward_times[len(backward_times) // 2],
                          "parameters": sum(p.numel() for p in model.parameters()), "final_loss": loss.item()}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
