#!/usr/bin/env python3
"""`normlab analyze` on a model of Qwen3-0.6B's shape against transformers, time and peak memory.

    python3 examples/python/analyze_bench.py --normlab build/normlab --dir runs/qwen3-0.6b-shape

1. --dir gets (once; an existing model there is reused) a Qwen3ForCausalLM with Qwen3-0.6B's
   config (hidden 1024, 28 layers, 16 heads of 128 with 8 key/value heads, intermediate 3072,
   vocabulary 151,936, tied embeddings) and random weights N(0, 0.02), saved in bf16 as the real
   checkpoint ships, and tokens/val.bin: N * (T + 1) random ids (uint32, with meta.json).
2. transformers (eager attention, float32, the script's thread count) runs the same windows one at
   a time with output_attentions and output_hidden_states: the probed forward analyze makes. Its
   time and the process's peak resident memory (ru_maxrss) are printed.
3. `normlab analyze DIR --tokens DIR/tokens --windows N --seq-len T` runs as a child process: its
   time split as the job reports it (the probed forward against the whole job, which adds one
   forward per block for drop_delta_loss) and its peak resident memory (the child's ru_maxrss).

Both on the same threads (--threads, default 2, through OMP_NUM_THREADS and torch.set_num_threads).
CI never runs this (it needs torch and transformers, and minutes).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time


def make_model(path, windows, seq_len):
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                         attention_bias=False, hidden_act="silu")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.tie_weights()
    model.save_pretrained(path, safe_serialization=True)
    tokens = os.path.join(path, "tokens")
    os.makedirs(tokens, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=windows * (seq_len + 1)).astype("<u4")
    ids.tofile(os.path.join(tokens, "val.bin"))
    with open(os.path.join(tokens, "meta.json"), "w") as f:
        json.dump({"vocab_size": config.vocab_size, "dtype": "uint32"}, f)


def transformers_forward(path, windows, seq_len, threads):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    ids = np.fromfile(os.path.join(path, "tokens", "val.bin"), dtype="<u4").astype(np.int64)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    loaded = time.perf_counter()
    with torch.no_grad():
        for w in range(windows):
            x = torch.from_numpy(ids[w * (seq_len + 1):w * (seq_len + 1) + seq_len]).unsqueeze(0)
            model(x, output_attentions=True, output_hidden_states=True, use_cache=False)
    done = time.perf_counter()
    return {"load_s": loaded - start, "forward_s": done - loaded,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def normlab_analyze(normlab, path, windows, seq_len, threads, out):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    r = subprocess.run([normlab, "analyze", path, "--tokens", os.path.join(path, "tokens"), "--windows", str(windows),
                        "--seq-len", str(seq_len), "--out", out, "--force"], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"normlab analyze failed ({r.returncode}): {r.stderr.strip()}")
    analysis = json.load(open(os.path.join(out, "analysis.json")))
    return {"total_s": elapsed, "timing": analysis.get("timing", {}),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--normlab", required=True, help="the normlab program")
    parser.add_argument("--dir", required=True, help="the model's directory (made when absent)")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-transformers", action="store_true", help="time normlab only")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        make_model(args.dir, args.windows, args.seq_len)
    ours = normlab_analyze(args.normlab, args.dir, args.windows, args.seq_len, args.threads,
                           os.path.join(args.dir, "analysis"))
    print(f"normlab analyze: {ours['total_s']:.1f} s in all, {json.dumps(ours['timing'])}, "
          f"peak RSS {ours['peak_rss_gib']:.2f} GiB")
    if not args.skip_transformers:
        theirs = transformers_forward(args.dir, args.windows, args.seq_len, args.threads)
        print(f"transformers: load {theirs['load_s']:.1f} s, {args.windows} windows of {args.seq_len} with "
              f"output_attentions and output_hidden_states {theirs['forward_s']:.1f} s, "
              f"peak RSS {theirs['peak_rss_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
