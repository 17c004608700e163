"""normlab.Tensor from Python: creation and dtypes, zero-copy NumPy and DLPack (the same memory seen
from both sides, kept alive by either), views and indexing, autograd (backward, create_graph,
autograd.grad, no_grad, gradcheck), graph inspection, printing as PyTorch prints, errors."""
import gc
import math

import numpy as np
import pytest

import normlab as nl


def test_creation_dtypes_and_shapes():
    assert nl.tensor([1.0, 2.0]).dtype == nl.float32  # Python floats: float32, as PyTorch
    assert nl.tensor([1, 2]).dtype == nl.int64
    assert nl.tensor(np.zeros(3)).dtype == nl.float64  # a NumPy array keeps its dtype
    assert nl.tensor([1.5], dtype=nl.bfloat16).dtype == nl.bfloat16
    assert nl.tensor([1.5], dtype="float16").dtype == nl.float16
    assert nl.zeros(2, 3).shape == (2, 3) and nl.ones((4,)).shape == (4,)
    assert nl.full((2, 2), 7.0).tolist() == [[7.0, 7.0], [7.0, 7.0]]
    assert nl.arange(4).tolist() == [0, 1, 2, 3] and nl.arange(4).dtype == nl.int64
    assert nl.arange(0.0, 1.0, 0.5).tolist() == [0.0, 0.5]
    a = nl.randn(3, 4, generator=nl.Generator(7))
    b = nl.randn(3, 4, generator=nl.Generator(7))
    assert a.tolist() == b.tolist()  # a seed gives the same numbers
    t = nl.randn(2, 3, 4)
    assert t.ndim == 3 and t.numel() == 24 and t.size(1) == 3 and t.stride() == (12, 4, 1)
    with pytest.raises(nl.Error, match='dtype: expected .*found "int32"'):
        nl.zeros(2, dtype="int32")
    with pytest.raises(nl.Error, match='dtype: expected .*found "float17"'):
        nl.tensor([1.0], dtype="float17")
    # The short names configs use name the same dtypes.
    assert nl.tensor([1.0], dtype="f64").dtype == nl.float64 and nl.zeros(2, dtype="bf16").dtype == nl.bfloat16


def test_numpy_shares_memory_both_ways():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = nl.from_numpy(array)
    assert t.data_ptr() == array.ctypes.data  # the same memory, not a copy
    array[0, 1] = 42.0
    assert t[0, 1].item() == 42.0  # NumPy's write seen by normlab
    t[1, 2] = -1.0
    assert array[1, 2] == -1.0  # normlab's write seen by NumPy
    back = t.numpy()
    assert back.ctypes.data == array.ctypes.data
    assert np.asarray(t).ctypes.data == array.ctypes.data


def test_storage_outlives_whichever_side_is_dropped():
    t = nl.from_numpy(np.arange(4, dtype=np.float64))
    gc.collect()  # the array has no other reference: the tensor keeps it
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    owned = nl.tensor([1.0, 2.0, 3.0])
    view = owned.numpy()
    del owned
    gc.collect()
    assert view.tolist() == [1.0, 2.0, 3.0]  # the array keeps normlab's storage
    # Replacing a tensor's data does not free memory an array still reads.
    x = nl.tensor([5.0, 6.0])
    array = x.numpy()
    x.data = nl.tensor([0.0, 0.0, 0.0])
    gc.collect()
    assert array.tolist() == [5.0, 6.0]


def test_numpy_layouts_and_dtypes():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1::2]  # a strided view
    t = nl.from_numpy(array)
    assert t.shape == (3, 2) and t.stride() == (4, 2) and t.tolist() == array.tolist()
    assert t.data_ptr() == array.ctypes.data
    flipped = nl.from_numpy(np.arange(3.0)[::-1])  # negative strides: copied
    assert flipped.tolist() == [2.0, 1.0, 0.0]
    half = nl.from_numpy(np.ones(3, dtype=np.float16))
    assert half.dtype == nl.float16 and half.numpy().dtype == np.float16
    with pytest.raises(nl.Error, match="typestr '<i4'"):
        nl.from_numpy(np.zeros(3, dtype=np.int32))
    with pytest.raises(nl.Error, match="no bfloat16 dtype"):
        nl.ones(2, dtype=nl.bfloat16).numpy()  # an explicit conversion, never garbage
    assert nl.ones(2, dtype=nl.bfloat16).float().numpy().tolist() == [1.0, 1.0]
    with pytest.raises(nl.Error, match="requires grad"):
        nl.ones(2, requires_grad=True).numpy()


def test_dlpack_with_numpy():
    t = nl.arange(0.0, 4.0)
    array = np.from_dlpack(t)
    assert array.ctypes.data == t.data_ptr()
    array[0] = 9.0
    assert t[0].item() == 9.0
    source = np.linspace(0, 1, 5)
    u = nl.from_dlpack(source)
    assert u.data_ptr() == source.ctypes.data and u.dtype == nl.float64
    with pytest.raises(nl.Error, match="__dlpack__"):
        nl.from_dlpack([1, 2])


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = nl.from_dlpack(x)
    assert t.data_ptr() == x.data_ptr() and t.shape == (2, 3)
    x[1, 1] = 100.0
    assert t[1, 1].item() == 100.0
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    b16 = nl.tensor([1.5, -2.0], dtype=nl.bfloat16)
    assert torch.from_dlpack(b16).dtype == torch.bfloat16
    assert torch.from_dlpack(b16).tolist() == [1.5, -2.0]
    transposed = nl.from_dlpack(x.t())  # strides kept
    assert transposed.stride() == (1, 3) and transposed.tolist() == x.t().tolist()


def test_views_and_indexing_share_memory():
    t = nl.arange(0.0, 24.0).reshape(2, 3, 4)
    assert t[1].shape == (3, 4) and t[1, 2, 3].item() == 23.0
    assert t[:, 1:, ::2].shape == (2, 2, 2) and t[:, 1:, ::2].tolist() == [[[4.0, 6.0], [8.0, 10.0]],
                                                                           [[16.0, 18.0], [20.0, 22.0]]]
    assert t[..., 0].shape == (2, 3) and t[None, 0].shape == (1, 3, 4) and t[-1, -1, -1].item() == 23.0
    assert t[:, [2, 0]].tolist() == [[t[0, 2].tolist(), t[0, 0].tolist()], [t[1, 2].tolist(), t[1, 0].tolist()]]
    view = t.transpose(0, 2)
    assert view.shape == (4, 3, 2) and view.data_ptr() == t.data_ptr()
    t[0, 0, 0] = -5.0
    assert view[0, 0, 0].item() == -5.0
    assert t.flatten(1).shape == (2, 12) and t.reshape(6, 4).shape == (6, 4) and t.T.shape == (4, 3, 2)
    with pytest.raises(nl.Error, match="too many indices"):
        t[0, 0, 0, 0]


def test_arithmetic_broadcasting_and_reductions_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    x, y = nl.tensor(a), nl.tensor(b)
    np.testing.assert_allclose((x * y + 2.0 - x / 3.0).numpy(), a * b + 2.0 - a / 3.0, rtol=1e-12)
    np.testing.assert_allclose((1.0 - x).numpy(), 1.0 - a, rtol=1e-12)
    np.testing.assert_allclose((x @ x.T).numpy(), a @ a.T, rtol=1e-12)
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-12)
    np.testing.assert_allclose(x.mean((0, 1), keepdim=True).numpy(), a.mean(keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(x.var(1).numpy(), a.var(1, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(x.std(1, correction=0).numpy(), a.std(1), rtol=1e-12)
    values, indices = x.max(1)
    assert values.tolist() == a.max(1).tolist() and indices.tolist() == a.argmax(1).tolist()
    np.testing.assert_allclose(nl.softmax(x, -1).numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(nl.exp(x).numpy(), np.exp(a), rtol=1e-12)
    assert (x > 0.0).tolist() == (a > 0).astype(float).tolist()
    np.testing.assert_allclose(nl.stack([x, x], 1).numpy(), np.stack([a, a], 1))
    with pytest.raises(nl.Error, match="cannot multiply"):
        x @ y.reshape(2, 2)


def test_backward_grad_and_double_backward():
    x = nl.tensor([1.0, 2.0, 3.0], dtype=nl.float64, requires_grad=True)
    y = (x ** 3).sum()
    (g,) = nl.autograd.grad(y, x, create_graph=True)
    assert g.tolist() == [3.0, 12.0, 27.0]  # 3 x^2
    g.sum().backward()
    assert x.grad.tolist() == [6.0, 12.0, 18.0]  # d/dx sum(3 x^2) = 6 x
    z = nl.tensor([[1.0, 2.0]], requires_grad=True)
    out = z * 2.0
    out.backward(nl.ones(1, 2))
    assert z.grad.tolist() == [[2.0, 2.0]] and z.is_leaf and not out.is_leaf
    assert out.grad_fn is not None and z.grad_fn is None
    with nl.no_grad():
        w = z * 3.0
    assert not w.requires_grad and w.grad_fn is None
    with pytest.raises(nl.Error, match="in-place"):
        z += 1.0
    with nl.no_grad():
        z -= 1.0  # an in-place update outside the graph, as an optimizer's
    assert z.tolist() == [[0.0, 1.0]]


def test_grad_modes_as_blocks_and_decorators():
    x = nl.ones(2, requires_grad=True)

    @nl.no_grad()
    def evaluate(v):
        return v * 2.0

    @nl.enable_grad()
    def record(v):
        return v * 2.0

    assert not evaluate(x).requires_grad and nl.is_grad_enabled()
    with nl.no_grad():
        assert record(x).requires_grad  # enable_grad inside no_grad records again
        with nl.enable_grad():
            assert (x * 1.0).requires_grad
        assert not (x * 1.0).requires_grad and not nl.is_grad_enabled()
    assert nl.is_grad_enabled()


def test_gradcheck_and_gradgradcheck():
    x = nl.randn(4, 5, dtype=nl.float64, requires_grad=True, generator=nl.Generator(1))
    w = nl.randn(5, dtype=nl.float64, requires_grad=True, generator=nl.Generator(2))

    def rms(x, w):
        return x * nl.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w

    result = nl.autograd.gradcheck(rms, [x, w])
    assert result and result.ok and result.abs_error < 1e-6
    assert nl.autograd.gradgradcheck(rms, [x, w])
    with pytest.raises(nl.autograd.GradcheckError):
        nl.autograd.gradcheck(lambda x: nl._normlab.Tensor.detach(x) * x, [x])  # a wrong gradient (detach)


def test_graph_inspection():
    x = nl.randn(4, 8, dtype=nl.float64, requires_grad=True)
    y = (nl.exp(x) * x).sum()
    nodes = nl.autograd.graph_nodes(y)
    assert [n.name for n in nodes] == ["sum", "mul", "exp"]
    saved = {s["name"]: s for n in nodes for s in n.saved}
    assert saved["y"]["shape"] == (4, 8) and saved["y"]["bytes"] == 4 * 8 * 8
    assert nl.autograd.graph_saved_bytes(y) == 2 * 4 * 8 * 8  # x and exp(x), each once
    assert "saved for backward" in nl.autograd.graph_summary(y)
    assert nl.autograd.graph_to_dot(y).startswith("digraph")


def test_printing_as_pytorch():
    assert repr(nl.tensor([[1.0, 2.5], [3.0, 4.0]], requires_grad=True)) == (
        "tensor([[1.0000, 2.5000],\n        [3.0000, 4.0000]], requires_grad=True)")
    assert repr(nl.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(nl.tensor([1, 2, 3])) == "tensor([1, 2, 3])"
    assert repr(nl.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"
    assert repr(nl.tensor(2.5)) == "tensor(2.5000)"
    assert repr(nl.tensor([1.0], dtype=nl.float64)) == "tensor([1.], dtype=normlab.float64)"
    assert repr(nl.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert repr(nl.tensor([math.nan, 1.0])) == "tensor([nan, 1.])"
    x = nl.tensor([1.0], requires_grad=True)
    assert repr(x * 2.0).endswith("grad_fn=<mul>)")
    big = repr(nl.zeros(2000))
    assert "..." in big and len(big) < 200


def test_printing_matches_torch_where_installed():
    torch = pytest.importorskip("torch")
    for values in ([[0.5, -1.25], [3.0, 100.0]], [1.0, 2000.0], [[1e-3, 1.0, 5.0] * 40] * 3):
        assert repr(nl.tensor(values)) == repr(torch.tensor(values))


def test_errors_are_python_exceptions_with_normlab_messages():
    assert issubclass(nl.Error, ValueError)
    with pytest.raises(nl.Error, match=r"cannot multiply \[2, 3\] by \[4, 5\]"):
        nl.zeros(2, 3) @ nl.zeros(4, 5)
    with pytest.raises(nl.Error):
        nl.zeros(2, 3).reshape(7)
