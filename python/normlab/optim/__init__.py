"""normlab's optimizers and learning-rate schedules (torch.optim's analogue).

SGD, Adam and AdamW are the C++ optimizers (optim/), with torch.optim's update rules, signatures and
defaults (AdamW's weight_decay 0.01). They hold one parameter group: ``param_groups[0]`` reads like
PyTorch's and its ``"lr"`` can be set (as can ``opt.lr``), which is what schedules do; the other
hyperparameters are fixed once the optimizer is made, because the C++ optimizer owns them. The
parameters are an iterable of tensors, of (name, tensor) pairs (``module.named_parameters()``: the
state is then keyed by PyTorch's names), or one param-group dict. ``lr_scheduler`` has the
schedules of optim/schedule.h.
"""
from collections.abc import MutableMapping

from .. import _normlab as C
from .._normlab import Error, Tensor
from ..autograd import enable_grad
from . import lr_scheduler  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]

# The defaults, as optim/sgd.h and optim/adam.h declare them.
_SGD = C.optim.SGDOptions()
_ADAM = C.optim.AdamOptions()
_ADAMW = C.optim.adamw_defaults()


def _named_params(params, what):
    """(name, tensor) pairs and the group's own options from what torch.optim takes: tensors (named "0",
    "1", ... as PyTorch numbers them), (name, tensor) pairs, or one {"params": ..., <options>} dict."""
    if isinstance(params, Tensor):
        raise TypeError(f"{what}: params should be an iterable of Tensors or dicts, found a Tensor")
    items = list(params)
    group = {}
    if items and all(isinstance(item, dict) for item in items):
        if len(items) != 1:
            raise Error(f"{what}: normlab's optimizers hold one parameter group, found {len(items)}")
        group = dict(items[0])
        if "params" not in group:
            raise Error(f"{what}: the parameter group has no 'params' entry")
        group_params = group.pop("params")
        items = [group_params] if isinstance(group_params, Tensor) else list(group_params)
    if not items:
        raise Error(f"{what}: got an empty parameter list")
    named = []
    for i, item in enumerate(items):
        if isinstance(item, Tensor):
            named.append((str(i), item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Tensor):
            named.append(item)
        else:
            raise TypeError(f"{what}: expected Tensors or (name, Tensor) pairs, found {type(item).__name__}")
    return named, group


class _ParamGroup(MutableMapping):
    """The one parameter group, read like PyTorch's dict: "params", "lr" (settable: the C++ optimizer's
    learning rate) and the other options (fixed; keys of one's own, as "initial_lr", may be added)."""

    def __init__(self, optimizer, params, options):
        self._optimizer = optimizer
        self._params = params
        self._options = options  # the hyperparameters other than lr, as torch.optim names them
        self._extra = {}

    def __getitem__(self, key):
        if key == "lr":
            return self._optimizer._cxx.lr
        if key == "params":
            return self._params
        if key in self._options:
            return self._options[key]
        return self._extra[key]

    def __setitem__(self, key, value):
        if key == "lr":
            self._optimizer._cxx.lr = float(value)
        elif key == "params" or key in self._options:
            if key != "params" and value == self._options[key]:
                return
            raise Error(f"{type(self._optimizer).__name__}: only 'lr' can change once the optimizer is made (the C++ "
                        f"optimizer keeps the rest); found a new '{key}'")
        else:
            self._extra[key] = value

    def __delitem__(self, key):
        if key in ("lr", "params") or key in self._options:
            raise Error(f"{type(self._optimizer).__name__}: the parameter group's '{key}' cannot be removed")
        del self._extra[key]

    def __iter__(self):
        yield "params"
        yield "lr"
        yield from self._options
        yield from self._extra

    def __len__(self):
        return 2 + len(self._options) + len(self._extra)

    def __repr__(self):
        return repr(dict(self))


class Optimizer:
    """The base of normlab's optimizers: a C++ optimizer (``_cxx``) over named parameters, with
    torch.optim's step, zero_grad, param_groups, state_dict and load_state_dict."""

    def __init__(self, params, defaults):
        what = type(self).__name__
        named, group = _named_params(params, what)
        unknown = sorted(set(group) - set(defaults))
        if unknown:
            raise Error(f"{what}: unknown option(s) {', '.join(unknown)} in the parameter group "
                        f"(options: {', '.join(defaults)})")
        options = {**defaults, **group}
        self.defaults = dict(defaults)
        self._cxx = self._make(named, options)
        options.pop("lr")
        self._names = [name for name, _ in self._cxx.named_parameters()]
        # The caller's tensor objects, each once (the C++ optimizer keeps a tensor given twice once).
        unique = {}
        for _, p in named:
            unique.setdefault(hash(p), p)
        self.param_groups = [_ParamGroup(self, list(unique.values()), options)]

    def _make(self, named, options):
        raise NotImplementedError

    def _group_from_hyper(self, hyper):
        """torch.optim's group options from the C++ hyperparameters."""
        raise NotImplementedError

    def _hyper_from_group(self, group):
        """The C++ hyperparameters from torch.optim's group options (lr included)."""
        raise NotImplementedError

    @property
    def lr(self):
        """The learning rate the next step uses (settable; the same as param_groups[0]["lr"])."""
        return self._cxx.lr

    @lr.setter
    def lr(self, value):
        self._cxx.lr = float(value)

    def step(self, closure=None):
        """One update of every parameter that has a .grad (the others are skipped, their state untouched, as
        PyTorch does). closure: a function that recomputes the loss (and its gradients), called first
        with grad mode on; its loss is returned."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._cxx.step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Clears the parameters' .grad: None (PyTorch's default), or zeros in place with set_to_none=False."""
        if set_to_none:
            self._cxx.zero_grad()
            return
        for p in self.param_groups[0]["params"]:
            if p.grad is not None:
                p.grad.zero_()

    def state_dict(self):
        """The state for an exact resume, in torch.optim's shape: {"state": {param name: {buffer: tensor}},
        "param_groups": [{options..., "params": [names]}]}, plus "type" and "step" (the step() count). The
        tensors are copies. The parameters are named by name (module.named_parameters()) or by position
        ("0", "1", ...), where PyTorch numbers them."""
        s = self._cxx.state_dict()
        state = {}
        for key, tensor in s["tensors"]:
            name, buffer = key.rsplit(".", 1)
            state.setdefault(name, {})[buffer] = tensor
        group = {"lr": s["hyper"]["lr"], **self._group_from_hyper(s["hyper"]), "params": list(self._names)}
        return {"state": state, "param_groups": [group], "type": s["type"], "step": s["step"]}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() (this optimizer's type; PyTorch's state dicts load too, their integer
        keys read as the positions "0", "1", ...). A buffer of an unknown parameter, an unknown buffer, or
        a shape or dtype mismatch is a normlab.Error naming the key, and leaves the optimizer as it was."""
        from ..nn.module import _as_tensor
        what, kind = f"{type(self).__name__}.load_state_dict", state_dict.get("type", self._cxx.type_name)
        if kind != self._cxx.type_name:
            raise Error(f"{what}: the state is from a {kind} optimizer, expected {self._cxx.type_name}")
        groups = state_dict.get("param_groups", [])
        if len(groups) != 1:
            raise Error(f"{what}: expected one parameter group, found {len(groups)}")
        try:
            hyper = self._hyper_from_group(groups[0])
        except KeyError as missing:
            raise Error(f"{what}: the parameter group has no {missing} (not a {type(self).__name__}'s state)") from None
        tensors = []
        for name, buffers in state_dict.get("state", {}).items():
            for buffer, value in buffers.items():
                key = f"{name}.{buffer}"
                tensors.append((key, _as_tensor(value, key)))
        self._cxx.load_state_dict({"type": state_dict.get("type", self._cxx.type_name),
                                   "step": int(state_dict.get("step", self._cxx.step_count)),
                                   "hyper": hyper, "tensors": tensors})
        self.param_groups[0]._options.update(self._group_from_hyper(self._cxx.state_dict()["hyper"]))

    def __repr__(self):
        lines = [f"{type(self).__name__} (", "Parameter Group 0"]
        group = self.param_groups[0]
        lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines + [")"])


class SGD(Optimizer):
    """torch.optim.SGD: with weight decay g += wd * p; with momentum b = momentum * b + (1 - dampening) * g
    (b = g on the first step), g = b, or g + momentum * b with nesterov; p -= lr * g."""

    def __init__(self, params, lr=_SGD.lr, momentum=_SGD.momentum, dampening=_SGD.dampening,
                 weight_decay=_SGD.weight_decay, nesterov=_SGD.nesterov):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def _make(self, named, o):
        return C.optim.SGD(named, float(o["lr"]), float(o["momentum"]), float(o["dampening"]),
                           float(o["weight_decay"]), bool(o["nesterov"]))

    def _group_from_hyper(self, h):
        return {"momentum": h["momentum"], "dampening": h["dampening"], "weight_decay": h["weight_decay"],
                "nesterov": bool(h["nesterov"])}

    def _hyper_from_group(self, g):
        return {"lr": float(g["lr"]), "momentum": float(g["momentum"]), "dampening": float(g["dampening"]),
                "weight_decay": float(g["weight_decay"]), "nesterov": float(bool(g["nesterov"]))}


def _betas(what, betas):
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise Error(f"{what}: betas must be a pair (beta1, beta2), found {betas!r}") from None
    return float(beta1), float(beta2)


class Adam(Optimizer):
    """torch.optim.Adam: g += wd * p (L2), m and v the moving averages of g and g^2 (v's running maximum
    with amsgrad), p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t each parameter's own
    step count."""

    _decoupled = False

    def __init__(self, params, lr=_ADAM.lr, betas=(_ADAM.beta1, _ADAM.beta2), eps=_ADAM.eps,
                 weight_decay=_ADAM.weight_decay, amsgrad=_ADAM.amsgrad):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _make(self, named, o):
        beta1, beta2 = _betas(type(self).__name__, o["betas"])
        make = C.optim.AdamW if self._decoupled else C.optim.Adam
        return make(named, float(o["lr"]), beta1, beta2, float(o["eps"]), float(o["weight_decay"]), bool(o["amsgrad"]))

    def _group_from_hyper(self, h):
        return {"betas": (h["beta1"], h["beta2"]), "eps": h["eps"], "weight_decay": h["weight_decay"],
                "amsgrad": bool(h["amsgrad"])}

    def _hyper_from_group(self, g):
        beta1, beta2 = _betas(type(self).__name__, g["betas"])
        return {"lr": float(g["lr"]), "beta1": beta1, "beta2": beta2, "eps": float(g["eps"]),
                "weight_decay": float(g["weight_decay"]), "amsgrad": float(bool(g["amsgrad"]))}


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, p *= 1 - lr * wd before the update (default
    weight_decay 0.01, as PyTorch's)."""

    _decoupled = True

    def __init__(self, params, lr=_ADAMW.lr, betas=(_ADAMW.beta1, _ADAMW.beta2), eps=_ADAMW.eps,
                 weight_decay=_ADAMW.weight_decay, amsgrad=_ADAMW.amsgrad):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)
