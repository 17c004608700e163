"""normlab.nn.utils: clip_grad_norm_ (torch.nn.utils.clip_grad_norm_), on optim/clip.h."""
from .. import _normlab as C
from .._normlab import Error, Tensor

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scales every gradient by min(1, max_norm / (total + 1e-6)), total the L2 norm of all the gradients
    together (summed in float64; parameters without a gradient skipped), as PyTorch's. Returns total,
    before clipping, as a 0-d tensor (float32, or the gradients' float64)."""
    if norm_type != 2.0:
        raise Error(f"clip_grad_norm_: normlab clips by the L2 norm only (norm_type=2), found norm_type={norm_type}")
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    total = C.optim.clip_grad_norm_(params, float(max_norm))
    grads = [p.grad for p in params if p.grad is not None]
    dtype = C.float64 if grads and grads[0].dtype == C.float64 else C.float32
    return C._full((), total, dtype)
