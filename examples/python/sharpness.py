"""The sharpness of a small LLaMA-style model's training loss: its top Hessian eigenvalue, by power
iteration on Hessian-vector products (normlab.autograd.functional.hvp, double backward through the
fused RMSNorm, attention, SwiGLU and cross-entropy nodes), in float64.

    python examples/python/sharpness.py [--iterations N]

The model, its weights, the batch and the start vector come from tests/reference/fixtures/
sharpness.safetensors, which tests/reference/make_fixtures.py wrote with PyTorch running the same
power iteration with torch.autograd.functional.hvp; the script prints both sequences and exits
non-zero when they differ by more than 1e-10 relative. Both are the same f64 computation apart from
rounding, which power iteration does not amplify: they agree to about 2e-14; the margin is for
other CPUs and BLAS kernels.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

import normlab as nl
import normlab.nn.functional as F
from normlab.autograd.functional import hvp

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference", "fixtures",
                       "sharpness.safetensors")


def read_safetensors(path):
    """{name: ndarray} and the metadata of a safetensors file (an 8-byte header length, a JSON header, the data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    dtypes = {"F64": np.float64, "F32": np.float32, "I64": np.int64}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"]).copy()
    return tensors, metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=None, help="power iterations (default: the fixture's)")
    args = parser.parse_args()

    tensors, meta = read_safetensors(FIXTURE)
    model = nl.nn.Transformer(vocab_size=int(meta["vocab_size"]), dim=int(meta["dim"]), n_layers=int(meta["n_layers"]),
                              n_heads=int(meta["n_heads"]), n_kv_heads=int(meta["n_kv_heads"]),
                              multiple_of=int(meta["multiple_of"]), norm_type="rmsnorm",
                              norm_eps=float(meta["norm_eps"]), rope_theta=float(meta["rope_theta"]),
                              dtype=nl.float64)  # fused norms, attention and SwiGLU: the defaults
    names = [name for name, _ in model.named_parameters()]
    model.load_state_dict({name: nl.tensor(tensors[name]) for name in names})
    ids, targets = nl.tensor(tensors["ids"]), nl.tensor(tensors["targets"])
    vocab = int(meta["vocab_size"])

    def loss_fn(*params):
        # hvp hands the parameters over as they are (leaves that require grad), so the model reads them.
        return F.cross_entropy(model(ids).reshape(-1, vocab), targets.reshape(-1))

    params = tuple(model.parameters())
    v = tuple(nl.tensor(tensors["v0." + name]) for name in names)
    expected = tensors["eigenvalue"]
    iterations = args.iterations or len(expected)
    print(f"{sum(p.numel() for p in params)} parameters, loss {loss_fn().item():.12f}")
    print(f"{'iteration':>9}  {'normlab <v, Hv>':>22}  {'PyTorch':>22}  {'relative difference':>19}")
    worst = 0.0
    for i in range(iterations):
        _, hv = hvp(loss_fn, params, v)
        eigenvalue = sum((a * b).sum().item() for a, b in zip(v, hv))
        norm = math.sqrt(sum((h * h).sum().item() for h in hv))
        v = tuple(h / norm for h in hv)
        if i < len(expected):
            difference = abs(eigenvalue - expected[i]) / abs(expected[i])
            worst = max(worst, difference)
            print(f"{i:>9}  {eigenvalue:>22.15g}  {expected[i]:>22.15g}  {difference:>19.2e}")
        else:
            print(f"{i:>9}  {eigenvalue:>22.15g}")
    low, high = tensors["hessian_eigenvalue_extremes"]
    print(f"sharpness after {iterations} iterations: {eigenvalue:.12g} (the full Hessian's eigenvalues, by "
          f"PyTorch, lie in [{low:.6g}, {high:.6g}])")
    if worst > 1e-10:
        print(f"FAILED: normlab and PyTorch differ by {worst:.2e} relative (more than 1e-10)")
        return 1
    print("normlab's power iteration matches PyTorch's to 1e-10 relative at every iteration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
