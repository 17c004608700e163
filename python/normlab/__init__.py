"""normlab: a small from-scratch training framework for studying normalization layers.

``normlab.Tensor`` is an n-dimensional array with reverse-mode autograd, with PyTorch's names for
ops; ``normlab.nn`` has the layers (every norm of normlab's registry, fused and composed, the
transformer), ``normlab.optim`` the optimizers, and ``normlab.train`` / ``stability`` / ``sample``
run the jobs of the ``normlab`` program. ``normlab.torch`` runs normlab's fused CPU kernels on
PyTorch tensors. NumPy arrays and PyTorch tensors cross without copies: ``from_numpy``,
``from_dlpack``, ``Tensor.numpy()``, ``numpy.asarray(t)``, ``torch.from_dlpack(t)``.
"""
import builtins as _builtins

import numpy as _np

from . import _normlab
from ._normlab import (  # noqa: F401
    Error, InternalError, Generator, Tensor, dtype, float32, float64, bfloat16, float16, int64,
    manual_seed, from_numpy, from_dlpack, is_grad_enabled, __version__,
    neg, exp, log, sqrt, rsqrt, abs, relu, silu, sigmoid, tanh, gelu, square, pow, maximum, minimum,
    matmul, softmax, log_softmax, where, cat, tril, sum, mean, max, min, var, std,
)
from . import autograd, nn, optim  # noqa: F401
from ._jobs import train, stability, sweep, sample, export, convert, analyze, load_checkpoint, save_checkpoint, TrainSession  # noqa: F401
from ._jobs import config_schema, config_defaults, config_jobs  # noqa: F401
from ._format import tensor_repr as _tensor_repr
from ._indexing import getitem as _indexing_getitem, setitem as _indexing_setitem
from .autograd import no_grad, enable_grad, set_grad_enabled  # noqa: F401

float = float32    # noqa: A001  (PyTorch's aliases)
double = float64
half = float16
long = int64


_HOST_TYPES = {float32: _np.float32, float64: _np.float64, float16: _np.float16, int64: _np.int64,
               bfloat16: _np.float32}  # bfloat16 is made from float32 (NumPy has none)


def _as_dtype(d):
    """A dtype from a normlab dtype, a name ("float16", or "f16" as configs spell it) or None (kept
    None: the op's default). The C++ creation functions read names themselves; tensor() needs the dtype
    object for NumPy's type."""
    if d is None or isinstance(d, dtype):
        return d
    return _normlab._parse_dtype(d)


def _inferred_dtype(data, array):
    """PyTorch's choice for torch.tensor(data): Python floats give float32, ints and bools int64;
    a NumPy array keeps its float width."""
    kind = array.dtype.kind
    if kind in "biu":
        return int64
    if kind != "f":
        raise Error(f"tensor: cannot make a tensor of NumPy dtype {array.dtype}")
    if not isinstance(data, _np.ndarray):
        return float32
    return {8: float64, 4: float32, 2: float16}[array.dtype.itemsize]


def tensor(data, dtype=None, requires_grad=False):
    """A new tensor holding a copy of `data` (a nested list, a number, a NumPy array, a Tensor).
    Python floats give float32 and ints int64, as in PyTorch; a NumPy array keeps its dtype."""
    if isinstance(data, Tensor):
        t = data.detach().clone().to(_as_dtype(dtype) or data.dtype)
    else:
        array = _np.asarray(data)
        dtype = _as_dtype(dtype)
        target = dtype if dtype is not None else _inferred_dtype(data, array)
        t = _normlab._copy_array(_np.asarray(array, dtype=_HOST_TYPES[target], order="C"))  # 0-d stays 0-d
        if target == bfloat16:
            t = t.to(bfloat16)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _sizes(size):
    return tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)


def _made(t, requires_grad):
    return t.requires_grad_(True) if requires_grad else t


def zeros(*size, dtype=None, requires_grad=False):
    """A tensor of zeros of the given size (float32 unless dtype says otherwise)."""
    return _made(_normlab._full(_sizes(size), 0.0, dtype), requires_grad)


def ones(*size, dtype=None, requires_grad=False):
    """A tensor of ones of the given size."""
    return _made(_normlab._full(_sizes(size), 1.0, dtype), requires_grad)


def full(size, fill_value, dtype=None, requires_grad=False):
    """A tensor of the given size filled with fill_value."""
    return _made(_normlab._full(_sizes((size,)), _builtins.float(fill_value), dtype), requires_grad)


def empty(*size, dtype=None, requires_grad=False):
    """A tensor of the given size whose values are not set."""
    return _made(_normlab._empty(_sizes(size), dtype), requires_grad)


def zeros_like(t, dtype=None):
    """A tensor of zeros of t's shape (and dtype unless given)."""
    return zeros(t.shape, dtype=dtype or t.dtype)


def ones_like(t, dtype=None):
    """A tensor of ones of t's shape (and dtype unless given)."""
    return ones(t.shape, dtype=dtype or t.dtype)


def full_like(t, fill_value, dtype=None):
    """A tensor of t's shape (and dtype unless given) filled with fill_value."""
    return full(t.shape, fill_value, dtype=dtype or t.dtype)


def arange(start, end=None, step=1, dtype=None):
    """start, start + step, ... below end; int64 when every argument is an int, else float32."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = int64 if all(isinstance(v, int) for v in (start, end, step)) else float32
    return _normlab._arange(start, end, step, dtype)


def randn(*size, generator=None, dtype=None, requires_grad=False):
    """Standard normal values, drawn from `generator` (the default generator: normlab.manual_seed)."""
    return _made(_normlab._randn(_sizes(size), generator, dtype), requires_grad)


def rand(*size, generator=None, dtype=None, requires_grad=False):
    """Uniform values in [0, 1), drawn from `generator` (the default generator: normlab.manual_seed)."""
    return _made(_normlab._rand(_sizes(size), generator, dtype), requires_grad)


def stack(tensors, dim=0):
    """The tensors (of one shape) joined along a new dim."""
    return cat([t.unsqueeze(dim) for t in tensors], dim)


# ---- Tensor methods written in Python ----
# Each is named as a method of the extension's Tensor (module, qualified name), so help(Tensor) and
# the type stubs (normlab/_normlab/__init__.pyi) show it with its signature and docstring.

def _tensor_method(name):
    def bind(fn):
        fn.__name__, fn.__qualname__, fn.__module__ = name, f"Tensor.{name}", _normlab.__name__
        setattr(Tensor, name, fn)
        return fn
    return bind


@_tensor_method("flatten")
def _flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
    """The dims start_dim..end_dim merged into one (a view where the strides allow), as torch.flatten."""
    ndim = _builtins.max(self.ndim, 1)
    start, end = start_dim % ndim, end_dim % ndim
    if self.ndim == 0:
        return self.reshape(1)
    shape = self.shape
    middle = 1
    for size in shape[start:end + 1]:
        middle *= size
    return self.reshape(shape[:start] + (middle,) + shape[end + 1:])


@_tensor_method("tolist")
def _tolist(self) -> object:
    """The values as nested Python lists (a number for a 0-d tensor); bfloat16 and float16 as floats."""
    if self.ndim == 0:
        return self.item() if self.dtype.is_floating_point else int(self.item())
    array = _np.asarray(self.detach().float() if self.dtype in (bfloat16, float16) else self.detach())
    return array.tolist()


@_tensor_method("__iter__")
def _iter(self):
    """The sub-tensors along dim 0, as iterating a torch.Tensor gives."""
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


@_tensor_method("__bool__")
def _bool(self) -> bool:
    """The truth of a one-element tensor (an Error for more elements: ambiguous)."""
    if self.numel() != 1:
        raise Error(f"the truth value of a tensor of {self.numel()} elements is ambiguous")
    return self.item() != 0


@_tensor_method("__float__")
def _float(self) -> _builtins.float:
    """The value of a one-element tensor as a Python float."""
    return _builtins.float(self.item())


@_tensor_method("__int__")
def _int(self) -> int:
    """The value of a one-element tensor as a Python int."""
    return int(self.item())


@_tensor_method("__getitem__")
def _getitem(self, key) -> "Tensor":
    """t[key]: ints, slices, None, ... and int64 or bool index tensors, as PyTorch indexes (a view
    where no index tensor is involved)."""
    return _indexing_getitem(self, key)


@_tensor_method("__setitem__")
def _setitem(self, key, value) -> None:
    """t[key] = value (a number or a tensor broadcast to the indexed part), in place."""
    _indexing_setitem(self, key, value)


@_tensor_method("__repr__")
def _repr(self) -> str:
    """The tensor as PyTorch prints it: tensor([...], dtype=..., requires_grad=True)."""
    return _tensor_repr(self)


Tensor.__str__ = Tensor.__repr__
