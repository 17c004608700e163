"""normlab.torch: normlab's norms, fused kernels, SwiGLU's gate and causal attention as PyTorch autograd
Functions and Modules, against PyTorch's own ops and plain-PyTorch formulas (forward and every gradient
in float64, torch.autograd.gradcheck), without copies; every norm of the registry has its class, with
PyTorch's signature and the C++ module's parameter names. Each test takes the `torch` fixture
(conftest.py) and skips by name where PyTorch is not installed."""
import importlib
import inspect
import math

import pytest

import normlab as nl

REGISTRY = nl._normlab.nn


@pytest.fixture
def nt(torch):
    """normlab.torch (which imports PyTorch)."""
    return importlib.import_module("normlab.torch")


def _inputs(torch, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=dtype) * 1.5 + 0.3).requires_grad_(True)
    d = shape[-1]
    weight = (1 + 0.5 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_(True)
    bias = (0.5 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_(True)
    return x, weight, bias


def _grads(torch, y, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(y.shape, generator=g, dtype=y.dtype)
    return torch.autograd.grad(y, inputs, dy)


def _close(torch, a, b, dtype):
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_layer_norm_matches_pytorch(torch, nt, dtype_name):
    dtype = getattr(torch, dtype_name)
    x, w, b = _inputs(torch, (3, 5, 48), dtype)
    ours = nt.layer_norm(x, (48,), w, b, 1e-5)
    theirs = torch.nn.functional.layer_norm(x, (48,), w, b, 1e-5)
    _close(torch, ours, theirs, dtype)
    for a, c in zip(_grads(torch, ours, (x, w, b)), _grads(torch, theirs, (x, w, b))):
        _close(torch, a, c, dtype)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_rms_norm_matches_pytorch(torch, nt, dtype_name):
    dtype = getattr(torch, dtype_name)
    x, w, _ = _inputs(torch, (7, 40), dtype)
    for eps in (None, 1e-6):
        ours = nt.rms_norm(x, (40,), w, eps)
        theirs = torch.nn.functional.rms_norm(x, (40,), w, eps)
        _close(torch, ours, theirs, dtype)
        for a, c in zip(_grads(torch, ours, (x, w)), _grads(torch, theirs, (x, w))):
            _close(torch, a, c, dtype)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_rms_norm_default_eps_is_pytorchs_for_half_inputs(torch, nt, dtype_name):
    # Rows of tiny values, where eps decides the output: PyTorch's eps=None is float32's epsilon for
    # half inputs (the dtype it computes the statistic in), not finfo(float16).eps.
    dtype = getattr(torch, dtype_name)
    x = (torch.randn(4, 16, generator=torch.Generator().manual_seed(3)) * 1e-3).to(dtype)
    F = torch.nn.functional
    theirs = F.rms_norm(x, (16,), None, None).float()
    wrong = F.rms_norm(x, (16,), None, torch.finfo(dtype).eps).float()
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    for ours in (nt.rms_norm(x, (16,), None, None), nt.RMSNorm(16, elementwise_affine=False)(x)):
        torch.testing.assert_close(ours.float(), theirs, rtol=tol, atol=tol)
    assert (wrong - theirs).abs().max() > 10 * tol  # the check can tell the two eps apart


# ---- every norm of the registry ----

def _rms(torch, x, eps, k=None):
    """x / sqrt(mean(x[..., :k]^2) + eps)."""
    return x * torch.rsqrt(x[..., :k].pow(2).mean(-1, keepdim=True) + eps)


def _standardized(torch, x, eps):
    """(x - mean(x)) / sqrt(var(x) + eps), var biased."""
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)


# Each registry norm's formula in plain PyTorch ops, written here rather than read from the registry:
# f(torch, x, parameters by state-dict name, eps, options) with the options the entry reads. A norm
# added to the registry fails test_every_registry_norm_matches_its_formula until it has its row here.
FORMULAS = {
    "layernorm": lambda torch, x, p, eps, o: _standardized(torch, x, eps) * p["weight"] + p["bias"],
    "rmsnorm": lambda torch, x, p, eps, o: _rms(torch, x, eps) * p["weight"],
    "rmsnorm_bias": lambda torch, x, p, eps, o: _rms(torch, x, eps) * p["weight"] + p["bias"],
    "prmsnorm": lambda torch, x, p, eps, o: _rms(torch, x, eps, math.ceil(o["p"] * x.shape[-1])) * p["weight"],
    "adaptive_rmsnorm": lambda torch, x, p, eps, o: (_rms(torch, x, eps) * p["weight"]
                                                     * torch.sigmoid(p["alpha"] * x.std(-1, keepdim=True))),
    "hybridnorm": lambda torch, x, p, eps, o: (
        o["alpha"] * _rms(torch, x, eps) * p["rms_norm.weight"]
        + (1 - o["alpha"]) * (_standardized(torch, x, eps) * p["layer_norm.weight"] + p["layer_norm.bias"])),
    "scalenorm": lambda torch, x, p, eps, o: p["g"] * x / x.norm(dim=-1, keepdim=True).clamp_min(eps),
    "dyt": lambda torch, x, p, eps, o: torch.tanh(p["alpha"] * x) * p["weight"] + p["bias"],
}


def _check_options(entry):
    """The options the entry's gradient check uses (p and alpha away from their defaults), for those it reads."""
    return {name: getattr(entry.gradcheck_options, name) for name in entry.option_names}


def _module(torch, entry, nt, d, seed=0):
    """The entry's normlab.torch module in float64 at its check options, its parameters away from their init."""
    module = getattr(nt, entry.class_name)(d, entry.default_eps, **_check_options(entry), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


@pytest.mark.parametrize("type_name", REGISTRY.norm_types())
def test_every_registry_norm_has_a_class_with_pytorchs_signature(torch, nt, type_name):
    entry = REGISTRY.find_norm_type(type_name)
    cls = getattr(nt, entry.class_name)
    assert nt.norm_class(type_name) is cls and issubclass(cls, nt.Norm) and issubclass(cls, torch.nn.Module)
    assert entry.class_name in nt.__all__
    # PyTorch's signature: eps the entry's default (RMSNorm's None, as torch.nn.RMSNorm), the options the
    # registry says the entry reads at C++ NormOptions' defaults, then device and dtype.
    signature = inspect.signature(cls).parameters
    assert list(signature) == ["normalized_shape", "eps", *entry.option_names, "device", "dtype"]
    assert signature["eps"].default == (None if entry.class_name == "RMSNorm" else entry.default_eps)
    defaults = REGISTRY.NormOptions()
    assert all(signature[name].default == getattr(defaults, name) for name in entry.option_names)
    assert signature["device"].default is None and signature["dtype"].default is None
    # The C++ module's state-dict names and initial values, in the default dtype and the one asked for.
    module = cls(8)
    names = [p["name"] for p in entry.parameters]
    assert list(module.state_dict()) == names == list(nl.nn.make_norm(type_name, 8).state_dict())
    cxx = nl.nn.make_norm(type_name, 8, dtype=nl.float64)
    for name, value in module.state_dict().items():
        assert value.dtype == torch.get_default_dtype()
        torch.testing.assert_close(value.double(), torch.from_dlpack(cxx.state_dict()[name]), rtol=0, atol=1e-6)
    assert {p.dtype for p in cls(8, dtype=torch.float64).parameters()} == {torch.float64}
    # State dicts cross between normlab.nn and normlab.torch by name, and both compute the same norm.
    module = _module(torch, entry, nt, 8)
    ours = nl.nn.make_norm(type_name, 8, dtype=nl.float64, **_check_options(entry))
    ours.load_state_dict(module.state_dict())
    x, _, _ = _inputs(torch, (3, 8), torch.float64)
    torch.testing.assert_close(module(x), torch.from_dlpack(ours(nl.from_dlpack(x.detach())).detach()), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("type_name", REGISTRY.norm_types())
def test_every_registry_norm_matches_its_formula(torch, nt, type_name):
    # float64, forward and the gradients of x and of every parameter, against plain PyTorch ops.
    entry = REGISTRY.find_norm_type(type_name)
    assert type_name in FORMULAS, f"add {entry.class_name}'s formula to FORMULAS"
    module = _module(torch, entry, nt, 16)
    x, _, _ = _inputs(torch, (2, 5, 16), torch.float64)
    params = dict(module.named_parameters())
    ours = module(x)
    theirs = FORMULAS[type_name](torch, x, params, entry.default_eps, _check_options(entry))
    _close(torch, ours, theirs, torch.float64)
    inputs = (x, *params.values())
    for name, a, c in zip(["x", *params], _grads(torch, ours, inputs), _grads(torch, theirs, inputs)):
        assert a is not None, name
        _close(torch, a, c, torch.float64)


@pytest.mark.parametrize("type_name", REGISTRY.norm_types())
def test_every_registry_norm_passes_gradcheck(torch, nt, type_name):
    entry = REGISTRY.find_norm_type(type_name)
    module = _module(torch, entry, nt, 16)
    x, _, _ = _inputs(torch, (3, 16), torch.float64)
    names = [n for n, _ in module.named_parameters()]

    def f(x, *values):
        return torch.func.functional_call(module, dict(zip(names, values)), (x,))

    values = tuple(p.detach().clone().requires_grad_(True) for p in module.parameters())
    # gradcheck runs backward many times through one retained graph.
    assert torch.autograd.gradcheck(f, (x, *values))


def test_pytorchs_norms_and_options(torch, nt):
    x, _, _ = _inputs(torch, (4, 32), torch.float64)
    torch.testing.assert_close(nt.LayerNorm(32, dtype=torch.float64)(x), torch.nn.LayerNorm(32, dtype=torch.float64)(x))
    torch.testing.assert_close(nt.RMSNorm(32, dtype=torch.float64)(x), torch.nn.RMSNorm(32, dtype=torch.float64)(x))
    for args in ((8,), ((8,), 1e-6, False), ((8,), 1e-6, True, False)):
        for ours, theirs in ((nt.LayerNorm(*args), torch.nn.LayerNorm(*args)), (nt.RMSNorm(*args[:3]),
                                                                                 torch.nn.RMSNorm(*args[:3]))):
            assert repr(ours) == repr(theirs)
            assert [(n, p.shape) for n, p in ours.named_parameters()] == [
                (n, p.shape) for n, p in theirs.named_parameters()]
    assert nt.LayerNorm(8, elementwise_affine=False).weight is None and nt.LayerNorm(8, bias=False).bias is None
    # The options the norms read, with their C++ checks.
    assert repr(nt.PRMSNorm(8, p=0.25)) == "PRMSNorm((8,), eps=1e-05, elementwise_affine=True, p=0.25)"
    hybrid = nt.HybridNorm(8, alpha=0.3, bias=False)
    assert [n for n, _ in hybrid.named_parameters()] == ["rms_norm.weight", "layer_norm.weight"]
    assert hybrid.alpha == 0.3 and nt.ScaleNorm(16).g.item() == 4.0
    assert "(8,), eps=1e-05, elementwise_affine=True, bias=False, alpha=0.3" in repr(hybrid)
    dyt = nt.DyT(8, alpha_init=0.25)  # the paper's DyT: alpha, weight, bias, alpha from alpha_init
    assert [n for n, _ in dyt.named_parameters()] == ["alpha", "weight", "bias"]
    assert dyt.alpha.item() == 0.25 and dyt.alpha.shape == (1,) and dyt.alpha_init == 0.25
    assert "(8,), eps=1e-05, elementwise_affine=True, alpha_init=0.25" in repr(dyt)
    assert [n for n, _ in nt.DyT(8, elementwise_affine=False).named_parameters()] == ["alpha"]
    with pytest.raises(nl.Error, match="DyT: expected a finite alpha_init, found nan"):
        nt.DyT(8, alpha_init=float("nan"))
    with pytest.raises(nl.Error, match="p in \\(0, 1\\]"):
        nt.PRMSNorm(8, p=0.0)
    with pytest.raises(nl.Error, match="alpha in \\[0, 1\\]"):
        nt.HybridNorm(8, alpha=2.0)
    with pytest.raises(TypeError):
        nt.LayerNorm(8, p=0.5)
    with pytest.raises(nl.Error, match="expected normalized_shape \\(8,\\) for an input \\(2, 8\\), found \\(4,\\)"):
        nt.ScaleNorm(4)(torch.randn(2, 8))


def test_a_graph_is_freed_by_backward_as_pytorchs(torch, nt):
    # Without retain_graph a second backward is PyTorch's own error; with it, the gradients repeat.
    x, _, _ = _inputs(torch, (3, 8), torch.float64)
    for module in (nt.HybridNorm(8, dtype=torch.float64), nt.RMSNorm(8, dtype=torch.float64)):
        y = module(x).sum()
        first = torch.autograd.grad(y, x, retain_graph=True)[0]
        torch.testing.assert_close(torch.autograd.grad(y, x)[0], first, rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.grad(y, x)
        # The input changed in place after the forward: PyTorch's error, not a silently wrong gradient.
        h = x * 1
        y = module(h).sum()
        with torch.no_grad():
            h.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_swiglu_and_attention_match_pytorch(torch, nt):
    F = torch.nn.functional
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
    for x, y in zip(_grads(torch, ours, (q, k, v)), _grads(torch, theirs, (q, k, v))):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_tensors_cross_without_copies(torch, nt):
    x = torch.randn(8, 16)
    assert nl.from_dlpack(x).data_ptr() == x.data_ptr()
    y = nl.randn(3, 4)
    assert torch.from_dlpack(y).data_ptr() == y.data_ptr()
    t = torch.from_dlpack(y)
    t[0, 0] = 42.0  # PyTorch writes normlab's memory
    assert y[0, 0].item() == 42.0


def test_bad_input_names_what_was_expected(torch, nt):
    x = torch.randn(2, 8)
    with pytest.raises(nl.Error, match=r"expected normalized_shape \(8,\) for an input \(2, 8\), found \(4,\)"):
        nt.layer_norm(x, (4,))
    with pytest.raises(nl.Error):
        nt.rms_norm(torch.randn(2, 8), (8,), torch.ones(5))


def test_torch_imports_after_normlab_in_a_fresh_process(torch):
    # normlab opens NCCL only on first use: had its extension loaded the CUDA toolkit's libnccl.so.2,
    # a CUDA build of PyTorch imported afterwards would find that older library in its place.
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", "import normlab, torch; print(torch.ones(2).sum().item())"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.0"
