"""The layers backed by normlab's C++ modules (layers/): Linear, Embedding, the activations and
Dropout, LLaMA's SwiGLU FeedForward, Attention, TransformerBlock and the Transformer, plus the loss
modules over the functional losses. Each builds its C++ module and is its Python face (Module._adopt):
its parameters are the C++ module's Vars, under the C++ names (the transformer's are Meta LLaMA's).

The transformer's parts take their C++ option structs' fields as keyword arguments (an unknown one
is a normlab.Error naming the fields), so a field added in C++ is an argument here; the norm of a
block or model is ``norm=`` (a type name, a dict of NormOptions fields, or a NormOptions) or the
shorthands ``norm_type=`` and ``norm_eps=``.
"""
from .. import _normlab as C
from .._normlab import Error
from . import functional as F
from .module import Module, _cxx_class, _dtype, _wrap

__all__ = ["Linear", "Embedding", "ReLU", "SiLU", "GELU", "Dropout", "FeedForward", "SwiGLU", "Attention",
           "TransformerBlock", "Transformer", "CrossEntropyLoss", "MSELoss"]

# The C++ option structs' defaults, which the signatures below take rather than restate.
_FEED_FORWARD = C.nn.FeedForwardOptions()
_ATTENTION = C.nn.AttentionOptions()


# ---- options from keyword arguments ----

def _fields(options):
    """The field names of a bound C++ options struct, in declaration order."""
    return [name for name, value in vars(type(options)).items() if isinstance(value, property)]


def _fill(what, options, kwargs):
    """Sets each keyword argument on the options struct; an unknown name or a value of the wrong type is a
    normlab.Error naming it."""
    fields = _fields(options)
    for key, value in kwargs.items():
        if key not in fields:
            raise Error(f"{what}: unknown option '{key}' (options: {', '.join(fields)})")
        if key == "dtype":
            value = _dtype(value)
        elif key == "norm":
            value = _norm_options(what, value)
        try:
            setattr(options, key, value)
        except TypeError:
            expected = type(getattr(options, key)).__name__
            raise Error(f"{what}: option '{key}' expects a {expected}, found {value!r}") from None
    return options


def _norm_options(what, spec):
    """A norm given as a type name, a dict of NormOptions fields, or a NormOptions."""
    if isinstance(spec, C.nn.NormOptions):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise Error(f"{what}: norm is a norm type name, a dict of norm options or a NormOptions, found "
                    f"{type(spec).__name__}")
    if "dim" in spec:
        raise Error(f"{what}: the norm's dim is the model's dim; leave 'dim' out of norm")
    C.nn.find_norm_type(spec.get("type", "rmsnorm"))  # an unknown type: the error lists the registry's names
    return _fill(f"{what} norm", C.nn.NormOptions(), spec)


def _pop_norm(what, kwargs):
    """norm=, norm_type= and norm_eps= as one NormOptions (None when none is given)."""
    norm, norm_type, norm_eps = kwargs.pop("norm", None), kwargs.pop("norm_type", None), kwargs.pop("norm_eps", None)
    if norm is None and norm_type is None and norm_eps is None:
        return None
    options = _norm_options(what, norm if norm is not None else {})
    if norm_type is not None:
        if isinstance(norm, (str, dict)) and (isinstance(norm, str) or "type" in norm):
            raise Error(f"{what}: give the norm's type once, in norm= or in norm_type=")
        C.nn.find_norm_type(norm_type)
        options.type = norm_type
    if norm_eps is not None:
        options.eps = norm_eps
    return options


def _pop_pre_norm(what, kwargs):
    """pre_norm=, the older name of norm_placement "pre" (True) or "post" (False), into norm_placement."""
    if "pre_norm" not in kwargs:
        return
    placement = "pre" if kwargs.pop("pre_norm") else "post"
    if kwargs.get("norm_placement", placement) != placement:
        raise Error(f"{what}: pre_norm={placement == 'pre'} and norm_placement={kwargs['norm_placement']!r} disagree; "
                    "give norm_placement only")
    kwargs["norm_placement"] = placement


def _options_dict(options):
    out = {}
    for name in _fields(options):
        value = getattr(options, name)
        out[name] = _options_dict(value) if isinstance(value, C.nn.NormOptions) else value
    return out


# ---- Linear, Embedding, activations ----

@_cxx_class("Linear")
class Linear(Module):
    """torch.nn.Linear: y = x W^T + b, weight (out_features, in_features), bias (out_features), both drawn
    from U(-1/sqrt(in), 1/sqrt(in)) as PyTorch's init, from `generator` (None: the default generator,
    normlab.manual_seed)."""

    def __init__(self, in_features, out_features, bias=True, *, dtype=None, generator=None):
        self._adopt(C.nn.Linear(in_features, out_features, bias, _dtype(dtype), generator))

    in_features = property(lambda self: self._cxx.in_features, doc="The input features.")
    out_features = property(lambda self: self._cxx.out_features, doc="The output features.")

    def forward(self, input):
        """input (..., in_features) -> (..., out_features)."""
        return self._cxx.forward(input)

    def reset_parameters(self, generator=None):
        """Redraws weight and bias in place (the Parameters keep their identity)."""
        self._cxx.reset_parameters(generator)


@_cxx_class("Embedding")
class Embedding(Module):
    """torch.nn.Embedding: a (num_embeddings, embedding_dim) table, weight ~ N(0, 1) drawn from
    `generator` (None: the default generator)."""

    def __init__(self, num_embeddings, embedding_dim, *, dtype=None, generator=None):
        self._adopt(C.nn.Embedding(num_embeddings, embedding_dim, _dtype(dtype), generator))

    num_embeddings = property(lambda self: self._cxx.num_embeddings, doc="The table's rows.")
    embedding_dim = property(lambda self: self._cxx.embedding_dim, doc="Each row's size.")

    def forward(self, input):
        """int64 ids of any shape -> input.shape + (embedding_dim,)."""
        return self._cxx.forward(input)


class _Unary(Module):
    """A C++ module of one input (an activation, Dropout)."""

    def forward(self, input):
        """The module applied to input."""
        return self._cxx.forward(input)


@_cxx_class("ReLU")
class ReLU(_Unary):
    """max(x, 0) (torch.nn.ReLU)."""

    def __init__(self):
        self._adopt(C.nn.ReLU())


@_cxx_class("SiLU")
class SiLU(_Unary):
    """x * sigmoid(x) (torch.nn.SiLU)."""

    def __init__(self):
        self._adopt(C.nn.SiLU())


@_cxx_class("GELU")
class GELU(_Unary):
    """The exact (erf) GELU, torch.nn.GELU(approximate='none')."""

    def __init__(self, approximate="none"):
        if approximate != "none":
            raise Error(f"GELU: normlab has the exact (erf) GELU only, approximate='none'; found '{approximate}'")
        self._adopt(C.nn.GELU())

    def extra_repr(self):
        """PyTorch's: approximate='none'."""
        return "approximate='none'"


@_cxx_class("Dropout")
class Dropout(_Unary):
    """Inverted dropout (torch.nn.Dropout): in training each element is zeroed with probability p and the
    rest scaled by 1 / (1 - p); the identity in eval mode. The masks come from the module's own
    generator, seeded by `seed`, so they are the same on every run."""

    def __init__(self, p=0.5, *, seed=0):
        self._adopt(C.nn.Dropout(p, seed))

    p = property(lambda self: self._cxx.p, doc="The probability of zeroing an element.")


# ---- the transformer's parts ----

@_cxx_class("FeedForward")
class FeedForward(Module):
    """LLaMA's SwiGLU feed-forward, w2(silu(w1 x) * w3 x), without biases; the hidden size is LLaMA's
    rule on hidden_dim: multiple_of * ceil(int(2 * hidden_dim / 3) / multiple_of). fused: the gate as one
    kernel node (else silu and mul in autograd ops)."""

    def __init__(self, dim, hidden_dim, multiple_of=_FEED_FORWARD.multiple_of, *, fused=_FEED_FORWARD.fused,
                 dtype=None, generator=None):
        options = _fill("FeedForward", C.nn.FeedForwardOptions(),
                        dict(dim=dim, hidden_dim=hidden_dim, multiple_of=multiple_of, fused=fused))
        if dtype is not None:
            options.dtype = _dtype(dtype)
        self._adopt(C.nn.FeedForward(options, generator))

    hidden = property(lambda self: self._cxx.hidden, doc="The hidden size after LLaMA's 2/3 rule.")

    def forward(self, input):
        """input (..., dim) -> (..., dim)."""
        return self._cxx.forward(input)


SwiGLU = FeedForward  # the name the SwiGLU feed-forward goes by (Shazeer 2020)


@_cxx_class("Attention")
class Attention(Module):
    """LLaMA's causal self-attention: wq, wk, wv, wo without biases, rotary position embeddings on q and
    k, grouped-query heads (n_kv_heads dividing n_heads; 0: n_heads), each head_dim wide (0: dim / n_heads).
    fused: FlashAttention-style tiles in one node (else LLaMA's code in autograd ops)."""

    def __init__(self, dim, n_heads, n_kv_heads=_ATTENTION.n_kv_heads, *, head_dim=_ATTENTION.head_dim,
                 rope_theta=_ATTENTION.rope_theta, max_seq_len=_ATTENTION.max_seq_len, fused=_ATTENTION.fused,
                 dtype=None, generator=None):
        options = _fill("Attention", C.nn.AttentionOptions(),
                        dict(dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, rope_theta=rope_theta,
                             max_seq_len=max_seq_len, fused=fused))
        if dtype is not None:
            options.dtype = _dtype(dtype)
        self._adopt(C.nn.Attention(options, generator))

    head_dim = property(lambda self: self._cxx.head_dim, doc="Each head's size (dim / n_heads unless set).")
    n_heads = property(lambda self: self._cxx.n_heads, doc="The query heads.")
    n_kv_heads = property(lambda self: self._cxx.n_kv_heads, doc="The key/value heads.")

    def forward(self, input):
        """input (B, T, dim) -> (B, T, dim), position t attending to positions 0..t."""
        return self._cxx.forward(input)


@_cxx_class("TransformerBlock")
class TransformerBlock(Module):
    """LLaMA's pre-norm block, h = x + attention(attention_norm(x)), out = h + feed_forward(ffn_norm(h)),
    or another norm placement (norm_placement= "post", "peri", "output", "deepnorm", "none"; docs/norms.md;
    pre_norm=False is the older spelling of "post"). Options: the fields of TransformerBlockOptions
    (dim, n_heads, n_kv_heads, head_dim, ffn_hidden_dim, multiple_of, norm_placement, pre_norm_scale,
    deepnorm_alpha, deepnorm_beta, qk_norm, alpha_init_attention, attn_softcap, rope_theta,
    max_seq_len, fused_attention, fused_swiglu, dtype) and the norm (norm=, norm_type=, norm_eps=)."""

    def __init__(self, dim, n_heads, *, generator=None, **options):
        _pop_pre_norm("TransformerBlock", options)
        norm = _pop_norm("TransformerBlock", options)
        o = _fill("TransformerBlock", C.nn.TransformerBlockOptions(), dict(dim=dim, n_heads=n_heads, **options))
        if norm is not None:
            o.norm = norm
        self._adopt(C.nn.TransformerBlock(o, generator))

    @property
    def options(self):
        """Its options as a dict."""
        return _options_dict(self._cxx.options)

    def forward(self, input):
        """input (B, T, dim) -> (B, T, dim)."""
        return self._cxx.forward(input)


@_cxx_class("Transformer")
class Transformer(Module):
    """A LLaMA-style decoder-only language model (layers/transformer.h) under Meta LLaMA's parameter
    names: tok_embeddings, layers.<i>.{attention.w{q,k,v,o}, feed_forward.w{1,2,3}, attention_norm,
    ffn_norm}, norm, output. Options: the fields of TransformerOptions as keyword arguments
    (vocab_size, dim, n_layers, n_heads, n_kv_heads, head_dim, multiple_of, ffn_hidden_dim, norm_placement,
    mix_fraction, norm_scaling, qk_norm, alpha_init_attention, logit_softcap, attn_softcap, rope_theta,
    max_seq_len, fused_attention, fused_swiglu, seed, dtype; pre_norm=False is the older spelling of
    norm_placement="post") and the norm (norm= a type name, a dict of
    NormOptions fields or a NormOptions; or norm_type=, norm_eps=). The initial weights are drawn from
    Generator(seed), so the same options give the same model."""

    def __init__(self, **options):
        _pop_pre_norm("Transformer", options)
        norm = _pop_norm("Transformer", options)
        o = _fill("Transformer", C.nn.TransformerOptions(), options)
        if norm is not None:
            o.norm = norm
        self._adopt(C.nn.Transformer(o))

    @classmethod
    def of(cls, model):
        """The normlab.nn face of a model the jobs made (TrainSession.model, load_checkpoint(...).model):
        the same C++ model, so its parameters are the trained tensors, to evaluate, fine-tune or save
        with state_dict."""
        return _wrap(model.module)

    @property
    def options(self):
        """Its options as a dict (the norm's as a dict)."""
        return _options_dict(self._cxx.options)

    def forward(self, ids):
        """ids (B, T) int64, each in [0, vocab_size), T <= max_seq_len -> logits (B, T, vocab_size)."""
        return self._cxx.forward(ids)

    def num_parameters(self, include_embeddings=True):
        """Parameter elements; without the embedding table on request (as model sizes are quoted)."""
        return self._cxx.count_parameters(include_embeddings)


# ---- losses ----

class CrossEntropyLoss(Module):
    """torch.nn.CrossEntropyLoss with the class dim last (logits (..., C), int64 targets (...); the same as
    PyTorch for (N, C) logits): rows whose target is ignore_index count for nothing. fused: one kernel
    node (else log_softmax and gather in autograd ops)."""

    def __init__(self, ignore_index=-100, reduction="mean", *, fused=True):
        super().__init__()
        self.ignore_index, self.reduction, self.fused = ignore_index, reduction, fused

    def forward(self, input, target):
        """The loss of logits `input` against `target`."""
        return F.cross_entropy(input, target, self.ignore_index, self.reduction, fused=self.fused)


class MSELoss(Module):
    """torch.nn.MSELoss with reduction='mean': mean((input - target)^2), the shapes equal."""

    def __init__(self, reduction="mean"):
        super().__init__()
        F._check_mean("MSELoss", reduction)
        self.reduction = reduction

    def forward(self, input, target):
        """The mean squared error."""
        return F.mse_loss(input, target)
