"""Autograd: grad mode (``no_grad``), ``grad`` (torch.autograd.grad), ``gradcheck`` and
``gradgradcheck`` against f64 central differences, graph inspection (the nodes a tensor's graph
holds, what each saved for backward and how many bytes, a text summary, Graphviz DOT), and
``functional.hvp`` (torch.autograd.functional.hvp).
"""
import functools

from .. import _normlab as C
from .._normlab import GradcheckResult, Node, graph_nodes, graph_saved_bytes, graph_summary, graph_to_dot  # noqa: F401
from . import functional  # noqa: F401


class GradcheckError(RuntimeError):
    """gradcheck found an element whose analytic and numeric gradients disagree."""


class set_grad_enabled:
    """Turns graph recording on or off, for a ``with`` block or from the call on (torch.set_grad_enabled)."""

    def __init__(self, mode: bool):
        self._before = C._set_grad_enabled(bool(mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        C._set_grad_enabled(self._before)
        return False


class _GradMode:
    """A ``with`` block (or a decorator) that runs with graph recording set to ``_enabled``."""
    _enabled = False

    def __enter__(self):
        self._before = C._set_grad_enabled(self._enabled)
        return self

    def __exit__(self, *exc):
        C._set_grad_enabled(self._before)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """A ``with`` block (or a decorator) in which ops record no graph: evaluation, in-place updates."""
    _enabled = False


class enable_grad(_GradMode):
    """A ``with`` block (or a decorator) in which ops record the graph again."""
    _enabled = True


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """The gradients of `outputs` (summed over them) with respect to `inputs`, as a tuple, without touching
    any ``.grad``; with create_graph they carry a graph (Hessian-vector products)."""
    single = isinstance(inputs, C.Tensor)
    result = C._grad(outputs, [inputs] if single else list(inputs), grad_outputs, retain_graph, create_graph,
                     allow_unused)
    return tuple(result)


def _check(run, fn, inputs, eps, atol, rtol, raise_exception):
    result = run(lambda *args: fn(*args), list(inputs), eps, atol, rtol)
    if not result.ok and raise_exception:
        raise GradcheckError(result.message)
    return result


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """Checks fn's gradients with respect to `inputs` (float64 tensors that require grad) against
    central differences. Returns the GradcheckResult (truthy when every element passes:
    |analytic - numeric| <= atol + rtol |numeric|); raises GradcheckError on a failure unless
    raise_exception is False."""
    return _check(C._gradcheck, fn, inputs, eps, atol, rtol, raise_exception)


def gradgradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """gradcheck of the gradient: fn's second derivatives, through backward(create_graph=True)."""
    return _check(C._gradgradcheck, fn, inputs, eps, atol, rtol, raise_exception)
