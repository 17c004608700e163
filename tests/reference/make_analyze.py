#!/usr/bin/env python3
"""Writes the fixtures of `normlab analyze`'s tests with Hugging Face transformers: two random tiny
models, a token file, and every field of analysis.json recomputed by transformers in float64.

    python3 -m venv .venv-interop        # from the repository root
    .venv-interop/bin/pip install torch transformers safetensors numpy
    .venv-interop/bin/python tests/reference/make_analyze.py [--dir DIR]

Outputs (overwritten) in tests/reference/analyze/ (or DIR):
    qwen3_planted/     a random Qwen3ForCausalLM whose head_dim (16) is not hidden_size / heads (8),
                       3 layers, grouped-query heads (4 heads, 2 key/value heads); block 1's
                       down_proj writes channel PLANTED_CHANNEL 40 times larger than the others, a
                       planted massive activation (Sun et al. 2024) from block 1 on
    llama/             a random LlamaForCausalLM of hidden size 32, 3 layers, 4 heads, 2 key/value heads
    tokens/val.bin     WINDOWS * (SEQ_LEN + 1) + 7 random ids below VOCAB, uint16 (no meta.json)
    expected_qwen3_planted.json, expected_llama.json
                       analysis.json's fields for WINDOWS windows of SEQ_LEN tokens, computed here
                       with transformers' forward in float64: output_attentions for the sink and the
                       entropy, forward hooks on each decoder layer for the residual stream and for
                       skipping a block. Norm weights are keyed by transformers' parameter names.
                       transformers computes RoPE's tables, its RMSNorms and the eager softmax in
                       float32 whatever the model's dtype, so the fields are float32-exact (about
                       1e-7 relative), not float64-exact.

The definitions (docs/analyze.md): window w is ids [w(T+1), (w+1)(T+1)), inputs its first T,
targets its last T; loss the mean cross-entropy over every target; per layer act_max the largest
|h| of the decoder layer's output (before the final norm), act_max_channel its channel,
act_kurtosis mean(s^4)/mean(s^2)^2 with s_j the RMS of channel j over windows and positions,
attn_sink per head the mean over windows and query positions t >= 1 of the probability on key 0,
attn_entropy per head the mean over windows and every query position of -sum p log p, and
drop_delta_loss the loss with the layer's output replaced by its input minus the loss.

`compute_analysis(model_dir, ids, seq_len, windows)` is what tests/python/test_analyze.py calls to
check `normlab.analyze` against transformers live (where torch and transformers are installed).
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "analyze")

VOCAB = 64
WINDOWS = 4
SEQ_LEN = 16
PLANTED_CHANNEL = 13
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=45, rope_theta=5000.0, rms_norm_eps=1e-6, max_position_embeddings=64,
            hidden_act="silu", attention_bias=False, attn_implementation="eager", tie_word_embeddings=False)


def randomized(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)  # not all ones, so a norm read from the wrong place shows
            else:
                p.normal_(0.0, 0.3)
    return model


def qwen3_planted(seed):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = randomized(Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=16, use_sliding_window=False)).eval())
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[PLANTED_CHANNEL] *= 40.0
    return model


def llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return randomized(LlamaForCausalLM(LlamaConfig(**TINY, mlp_bias=False)).eval())


def layer_output(output):
    return output if isinstance(output, torch.Tensor) else output[0]


def compute_analysis(model_dir, ids, seq_len, windows):
    """analysis.json's loss, layers and norms for the transformers model in model_dir, in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                 dtype=torch.float64).eval()
    T = seq_len
    x = torch.tensor([ids[w * (T + 1):(w + 1) * (T + 1)] for w in range(windows)], dtype=torch.int64)
    inputs, targets = x[:, :T], x[:, 1:]
    layers = model.model.layers
    captured = {}

    def capture(index):
        def hook(module, args, kwargs, output):
            captured[index] = layer_output(output).detach()
        return hook

    def skip(module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        return hidden if isinstance(output, torch.Tensor) else (hidden,) + tuple(output[1:])

    def loss_of(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()

    with torch.no_grad():
        handles = [layer.register_forward_hook(capture(i), with_kwargs=True) for i, layer in enumerate(layers)]
        out = model(inputs, output_attentions=True, use_cache=False)
        for h in handles:
            h.remove()
        loss = loss_of(out.logits)
        result_layers = []
        for i in range(len(layers)):
            h = captured[i]                        # (N, T, D)
            flat = h.abs().reshape(-1, h.shape[-1])
            act_max = flat.max().item()
            channel = int(torch.nonzero(flat == act_max)[0, 1])
            s2 = (h * h).mean(dim=(0, 1))          # (D,) s_j^2
            p = out.attentions[i]                  # (N, H, T, T)
            entropy = torch.special.entr(p).sum(-1)  # (N, H, T)
            handle = layers[i].register_forward_hook(skip, with_kwargs=True)
            dropped = loss_of(model(inputs, use_cache=False).logits)
            handle.remove()
            result_layers.append({
                "layer": i, "act_max": act_max, "act_max_channel": channel,
                "act_kurtosis": ((s2 * s2).mean() / s2.mean() ** 2).item(),
                "attn_sink": p[:, :, 1:, 0].mean(dim=(0, 2)).tolist(),
                "attn_entropy": entropy.mean(dim=(0, 2)).tolist(),
                "drop_delta_loss": dropped - loss})
    norms = []
    for name, param in model.named_parameters():
        if "norm" not in name:
            continue
        w = param.detach().abs()
        order = sorted(range(w.numel()), key=lambda j: (-w[j].item(), j))[:5]
        norms.append({"hf_name": name, "weight_max_abs": w.max().item(), "weight_mean_abs": w.mean().item(),
                      "weight_top_channels": order})
    return {"loss": loss, "layers": result_layers, "norms": norms}


def main():
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=FIXTURES, help="where to write (default tests/reference/analyze/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(os.path.join(args.dir, "tokens"), exist_ok=True)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, VOCAB, size=WINDOWS * (SEQ_LEN + 1) + 7).astype("<u2")
    ids.tofile(os.path.join(args.dir, "tokens", "val.bin"))
    for name, make, seed in (("qwen3_planted", qwen3_planted, 11), ("llama", llama, 12)):
        model_dir = os.path.join(args.dir, name)
        shutil.rmtree(model_dir, ignore_errors=True)
        make(seed).save_pretrained(model_dir, safe_serialization=True)
        expected = compute_analysis(model_dir, ids.astype(np.int64).tolist(), SEQ_LEN, WINDOWS)
        expected.update({"windows": WINDOWS, "seq_len": SEQ_LEN, "torch": torch.__version__,
                         "transformers": transformers.__version__})
        with open(os.path.join(args.dir, f"expected_{name}.json"), "w") as f:
            json.dump(expected, f, indent=1)
        print(name, "loss", expected["loss"], "act_max", [round(l["act_max"], 3) for l in expected["layers"]],
              "channels", [l["act_max_channel"] for l in expected["layers"]])


if __name__ == "__main__":
    main()
