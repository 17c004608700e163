"""normlab.torch: normlab's fused CPU kernels as PyTorch autograd Functions and Modules, against
PyTorch's own ops (forward, gradients, torch.autograd.gradcheck in float64) and without copies."""
import math

import pytest

torch = pytest.importorskip("torch", reason="test_torch needs PyTorch (pip install torch)")
import torch.nn.functional as F  # noqa: E402

import normlab as nl  # noqa: E402
import normlab.torch as nt  # noqa: E402


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=dtype) * 1.5 + 0.3).requires_grad_(True)
    d = shape[-1]
    weight = (1 + 0.5 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_(True)
    bias = (0.5 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_(True)
    return x, weight, bias


def _grads(y, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(y.shape, generator=g, dtype=y.dtype)
    return torch.autograd.grad(y, inputs, dy)


def _close(a, b, dtype):
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_matches_pytorch(dtype):
    x, w, b = _inputs((3, 5, 48), dtype)
    ours = nt.layer_norm(x, (48,), w, b, 1e-5)
    theirs = F.layer_norm(x, (48,), w, b, 1e-5)
    _close(ours, theirs, dtype)
    for a, c in zip(_grads(ours, (x, w, b)), _grads(theirs, (x, w, b))):
        _close(a, c, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_pytorch(dtype):
    x, w, _ = _inputs((7, 40), dtype)
    for eps in (None, 1e-6):
        ours = nt.rms_norm(x, (40,), w, eps)
        theirs = F.rms_norm(x, (40,), w, eps)
        _close(ours, theirs, dtype)
        for a, c in zip(_grads(ours, (x, w)), _grads(theirs, (x, w))):
            _close(a, c, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_default_eps_is_pytorchs_for_half_inputs(dtype):
    # Rows of tiny values, where eps decides the output: PyTorch's eps=None is float32's epsilon for
    # half inputs (the dtype it computes the statistic in), not finfo(float16).eps.
    x = (torch.randn(4, 16, generator=torch.Generator().manual_seed(3)) * 1e-3).to(dtype)
    ours = nt.rms_norm(x, (16,), None, None).float()
    theirs = F.rms_norm(x, (16,), None, None).float()
    wrong = F.rms_norm(x, (16,), None, torch.finfo(dtype).eps).float()
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    assert (wrong - theirs).abs().max() > 10 * tol  # the check can tell the two eps apart


def test_modules_match_pytorch_and_the_articles_formulas():
    dtype = torch.float64
    x, _, _ = _inputs((4, 32), dtype)
    torch.testing.assert_close(nt.LayerNorm(32, dtype=dtype)(x), torch.nn.LayerNorm(32, dtype=dtype)(x))
    torch.testing.assert_close(nt.RMSNorm(32, dtype=dtype)(x), torch.nn.RMSNorm(32, dtype=dtype)(x))

    def rms(v, eps=1e-5):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)

    m = nt.RMSNormWithBias(32, dtype=dtype)
    with torch.no_grad():
        m.bias.fill_(0.25)
    torch.testing.assert_close(m(x), rms(x) * m.weight + m.bias)
    p = nt.PRMSNorm(32, p=0.25, dtype=dtype)
    k = math.ceil(0.25 * 32)
    torch.testing.assert_close(p(x), x * torch.rsqrt(x[:, :k].pow(2).mean(-1, keepdim=True) + 1e-5))
    a = nt.AdaptiveRMSNorm(32, dtype=dtype)
    torch.testing.assert_close(a(x), rms(x) * torch.sigmoid(x.std(-1, keepdim=True)))
    h = nt.HybridNorm(32, alpha=0.3, dtype=dtype)
    torch.testing.assert_close(h(x), 0.3 * rms(x) + 0.7 * F.layer_norm(x, (32,), eps=1e-5))
    assert [n for n, _ in h.named_parameters()] == ["rms_norm.weight", "layer_norm.weight", "layer_norm.bias"]


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm", "RMSNormWithBias", "PRMSNorm", "AdaptiveRMSNorm",
                                  "HybridNorm"])
def test_module_gradients_pass_gradcheck(name):
    module = getattr(nt, name)(16, dtype=torch.float64)
    x, _, _ = _inputs((3, 16), torch.float64)
    params = list(module.parameters())

    def f(x, *values):
        for p, v in zip(params, values):
            p.data = v.detach()
        return torch.func.functional_call(module, {n: v for (n, _), v in zip(module.named_parameters(), values)}, (x,))

    values = tuple(p.detach().clone().add_(0.1).requires_grad_(True) for p in params)
    assert torch.autograd.gradcheck(f, (x, *values))


def test_swiglu_and_attention_match_pytorch():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 24, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 24, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(nt.swiglu(a, b), F.silu(a) * b)
    assert torch.autograd.gradcheck(nt.swiglu, (a, b))

    B, T, H, KV, hd = 2, 9, 4, 2, 8
    q = torch.randn(B, T, H, hd, generator=g, requires_grad=True)
    k = torch.randn(B, T, KV, hd, generator=g, requires_grad=True)
    v = torch.randn(B, T, KV, hd, generator=g, requires_grad=True)
    ours = nt.causal_attention(q, k, v)
    repeat = H // KV
    theirs = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(repeat, 2).transpose(1, 2),
                                            v.repeat_interleave(repeat, 2).transpose(1, 2),
                                            is_causal=True).transpose(1, 2)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for x, y in zip(_grads(ours, (q, k, v)), _grads(theirs, (q, k, v))):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_tensors_cross_without_copies():
    x = torch.randn(8, 16)
    assert nl.from_dlpack(x).data_ptr() == x.data_ptr()
    y = nl.randn(3, 4)
    assert torch.from_dlpack(y).data_ptr() == y.data_ptr()
    t = torch.from_dlpack(y)
    t[0, 0] = 42.0  # PyTorch writes normlab's memory
    assert y[0, 0].item() == 42.0


def test_bad_input_names_what_was_expected():
    x = torch.randn(2, 8)
    with pytest.raises(nl.Error, match=r"expected normalized_shape \(8,\) for an input \(2, 8\), found \(4,\)"):
        nt.layer_norm(x, (4,))
    with pytest.raises(nl.Error):
        nt.rms_norm(torch.randn(2, 8), (8,), torch.ones(5))


def test_torch_imports_after_normlab_in_a_fresh_process():
    # normlab opens NCCL only on first use: had its extension loaded the CUDA toolkit's libnccl.so.2,
    # a CUDA build of PyTorch imported afterwards would find that older library in its place.
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", "import normlab, torch; print(torch.ones(2).sum().item())"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.0"
