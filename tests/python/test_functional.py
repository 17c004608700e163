"""normlab.autograd.functional.hvp: against an explicit Hessian, through the fused norm, SwiGLU, attention
and cross-entropy nodes, its tuple/tensor conventions, create_graph and strict, and against
torch.autograd.functional.hvp (skipped by name where PyTorch is not installed)."""
import numpy as np
import pytest

import normlab as nl
from normlab.autograd.functional import hvp


def f64(array, requires_grad=False):
    return nl.tensor(np.asarray(array, dtype=np.float64), requires_grad=requires_grad)


def test_hvp_of_a_cubic_matches_its_explicit_hessian():
    x0 = np.array([0.5, -1.25, 2.0])
    v0 = np.array([1.0, -2.0, 0.5])
    a = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, -1.0], [0.0, -1.0, 3.0]])
    # f(x) = sum(x^3) + x^T A x / 2: H = diag(6 x) + A.
    out, product = hvp(lambda x: (x ** 3).sum() + (x * (f64(a) @ x)).sum() * 0.5, f64(x0), f64(v0))
    expected = (np.diag(6 * x0) + a) @ v0
    np.testing.assert_allclose(product.numpy(), expected, rtol=1e-13, atol=1e-13)
    assert out.item() == pytest.approx(np.sum(x0 ** 3) + x0 @ a @ x0 / 2, rel=1e-14)
    assert isinstance(product, nl.Tensor) and not product.requires_grad  # a tensor in, a tensor out


def test_hvp_tuple_in_tuple_out_create_graph_and_strict():
    x, y = f64([1.0, 2.0]), f64([0.5, -1.0])
    out, products = hvp(lambda a, b: (a * a * b).sum(), (x, y), (f64([1.0, 0.0]), f64([0.0, 1.0])))
    assert isinstance(products, tuple) and len(products) == 2
    # H = [[diag(2 b), diag(2 a)], [diag(2 a), 0]]
    np.testing.assert_allclose(products[0].numpy(), [1.0, 4.0])   # 2 b_0 * 1, 2 a_1 * 1
    np.testing.assert_allclose(products[1].numpy(), [2.0, 0.0])   # 2 a_0 * 1, 0
    _, graphed = hvp(lambda a: (a ** 3).sum(), f64([1.0, 2.0], requires_grad=True), f64([1.0, 1.0]),
                     create_graph=True)
    assert graphed.requires_grad
    _, scalar = hvp(lambda a: (a ** 3).sum(), f64([2.0]))  # v omitted for a single-element input
    assert scalar.tolist() == [12.0]
    _, zeros = hvp(lambda a, b: (a * 3.0).sum(), (x, y), (x, y))
    assert zeros[0].tolist() == [0.0, 0.0] and zeros[1].tolist() == [0.0, 0.0]
    with pytest.raises(nl.Error, match="independent of input 1"):
        hvp(lambda a, b: (a * a).sum(), (x, y), (x, y), strict=True)


def test_hvp_through_the_fused_nodes_equals_the_composed_forms():
    gen = nl.Generator(3)
    x = nl.randn(3, 8, generator=gen, dtype=nl.float64)
    w = nl.randn(8, generator=gen, dtype=nl.float64)
    v = (nl.randn(3, 8, generator=gen, dtype=nl.float64), nl.randn(8, generator=gen, dtype=nl.float64))
    targets = nl.tensor([1, 5, 7])
    F = nl.nn.functional
    results = []
    for fused in (True, False):
        def loss(a, b):
            return F.cross_entropy(F.rms_norm(a, (8,), b, 1e-5, fused=fused) * 2.0, targets)
        results.append(hvp(loss, (x, w), v)[1])
    for fused_part, composed_part in zip(*results):
        np.testing.assert_allclose(fused_part.numpy(), composed_part.numpy(), rtol=1e-10, atol=1e-12)


def test_hvp_matches_torch(torch):
    gen = np.random.default_rng(5)
    xs = [gen.standard_normal((4, 5)), gen.standard_normal((5, 3))]
    vs = [gen.standard_normal((4, 5)), gen.standard_normal((5, 3))]

    def f_torch(a, b):
        return torch.log_softmax(torch.tanh(a @ b), -1).sum() * 0.5 + (a ** 3).sum()

    def f_nl(a, b):
        return nl.nn.functional.log_softmax(nl.tanh(a @ b), -1).sum() * 0.5 + (a ** 3).sum()

    t_out, t_hvp = torch.autograd.functional.hvp(f_torch, tuple(torch.tensor(a) for a in xs),
                                                 tuple(torch.tensor(a) for a in vs))
    n_out, n_hvp = hvp(f_nl, tuple(f64(a) for a in xs), tuple(f64(a) for a in vs))
    assert n_out.item() == pytest.approx(t_out.item(), rel=1e-13)
    for mine, theirs in zip(n_hvp, t_hvp):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-11, atol=1e-12)
    # One tensor in, one tensor out, as PyTorch.
    t_single = torch.autograd.functional.hvp(lambda a: (a ** 3).sum(), torch.tensor(xs[0]), torch.tensor(vs[0]))[1]
    n_single = hvp(lambda a: (a ** 3).sum(), f64(xs[0]), f64(vs[0]))[1]
    np.testing.assert_allclose(n_single.numpy(), t_single.numpy(), rtol=1e-13)
