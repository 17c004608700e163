"""nn.Parameter: a Tensor that a Module registers as a parameter when it is assigned as an attribute.

Parameter is a Python subclass of normlab.Tensor (the nanobind class of autograd's Var). nanobind
lets a Python subclass be built from an existing tensor through Tensor's ``__init__(tensor)``,
which makes the new object a handle on the same VarImpl: data, ``.grad`` and requires_grad are
shared, not copied. ``Parameter(t)`` uses it on ``t.detach()`` (a new leaf on t's memory, as
torch.nn.Parameter(t) shares t's storage but not its autograd state); a C++ module's parameters
are wrapped on their own VarImpl (``Parameter._of``), so the Python object and the C++ module's
Var are one tensor.
"""
from .. import _normlab as C
from .._normlab import Tensor


class Parameter(Tensor):
    """A tensor that is a module's parameter (torch.nn.Parameter): assigning one to a Module attribute
    registers it, so parameters(), state_dict() and the optimizers see it. It shares `data`'s memory
    and is a leaf that requires grad unless requires_grad is False."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = C._empty((0,), None)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: expected a normlab.Tensor, found {type(data).__name__}")
        super().__init__(data.detach())
        if requires_grad:
            self.requires_grad_(True)  # a normlab.Error for an int64 tensor, as PyTorch refuses it

    @classmethod
    def _of(cls, var):
        """The Parameter that IS `var` (same VarImpl): how a C++ module's Vars become Python parameters."""
        p = cls.__new__(cls)
        Tensor.__init__(p, var)
        return p

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)

    __str__ = __repr__
