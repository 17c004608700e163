"""normlab's layers with PyTorch's names (torch.nn's analogue).

``Module`` is the base users subclass as torch.nn.Module (parameters, buffers and submodules by
attribute, named_parameters, state_dict, load_state_dict, train/eval, to); ``Parameter`` a Tensor
subclass. The layers are normlab's C++ modules behind Python Modules whose parameters are the C++
modules' own tensors: Linear, Embedding, the activations, Dropout, FeedForward (SwiGLU), Attention,
TransformerBlock, Transformer, and one class per norm of the C++ norm registry (LayerNorm, RMSNorm,
RMSNormWithBias, PRMSNorm, AdaptiveRMSNorm, HybridNorm, ScaleNorm, ...: ``norm_types()``,
``make_norm(type, dim, **options)``). ``functional`` has the same computations as functions,
``utils`` gradient clipping.
"""
from . import functional, utils  # noqa: F401
from .layers import *  # noqa: F401,F403
from .layers import __all__ as _layers
from .module import CxxModule, IncompatibleKeys, Module, ModuleList, Sequential  # noqa: F401
from .norms import *  # noqa: F401,F403
from .norms import __all__ as _norms
from .parameter import Parameter  # noqa: F401

__all__ = ["Module", "ModuleList", "Sequential", "Parameter", "CxxModule", "IncompatibleKeys", "functional",
           "utils"] + _layers + _norms
