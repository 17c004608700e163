"""``t[key]`` and ``t[key] = value`` with PyTorch's rules for basic indexing.

An int selects (the dim goes), a slice narrows (steps > 0), ``None`` inserts a dim of size 1,
``...`` stands for the dims not named; all of these are views that share the tensor's memory and
that autograd follows. One integer tensor or list indexes a dim by position (``index_select``, a
copy). Assignment writes through the same views in place.
"""
from . import _normlab as C


def _expand_key(t, key):
    if not isinstance(key, tuple):
        key = (key,)
    named = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise C.Error("an index can have only one ellipsis (...)")
    if named > t.ndim:
        raise C.Error(f"too many indices for a tensor of {t.ndim} dims: {named} given")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (t.ndim - named))
        else:
            expanded.append(k)
    return expanded


def _as_index_tensor(k):
    if isinstance(k, C.Tensor):
        if k.dtype != C.int64:
            raise C.Error(f"index tensors must be int64 (normlab has no bool dtype: use where or masked_fill for "
                          f"masks), found {k.dtype.name}")
        return k
    return C._copy_array(__import__("numpy").asarray(k, dtype="int64"))


def getitem(t, key):
    dim = 0
    advanced = False
    for k in _expand_key(t, key):
        if k is None:
            t = t.unsqueeze(dim)
            dim += 1
        elif isinstance(k, bool):
            raise C.Error("indexing with a bool is not supported")
        elif isinstance(k, int) or (hasattr(k, "__index__") and not isinstance(k, (C.Tensor, list, tuple))):
            t = t._select(dim, int(k))
        elif isinstance(k, slice):
            start, stop, step = k.start, k.stop, 1 if k.step is None else k.step
            if step <= 0:
                raise C.Error(f"slice steps must be positive, found {step}")
            size = t.shape[dim]
            t = t._slice(dim, 0 if start is None else start, size if stop is None else stop, step)
            dim += 1
        elif isinstance(k, (C.Tensor, list, tuple)):
            if advanced:
                raise C.Error("only one tensor or list index per indexing is supported")
            advanced = True
            index = _as_index_tensor(k)
            if index.ndim != 1:
                raise C.Error(f"an index tensor must be 1-D, found shape {index.shape}")
            t = t.index_select(dim, index)
            dim += 1
        else:
            raise C.Error(f"unsupported index {k!r}: use ints, slices, None, ..., or one int64 tensor or list")
    return t


def setitem(t, key, value):
    keys = _expand_key(t, key)
    if any(isinstance(k, (C.Tensor, list, tuple)) for k in keys):
        raise C.Error("assignment through a tensor or list index is not supported; use index_add or scatter_add")
    if t.requires_grad and t.is_leaf and C.is_grad_enabled():
        raise C.Error("a leaf tensor that requires grad is written in place; do it under normlab.no_grad()")
    view = getitem(t.data, tuple(keys))
    if isinstance(value, C.Tensor):
        view.copy_(value)
    else:
        view.fill_(float(value))
