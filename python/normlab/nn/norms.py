"""Every norm of normlab's registry (layers/norm_registry.h) as a Module class named by its class name
(LayerNorm, RMSNorm, RMSNormWithBias, PRMSNorm, AdaptiveRMSNorm, HybridNorm, ScaleNorm, DyT, ...),
generated from the registry when the package is imported, so a norm added to the registry in C++
is a class here without a line of Python.

Each class builds the C++ norm (make_norm) and is its Python face: its parameters are the C++
module's Vars. The signature comes from the entry: ``(normalized_shape, eps=<the entry's default>,
<the options the entry reads>, *, fused=True, dtype=None)``, the options being those the registry
says the entry reads (``entry.option_names``: elementwise_affine, bias, p, alpha, alpha_init), each defaulting
to C++ NormOptions' default. ``fused`` picks the fused kernel form or the composed autograd ops.
LayerNorm's signature is PyTorch's; RMSNorm is written out below with PyTorch's (eps=None: the
input dtype's machine epsilon, as torch.nn.RMSNorm).
"""
import inspect

from .. import _normlab as C
from .._normlab import Error
from .functional import _MACHINE_EPS
from .module import Module, _CXX_CLASSES, _dtype

__all__ = ["Norm", "make_norm", "norm_types", "norm_registry", "norm_class"]

_DEFAULTS = C.nn.NormOptions()  # the C++ defaults of the options, which the signatures take


def _machine_eps(dtype):
    """RMSNorm's eps=None for a module or input of `dtype` (None: float32), as PyTorch's."""
    return _MACHINE_EPS[_dtype(dtype) or C.float32]


def _features(normalized_shape, what):
    """normalized_shape (an int or a 1-sequence) as the number of features."""
    if isinstance(normalized_shape, int):
        return normalized_shape
    shape = tuple(normalized_shape)
    if len(shape) != 1:
        raise Error(f"{what}: normlab's norms normalize over the last dim, so normalized_shape is an int or has "
                    f"one entry; found {shape}")
    return int(shape[0])


def _signature(entry, eps, tail):
    """A norm class's signature (normlab.nn's and normlab.torch's): (self, normalized_shape, eps=eps, <the
    options the entry reads, each defaulting to C++ NormOptions' default>), then the parameters `tail`."""
    P = inspect.Parameter
    return inspect.Signature(
        [P("self", P.POSITIONAL_OR_KEYWORD), P("normalized_shape", P.POSITIONAL_OR_KEYWORD),
         P("eps", P.POSITIONAL_OR_KEYWORD, default=eps)]
        + [P(name, P.POSITIONAL_OR_KEYWORD, default=getattr(_DEFAULTS, name)) for name in entry.option_names]
        + list(tail))


def _options_from_arguments(entry, arguments):
    """The NormOptions of a norm class's bound arguments: the entry's type, dim, eps and the options it reads."""
    o = C.nn.NormOptions()
    o.type = entry.name
    o.dim = _features(arguments["normalized_shape"], entry.class_name)
    o.eps = arguments["eps"]
    for name in entry.option_names:
        setattr(o, name, arguments[name])
    return o


class Norm(Module):
    """The base of every norm class: a C++ norm over the last dim, in its fused form (a kernel) or
    composed from autograd ops (``fused``, settable). Its parameters are the C++ module's."""

    _entry = None    # the registry entry (normlab._normlab.nn.NormType), set on each generated class
    _options = ()    # the options the class reads beyond eps, set on each generated class

    def _adopt(self, cxx):
        super()._adopt(cxx)
        # An absent parameter (elementwise_affine=False, bias=False) reads as None, as in PyTorch.
        for p in self._entry.parameters:
            if p["child"] == "" and p["name"] not in self._parameters:
                self._parameters[p["name"]] = None
        self.__dict__["_cxx_names"] = self._cxx_names | frozenset(self._parameters)

    def forward(self, input):
        """The norm of input over its last dim (which must be the norm's dim)."""
        return self._cxx.forward(input)

    @property
    def normalized_shape(self):
        """(dim,): the last dim, normalized over."""
        return (self._cxx.dim,)

    @property
    def eps(self):
        """The eps added to the statistic."""
        return self._cxx.eps

    @property
    def elementwise_affine(self):
        """Whether the norm has its learnable weight (and bias)."""
        return self._cxx.options.elementwise_affine

    @property
    def fused(self):
        """True: the fused kernel form; False: composed from autograd ops (twice differentiable)."""
        return self._cxx.fused

    @fused.setter
    def fused(self, value):
        self._cxx.fused = bool(value)

    @property
    def norm_type(self):
        """The registry name: "layernorm", "rmsnorm", ..."""
        return self._entry.name

    def extra_repr(self):
        """PyTorch's form for its norms, then the options the norm reads, and fused=False when composed."""
        # PyTorch's form for its norms ("(8,), eps=1e-05, elementwise_affine=True, bias=True", bias
        # saying whether there is a bias), then p and alpha where the norm reads them.
        options = self._cxx.options
        text = f"{self.normalized_shape}, eps={self.eps}"
        for name in self._options:
            value = getattr(options, name)
            text += f", {name}={value and options.elementwise_affine if name == 'bias' else value}"
        if not self.fused:
            text += ", fused=False"
        return text


def _norm_class(entry):
    """The Module class of one registry entry, with its signature."""
    P = inspect.Parameter
    signature = _signature(entry, entry.default_eps, [P("fused", P.KEYWORD_ONLY, default=_DEFAULTS.fused),
                                                      P("dtype", P.KEYWORD_ONLY, default=None)])

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        o = _options_from_arguments(entry, a)
        o.fused = bool(a["fused"])
        if a["dtype"] is not None:
            o.dtype = _dtype(a["dtype"])
        self._adopt(C.nn.make_norm(o))

    __init__.__signature__ = signature
    doc = (f"{entry.class_name} (registry type '{entry.name}'): {entry.formula}. {entry.reference}. "
           f"fused=True runs {entry.fused_help}; fused=False composes it from autograd ops.")
    return type(entry.class_name, (Norm,), {
        "__init__": __init__, "__doc__": doc, "__module__": "normlab.nn", "__qualname__": entry.class_name,
        "_entry": entry, "_options": tuple(entry.option_names)})


_CLASSES = {entry.class_name: _norm_class(entry) for entry in C.nn.norm_registry()}


class RMSNorm(_CLASSES["RMSNorm"]):
    """torch.nn.RMSNorm over the last dim, LLaMA's form: y = x / sqrt(mean(x^2) + eps) * weight, the
    statistic in f32 for half inputs. eps=None (PyTorch's default) is the machine epsilon of the dtype
    the statistic is computed in (float64's for float64 inputs, else float32's), as PyTorch takes it,
    at each call; make_norm("rmsnorm", d) uses the registry's 1e-5."""

    _eps_none = False  # eps=None: the computing dtype's machine epsilon (a C++ norm's face has its own eps)

    def __init__(self, normalized_shape, eps=None, elementwise_affine=_DEFAULTS.elementwise_affine, *,
                 fused=_DEFAULTS.fused, dtype=None):
        super().__init__(normalized_shape, _machine_eps(dtype) if eps is None else eps, elementwise_affine,
                         fused=fused, dtype=dtype)
        self.__dict__["_eps_none"] = eps is None

    @property
    def eps(self):
        """The eps added to the mean square; None: the computing dtype's machine epsilon."""
        return None if self._eps_none else self._cxx.eps

    def forward(self, input):
        """The norm of input over its last dim."""
        if not self._eps_none or _machine_eps(input.dtype) == self._cxx.eps:
            return self._cxx.forward(input)
        # Another dtype than the one the C++ norm was built for (after to(), or a float64 input): the
        # same C++ function with that dtype's epsilon, as PyTorch takes it per call.
        if input.ndim >= 1 and input.shape[-1] != self._cxx.dim:
            raise Error(f"RMSNorm: expected input (..., {self._cxx.dim}), found {list(input.shape)}")
        return C.nn.rms_norm(input, self.weight, None, _machine_eps(input.dtype), self.fused)


_CLASSES["RMSNorm"] = RMSNorm
_CXX_CLASSES.update(_CLASSES)  # a C++ norm's type_name is its registry class name
globals().update(_CLASSES)
__all__ += list(_CLASSES)


def norm_types():
    """The registry's norm names, in its order: "layernorm", "rmsnorm", ..."""
    return list(C.nn.norm_types())


def norm_registry():
    """The registry's entries (name, class_name, default_eps, statistic, option_names, parameters, formula, ...)."""
    return list(C.nn.norm_registry())


def norm_class(type):
    """The Module class of the registry type named `type`; normlab.Error naming the choices otherwise."""
    return _CLASSES[C.nn.find_norm_type(type).class_name]


def make_norm(type, dim, **options):
    """The norm of the registry named `type` over `dim` features, with its options (eps, and those its
    class reads: elementwise_affine, bias, p, alpha; fused, dtype). eps defaults to the registry's (1e-5
    for every type, RMSNorm included); an option the type does not read is a normlab.Error."""
    entry = C.nn.find_norm_type(type)
    cls = _CLASSES[entry.class_name]
    accepted = ("eps",) + cls._options + ("fused", "dtype")
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise Error(f"make_norm: {entry.class_name} ('{type}') has no option {', '.join(unknown)} "
                    f"(its options: {', '.join(accepted)})")
    options.setdefault("eps", entry.default_eps)
    return cls(dim, **options)
