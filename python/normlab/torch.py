"""normlab's fused CPU kernels for PyTorch: LayerNorm, RMSNorm and the article's variants, SwiGLU's
gate and causal attention as ``torch.autograd.Function``s and ``torch.nn.Module``s that run on
PyTorch CPU tensors, so a PyTorch model can use them in place of its own.

The tensors cross by DLPack, without a copy: the kernels read PyTorch's memory and PyTorch reads
the results in normlab's. Each norm's forward saves only x and its row statistics (mean and rstd
for LayerNorm, rstd for the RMS norms), and its backward is the closed form (core/backend.h has the
formulas). The gradients equal PyTorch's own within rounding (tests/python/test_torch.py).
"""
import torch

from . import _normlab as C

__all__ = ["LayerNorm", "RMSNorm", "RMSNormWithBias", "PRMSNorm", "AdaptiveRMSNorm", "HybridNorm",
           "layer_norm", "rms_norm", "swiglu", "causal_attention"]


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


class _NormFunction(torch.autograd.Function):
    """One fused norm node over normlab's forward/backward kernel pair."""

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
        eps = torch.finfo(torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype).eps
    return _NormFunction.apply(x, weight, bias, eps, False, stat_count)


class _Norm(torch.nn.Module):
    """The shared parameters of the norms: weight ones (and bias zeros), over the last dim."""

    def __init__(self, normalized_shape, eps, elementwise_affine, bias, device=None, dtype=None):
        super().__init__()
        dim = normalized_shape if isinstance(normalized_shape, int) else tuple(normalized_shape)[-1]
        self.normalized_shape = (dim,)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.ones(dim, **factory)) if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.zeros(dim, **factory)) if elementwise_affine and bias else None

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(_Norm):
    """torch.nn.LayerNorm over the last dim, on normlab's fused kernel pair."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(_Norm):
    """torch.nn.RMSNorm over the last dim, on normlab's fused kernel pair."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)


class RMSNormWithBias(_Norm):
    """The article's RMSNormWithBias: RMSNorm(x) * weight + bias, one fused kernel."""

    def __init__(self, normalized_shape, eps=1e-5, device=None, dtype=None):
        super().__init__(normalized_shape, eps, True, True, device, dtype)

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, bias=self.bias)


class PRMSNorm(_Norm):
    """Partial RMSNorm (Zhang & Sennrich 2019): the RMS of the first ceil(p * d) elements normalizes all d."""

    def __init__(self, normalized_shape, p=0.0625, eps=1e-5, device=None, dtype=None):
        super().__init__(normalized_shape, eps, True, False, device, dtype)
        self.p = p
        self.stat_count = C.kernels.partial_stat_count(self.normalized_shape[0], p)

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, stat_count=self.stat_count)


class AdaptiveRMSNorm(RMSNorm):
    """The article's AdaptiveRMSNorm: RMSNorm(x) * sigmoid(alpha * x.std(-1)), the RMSNorm fused and the
    per-row gate in PyTorch ops; alpha a learned [1] parameter initialized to 1."""

    def __init__(self, normalized_shape, eps=1e-5, device=None, dtype=None):
        super().__init__(normalized_shape, eps, True, device, dtype)
        self.alpha = torch.nn.Parameter(torch.ones(1, device=device, dtype=dtype))

    def forward(self, x):
        gate = torch.sigmoid(self.alpha * x.std(dim=-1, keepdim=True))
        return super().forward(x) * gate


class HybridNorm(torch.nn.Module):
    """The article's HybridNorm: alpha * RMSNorm(x) + (1 - alpha) * LayerNorm(x), alpha a fixed float."""

    def __init__(self, normalized_shape, alpha=0.5, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.alpha = alpha
        self.rms_norm = RMSNorm(normalized_shape, eps, True, device, dtype)
        self.layer_norm = LayerNorm(normalized_shape, eps, True, True, device, dtype)

    def forward(self, x):
        return self.alpha * self.rms_norm(x) + (1 - self.alpha) * self.layer_norm(x)


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
