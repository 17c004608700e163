"""Tensors printed as PyTorch prints them: ``tensor([[ 0.1234, -1.5000], ...], requires_grad=True)``.

PyTorch's rules (torch/_tensor_str.py, default print options): floats that are all whole numbers
print as ``1.``; otherwise four decimals, or scientific notation with four when the finite nonzero
magnitudes span more than 1000x, exceed 1e8 or fall below 1e-4. Every element is padded to the
widest one, rows wrap at 80 characters, and tensors over 1000 elements show the first and last
three entries of each dimension around ``...``.
"""
import math

import numpy as np

THRESHOLD = 1000  # elements above which a tensor is summarized
EDGE = 3          # entries kept at each end of a summarized dimension
LINE_WIDTH = 80


def _element_formatter(values, floating):
    """A function from one value to its text, all of equal width (PyTorch's _Formatter)."""
    finite = values[np.isfinite(values)] if floating else values
    if not floating:
        texts = [str(int(v)) for v in values]
        width = max((len(t) for t in texts), default=1)
        return lambda v: str(int(v)).rjust(width)
    nonzero = np.abs(finite[finite != 0])
    whole = finite.size == 0 or bool(np.all(finite == np.ceil(finite)))
    if whole:
        sci = nonzero.size > 0 and (nonzero.max() / nonzero.min() > 1000 or nonzero.max() > 1e8)
        fmt = (lambda v: f"{v:.4e}") if sci else (lambda v: f"{v:.0f}.")
    else:
        sci = nonzero.size > 0 and (nonzero.max() / nonzero.min() > 1000 or nonzero.max() > 1e8 or nonzero.min() < 1e-4)
        fmt = (lambda v: f"{v:.4e}") if sci else (lambda v: f"{v:.4f}")

    def text(v):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return fmt(v)

    # The width comes from the finite nonzero values (nan, inf and 0 are padded to it, not widen it).
    width = max((len(fmt(v)) for v in finite[finite != 0].ravel()), default=1)
    return lambda v: text(v).rjust(width)


def _summarized(array, summarize):
    """The values PyTorch would show (the edges of each dim when summarizing), for the widths."""
    if not summarize or array.ndim == 0:
        return array.ravel()
    parts = []
    if array.shape[0] > 2 * EDGE:
        rows = list(array[:EDGE]) + list(array[-EDGE:])
    else:
        rows = list(array)
    for row in rows:
        parts.append(_summarized(np.asarray(row), summarize))
    return np.concatenate(parts) if parts else np.array([])


def _rows(array, fmt, indent, summarize):
    """The text of `array` (ndim >= 1) starting after its opening bracket, PyTorch's nesting."""
    if array.ndim == 1:
        items = [fmt(v) for v in array]
        if summarize and array.shape[0] > 2 * EDGE:
            items = [fmt(v) for v in array[:EDGE]] + [" ..."] + [fmt(v) for v in array[-EDGE:]]
        # Wrap at LINE_WIDTH: as many elements per line as fit after the indentation.
        element_width = max((len(i) for i in items), default=1) + 2
        per_line = max(1, (LINE_WIDTH - indent) // element_width)
        lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    index = list(range(array.shape[0]))
    if summarize and array.shape[0] > 2 * EDGE:
        index = index[:EDGE] + [None] + index[-EDGE:]
    parts = ["..." if i is None else _rows(array[i], fmt, indent + 1, summarize) for i in index]
    separator = "," + "\n" * (array.ndim - 1) + " " * (indent + 1)
    return "[" + separator.join(parts) + "]"


def tensor_repr(t):
    """PyTorch's repr of a tensor: values, then dtype (when not the default), grad_fn or requires_grad."""
    from . import _normlab as C

    dtype = t.dtype
    floating = dtype.is_floating_point
    data = t.detach()
    if dtype == C.bfloat16 or dtype == C.float16:
        data = data.float()
    array = np.asarray(data.cpu()).astype(np.float64 if floating else np.int64)
    summarize = array.size > THRESHOLD
    prefix = "tensor("
    if array.size == 0:
        body = "[]"
    else:
        fmt = _element_formatter(_summarized(array, summarize).astype(np.float64 if floating else np.int64), floating)
        body = fmt(array.item()).strip() if array.ndim == 0 else _rows(array, fmt, len(prefix), summarize)
    suffixes = []
    if array.size == 0 and array.shape != (0,):
        suffixes.append(f"size={tuple(array.shape)}")
    default = C.float32 if floating else C.int64
    if dtype != default:
        suffixes.append(f"dtype=normlab.{dtype.name}")
    if t.device != "cpu":
        suffixes.append(f"device='{t.device}'")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return prefix + body + "".join(", " + s for s in suffixes) + ")"
