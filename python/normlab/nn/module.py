"""nn.Module, the base users subclass as torch.nn.Module, and the containers ModuleList and Sequential.

A Module keeps its parameters, buffers and submodules in three ordered dicts, filled by attribute
assignment (``__setattr__``), so named_parameters() and state_dict() give PyTorch's dotted names in
PyTorch's order: a module's own parameters, then (state_dict) its buffers, then each child's.

A C++-backed module (Linear, the norms, the transformer, ...) is a Module that also holds the C++
module (``_cxx``, a normlab._normlab.nn.Module). Its parameters are the C++ module's own Vars as
Parameters (Parameter._of: the same tensors, no copies), under the C++ names, and its children are
Python faces of the C++ children, built the same way (``_wrap``). So a Python tree that mixes
Python modules and C++ ones has one set of names and one set of tensors: the C++ forward reads what
an optimizer or load_state_dict writes. What belongs to the C++ module (its parameter and child
names) cannot be reassigned from Python, since the C++ forward would not see it; anything a Python
subclass adds on top is an ordinary Python parameter, buffer or child.
"""
from collections import OrderedDict, namedtuple

from .. import _normlab as C
from .._normlab import Error, Tensor
from ..autograd import no_grad
from .parameter import Parameter

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
IncompatibleKeys.__doc__ = "What a non-strict load_state_dict found: the missing and the unexpected keys."

# The Python class that faces each C++ module type (by its type_name), filled by the layer modules.
_CXX_CLASSES = {}


def _cxx_class(type_name):
    """Class decorator: the Python face of C++ modules whose type_name is `type_name`."""
    def register(cls):
        _CXX_CLASSES[type_name] = cls
        return cls
    return register


def _wrap(cxx):
    """The Python face of a C++ module (its registered class, or CxxModule), without calling __init__."""
    cls = _CXX_CLASSES.get(cxx.type_name, CxxModule)
    module = cls.__new__(cls)
    module._adopt(cxx)
    return module


def _join(prefix, name):
    """'a.b' for non-empty parts; an empty part adds nothing (a C++ module's transparent child)."""
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _python_bools(text):
    """A C++ extra_repr's ``=true`` / ``=false`` as Python prints them."""
    return text.replace("=true", "=True").replace("=false", "=False")


def _dtype(value):
    """A dtype argument as a normlab.dtype: a normlab.dtype, its name ("float64"), a config's name ("f64"),
    or None (kept None: the default)."""
    return None if value is None else C._parse_dtype(value)


def _described(t):
    return f"{list(t.shape)} {t.dtype.name}"


def _as_tensor(value, name):
    """A state-dict value as a normlab tensor: a Tensor as is; anything with DLPack (a PyTorch tensor) or a
    NumPy array on its memory."""
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        detach = getattr(value, "detach", None)
        return C.from_dlpack(detach() if detach is not None else value)
    if hasattr(value, "__array_interface__"):
        return C.from_numpy(value)
    raise Error(f"load_state_dict: '{name}' holds a {type(value).__name__}, expected a normlab.Tensor")


def _addindent(text, spaces):
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


class Module:
    """The base class of every layer (torch.nn.Module): subclass it, assign Parameters, buffers and
    submodules as attributes in ``__init__`` (after ``super().__init__()``) and write ``forward``;
    calling the module calls forward."""

    _cxx = None  # the C++ module behind a C++-backed module; None for a Python one
    _cxx_names = frozenset()  # its parameter and child names, which Python cannot reassign

    def __init__(self):
        d = self.__dict__
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent_buffers"] = set()
        d["_modules"] = OrderedDict()
        d["training"] = True

    def _adopt(self, cxx):
        """Makes this module the face of the C++ module `cxx`: its own parameters (the same tensors) and
        a face for each child. Called first by a C++-backed class's __init__, and by _wrap."""
        Module.__init__(self)
        d = self.__dict__
        d["_cxx"] = cxx
        d["training"] = cxx.training
        for name, var in cxx.named_parameters(recurse=False):
            self._parameters[name] = Parameter._of(var)
        for name, child in cxx.named_children():
            self._modules[name] = _wrap(child)
        d["_cxx_names"] = frozenset(self._parameters) | frozenset(self._modules)

    # ---- calling ----

    def forward(self, *args, **kwargs):
        """What the module computes; subclasses define it."""
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- registration ----

    def _check_init(self, what):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")

    def _check_own(self, name):
        """A C++ module's parameter or child cannot be replaced: its C++ forward reads its own."""
        if name in self._cxx_names:
            raise Error(f"{type(self).__name__}.{name} belongs to the C++ {self._cxx.type_name} module, whose "
                        f"forward reads its own; change its values in place instead (with normlab.no_grad(): "
                        f"module.{name}.copy_(value)) or with load_state_dict")

    def _check_name(self, name, what, store):
        if not isinstance(name, str):
            raise TypeError(f"{what} name should be a string, found {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f"{what} name can't be empty or contain \".\", found '{name}'")
        if hasattr(self, name) and name not in store:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name, param):
        """Adds a parameter (a Parameter, or None for an absent one) under `name`."""
        self._check_init("parameters")
        self._check_name(name, "parameter", self._parameters)
        self._check_own(name)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            f"(normlab.nn.Parameter or None required)")
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Adds a buffer: state saved in state_dict (unless persistent is False) but not trained."""
        self._check_init("buffers")
        self._check_name(name, "buffer", self._buffers)
        self._check_own(name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            f"(normlab.Tensor or None required)")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name, module):
        """Adds a child module (or None) under `name`."""
        self._check_init("module")
        self._check_name(name, "module", self._modules)
        self._check_own(name)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        d = self.__dict__
        params, buffers, modules = d.get("_parameters"), d.get("_buffers"), d.get("_modules")
        if isinstance(value, Parameter):
            self._check_init("parameters")
            self._check_own(name)
            d.pop(name, None)
            buffers.pop(name, None)
            modules.pop(name, None)
            params[name] = value
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                f"(normlab.nn.Parameter or None expected)")
            self._check_own(name)
            params[name] = None
        elif isinstance(value, Module):
            self._check_init("module")
            self._check_own(name)
            d.pop(name, None)
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                f"(normlab.nn.Module or None expected)")
            self._check_own(name)
            modules[name] = None
        elif buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(normlab.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only called when ordinary lookup fails: the registered parameters, buffers and modules.
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        cxx = d.get("_cxx")
        if cxx is not None:
            for buffer_name, buffer in cxx.named_buffers(recurse=False):
                if buffer_name == name:
                    return buffer
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__.get(store, ()):
                self._check_own(name)
                del self.__dict__[store][name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    # ---- access ----

    def _own_buffers(self):
        """(name, tensor) of this module's own buffers: a C++ module's, read live (its to() replaces the
        tensors), then those Python registered."""
        items = list(self._cxx.named_buffers(recurse=False)) if self._cxx is not None else []
        items.extend((name, b) for name, b in self._buffers.items() if b is not None)
        return items

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """This module (name prefix) and every descendant with its dotted name, depth first (PyTorch's order)."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, _join(prefix, name), remove_duplicate)

    def modules(self):
        """This module and every descendant, depth first."""
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        """(name, module) of the direct children, in registration order."""
        for name, module in self._modules.items():
            if module is not None:
                yield name, module

    def children(self):
        """The direct children, in registration order."""
        for _, module in self.named_children():
            yield module

    def _named_members(self, members, prefix, recurse, remove_duplicate):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, tensor in members(module):
                if tensor is None:
                    continue
                if remove_duplicate:
                    key = hash(tensor)  # the VarImpl: one tensor under two names counts once, as in PyTorch
                    if key in seen:
                        continue
                    seen.add(key)
                yield _join(module_prefix, name), tensor

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Parameter) over this module and its descendants, in PyTorch's order (each module's
        own, depth first); a parameter shared by two modules comes once, under its first name."""
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        """Every parameter (for an optimizer), in named_parameters()'s order."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Tensor) of the buffers, in PyTorch's order."""
        yield from self._named_members(lambda m: m._own_buffers(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        """Every buffer."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        """The descendant at dotted path `target` ("" is this module)."""
        module = self
        for part in target.split(".") if target else []:
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule '{part}' (in '{target}')")
            module = child
        return module

    # ---- state ----

    def _state_items(self, prefix, keep_vars, out):
        for name, p in self._parameters.items():
            if p is not None:
                out[_join(prefix, name)] = p if keep_vars else p.detach()
        for name, b in self._own_buffers():
            if name not in self._non_persistent_buffers:
                out[_join(prefix, name)] = b if keep_vars else b.detach()
        for name, module in self._modules.items():
            if module is not None:
                module._state_items(_join(prefix, name), keep_vars, out)
        return out

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """An OrderedDict of dotted name -> tensor over the parameters and persistent buffers, in PyTorch's
        order. The tensors are the live ones (detached views on the same memory; the Parameters
        themselves with keep_vars), not copies: clone them to keep a snapshot."""
        items = self._state_items("", keep_vars, OrderedDict())
        out = OrderedDict() if destination is None else destination
        for name, tensor in items.items():
            out[prefix + name] = tensor
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Copies each value into the parameter or buffer of its name, in place under no_grad (so an
        optimizer holding them sees the new values), converted to that tensor's dtype as PyTorch does
        (a float64 state loads into a float32 module, which stays float32). strict: every missing and
        every unexpected key is a normlab.Error naming them all; a shape mismatch always is. Nothing is
        copied when anything is wrong. Values may be normlab tensors, PyTorch tensors or NumPy arrays.
        Returns (missing_keys, unexpected_keys)."""
        own = self._state_items("", True, OrderedDict())
        given = OrderedDict((name, value) for name, value in state_dict.items())
        missing = [name for name in own if name not in given]
        unexpected = [name for name in given if name not in own]
        problems = []
        if strict and missing:
            problems.append("missing key(s) " + ", ".join(f"'{n}' ({_described(own[n])})" for n in missing))
        if strict and unexpected:
            problems.append("unexpected key(s) " + ", ".join(f"'{n}'" for n in unexpected))
        sources = {}
        for name, dst in own.items():
            if name not in given:
                continue
            src = sources[name] = _as_tensor(given[name], name)
            if src.shape != dst.shape:
                problems.append(f"shape mismatch for '{name}': the module has {_described(dst)}, the state has "
                                f"{_described(src)}")
        if problems:
            raise Error(f"load_state_dict: {'; '.join(problems)} for {type(self).__name__}")
        with no_grad():
            for name, src in sources.items():
                own[name].copy_(src)  # copy_ converts to the destination's dtype
        return IncompatibleKeys(missing, unexpected)

    # ---- mode, gradients, dtype ----

    def train(self, mode=True):
        """Sets training mode (or evaluation mode, mode=False) here and in every descendant; returns self."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.__dict__["training"] = mode
        if self._cxx is not None:
            self._cxx.train(mode)
        for module in self.children():
            module.train(mode)
        return self

    def eval(self):
        """Evaluation mode (train(False)); returns self."""
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        """Clears every parameter's .grad: None (PyTorch's default), or zeros in place with set_to_none=False."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def requires_grad_(self, requires_grad=True):
        """Sets requires_grad on every parameter; returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def _convert(self, dtype, cxx_done):
        if self._cxx is not None and not cxx_done:
            self._cxx.to(dtype)  # its parameters, buffers and C++ children, the Vars kept
            cxx_done = True
        for name, p in self._parameters.items():
            if p is not None and name not in self._cxx_names and p.dtype.is_floating_point:
                p.data = p.data.to(dtype)
        for name, b in self._buffers.items():
            if b is not None and b.dtype.is_floating_point:
                self._buffers[name] = b.to(dtype)
        for name, module in self._modules.items():
            if module is not None:
                module._convert(dtype, cxx_done and name in self._cxx_names)

    def to(self, dtype):
        """Converts the floating parameters and buffers (and their grads) to `dtype` (a normlab.dtype, its
        name "float64", or a config's "f64", "f32", "bf16", "f16") in place; the Parameters keep their
        identity, so an optimizer made before still holds them. Returns self."""
        dtype = _dtype(dtype)
        if not dtype.is_floating_point:
            raise Error(f"{type(self).__name__}.to: expected a floating dtype, found {dtype.name}")
        self._convert(dtype, False)
        for p in self.parameters():
            if p.grad is not None and p.grad.dtype != p.dtype:
                p.grad = p.grad.to(p.dtype)
        return self

    def float(self):
        """to(float32)."""
        return self.to(C.float32)

    def double(self):
        """to(float64)."""
        return self.to(C.float64)

    def half(self):
        """to(float16)."""
        return self.to(C.float16)

    def bfloat16(self):
        """to(bfloat16)."""
        return self.to(C.bfloat16)

    def apply(self, fn):
        """Calls fn on every descendant, then on this module (PyTorch's order); returns self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ---- printing ----

    def extra_repr(self):
        """What the print shows inside the parentheses (a C++ module's own description)."""
        return _python_bools(self._cxx.extra_repr()) if self._cxx is not None else ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _addindent(repr(module), 2) for name, module in self._modules.items()]
        lines = extra_lines + child_lines
        text = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


class CxxModule(Module):
    """The Python face of a C++ module without a class of its own here (its forward is the C++ one)."""

    def forward(self, *args):
        """The C++ module's forward."""
        return self._cxx.forward(*args)

    def _get_name(self):
        return self._cxx.type_name


class ModuleList(Module):
    """Holds modules in a list, named "0", "1", ... (torch.nn.ModuleList); a C++ model's list of layers
    is one, fixed at construction."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _check_growable(self):
        if self._cxx is not None:
            raise Error("this ModuleList belongs to a C++ module, which runs the modules it was built with")

    def _index(self, idx):
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range for a ModuleList of {n}")
        return str(idx % n)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[self._index(idx)]

    def __setitem__(self, idx, module):
        setattr(self, self._index(idx), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __repr__(self):
        # PyTorch's: a run of equal consecutive modules prints once, "(0-3): 4 x Block(...)".
        runs = []  # [first index, last index, repr]
        for i, module in enumerate(self._modules.values()):
            text = repr(module)
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        if not runs:
            return self._get_name() + "()"
        lines = [_addindent(f"({first}): {text}" if first == last else f"({first}-{last}): {last - first + 1} x {text}",
                            2) for first, last, text in runs]
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def append(self, module):
        """Adds a module at the end; returns self."""
        self._check_growable()
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        """Adds modules at the end; returns self."""
        for module in modules:
            self.append(module)
        return self


class Sequential(Module):
    """Runs its modules in order, each on the previous one's output (torch.nn.Sequential); children
    named "0", "1", ..., or by an OrderedDict's keys."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def __getitem__(self, idx):
        values = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        return values[idx]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        """Adds a module at the end; returns self."""
        if self._cxx is not None:
            raise Error("this Sequential belongs to a C++ module, which runs the modules it was built with")
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input):
        """Each module on the previous one's output."""
        for module in self._modules.values():
            input = module(input)
        return input


_CXX_CLASSES["ModuleList"] = ModuleList
_CXX_CLASSES["Sequential"] = Sequential
