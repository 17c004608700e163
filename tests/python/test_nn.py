"""normlab.nn: the C++ layers behind Python Modules, against PyTorch's (forward and backward in float64
with the same weights, parameter and state-dict names, printing), user subclasses that train, strict
load_state_dict converting dtypes as PyTorch's, to() by dtype name, the transformer's LLaMA names and
bit-exact state-dict round trips, signatures whose defaults are the C++ options' defaults, and every
norm of the registry built by class and by make_norm with its gradients checked in float64. The tests that
compare with PyTorch take the `torch` fixture (conftest.py) and skip by name where it is absent."""
import inspect
import pathlib

import numpy as np
import pytest

import normlab as nl
import normlab.nn.functional as F
from normlab import nn
from normlab.autograd import gradcheck

F64 = nl.float64
TOL = 1e-10  # float64 against PyTorch: the same formulas, summed in another order


def _array(shape, seed, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def _np(t):
    return np.asarray(t.detach())


def _close(ours, theirs, tol=TOL):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    np.testing.assert_allclose(_np(ours), theirs, rtol=tol, atol=tol)


def _randomize(module, seed):
    """Parameters away from their init (a weight of ones hides a missing factor)."""
    with nl.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(nl.tensor(_array(p.shape, seed + i, 0.5, 1.0 if i % 2 == 0 else 0.0), dtype=p.dtype))


def _copy_into_torch(ours, theirs, torch):
    """PyTorch's module gets our weights; the two must name their parameters alike."""
    ours_named, theirs_named = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert list(ours_named) == list(theirs_named)
    with torch.no_grad():
        for name, p in theirs_named.items():
            p.copy_(torch.from_dlpack(ours_named[name].detach()))


# ---- the layers against PyTorch's ----

LAYER_CASES = {
    "linear": (lambda: nn.Linear(6, 5, dtype=F64), lambda t: t.nn.Linear(6, 5, dtype=t.float64), (3, 4, 6)),
    "linear_no_bias": (lambda: nn.Linear(6, 5, bias=False, dtype=F64),
                       lambda t: t.nn.Linear(6, 5, bias=False, dtype=t.float64), (7, 6)),
    "layer_norm": (lambda: nn.LayerNorm(16, dtype=F64), lambda t: t.nn.LayerNorm(16, dtype=t.float64), (3, 5, 16)),
    "layer_norm_composed": (lambda: nn.LayerNorm(16, fused=False, dtype=F64),
                            lambda t: t.nn.LayerNorm(16, dtype=t.float64), (3, 5, 16)),
    "layer_norm_no_bias": (lambda: nn.LayerNorm((16,), eps=1e-6, bias=False, dtype=F64),
                           lambda t: t.nn.LayerNorm((16,), eps=1e-6, bias=False, dtype=t.float64), (4, 16)),
    "layer_norm_no_affine": (lambda: nn.LayerNorm(16, elementwise_affine=False, dtype=F64),
                             lambda t: t.nn.LayerNorm(16, elementwise_affine=False, dtype=t.float64), (4, 16)),
    "rms_norm": (lambda: nn.RMSNorm(16, dtype=F64), lambda t: t.nn.RMSNorm(16, dtype=t.float64), (3, 5, 16)),
    "rms_norm_composed": (lambda: nn.RMSNorm(16, fused=False, dtype=F64),
                          lambda t: t.nn.RMSNorm(16, dtype=t.float64), (3, 5, 16)),
    "rms_norm_eps": (lambda: nn.RMSNorm(16, eps=1e-6, dtype=F64),
                     lambda t: t.nn.RMSNorm(16, eps=1e-6, dtype=t.float64), (4, 16)),
    "rms_norm_no_affine": (lambda: nn.RMSNorm(16, elementwise_affine=False, dtype=F64),
                           lambda t: t.nn.RMSNorm(16, elementwise_affine=False, dtype=t.float64), (4, 16)),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_layers_match_pytorch_forward_and_backward(torch, case):
    make_ours, make_theirs, shape = LAYER_CASES[case]
    ours, theirs = make_ours(), make_theirs(torch)
    _randomize(ours, 10)
    _copy_into_torch(ours, theirs, torch)
    x_np, dy_np = _array(shape, 1, 1.5, 0.3), None
    x, tx = nl.tensor(x_np, requires_grad=True), torch.tensor(x_np, requires_grad=True)
    y, ty = ours(x), theirs(tx)
    _close(y, ty)
    dy_np = _array(tuple(y.shape), 2)
    y.backward(nl.tensor(dy_np))
    ty.backward(torch.tensor(dy_np))
    _close(x.grad, tx.grad)
    for (name, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        _close(p.grad, tp.grad)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("float16", 2e-3), ("bfloat16", 2e-2), ("float64", 1e-12)])
def test_rms_norms_default_eps_is_pytorchs(torch, dtype, tol):
    # Small rows, where eps decides the result: PyTorch's eps=None is the machine epsilon of the dtype it
    # computes in (float32 for half inputs).
    x_np = _array((4, 16), 1, 1e-3)
    for fused in (True, False):
        ours = nn.RMSNorm(16, fused=fused, dtype=dtype)
        theirs = torch.nn.RMSNorm(16, dtype=getattr(torch, dtype))
        y = ours(nl.tensor(x_np, dtype=dtype))
        ty = theirs(torch.tensor(x_np, dtype=getattr(torch, dtype)))
        np.testing.assert_allclose(_np(y.float()), ty.float().detach().numpy(), rtol=tol, atol=tol)
        y = F.rms_norm(nl.tensor(x_np, dtype=dtype), (16,), fused=fused)
        ty = torch.nn.functional.rms_norm(torch.tensor(x_np, dtype=getattr(torch, dtype)), (16,))
        np.testing.assert_allclose(_np(y.float()), ty.float().numpy(), rtol=tol, atol=tol)
    ours = nn.RMSNorm(16).double()  # after to(), eps follows the new dtype
    np.testing.assert_allclose(_np(ours(nl.tensor(x_np))), torch.nn.RMSNorm(16).double()(torch.tensor(x_np)).detach(),
                               rtol=1e-12, atol=1e-12)


def test_embedding_matches_pytorch(torch):
    ours, theirs = nn.Embedding(10, 4, dtype=F64), torch.nn.Embedding(10, 4, dtype=torch.float64)
    _copy_into_torch(ours, theirs, torch)
    ids_np = np.array([[1, 3, 3, 0], [9, 1, 1, 1]])
    y, ty = ours(nl.tensor(ids_np)), theirs(torch.tensor(ids_np))
    _close(y, ty, 0)
    dy = _array((2, 4, 4), 3)
    y.backward(nl.tensor(dy))
    ty.backward(torch.tensor(dy))
    _close(ours.weight.grad, theirs.weight.grad)


def test_functional_matches_pytorch(torch):
    TF = torch.nn.functional
    x_np, w_np, b_np = _array((3, 4, 8), 1), _array((5, 8), 2), _array(5, 3)
    x, w, b = nl.tensor(x_np), nl.tensor(w_np), nl.tensor(b_np)
    tx, tw, tb = torch.tensor(x_np), torch.tensor(w_np), torch.tensor(b_np)
    _close(F.linear(x, w, b), TF.linear(tx, tw, tb))
    _close(F.linear(x, w), TF.linear(tx, tw))
    g_np, h_np = _array(8, 4, 0.5, 1.0), _array(8, 5)
    g, h, tg, th = nl.tensor(g_np), nl.tensor(h_np), torch.tensor(g_np), torch.tensor(h_np)
    for fused in (True, False):
        _close(F.layer_norm(x, (8,), g, h, 1e-5, fused=fused), TF.layer_norm(tx, (8,), tg, th, 1e-5))
        _close(F.rms_norm(x, (8,), g, fused=fused), TF.rms_norm(tx, (8,), tg))
        _close(F.rms_norm(x, [8], None, 1e-6, fused=fused), TF.rms_norm(tx, [8], None, 1e-6))
    _close(F.softmax(x, -1), TF.softmax(tx, -1))
    _close(F.log_softmax(x, 1), TF.log_softmax(tx, 1))
    _close(F.silu(x), TF.silu(tx))
    _close(F.gelu(x), TF.gelu(tx))
    _close(F.swiglu(x, x * 2), TF.silu(tx) * (tx * 2))
    _close(F.mse_loss(x, x * 0.5), TF.mse_loss(tx, tx * 0.5))
    logits_np, targets_np = _array((6, 5), 6), np.array([0, 4, -100, 2, 2, 1])
    logits, tlogits = nl.tensor(logits_np), torch.tensor(logits_np)
    for reduction in ("mean", "sum", "none"):
        for fused in (True, False):
            _close(F.cross_entropy(logits, nl.tensor(targets_np), reduction=reduction, fused=fused),
                   TF.cross_entropy(tlogits, torch.tensor(targets_np), reduction=reduction))
    _close(F.embedding(nl.tensor([[0, 4]]), w), TF.embedding(torch.tensor([[0, 4]]), tw))
    q_np, k_np, v_np = _array((2, 4, 7, 8), 7), _array((2, 2, 7, 8), 8), _array((2, 2, 7, 8), 9)
    tq, tk, tv = torch.tensor(q_np), torch.tensor(k_np), torch.tensor(v_np)
    expected = TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    for fused in (True, False):
        _close(F.scaled_dot_product_attention(nl.tensor(q_np), nl.tensor(k_np), nl.tensor(v_np), is_causal=True,
                                              fused=fused), expected)
        q, k, v = (nl.tensor(a.transpose(0, 2, 1, 3).copy()) for a in (q_np, k_np, v_np))  # (B, T, H, hd)
        _close(F.causal_attention(q, k, v, fused=fused), expected.transpose(1, 2))


def test_clip_grad_norm_matches_pytorch(torch):
    grads = [_array((4, 3), 1), _array(5, 2, 3.0)]
    ours = [nl.zeros(*g.shape, dtype=F64, requires_grad=True) for g in grads]
    theirs = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, tp, g in zip(ours, theirs, grads):
        p.grad, tp.grad = nl.tensor(g), torch.tensor(g)
    total = nn.utils.clip_grad_norm_(ours, 1.5)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.5)
    assert total.dtype == F64 and abs(total.item() - ttotal.item()) < 1e-12
    for p, tp in zip(ours, theirs):
        _close(p.grad, tp.grad, 1e-14)


# ---- names and printing against PyTorch's ----

def _net(lib, dtype, full=None):
    """One structure in normlab.nn or torch.nn (full: torch.full for torch.nn): own parameter and buffer,
    nested containers, norms."""
    full = full or (lambda n, value: nl.full((n,), value, dtype=dtype))
    class Block(lib.Module):
        def __init__(self):
            super().__init__()
            self.proj = lib.Linear(8, 8, dtype=dtype)
            self.norm = lib.RMSNorm(8, dtype=dtype)

        def forward(self, x):
            return x + self.norm(self.proj(x))

    class Net(lib.Module):
        def __init__(self):
            super().__init__()
            self.scale = lib.Parameter(full(2, 1.0))
            self.embed = lib.Embedding(10, 8, dtype=dtype)
            self.blocks = lib.ModuleList([Block() for _ in range(2)])
            self.mix = lib.Sequential(lib.Linear(8, 8, dtype=dtype), lib.SiLU(), lib.LayerNorm(8, dtype=dtype))
            self.head = lib.Linear(8, 2, bias=False, dtype=dtype)
            self.register_buffer("steps", full(1, 0.0))

        def forward(self, ids):
            h = self.embed(ids)
            for block in self.blocks:
                h = block(h)
            return self.head(self.mix(h)) * self.scale

    return Net()


def _torch_net(torch):
    return _net(torch.nn, torch.float64, lambda n, value: torch.full((n,), value, dtype=torch.float64))


def test_names_and_printing_match_pytorch(torch):
    ours, theirs = _net(nn, F64), _torch_net(torch)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert repr(ours).replace("normlab.nn.", "") == repr(theirs)
    pairs = [(nn.Linear(3, 4), torch.nn.Linear(3, 4)), (nn.Embedding(10, 3), torch.nn.Embedding(10, 3)),
             (nn.LayerNorm(8, bias=False), torch.nn.LayerNorm(8, bias=False)),
             (nn.LayerNorm(8, elementwise_affine=False), torch.nn.LayerNorm(8, elementwise_affine=False)),
             (nn.RMSNorm((8,), eps=1e-6), torch.nn.RMSNorm((8,), eps=1e-6)),
             (nn.GELU(), torch.nn.GELU()), (nn.ReLU(), torch.nn.ReLU())]
    for ours_module, theirs_module in pairs:
        assert repr(ours_module) == repr(theirs_module)
    # PyTorch's weights load into the normlab structure (and back) by name; the outputs agree.
    _randomize(ours, 20)
    theirs.load_state_dict({k: torch.from_dlpack(v) for k, v in ours.state_dict().items()})
    fresh = _net(nn, F64)
    fresh.load_state_dict(theirs.state_dict())
    ids = np.array([[1, 2, 3], [4, 4, 0]])
    _close(fresh(nl.tensor(ids)), theirs(torch.tensor(ids)))


def test_modules_children_and_buffers():
    net = _net(nn, F64)
    assert [type(m).__name__ for m in net.children()] == ["Embedding", "ModuleList", "Sequential", "Linear"]
    assert [type(m).__name__ for m in net.modules()][:5] == ["Net", "Embedding", "ModuleList", "Block", "Linear"]
    assert len(net.blocks) == 2 and net.blocks[-1] is net.blocks[1] and len(net.blocks[0:1]) == 1
    assert net.get_submodule("blocks.1.norm") is net.blocks[1].norm
    assert [n for n, _ in net.named_buffers()] == ["steps"]
    assert "steps" in net.state_dict()
    net.register_buffer("scratch", nl.zeros(3), persistent=False)
    assert "scratch" not in net.state_dict() and net.scratch.shape == (3,)
    with pytest.raises(KeyError, match="already exists"):
        net.register_buffer("head", nl.zeros(1))
    with pytest.raises(TypeError, match="Parameter or None"):
        net.scale = nl.ones(2)


# ---- Python modules over C++ ones ----

def test_parameter_is_a_tensor_on_the_same_memory():
    t = nl.randn(3, 4)
    p = nn.Parameter(t)
    assert isinstance(p, nl.Tensor) and isinstance(p, nn.Parameter)
    assert p.data_ptr() == t.data_ptr() and p.requires_grad and p.is_leaf and not t.requires_grad
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert not nn.Parameter(t, requires_grad=False).requires_grad
    with pytest.raises(nl.Error):
        nn.Parameter(nl.arange(3))  # int64 cannot require grad

    lin = nn.Linear(4, 2)
    assert isinstance(lin.weight, nn.Parameter) and lin.weight is lin.weight
    # The Parameter is the C++ module's Var: the same memory, and the C++ forward's gradient lands on it.
    cxx_weight = dict(lin._cxx.named_parameters())["weight"]
    assert cxx_weight.data_ptr() == lin.weight.data_ptr()
    with nl.no_grad():
        lin.weight.fill_(0.5)
        lin.bias.zero_()
    x = nl.ones(3, 4)
    assert lin(x).tolist() == [[2.0, 2.0]] * 3
    lin(x).sum().backward()
    assert lin.weight.grad.tolist() == [[3.0] * 4] * 2 and cxx_weight.grad.tolist() == lin.weight.grad.tolist()


def test_cxx_parameters_cannot_be_replaced_but_subclasses_add_their_own():
    lin = nn.Linear(4, 2)
    with pytest.raises(nl.Error, match="belongs to the C\\+\\+ Linear module"):
        lin.weight = nn.Parameter(nl.ones(2, 4))
    with pytest.raises(nl.Error, match="belongs to the C\\+\\+"):
        del lin.bias
    t = nn.Transformer(vocab_size=7, dim=8, n_layers=1, n_heads=2)
    with pytest.raises(nl.Error, match="belongs to the C\\+\\+ Transformer module"):
        t.norm = nn.LayerNorm(8)
    with pytest.raises(nl.Error, match="belongs to a C\\+\\+ module"):
        t.layers.append(nn.Linear(8, 8))

    class ScaledLinear(nn.Linear):
        def __init__(self, n_in, n_out):
            super().__init__(n_in, n_out, dtype=F64)
            self.gain = nn.Parameter(nl.full((n_out,), 2.0, dtype=F64))

        def forward(self, x):
            return super().forward(x) * self.gain

    m = ScaledLinear(3, 2)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias", "gain"]
    x = nl.randn(5, 3, dtype=F64)
    np.testing.assert_array_equal(_np(m(x)), _np(F.linear(x, m.weight, m.bias) * 2.0))
    assert gradcheck(lambda x, gain: F.linear(x, m.weight, m.bias) * gain,
                     [x.requires_grad_(), m.gain.detach().requires_grad_()])


def test_user_mlp_with_a_norm_trains():
    nl.manual_seed(0)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 32)
            self.norm = nn.RMSNorm(32)
            self.fc2 = nn.Linear(32, 3)

        def forward(self, x):
            return self.fc2(nl.relu(self.norm(self.fc1(x))))

    model = MLP()
    assert [n for n, _ in model.named_parameters()] == ["fc1.weight", "fc1.bias", "norm.weight", "fc2.weight",
                                                        "fc2.bias"]
    x = nl.randn(64, 4)
    targets = nl.tensor([int(v > 0) + int(v > 1) for v in x.sum(-1).tolist()])
    opt = nl.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0] and all(b < a for a, b in zip(losses[:5], losses[1:6]))
    assert all(not np.array_equal(_np(a), _np(b)) for a, b in zip(before, model.parameters()))
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_train_eval_and_to():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LayerNorm(4))
    assert model.training and model[1]._cxx.training
    x = nl.ones(2, 4)
    model.eval()
    assert not model.training and not model[1].training and not model[1]._cxx.training
    np.testing.assert_array_equal(_np(model[1](x)), _np(x))  # dropout is the identity in eval mode
    model.train()
    assert model[1]._cxx.training and model[2]._cxx.training

    net = _net(nn, nl.float32)
    params = list(net.parameters())
    opt = nl.optim.SGD(params, lr=0.1)
    net(nl.tensor([[1, 2]])).sum().backward()
    assert net.to("float64") is net
    assert [p is q for p, q in zip(params, net.parameters())] == [True] * len(params)
    # The configs' names too ("f64", ...), each converting parameters, buffers and grads in place.
    for name, dtype in (("bf16", nl.bfloat16), ("f16", nl.float16), ("f32", nl.float32), ("f64", F64)):
        assert net.to(name) is net
        assert {p.dtype for p in net.parameters()} == {dtype} and net.steps.dtype == dtype
        assert {p.grad.dtype for p in net.parameters() if p.grad is not None} == {dtype}
    assert [p is q for p, q in zip(params, net.parameters())] == [True] * len(params)
    assert {p.dtype for p in net.parameters()} == {F64} and net.steps.dtype == F64
    assert {p.grad.dtype for p in net.parameters() if p.grad is not None} == {F64}
    opt.step()  # the optimizer made before holds the converted tensors
    assert net(nl.tensor([[1, 2]])).dtype == F64
    # RMSNorm(eps=None) takes the input dtype's epsilon, after to() too, as PyTorch's does.
    norm = nn.RMSNorm(8).double()
    y = nl.randn(3, 8, dtype=F64)
    np.testing.assert_array_equal(_np(norm(y)), _np(F.rms_norm(y, (8,), norm.weight)))
    with pytest.raises(nl.Error, match="floating"):
        net.to(nl.int64)
    with pytest.raises(nl.Error, match='dtype: expected one of f32, f64, bf16, f16, i64, found "f8"'):
        net.to("f8")


def test_state_dict_is_live_and_load_state_dict_is_strict():
    a, b = _net(nn, F64), _net(nn, F64)
    sd = a.state_dict()
    assert all(type(v) is nl.Tensor for v in sd.values())  # the live tensors (detached), not Parameters
    assert sd["head.weight"].data_ptr() == a.head.weight.data_ptr()
    assert a.state_dict(keep_vars=True)["head.weight"] is a.head.weight
    assert list(a.state_dict(prefix="model."))[0] == "model.scale"
    _randomize(a, 30)
    assert b.load_state_dict(sd) == ([], [])
    ids = nl.tensor([[3, 1, 4]])
    np.testing.assert_array_equal(_np(a(ids)), _np(b(ids)))

    before = _np(b.head.weight).copy()
    bad = dict(sd)
    del bad["head.weight"], bad["blocks.1.norm.weight"]
    bad["head.extra"] = nl.ones(1)
    bad["extra"] = nl.ones(1)
    bad["mix.0.weight"] = nl.ones(8, 7, dtype=F64)
    bad["embed.weight"] = nl.ones(10, 8, dtype=nl.float32)  # another dtype: converted, not a mismatch
    with pytest.raises(nl.Error) as raised:
        b.load_state_dict(bad)
    message = str(raised.value)
    for key in ("missing key(s) 'blocks.1.norm.weight' ([8] float64), 'head.weight' ([2, 8] float64)",
                "unexpected key(s) 'head.extra', 'extra'",
                "shape mismatch for 'mix.0.weight': the module has [8, 8] float64, the state has [8, 7] float64"):
        assert key in message, message
    assert "embed.weight" not in message, message
    np.testing.assert_array_equal(_np(b.head.weight), before)  # nothing was copied
    assert not np.array_equal(_np(b.embed.weight), np.ones((10, 8)))
    bad["mix.0.weight"] = sd["mix.0.weight"]
    result = b.load_state_dict(bad, strict=False)
    assert result.missing_keys == ["blocks.1.norm.weight", "head.weight"]
    assert result.unexpected_keys == ["head.extra", "extra"]
    np.testing.assert_array_equal(_np(b.embed.weight), np.ones((10, 8)))


def test_load_state_dict_converts_to_each_parameters_dtype():
    # As PyTorch's: a float64 state loads into a float32 module, which stays float32 (the Parameters
    # themselves, so an optimizer holding them sees the values), and back.
    f64, f32 = _net(nn, F64), _net(nn, nl.float32)
    _randomize(f64, 50)
    params = list(f32.parameters())
    assert f32.load_state_dict(f64.state_dict()) == ([], [])
    assert [p is q for p, q in zip(params, f32.parameters())] == [True] * len(params)
    assert {t.dtype for t in f32.state_dict().values()} == {nl.float32}
    for name, value in f64.state_dict().items():
        np.testing.assert_array_equal(_np(f32.state_dict()[name]), _np(value).astype(np.float32))
    back = _net(nn, F64)
    back.load_state_dict(f32.state_dict())
    assert {t.dtype for t in back.state_dict().values()} == {F64}
    np.testing.assert_array_equal(_np(back.head.weight), _np(f32.head.weight).astype(np.float64))
    # NumPy arrays and bfloat16 tensors are converted alike.
    norm = nn.LayerNorm(4)
    norm.load_state_dict({"weight": np.full(4, 2.0), "bias": nl.full((4,), 0.5, dtype=nl.bfloat16)})
    assert norm.weight.dtype == norm.bias.dtype == nl.float32
    assert _np(norm.weight).tolist() == [2.0] * 4 and _np(norm.bias).tolist() == [0.5] * 4


# ---- the transformer ----

def _llama_names(n_layers, norm_params):
    names = ["tok_embeddings.weight"]
    for i in range(n_layers):
        names += [f"layers.{i}.attention.w{w}.weight" for w in "qkvo"]
        names += [f"layers.{i}.feed_forward.w{w}.weight" for w in "123"]
        names += [f"layers.{i}.{norm}.{p}" for norm in ("attention_norm", "ffn_norm") for p in norm_params]
    return names + [f"norm.{p}" for p in norm_params] + ["output.weight"]


def test_transformer_has_llamas_names_and_round_trips_bit_for_bit():
    options = dict(vocab_size=13, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=8, max_seq_len=12)
    model = nn.Transformer(**options, seed=1)
    assert list(model.state_dict()) == _llama_names(2, ["weight"])
    assert list(model.state_dict()) == [name for name, _ in model._cxx.state_dict()]
    assert isinstance(model.layers[0].attention.wq, nn.Linear) and isinstance(model.norm, nn.RMSNorm)
    assert list(nn.Transformer(**options, norm_type="layernorm").state_dict()) == _llama_names(2, ["weight", "bias"])
    hybrid = nn.Transformer(**options, norm={"type": "hybridnorm", "alpha": 0.3})
    assert "layers.1.ffn_norm.layer_norm.bias" in hybrid.state_dict() and hybrid.norm._cxx.alpha == 0.3

    ids = nl.tensor([[1, 5, 2, 12, 0, 3], [7, 7, 7, 1, 2, 3]])
    logits = model(ids)
    assert logits.shape == (2, 6, 13)
    other = nn.Transformer(**options, seed=2)
    assert not np.array_equal(_np(other(ids)), _np(logits))
    other.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(_np(other(ids)), _np(logits))
    # A state dict of copies loads the same (the live tensors are not needed).
    copies = {k: v.clone() for k, v in model.state_dict().items()}
    third = nn.Transformer(**options, seed=3)
    third.load_state_dict(copies)
    np.testing.assert_array_equal(_np(third(ids)), _np(logits))
    # The gradient reaches every parameter through the C++ forward.
    F.cross_entropy(model(ids), ids).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_python_module_around_the_transformer_round_trips():
    class Classifier(nn.Module):
        def __init__(self, seed):
            super().__init__()
            self.backbone = nn.Transformer(vocab_size=9, dim=8, n_layers=1, n_heads=2, multiple_of=4, seed=seed)
            self.head = nn.Linear(9, 2, generator=nl.Generator(seed))

        def forward(self, ids):
            return self.head(self.backbone(ids)[:, -1])

    a, b = Classifier(1), Classifier(2)
    names = list(a.state_dict())
    assert names[:2] == ["backbone.tok_embeddings.weight", "backbone.layers.0.attention.wq.weight"]
    assert names[-3:] == ["backbone.output.weight", "head.weight", "head.bias"]
    assert [n for n, _ in a.named_parameters()] == names
    ids = nl.tensor([[1, 2, 3, 4]])
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(_np(b(ids)), _np(a(ids)))
    opt = nl.optim.AdamW(a.named_parameters(), lr=1e-2)
    F.cross_entropy(a(ids), nl.tensor([1])).backward()
    opt.step()
    assert "backbone.norm.weight" in opt.state_dict()["state"]


def test_a_checkpoints_model_as_an_nn_transformer(tmp_path):
    toy = pathlib.Path(__file__).resolve().parents[2] / "configs" / "toy_transformer.json"
    run = nl.train(toy, ["train.steps=2", "optim.warmup_steps=1", "train.eval_every=2", "data.eval_sequences=16"],
                   out=tmp_path / "run")
    checkpoint = nl.load_checkpoint(run.run_dir)
    model = nn.Transformer.of(checkpoint.model)
    assert isinstance(model, nn.Transformer) and model.options["vocab_size"] == checkpoint.vocab_size
    assert list(model.state_dict()) == [name for name, _ in checkpoint.model.state_dict()]
    assert model.norm.weight.data_ptr() == dict(checkpoint.model.named_parameters())["norm.weight"].data_ptr()
    ids = nl.tensor([[1, 2, 3, 4]])
    np.testing.assert_array_equal(_np(model(ids)), _np(checkpoint.model.forward(ids)))
    # Fine-tuning from Python updates the checkpoint's model itself.
    opt = nl.optim.AdamW(model.named_parameters(), lr=1e-3)
    F.cross_entropy(model(ids), ids).backward()
    opt.step()
    np.testing.assert_array_equal(_np(model(ids)), _np(checkpoint.model.forward(ids)))


def test_transformer_options_and_their_errors():
    model = nn.Transformer(vocab_size=5, dim=8, n_layers=1, n_heads=2, norm_type="prmsnorm", norm_eps=1e-6,
                           dtype="float64", fused_attention=False)
    o = model.options
    assert o["norm"]["type"] == "prmsnorm" and o["norm"]["eps"] == 1e-6 and o["dtype"] == F64
    assert not o["fused_attention"] and model.norm.eps == 1e-6 and model.output.weight.dtype == F64
    with pytest.raises(nl.Error, match="Transformer: unknown option 'n_layer' \\(options: vocab_size, dim, n_layers"):
        nn.Transformer(vocab_size=5, n_layer=2)
    with pytest.raises(nl.Error, match="unknown norm type 'batchnorm' \\(choices: layernorm, rmsnorm"):
        nn.Transformer(vocab_size=5, norm="batchnorm")
    with pytest.raises(nl.Error, match="norm: unknown option 'momentum'"):
        nn.Transformer(vocab_size=5, norm={"type": "layernorm", "momentum": 0.1})
    with pytest.raises(nl.Error, match="option 'dim' expects a int"):
        nn.Transformer(vocab_size=5, dim="wide")
    with pytest.raises(nl.Error, match="dim"):
        nn.Transformer(vocab_size=5, dim=10, n_heads=4)  # the C++ validation: dim % n_heads
    block = nn.TransformerBlock(8, 2, multiple_of=4, norm="layernorm", pre_norm=False)
    assert [n for n, _ in block.named_children()] == ["attention", "feed_forward", "attention_norm", "ffn_norm"]
    assert block(nl.randn(1, 3, 8)).shape == (1, 3, 8) and block.options["norm_placement"] == "post"


def test_layer_signatures_take_the_cpp_options_defaults():
    # A default a C++ option struct has is read from it, not restated in Python.
    ff, attention = nl._normlab.nn.FeedForwardOptions(), nl._normlab.nn.AttentionOptions()
    defaults = {name: p.default for name, p in inspect.signature(nn.FeedForward).parameters.items()}
    assert defaults["multiple_of"] == ff.multiple_of and defaults["fused"] == ff.fused
    defaults = {name: p.default for name, p in inspect.signature(nn.Attention).parameters.items()}
    for name in ("n_kv_heads", "head_dim", "rope_theta", "max_seq_len", "fused"):
        assert defaults[name] == getattr(attention, name), name


def test_feed_forward_and_attention():
    ff = nn.FeedForward(8, 32, multiple_of=4, dtype=F64)
    assert ff.hidden == nl._normlab.nn.swiglu_hidden_dim(32, 4) == 24
    assert [(n, tuple(p.shape)) for n, p in ff.named_parameters()] == [("w1.weight", (24, 8)), ("w2.weight", (8, 24)),
                                                                         ("w3.weight", (24, 8))]
    x = nl.randn(2, 3, 8, dtype=F64)
    np.testing.assert_allclose(_np(ff(x)), _np(ff.w2(F.silu(ff.w1(x)) * ff.w3(x))), rtol=1e-12, atol=1e-12)
    assert nn.SwiGLU is nn.FeedForward
    fused = nn.Attention(8, 4, 2, dtype=F64, generator=nl.Generator(5))
    composed = nn.Attention(8, 4, 2, fused=False, dtype=F64, generator=nl.Generator(5))
    assert fused.head_dim == 2 and fused.n_kv_heads == 2
    assert [n for n, _ in fused.named_parameters()] == [f"w{w}.weight" for w in "qkvo"]
    np.testing.assert_allclose(_np(fused(x)), _np(composed(x)), rtol=1e-12, atol=1e-12)
    # Heads of their own size (Qwen3's head_dim): 3 heads of 4 at width 8, fused and composed alike.
    wide = nn.Attention(8, 3, head_dim=4, dtype=F64, generator=nl.Generator(6))
    wide_composed = nn.Attention(8, 3, head_dim=4, fused=False, dtype=F64, generator=nl.Generator(6))
    assert wide.head_dim == 4
    assert [tuple(p.shape) for _, p in wide.named_parameters()] == [(12, 8), (12, 8), (12, 8), (8, 12)]
    np.testing.assert_allclose(_np(wide(x)), _np(wide_composed(x)), rtol=1e-12, atol=1e-12)
    model = nn.Transformer(vocab_size=5, dim=8, n_layers=1, n_heads=3, head_dim=4, multiple_of=4)
    assert model.options["head_dim"] == 4 and model(nl.tensor([[1, 2, 3]])).shape == (1, 3, 5)


# ---- every norm of the registry ----

def _gradcheck_options(entry):
    """The options the entry's gradient check uses (p and alpha away from their defaults), for those it reads."""
    return {name: getattr(entry.gradcheck_options, name) for name in entry.option_names}


@pytest.mark.parametrize("type_name", nn.norm_types())
def test_every_registry_norm_by_class_and_make_norm_with_gradients(type_name):
    entry = nl._normlab.nn.find_norm_type(type_name)
    cls = getattr(nn, entry.class_name)
    assert nn.norm_class(type_name) is cls and issubclass(cls, nn.Norm)
    # The signature: the options the registry says the entry reads, each with the C++ default.
    signature = inspect.signature(cls).parameters
    assert list(signature) == ["normalized_shape", "eps", *entry.option_names, "fused", "dtype"]
    assert signature["eps"].default == (None if cls is nn.RMSNorm else entry.default_eps)
    defaults = nl._normlab.nn.NormOptions()
    assert all(signature[name].default == getattr(defaults, name) for name in [*entry.option_names, "fused"])
    options = _gradcheck_options(entry)
    by_class = cls(8, entry.default_eps, dtype=F64, **options)  # RMSNorm's own default eps is None
    by_name = nn.make_norm(type_name, 8, dtype=F64, **options)
    assert type(by_name) is cls and by_class.norm_type == type_name
    names = [p["name"] for p in entry.parameters]
    assert [n for n, _ in by_class.named_parameters()] == names == list(by_name.state_dict())
    _randomize(by_class, 40)
    by_name.load_state_dict(by_class.state_dict())
    x = nl.tensor(_array((3, 8), 4, 1.5, 0.3), requires_grad=True)
    np.testing.assert_array_equal(_np(by_class(x)), _np(by_name(x)))
    tol = dict(atol=entry.gradcheck_atol, rtol=entry.gradcheck_rtol)
    # The module: its fused form against its composed form, and its gradient with respect to x.
    composed = cls(8, entry.default_eps, dtype=F64, fused=False, **options)
    composed.load_state_dict(by_class.state_dict())
    np.testing.assert_allclose(_np(by_class(x)), _np(composed(x)), rtol=1e-12, atol=1e-12)
    for module in (by_class, composed):
        assert gradcheck(module, [x], **tol)
    # The functional form with respect to x and every parameter, in both forms.
    params = [p.detach().clone().requires_grad_() for p in by_class.parameters()]
    for fused in (True, False):
        assert gradcheck(lambda x, *ps: F.registry_norm(x, type_name, ps, fused=fused, **options), [x, *params], **tol)
    # The module's parameter gradients are the functional form's.
    dy = nl.tensor(_array((3, 8), 5))
    by_class(x).backward(dy)
    expected = nl.autograd.grad(F.registry_norm(x, type_name, params, **options), [x, *params], dy)
    for got, want in zip([x.grad, *[p.grad for p in by_class.parameters()]], expected):
        np.testing.assert_allclose(_np(got), _np(want), rtol=1e-12, atol=1e-12)


def test_norm_options_and_errors():
    assert nn.norm_types() == [e.name for e in nn.norm_registry()]
    assert nn.norm_types()[:2] == ["layernorm", "rmsnorm"] and "scalenorm" in nn.norm_types()
    assert nn.make_norm("rmsnorm", 8).eps == 1e-5 and nn.RMSNorm(8).eps is None
    assert nn.PRMSNorm(64, p=0.25)._cxx.stat_count == 16 and nn.HybridNorm(8, alpha=0.25)._cxx.alpha == 0.25
    assert nn.LayerNorm(8, elementwise_affine=False).weight is None and nn.LayerNorm(8, bias=False).bias is None
    dyt = nn.DyT(8, alpha_init=0.25)  # the paper's DyT: alpha, weight, bias, alpha from alpha_init
    assert [n for n, _ in dyt.named_parameters()] == ["alpha", "weight", "bias"] and dyt._cxx.alpha_init == 0.25
    assert dyt.alpha.item() == 0.25 and nn.make_norm("dyt", 8).alpha.item() == 0.5
    assert nn.DyT(8, elementwise_affine=False).weight is None and nn.DyT(8, elementwise_affine=False).bias is None
    with pytest.raises(nl.Error, match="DyT: expected a finite alpha_init, found inf"):
        nn.DyT(8, alpha_init=float("inf"))
    assert nn.LayerNorm(8, elementwise_affine=False).weight is None and nn.LayerNorm(8, bias=False).bias is None
    norm = nn.LayerNorm(8)
    norm.fused = False
    assert not norm._cxx.fused
    assert repr(norm) == "LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True, fused=False)"
    with pytest.raises(nl.Error, match="unknown norm type 'groupnorm' \\(choices: layernorm, rmsnorm"):
        nn.make_norm("groupnorm", 8)
    with pytest.raises(nl.Error, match="make_norm: RMSNorm \\('rmsnorm'\\) has no option p \\(its options: eps, "
                                       "elementwise_affine, fused, dtype\\)"):
        nn.make_norm("rmsnorm", 8, p=0.5)
    with pytest.raises(nl.Error, match="normalize over the last dim"):
        nn.LayerNorm((4, 8))
    with pytest.raises(nl.Error, match="p in \\(0, 1\\]"):
        nn.PRMSNorm(8, p=0.0)
    with pytest.raises(nl.Error, match="expected input \\(..., 8\\)"):
        nn.RMSNorm(8, eps=1e-5)(nl.ones(2, 4))
    with pytest.raises(TypeError):
        nn.LayerNorm(8, p=0.5)
