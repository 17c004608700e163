"""normlab for PyTorch: every norm of normlab's registry (layers/norm_registry.h) as a torch.nn.Module
class, and LayerNorm's and RMSNorm's fused kernels, SwiGLU's gate and causal attention as functions,
all ``torch.autograd.Function``s on PyTorch CPU tensors, so a PyTorch model can use them in place of
its own.

The norm classes (LayerNorm, RMSNorm, RMSNormWithBias, PRMSNorm, AdaptiveRMSNorm, HybridNorm,
ScaleNorm, DyT, ...) are generated from the registry when the module is imported, as normlab.nn's are, so
a norm added to the registry in C++ is a class here too. Each has PyTorch's signature,
``(normalized_shape, eps=<the entry's default>, <the options the entry reads>, device=None,
dtype=None)``, the options (elementwise_affine, bias, p, alpha, alpha_init: ``entry.option_names``) defaulting to
C++ NormOptions' defaults and RMSNorm's eps=None being torch.nn.RMSNorm's (the machine epsilon of the
dtype the statistic is computed in). Its parameters have the C++ module's state-dict names and
initial values (HybridNorm's rms_norm.weight, layer_norm.weight, layer_norm.bias), so state dicts
cross between normlab.nn and normlab.torch by name.

A norm whose fused form is one node over normlab's norm kernel pair (LayerNorm, RMSNorm,
RMSNormWithBias, PRMSNorm) runs that pair directly (_NormFunction: the forward saves x and its row
statistics, the backward is the closed form), which costs less per call than an autograd graph. Any
other (AdaptiveRMSNorm, HybridNorm, ScaleNorm, DyT, ...) runs its entry's fused functional form through
normlab's own autograd (_RegistryNormFunction), the backward being normlab's backward of that graph.
The tensors cross by DLPack, without a copy: normlab reads PyTorch's memory and PyTorch reads the
results in normlab's. The gradients equal PyTorch's own within rounding (tests/python/test_torch.py).
"""
import atexit
import inspect
import weakref

import torch

from . import _normlab as C
from .autograd import enable_grad, grad, no_grad
from .nn.norms import _options_from_arguments, _signature

__all__ = ["layer_norm", "rms_norm", "swiglu", "causal_attention", "norm_class"]


def _nl(t):
    """A PyTorch tensor as a normlab tensor on its memory (contiguous first; no copy when it is)."""
    return C.from_dlpack(t.detach().contiguous())


def _nl_or_none(t):
    return None if t is None else _nl(t)


def _torch(t):
    """A normlab tensor as a PyTorch tensor on its memory."""
    return None if t is None else torch.from_dlpack(t)


def _check_cpu(*tensors):
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            raise C.Error(f"normlab.torch runs normlab's CPU kernels: expected CPU tensors, found one on {t.device}")


def _machine_eps(dtype):
    """PyTorch's RMSNorm eps=None: the machine epsilon of the dtype it computes the statistic in (float32's
    for float16 and bfloat16 inputs, its kernels' opmath type)."""
    return torch.finfo(torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype).eps


class _NormFunction(torch.autograd.Function):
    """One fused norm node over normlab's forward/backward kernel pair (the functions layer_norm, rms_norm)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, subtract_mean, stat_count):
        _check_cpu(x, weight, bias)
        y, mean, rstd = C.kernels.norm_forward(_nl(x), _nl_or_none(weight), _nl_or_none(bias), eps, subtract_mean,
                                               stat_count)
        mean_t, rstd_t = _torch(mean), _torch(rstd)
        ctx.save_for_backward(x, weight, mean_t if mean_t is not None else rstd_t, rstd_t)
        ctx.subtract_mean, ctx.stat_count = subtract_mean, stat_count
        ctx.has_bias = bias is not None
        return _torch(y)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        need_dweight = weight is not None and ctx.needs_input_grad[1]
        need_dbias = ctx.has_bias and ctx.needs_input_grad[2]
        dx, dweight, dbias = C.kernels.norm_backward(
            _nl(dy), _nl(x), _nl_or_none(weight), _nl(mean) if ctx.subtract_mean else None, _nl(rstd),
            ctx.subtract_mean, ctx.stat_count, need_dweight, need_dbias)
        return _torch(dx), _torch(dweight), _torch(dbias), None, None, None


def _last_dim(x, normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.shape[-1:] != shape:
        raise C.Error(f"normlab.torch norms normalize over the last dim: expected normalized_shape ({x.shape[-1]},) "
                      f"for an input {tuple(x.shape)}, found {shape}")


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm over the last dim on normlab's fused kernels."""
    _last_dim(x, normalized_shape)
    return _NormFunction.apply(x, weight, bias, eps, True, -1)


def rms_norm(x, normalized_shape, weight=None, eps=None, bias=None, stat_count=-1):
    """F.rms_norm over the last dim on normlab's fused kernels (eps None: as PyTorch's, the machine epsilon
    of the dtype the statistic is computed in: float32's for float16 and bfloat16 inputs). `bias` adds
    the article's RMSNormWithBias term; `stat_count` computes the RMS over the first stat_count
    elements of each row (pRMSNorm)."""
    _last_dim(x, normalized_shape)
    if eps is None:
        eps = _machine_eps(x.dtype)
    return _NormFunction.apply(x, weight, bias, eps, False, stat_count)


# ---- every norm of the registry ----

class _Graph:
    """The normlab graph of one _RegistryNormFunction call, which its PyTorch node holds until its backward:
    the registry type's fused functional form with `options` (a dict of NormOptions fields) on normlab views
    of x and params; the output, the leaves needing a gradient and their positions among (x, *params)."""

    __slots__ = ("y", "leaves", "wanted", "__weakref__")

    def __init__(self, type, options, x, params, needs_grad):
        norm_options = C.nn.NormOptions()
        norm_options.type = type
        for name, value in options.items():
            setattr(norm_options, name, value)
        inputs = [_nl(x)] + [_nl_or_none(p) for p in params]
        self.wanted = [i for i, t in enumerate(inputs) if t is not None and needs_grad[i]]
        self.leaves = [inputs[i].requires_grad_(True) for i in self.wanted]
        with enable_grad() if self.wanted else no_grad():
            self.y = C.nn.find_norm_type(type).forward(inputs[0], inputs[1:], norm_options, True)
        _LIVE_GRAPHS.add(self)

    def release(self):
        self.y, self.leaves = None, []


# The graphs not yet released. PyTorch frees a graph still alive at exit only after normlab's extension
# has gone (nanobind then reports its tensors as leaked), so they are released first, at exit.
_LIVE_GRAPHS = weakref.WeakSet()
atexit.register(lambda: [g.release() for g in list(_LIVE_GRAPHS)])


class _RegistryNormFunction(torch.autograd.Function):
    """Any registry norm as one PyTorch node: the entry's fused functional form run by normlab's autograd
    on views of the PyTorch tensors; the backward is normlab's backward of that graph."""

    @staticmethod
    def forward(ctx, type, options, x, *params):
        _check_cpu(x, *params)
        ctx.graph = _Graph(type, options, x, params, ctx.needs_input_grad[2:])
        ctx.type, ctx.options = type, options
        # Saved for PyTorch's checks (x changed in place before backward is its error) and for a second
        # backward through a retained graph.
        ctx.save_for_backward(x, *params)
        return _torch(ctx.graph.y.detach())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, *params = ctx.saved_tensors  # PyTorch's error where its graph was freed by an earlier backward
        # normlab frees its graph as it goes back, as PyTorch does without retain_graph; a second backward
        # through a retained PyTorch graph (retain_graph=True, gradcheck) builds it again from the inputs.
        graph = ctx.graph if ctx.graph.y is not None else _Graph(ctx.type, ctx.options, x, params,
                                                                  ctx.needs_input_grad[2:])
        grads = [None] * (1 + len(params))
        for i, g in zip(graph.wanted, grad(graph.y, graph.leaves, _nl(dy))):
            grads[i] = _torch(g)
        graph.release()
        return (None, None, *grads)


class _Part(torch.nn.Module):
    """The parameters a registry norm's C++ module keeps in a child (HybridNorm's rms_norm and
    layer_norm), under the same names, so the state-dict names are the C++ module's."""

    def extra_repr(self):
        return ", ".join(name for name, p in self._parameters.items() if p is not None)


# The classes whose PyTorch counterpart defaults eps to None: torch.nn.RMSNorm (the machine epsilon of the
# dtype the statistic is computed in, at each call). The others default to their registry entry's eps.
_PYTORCH_EPS_NONE = {"RMSNorm"}


def _runs_the_kernel_pair(entry):
    """Whether the entry's fused form is one node over core/fused.h's norm kernel pair (a variance or RMS
    statistic) with its weight and bias: then _NormFunction runs it, costing less per call than
    normlab's autograd (about 10% at the configs' shapes)."""
    names = [spec["name"] for spec in entry.parameters]
    return (entry.fused_form == "one_kernel_node" and names in (["weight"], ["weight", "bias"])
            and entry.statistic in (C.nn.NormStatistic.variance, C.nn.NormStatistic.root_mean_square))


class Norm(torch.nn.Module):
    """The base of every registry norm class: the entry's norm over the last dim on normlab's kernels."""

    _entry = None          # the registry entry (normlab._normlab.nn.NormType), set on each generated class
    _kernel_pair = False   # whether it runs the norm kernel pair directly (_runs_the_kernel_pair)

    def _holder(self, child):
        """The module that holds a parameter of the entry's child `child` ("": this one)."""
        return self if not child else getattr(self, child)

    def _parameter(self, spec):
        return getattr(self._holder(spec["child"]), spec["name"].rpartition(".")[2])

    def forward(self, input):
        """The norm of input over its last dim (which must be normalized_shape)."""
        _last_dim(input, self.normalized_shape)
        entry, d = self._entry, self.normalized_shape[0]
        eps = _machine_eps(input.dtype) if self.eps is None else self.eps
        params = [self._parameter(spec) for spec in entry.parameters]
        if self._kernel_pair:
            stat_count = C.kernels.partial_stat_count(d, self.p) if entry.partial_row else -1
            return _NormFunction.apply(input, params[0], params[1] if len(params) > 1 else None, eps,
                                       entry.statistic == C.nn.NormStatistic.variance, stat_count)
        # The options kept as attributes (elementwise_affine, p, alpha; a bias option is the bias's presence).
        options = {name: getattr(self, name) for name in entry.option_names if name in vars(self)}
        return _RegistryNormFunction.apply(entry.name, dict(options, dim=d, eps=eps), input, *params)

    def extra_repr(self):
        """PyTorch's form: "(8,), eps=1e-05, elementwise_affine=True, bias=True", then p and alpha where the
        norm reads them; bias says whether there is one."""
        text = f"{self.normalized_shape}, eps={self.eps}"
        for name in self._entry.option_names:
            if name not in vars(self):  # an option that names the parameter (LayerNorm's bias): its presence
                value = getattr(self, name) is not None
            elif name == "bias":  # PyTorch prints whether there is a bias
                value = vars(self)[name] and self.elementwise_affine
            else:
                value = vars(self)[name]
            text += f", {name}={value}"
        return text


def _torch_norm_class(entry):
    """The torch.nn.Module class of one registry entry, with PyTorch's signature."""
    P = inspect.Parameter
    eps = None if entry.class_name in _PYTORCH_EPS_NONE else entry.default_eps
    signature = _signature(entry, eps, [P("device", P.POSITIONAL_OR_KEYWORD, default=None),
                                        P("dtype", P.POSITIONAL_OR_KEYWORD, default=None)])

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        torch.nn.Module.__init__(self)
        options = _options_from_arguments(entry, a)
        options.dtype = C.float64  # the initial values exactly; converted to dtype below
        self.normalized_shape = (options.dim,)
        self.eps = a["eps"]
        # The C++ module gives the parameters it has with these options, their initial values, and
        # normlab.Error for a bad option (p outside (0, 1], ...).
        values = dict(C.nn.make_norm(options).named_parameters())
        parameter_names = {spec["name"] for spec in entry.parameters}
        for name in entry.option_names:
            if name not in parameter_names:  # nn.LayerNorm keeps no bias flag: its bias is the parameter
                setattr(self, name, a[name])
        factory = {"device": a["device"], "dtype": a["dtype"] or torch.get_default_dtype()}
        for spec in entry.parameters:
            if spec["child"] and spec["child"] not in self._modules:
                self.add_module(spec["child"], _Part())
            value = values.get(spec["name"])
            if value is not None:
                value = torch.nn.Parameter(torch.from_dlpack(value.detach()).to(**factory, copy=True))
            self._holder(spec["child"]).register_parameter(spec["name"].rpartition(".")[2], value)

    __init__.__signature__ = signature
    doc = (f"{entry.class_name} (registry type '{entry.name}') for PyTorch: {entry.formula}. {entry.reference}. "
           f"Runs {entry.fused_help}.")
    return type(entry.class_name, (Norm,), {"__init__": __init__, "__doc__": doc, "__module__": "normlab.torch",
                                            "__qualname__": entry.class_name, "_entry": entry,
                                            "_kernel_pair": _runs_the_kernel_pair(entry)})


_CLASSES = {entry.class_name: _torch_norm_class(entry) for entry in C.nn.norm_registry()}
globals().update(_CLASSES)
__all__ += ["Norm"] + list(_CLASSES)


def norm_class(type):
    """The torch.nn.Module class of the registry type named `type`; normlab.Error naming the choices otherwise."""
    return _CLASSES[C.nn.find_norm_type(type).class_name]


class _SwigluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        _check_cpu(a, b)
        ctx.save_for_backward(a, b)
        return _torch(C.kernels.swiglu_forward(_nl(a), _nl(b)))

    @staticmethod
    def backward(ctx, dout):
        a, b = ctx.saved_tensors
        da, db = C.kernels.swiglu_backward(_nl(dout), _nl(a), _nl(b))
        return _torch(da), _torch(db)


def swiglu(a, b):
    """SwiGLU's gate, F.silu(a) * b, forward and backward each in one pass."""
    return _SwigluFunction.apply(a, b)


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        _check_cpu(q, k, v)
        out, lse = C.kernels.attention_forward(_nl(q), _nl(k), _nl(v))
        out_t, lse_t = _torch(out), _torch(lse)
        ctx.save_for_backward(q, k, v, out_t, lse_t)
        return out_t

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = C.kernels.attention_backward(_nl(dout), _nl(q), _nl(k), _nl(v), _nl(out), _nl(lse))
        return _torch(dq), _torch(dk), _torch(dv)


def causal_attention(q, k, v):
    """Causal scaled dot-product attention on normlab's FlashAttention-style CPU kernels. q (B, T, H, hd),
    k and v (B, L, KV, hd), KV dividing H; the same as F.scaled_dot_product_attention(q.transpose(1, 2),
    ..., is_causal=True).transpose(1, 2) for L == T (with the key/value heads repeated for H / KV)."""
    return _AttentionFunction.apply(q, k, v)
