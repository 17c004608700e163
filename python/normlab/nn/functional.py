"""normlab.nn.functional: the layers as functions (torch.nn.functional's names), each the C++ function
the modules run (layers/, autograd/): linear, embedding, layer_norm, rms_norm, every registry norm
(registry_norm), cross_entropy, mse_loss, the activations, softmax, swiglu, causal attention and
dropout. Autograd records them as it does any op.
"""
from .. import _normlab as C
from .._normlab import Error, relu, silu, sigmoid, tanh  # noqa: F401  (the activations are Tensor ops)

__all__ = ["linear", "embedding", "layer_norm", "rms_norm", "registry_norm", "cross_entropy", "mse_loss", "relu",
           "silu", "gelu", "sigmoid", "tanh", "softmax", "log_softmax", "swiglu", "causal_attention",
           "scaled_dot_product_attention", "dropout"]

# F.rms_norm's eps=None: the machine epsilon of the dtype PyTorch computes the statistic in (float32 for
# half inputs).
_MACHINE_EPS = {C.float32: 2.0 ** -23, C.float64: 2.0 ** -52, C.float16: 2.0 ** -23, C.bfloat16: 2.0 ** -23}


def _check_last_dim(what, input, normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or tuple(input.shape[-1:]) != shape:
        raise Error(f"{what}: normlab normalizes over the last dim: expected normalized_shape "
                    f"({input.shape[-1] if input.ndim else '?'},) for an input {list(input.shape)}, found {shape}")


def _check_mean(what, reduction):
    if reduction != "mean":
        raise Error(f"{what}: normlab's MSE loss has reduction='mean' only, found '{reduction}'")


def linear(input, weight, bias=None):
    """F.linear: input (..., in) @ weight (out, in)^T + bias (out)."""
    return C.nn.linear(input, weight, bias)


def embedding(input, weight):
    """F.embedding: the rows of weight (num, dim) at the int64 ids `input` -> input.shape + (dim,)."""
    return C.nn.embedding(input, weight)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, fused=True):
    """F.layer_norm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias, var biased; fused: one
    kernel node (else autograd ops)."""
    _check_last_dim("layer_norm", input, normalized_shape)
    return C.nn.layer_norm(input, weight, bias, eps, fused)


def rms_norm(input, normalized_shape, weight=None, eps=None, *, bias=None, fused=True, stat_count=-1):
    """F.rms_norm over the last dim, LLaMA's form: x / sqrt(mean(x^2) + eps) * weight (+ bias: the
    article's RMSNormWithBias), eps None the computing dtype's machine epsilon (float32's for half inputs)
    as PyTorch; stat_count k takes the
    mean over the first k elements of each row (pRMSNorm)."""
    _check_last_dim("rms_norm", input, normalized_shape)
    if eps is None:
        eps = _MACHINE_EPS[input.dtype]
    return C.nn.rms_norm(input, weight, bias, eps, fused, stat_count)


def registry_norm(input, type, parameters=(), *, eps=None, fused=True, **options):
    """Any norm of the registry as a function: its entry's functional form, with `parameters` in the
    entry's order (normlab.nn.norm_registry(): each entry's parameters; None for an absent one), eps
    (None: the entry's default) and the options the entry reads (its option_names: p, alpha, ...; each
    unset one at NormOptions' default). elementwise_affine and bias are accepted and change nothing: the
    parameters given say which are present. An option the entry does not read is a normlab.Error."""
    entry = C.nn.find_norm_type(type)
    params = list(parameters)
    if len(params) != len(entry.parameters):
        names = ", ".join(q["name"] for q in entry.parameters)
        raise Error(f"registry_norm: {entry.class_name} takes {len(entry.parameters)} parameter(s) ({names}), "
                    f"found {len(params)}")
    unknown = sorted(set(options) - set(entry.option_names))
    if unknown:
        raise Error(f"registry_norm: {entry.class_name} ('{type}') reads no option {', '.join(unknown)} (its "
                    f"options: {', '.join(['eps', *entry.option_names])})")
    norm_options = C.nn.NormOptions()
    norm_options.type = entry.name
    norm_options.dim = input.shape[-1] if input.ndim else 0
    norm_options.eps = eps
    for name, value in options.items():
        setattr(norm_options, name, value)
    return entry.forward(input, params, norm_options, fused)


def cross_entropy(input, target, ignore_index=-100, reduction="mean", *, fused=True):
    """F.cross_entropy with the class dim last: logits (..., C), int64 targets (...) (PyTorch's layout for
    (N, C) logits); rows whose target is ignore_index count for nothing; reduction 'mean', 'sum' or
    'none'."""
    return C.nn.cross_entropy(input, target, ignore_index, reduction, fused)


def mse_loss(input, target, reduction="mean"):
    """F.mse_loss with reduction='mean': mean((input - target)^2), the shapes equal."""
    _check_mean("mse_loss", reduction)
    return C.nn.mse_loss(input, target)


def gelu(input, approximate="none"):
    """The exact (erf) GELU (approximate='none' only)."""
    if approximate != "none":
        raise Error(f"gelu: normlab has the exact (erf) GELU only, approximate='none'; found '{approximate}'")
    return C.gelu(input)


def softmax(input, dim):
    """softmax over `dim`."""
    return C.softmax(input, dim)


def log_softmax(input, dim):
    """log(softmax) over `dim`, computed stably."""
    return C.log_softmax(input, dim)


def swiglu(a, b, *, fused=True):
    """SwiGLU's gate, silu(a) * b (a, b one shape); fused: one kernel node."""
    return C.nn.swiglu(a, b, fused)


def causal_attention(q, k, v, *, fused=True):
    """Causal attention in normlab's layout: q (B, T, H, hd), k and v (B, L, KV, hd) with KV dividing H
    (query head h reads kv head h // (H / KV)), scores scaled by 1/sqrt(hd); fused: FlashAttention-style
    tiles (no (T, L) matrix saved)."""
    return C.nn.causal_attention(q, k, v, fused)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, fused=True):
    """F.scaled_dot_product_attention in PyTorch's layout (B, H, T, hd) for the causal case normlab has:
    is_causal=True, no mask, no dropout, the default scale (grouped-query key/value heads allowed)."""
    if not is_causal or attn_mask is not None or dropout_p != 0.0 or scale is not None:
        raise Error("scaled_dot_product_attention: normlab computes causal attention only: is_causal=True, "
                    "attn_mask=None, dropout_p=0 and the default scale")
    out = C.nn.causal_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), fused)
    return out.transpose(1, 2)


def dropout(input, p=0.5, training=True, *, generator=None):
    """Inverted dropout: in training each element is zeroed with probability p and the rest scaled by
    1 / (1 - p); the mask drawn from `generator` (None: the default generator)."""
    return C.nn.dropout(input, p, training, generator)
