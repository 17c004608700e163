"""Higher-order autograd as functions, as torch.autograd.functional: ``hvp``, the Hessian of a
scalar function times a vector, by double backward (autograd/functional.h)."""
from .. import _normlab as C


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """torch.autograd.functional.hvp: ``(func(*inputs), H v)`` for the Hessian H of func's single-element
    output at `inputs` (a tensor or a tuple of tensors; v likewise, each of its input's shape, and may be
    None only for single-element inputs: then v = 1). A tuple in gives a tuple of H v out, a tensor a
    tensor. Both results are detached unless create_graph, which records them so they can be
    differentiated again. An input func does not use, or in which it is linear, gets zeros, or with
    strict a normlab.Error naming the input. Unlike PyTorch, a leaf that requires grad (a module's
    parameter) reaches func as it is, so func may read a model's parameters directly: pass
    ``tuple(model.parameters())``."""
    single = isinstance(inputs, C.Tensor)
    ins = [inputs] if single else list(inputs)
    if v is None:
        vs = []
    else:
        vs = [v] if isinstance(v, C.Tensor) else list(v)
    output, products = C._hvp(func, ins, vs, create_graph, strict)
    return output, (products[0] if single else tuple(products))
