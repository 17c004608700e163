#!/usr/bin/env python3
"""A PyTorch twin of normlab's Transformer (layers/transformer.h), written from the papers, for the
fixture generator (tests/reference/make_fixtures.py) and the training replay (torch_replay.py).

The modules follow Meta's LLaMA reference code (facebookresearch/llama, llama/model.py): RMSNorm,
FeedForward (SwiGLU), Attention with complex-pair RoPE and grouped-query heads, and TransformerBlock
(pre-norm); DyT is the module of Zhu et al. 2025 (Transformers without Normalization). Attention,
TransformerBlock and Transformer take options beyond LLaMA, off by default: the norm placements post,
peri, output, deepnorm and none, Mix-LN, LayerNorm Scaling, QK-norm, every normlab norm type
(norm_factory) and attention and logit soft-capping. Parameter names are normlab's (LLaMA's), so a
normlab checkpoint loads with load_state_dict. model_from_config builds the model a normlab train
config's /model object describes.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm: x * rsqrt(mean(x^2, -1) + eps), computed in f32, cast back, times weight.

    LLaMA writes x.float(); here f64 inputs stay f64 (computed in at least f32, f64 stays f64).
    For f32/bf16/f16 inputs this is exactly LLaMA's computation.
    """

    def __init__(self, dim, eps=1e-6, elementwise_affine=True, stat_count=None):
        super().__init__()
        self.eps = eps
        self.stat_count = stat_count  # pRMSNorm: the statistic over the first stat_count elements
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def _norm(self, x):
        stat = x if self.stat_count is None else x[..., :self.stat_count]
        return x * torch.rsqrt(stat.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        compute = torch.promote_types(x.dtype, torch.float32)
        output = self._norm(x.to(compute)).type_as(x)
        return output * self.weight if self.weight is not None else output


def swiglu_hidden_dim(hidden_dim, multiple_of):
    """LLaMA FeedForward's hidden size: multiple_of * ceil(int(2 * hidden_dim / 3) / multiple_of)."""
    hidden_dim = int(2 * hidden_dim / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, dim, hidden_dim, multiple_of):
        super().__init__()
        hidden = swiglu_hidden_dim(hidden_dim, multiple_of)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def precompute_freqs_cis(head_dim, seq_len, theta=10000.0):
    """(seq_len, head_dim/2) complex64: e^{i * t * theta^(-2k/head_dim)} for position t, pair k."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: (head_dim // 2)].float() / head_dim))
    t = torch.arange(seq_len, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """Rotates interleaved pairs (x[..., 2k], x[..., 2k+1]) as complex numbers by freqs_cis[t, k]."""
    compute = torch.promote_types(xq.dtype, torch.float32)  # LLaMA's .float(); f64 stays f64
    xq_ = torch.view_as_complex(xq.to(compute).reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.to(compute).reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])  # (1, T, 1, head_dim/2)
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    """(B, T, n_kv_heads, hd) -> (B, T, n_kv_heads * n_rep, hd): query head h uses kv head h // n_rep."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(
        bs, slen, n_kv_heads * n_rep, head_dim)


def causal_mask(seq_len):
    return torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, Transformers without Normalization), the paper's
    module: a learnable scalar alpha (alpha_init_value, 0.5 by default), then weight and bias."""

    def __init__(self, normalized_shape, alpha_init_value=0.5, elementwise_affine=True):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(normalized_shape)) if elementwise_affine else None

    def forward(self, x):
        x = torch.tanh(self.alpha * x)
        return x * self.weight + self.bias if self.weight is not None else x


class Attention(nn.Module):
    """LLaMA's Attention. Options beyond LLaMA (off by default):
    - qk_norm "head" | "full" with make_norm(dim) a norm factory: QK-norm (Dehghani et al. 2023,
      ViT-22B; Wortsman et al. 2023) on the projected q and k before RoPE: "head" normalizes each
      head's head_dim vector (Qwen3, Gemma 3), "full" the whole projection (OLMo 2);
    - softcap > 0: Gemma 2's attention-logit soft-capping, scores = cap * tanh(scores / cap) after
      the 1/sqrt(head_dim) scaling and before the mask and the softmax.
    """

    def __init__(self, dim, n_heads, n_kv_heads, qk_norm="none", make_norm=None, softcap=0.0, head_dim=None):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim = head_dim or dim // n_heads  # Qwen3's is its own
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.qk_norm = qk_norm
        self.softcap = softcap
        if qk_norm == "head":
            self.q_norm = make_norm(self.head_dim)
            self.k_norm = make_norm(self.head_dim)
        elif qk_norm == "full":
            self.q_norm = make_norm(n_heads * self.head_dim)
            self.k_norm = make_norm(n_kv_heads * self.head_dim)
        self.debug = {}  # intermediates kept for the fixture files

    def forward(self, x, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq, xk = self.wq(x), self.wk(x)
        if self.qk_norm == "full":
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        self.debug["q_rope"] = xq
        self.debug["k_rope"] = xk
        keys = repeat_kv(xk, self.n_rep).transpose(1, 2)      # (B, H, T, hd)
        values = repeat_kv(xv, self.n_rep).transpose(1, 2)    # (B, H, T, hd)
        xq = xq.transpose(1, 2)                               # (B, H, T, hd)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if self.softcap > 0:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        scores = scores + mask
        compute = torch.promote_types(scores.dtype, torch.float32)  # LLaMA's .float(); f64 stays f64
        probs = F.softmax(scores.to(compute), dim=-1).type_as(xq)  # (B, H, T, T)
        self.debug["probs"] = probs
        output = torch.matmul(probs, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class RMSNormWithBias(RMSNorm):
    """rmsnorm_bias: RMSNorm(x) + bias (the article's RMSNormWithBias, 8.2)."""

    def __init__(self, dim, eps, elementwise_affine=True):
        super().__init__(dim, eps, elementwise_affine)
        self.bias = nn.Parameter(torch.zeros(dim)) if elementwise_affine else None

    def forward(self, x):
        y = super().forward(x)
        return y + self.bias if self.bias is not None else y


class AdaptiveRMSNorm(RMSNorm):
    """adaptive_rmsnorm: RMSNorm(x) * sigmoid(alpha * std(x)), std unbiased (the article's, 8.2)."""

    def __init__(self, dim, eps, elementwise_affine=True):
        super().__init__(dim, eps, elementwise_affine)
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return super().forward(x) * torch.sigmoid(self.alpha * x.std(dim=-1, keepdim=True))


class HybridNorm(nn.Module):
    """hybridnorm: alpha * RMSNorm(x) + (1 - alpha) * LayerNorm(x), alpha a fixed float (the article's, 6.3)."""

    def __init__(self, dim, eps, alpha=0.5, elementwise_affine=True, bias=True):
        super().__init__()
        self.alpha = alpha
        self.rms_norm = RMSNorm(dim, eps, elementwise_affine)
        self.layer_norm = nn.LayerNorm(dim, eps, elementwise_affine=elementwise_affine, bias=bias)

    def forward(self, x):
        return self.alpha * self.rms_norm(x) + (1 - self.alpha) * self.layer_norm(x)


class ScaleNorm(nn.Module):
    """scalenorm: g * x / max(||x||_2, eps), g a learned scalar initialized to sqrt(dim) (Nguyen & Salazar 2019)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.full((1,), math.sqrt(dim)))

    def forward(self, x):
        return self.g * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps)


def partial_stat_count(dim, p):
    """pRMSNorm's k = ceil(p * d), at least 1 and at most d (core/fused.cpp partial_stat_count)."""
    return min(max(math.ceil(p * dim - 1e-9), 1), dim)


NORM_TYPES = ("layernorm", "rmsnorm", "rmsnorm_bias", "prmsnorm", "adaptive_rmsnorm", "hybridnorm", "scalenorm", "dyt")


def norm_factory(norm_type="rmsnorm", eps=1e-6, alpha_init=0.5, elementwise_affine=True, bias=True, p=0.0625,
                 alpha=0.5):
    """make_norm(dim) for one of normlab's norm types (NORM_TYPES; layers/norm_registry.cpp has the
    formulas) with the options of a config's /model/norm: LLaMA's RMSNorm, nn.LayerNorm, the article's
    variants, ScaleNorm or the DyT paper's module. make_norm(dim, alpha_init=a) overrides DyT's
    alpha_init (the norms before attention)."""
    def make_norm(dim, alpha_init=alpha_init):
        if norm_type == "rmsnorm":
            return RMSNorm(dim, eps=eps, elementwise_affine=elementwise_affine)
        if norm_type == "prmsnorm":
            return RMSNorm(dim, eps=eps, elementwise_affine=elementwise_affine, stat_count=partial_stat_count(dim, p))
        if norm_type == "layernorm":
            return nn.LayerNorm(dim, eps=eps, elementwise_affine=elementwise_affine, bias=bias)
        if norm_type == "rmsnorm_bias":
            return RMSNormWithBias(dim, eps, elementwise_affine)
        if norm_type == "adaptive_rmsnorm":
            return AdaptiveRMSNorm(dim, eps, elementwise_affine)
        if norm_type == "hybridnorm":
            return HybridNorm(dim, eps, alpha, elementwise_affine, bias)
        if norm_type == "scalenorm":
            return ScaleNorm(dim, eps)
        if norm_type == "dyt":
            return DyT(dim, alpha_init_value=alpha_init, elementwise_affine=elementwise_affine)
        raise ValueError(f"unknown norm type {norm_type!r} (expected one of {', '.join(NORM_TYPES)})")
    return make_norm


# Where a block's norms sit (N a norm, f the sublayer, x the residual stream; one line per sublayer):
#   pre (LLaMA; Xiong et al. 2020):         h = x + f(N(x))
#   post (Vaswani et al. 2017):             h = N(x + f(x))
#   peri (Kim et al. 2025, Peri-LN):        h = x + N_out(f(N_in(x)))
#   output (OLMo 2's reordered norm):       h = x + N_out(f(x))
#   deepnorm (Wang et al. 2022, DeepNet):   h = N(alpha * x + f(x))
#   none:                                   h = x + f(x)
# Mix-LN (Li et al. 2024) is the model's choice of post or pre per block.
BLOCK_PLACEMENTS = ("pre", "post", "peri", "output", "deepnorm", "none")


class TransformerBlock(nn.Module):
    """LLaMA's block, pre-norm by default: h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).

    Options (the defaults are LLaMA's): `placement` one of BLOCK_PLACEMENTS (input norms are
    attention_norm / ffn_norm, as are the norms after the sum of post and deepnorm; the output norms
    attention_out_norm / ffn_out_norm); `make_norm` a norm factory (norm_factory; default RMSNorm with
    norm_eps); `pre_norm_scale` multiplies each input norm's output of pre and peri (LayerNorm Scaling,
    Sun et al. 2025: 1 / sqrt(l) in the l-th block); `deepnorm_alpha` the residual's multiplier of
    deepnorm; `alpha_init_attention` DyT's alpha_init for the norm before attention (pre, peri; Zhu
    et al. 2025); `qk_norm`, `attn_softcap`, `head_dim` the Attention's.
    """

    def __init__(self, dim, n_heads, n_kv_heads, ffn_hidden_dim, multiple_of, norm_eps, placement="pre",
                 make_norm=None, pre_norm_scale=1.0, deepnorm_alpha=1.0, alpha_init_attention=None,
                 qk_norm="none", attn_softcap=0.0, head_dim=None):
        super().__init__()
        assert placement in BLOCK_PLACEMENTS, placement
        make_norm = make_norm or (lambda d, **_: RMSNorm(d, eps=norm_eps))
        self.placement = placement
        self.pre_norm_scale = pre_norm_scale
        self.deepnorm_alpha = deepnorm_alpha
        self.attention = Attention(dim, n_heads, n_kv_heads, qk_norm=qk_norm, make_norm=make_norm,
                                   softcap=attn_softcap, head_dim=head_dim)
        self.feed_forward = FeedForward(dim, ffn_hidden_dim, multiple_of)
        if placement not in ("output", "none"):
            before_attention = placement in ("pre", "peri") and alpha_init_attention is not None
            self.attention_norm = make_norm(dim, alpha_init=alpha_init_attention) if before_attention else make_norm(dim)
            self.ffn_norm = make_norm(dim)
        if placement in ("peri", "output"):
            self.attention_out_norm = make_norm(dim)
            self.ffn_out_norm = make_norm(dim)

    def forward(self, x, freqs_cis, mask):
        attend = lambda t: self.attention(t, freqs_cis, mask)  # noqa: E731
        p, s, a = self.placement, self.pre_norm_scale, self.deepnorm_alpha
        if p == "pre":
            h = x + attend(self.attention_norm(x) * s)
            return h + self.feed_forward(self.ffn_norm(h) * s)
        if p == "post":
            h = self.attention_norm(x + attend(x))
            return self.ffn_norm(h + self.feed_forward(h))
        if p == "peri":
            h = x + self.attention_out_norm(attend(self.attention_norm(x) * s))
            return h + self.ffn_out_norm(self.feed_forward(self.ffn_norm(h) * s))
        if p == "output":
            h = x + self.attention_out_norm(attend(x))
            return h + self.ffn_out_norm(self.feed_forward(h))
        if p == "deepnorm":
            h = self.attention_norm(a * x + attend(x))
            return self.ffn_norm(a * h + self.feed_forward(h))
        h = x + attend(x)
        return h + self.feed_forward(h)


class Transformer(nn.Module):
    """LLaMA's Transformer: tok_embeddings, the pre-norm blocks, a final RMSNorm and the output head.

    Options (the defaults are LLaMA's): `placements` one BLOCK_PLACEMENTS entry per block (Mix-LN is
    a list of post then pre); the final norm exists unless every block is "none"; `make_norm`,
    `pre_norm_scales` (one per block), `deepnorm_alpha`, `alpha_init_attention`, `qk_norm`,
    `attn_softcap` go to the blocks; `logit_softcap` > 0 caps the logits, cap * tanh(logits / cap)
    (Gemma 2).
    """

    def __init__(self, vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden_dim, multiple_of, norm_eps,
                 placements=None, make_norm=None, pre_norm_scales=None, deepnorm_alpha=1.0,
                 alpha_init_attention=None, qk_norm="none", attn_softcap=0.0, logit_softcap=0.0, head_dim=None):
        super().__init__()
        placements = placements or ["pre"] * n_layers
        pre_norm_scales = pre_norm_scales or [1.0] * n_layers
        make_norm = make_norm or (lambda d, **_: RMSNorm(d, eps=norm_eps))
        self.logit_softcap = logit_softcap
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList([TransformerBlock(dim, n_heads, n_kv_heads, ffn_hidden_dim, multiple_of, norm_eps,
                                                      placement=placements[i], make_norm=make_norm,
                                                      pre_norm_scale=pre_norm_scales[i], deepnorm_alpha=deepnorm_alpha,
                                                      alpha_init_attention=alpha_init_attention, qk_norm=qk_norm,
                                                      attn_softcap=attn_softcap, head_dim=head_dim)
                                     for i in range(n_layers)])
        self.norm = make_norm(dim) if any(p != "none" for p in placements) else None
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, ids, freqs_cis, mask):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h, freqs_cis, mask)
        logits = self.output(self.norm(h) if self.norm is not None else h)
        if self.logit_softcap > 0:
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return logits


def precompute_freqs_cis_f64(head_dim, seq_len, theta=10000.0):
    """precompute_freqs_cis in float64 throughout (complex128), as normlab's f64 RoPE tables are."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64)[: (head_dim // 2)] / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def model_from_config(model, vocab_size):
    """The Transformer a normlab train config's resolved /model object describes (config.json of a run
    directory holds every key), its RoPE table in float64 for model["max_seq_len"] positions, and the
    block placements. The weights are PyTorch's default init: load a normlab checkpoint over them."""
    n = model["n_layers"]
    norm = model["norm"]
    placement = model["norm_placement"]
    if placement == "mix":  # Mix-LN: the first ceil(mix_fraction * n_layers) blocks post-norm, then pre-norm
        n_post = math.ceil(model["mix_fraction"] * n - 1e-9)
        placements = ["post"] * n_post + ["pre"] * (n - n_post)
    else:
        placements = [placement] * n
    # LayerNorm Scaling (Sun et al. 2025): the l-th block's (1-based) pre-norm outputs times 1 / sqrt(l).
    scales = [1 / math.sqrt(l) for l in range(1, n + 1)] if model["norm_scaling"] == "depth" else None
    # DeepNet (Wang et al. 2022), decoder-only: alpha = (2N)^(1/4) (beta only scales the init).
    alpha = (2 * n) ** 0.25 if placement == "deepnorm" else 1.0
    make_norm = norm_factory(norm["type"], norm["eps"], norm["alpha_init"], norm["elementwise_affine"], norm["bias"],
                             norm["p"], norm["alpha"])
    n_kv_heads = model.get("n_kv_heads") or model["n_heads"]
    ffn_hidden_dim = model["ffn_hidden_dim"] or 4 * model["dim"]
    net = Transformer(vocab_size, model["dim"], n, model["n_heads"], n_kv_heads, ffn_hidden_dim, model["multiple_of"],
                      norm["eps"], placements=placements, make_norm=make_norm, pre_norm_scales=scales,
                      deepnorm_alpha=alpha, alpha_init_attention=norm.get("alpha_init_attention"),
                      qk_norm=model["qk_norm"], attn_softcap=model["attn_softcap"],
                      logit_softcap=model["logit_softcap"], head_dim=model.get("head_dim"))
    head_dim = model.get("head_dim") or model["dim"] // model["n_heads"]
    freqs_cis = precompute_freqs_cis_f64(head_dim, model["max_seq_len"], model["rope_theta"])
    return net, freqs_cis, placements


# ---------------------------------------------------------------------------------------------
# normlab's training probes (jobs/probes.h), computed on this model: what a replay compares with a
# run's probes.csv. The formulas are layers/transformer.h's attention_probe and residual_probe.
# ---------------------------------------------------------------------------------------------

NORM_MODULES = (RMSNorm, DyT, HybridNorm, ScaleNorm, nn.LayerNorm)


def probed_norms(model):
    """The norms normlab probes, (dotted name, module) in named_modules order: every outermost norm
    (a HybridNorm's input is probed, not its parts')."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, NORM_MODULES) and not any(name.startswith(n + ".") for n, _ in out):
            out.append((name, module))
    return out


def attention_probe(attention):
    """attn_score_max, attn_entropy and attn_sink of an Attention's last forward (its debug tensors)."""
    q, k, probs = attention.debug["q_rope"], attention.debug["k_rope"], attention.debug["probs"]
    keys = repeat_kv(k, attention.n_rep).transpose(1, 2)                                 # (B, H, T, hd)
    scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) / math.sqrt(attention.head_dim)
    T = scores.shape[-1]
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    return {"attn_score_max": scores.abs().masked_fill(~visible, 0).max().item(),
            "attn_entropy": -torch.special.xlogy(probs, probs).sum(-1).mean().item(),
            "attn_sink": probs[:, :, 1:, 0].mean().item() if T > 1 else float("nan")}


def residual_probe(h):
    """residual_rms, act_max and act_kurtosis (channel RMS s_j over every row: mean(s^4) / mean(s^2)^2)."""
    channel_ms = h.reshape(-1, h.shape[-1]).pow(2).mean(0)  # (dim,) s_j^2
    return {"residual_rms": h.pow(2).mean().sqrt().item(), "act_max": h.abs().max().item(),
            "act_kurtosis": (channel_ms.pow(2).mean() / channel_ms.mean() ** 2).item()}


class ActivationProbes:
    """normlab's activation probes of one forward: `with ActivationProbes(model) as p: logits = model(...)`,
    then p.values(logits) gives {column: value} for every block's attention and residual probes, the
    logits' logsumexp mean and max, and every norm's input RMS (norm_input_rms.<name>)."""

    def __init__(self, model):
        self.model, self.blocks, self.norm_rms, self.hooks = model, {}, {}, []

    def __enter__(self):
        for i, layer in enumerate(self.model.layers):
            def after_block(module, inputs, output, i=i):
                self.blocks[i] = {**attention_probe(module.attention), **residual_probe(output.detach())}
            self.hooks.append(layer.register_forward_hook(after_block))
        for name, norm in probed_norms(self.model):
            def before_norm(module, inputs, name=name):
                self.norm_rms[name] = inputs[0].detach().pow(2).mean().sqrt().item()
            self.hooks.append(norm.register_forward_pre_hook(before_norm))
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()

    def values(self, logits):
        out = {}
        for i, block in sorted(self.blocks.items()):
            out.update({f"{key}.block{i}": value for key, value in block.items()})
        lse = torch.logsumexp(logits.detach(), -1)
        out["logsumexp_mean"], out["logsumexp_max"] = lse.mean().item(), lse.max().item()
        out.update({f"norm_input_rms.{name}": rms for name, rms in self.norm_rms.items()})
        return out


def parameter_probes(model, before):
    """grad_rms.<param> (of .grad as it is: call it before clipping), and, with `before` the weights
    before the update ({name: tensor}), update_ratio.<param> = ||after - before|| / ||before|| (NaN for a
    zero weight) and dyt_alpha.<norm> after the update. With before None: the gradient's part only."""
    out = {}
    for name, p in model.named_parameters():
        if before is None:
            out[f"grad_rms.{name}"] = p.grad.pow(2).mean().sqrt().item() if p.grad is not None else 0.0
            continue
        weight = torch.linalg.vector_norm(before[name]).item()
        update = torch.linalg.vector_norm(p.detach() - before[name]).item()
        out[f"update_ratio.{name}"] = update / weight if weight > 0 else float("nan")
    if before is not None:
        for name, module in probed_norms(model):
            if isinstance(module, DyT):
                out[f"dyt_alpha.{name}"] = module.alpha.item()
    return out


# The largest model whose Hessian exact_sharpness builds whole: n^2 float64 entries (200 MB here).
HESSIAN_MAX_PARAMETERS = 5000


def full_hessian(model, loss_of):
    """The Hessian of loss_of(model) with respect to every parameter, flattened in named_parameters
    order: [n, n] float64, one row per double backward (torch.autograd.grad of one gradient entry)."""
    params = [p for _, p in model.named_parameters()]
    loss = loss_of(model)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])
    rows = []
    for i in range(flat.numel()):
        row = torch.autograd.grad(flat[i], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(r if r is not None else torch.zeros_like(p)).reshape(-1) for r, p in zip(row, params)]))
    hessian = torch.stack(rows)
    return 0.5 * (hessian + hessian.T)  # symmetric up to rounding; eigvalsh reads one triangle


def adam_inverse_sqrt_preconditioner(model, optimizer):
    """P^{-1/2} flattened in named_parameters order, P = sqrt(v_hat) + eps from torch.optim.Adam(W)'s
    state after a step: v_hat = exp_avg_sq / (1 - beta2^step) (Cohen et al. 2022); 0 for a parameter
    without state."""
    parts = []
    for _, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        if "exp_avg_sq" not in state:
            parts.append(torch.zeros(p.numel(), dtype=torch.float64))
            continue
        group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
        beta2, eps = group["betas"][1], group["eps"]
        step = float(state["step"])
        v_hat = state["exp_avg_sq"].reshape(-1).double() / (1.0 - beta2 ** step)
        parts.append(1.0 / (v_hat.sqrt() + eps).sqrt())
    return torch.cat(parts)


def exact_sharpness(hessian, scale=None):
    """The largest eigenvalue of the Hessian, or with scale = P^{-1/2} of P^{-1} H (the eigenvalues of
    the symmetric P^{-1/2} H P^{-1/2}), by torch.linalg.eigvalsh: normlab's sharpness probes, exactly."""
    matrix = hessian if scale is None else scale[:, None] * hessian * scale[None, :]
    return torch.linalg.eigvalsh(matrix).max().item()


def adam_sharpness_threshold(beta1, lr):
    """Cohen et al. 2022's threshold for Adam's preconditioned sharpness: (2 + 2 beta1) / ((1 - beta1) lr)."""
    return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * lr)
