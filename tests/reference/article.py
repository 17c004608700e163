"""The article's PyTorch modules, copied from its code (the LayerNorm-vs-RMSNorm article normlab
reproduces; section numbers are the article's). make_fixtures.py builds its article_* and
stability_* fixtures from these classes.

One change, in one place: where the article writes `x.float()` (RMSNorm.forward), `upcast(x)` is
used. For f32, bf16 and f16 inputs it is `x.float()`; an f64 input stays f64. `x.float()` exists
to upcast half precision: in an f64 run it would round every RMSNorm to f32, and f64 runs are how
normlab is compared with PyTorch to 1e-10.
"""

from typing import Optional

import torch
import torch.nn as nn


def upcast(x):
    """The article's x.float(), except that f64 stays f64 (see the module docstring)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# 4.2 LLaMA RMSNorm
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch_size, seq_len, dim] or [batch_size, dim]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(upcast(x)).type_as(x)  # the article: self._norm(x.float())
        return output * self.weight


# 4.3 the LLaMA feed-forward (its hidden-size rule)
class LLaMAFeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int = 256):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor):
        # SwiGLU
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


# 5.2 the training-stability experiment's model
class SimpleModel(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_rmsnorm=True):
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, output_dim)
        if use_rmsnorm:
            self.norm1 = RMSNorm(hidden_dim)
            self.norm2 = RMSNorm(hidden_dim)
        else:
            self.norm1 = nn.LayerNorm(hidden_dim)
            self.norm2 = nn.LayerNorm(hidden_dim)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.norm1(self.fc1(x)))
        x = self.relu(self.norm2(self.fc2(x)))
        return self.fc3(x)


# 6.3 migrating a model
def migrate_layernorm_to_rmsnorm(model):
    """Replaces the model's LayerNorms by RMSNorms (returns the replacements)."""
    replacements = []
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            rms_norm = RMSNorm(module.normalized_shape[0], eps=module.eps)
            # copy the weights (the scale only)
            with torch.no_grad():
                rms_norm.weight.data.copy_(module.weight.data)
            replacements.append((name, rms_norm))
    return replacements


# 6.3 gradual migration
class HybridNorm(nn.Module):
    """Blends RMSNorm and LayerNorm, for a smooth migration."""

    def __init__(self, dim, eps=1e-5, alpha=0.5):
        super().__init__()
        self.alpha = alpha  # how far the migration has gone
        self.rms_norm = RMSNorm(dim, eps)
        self.layer_norm = nn.LayerNorm(dim, eps)

    def forward(self, x):
        rms_out = self.rms_norm(x)
        ln_out = self.layer_norm(x)
        return self.alpha * rms_out + (1 - self.alpha) * ln_out


# 7.1 numerical stability
class StableRMSNorm(nn.Module):
    """RMSNorm written for numerical stability."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        x_normalized = x * torch.rsqrt(variance + self.eps)
        return self.weight * x_normalized


# 7.3 debugging and monitoring
class DebuggableRMSNorm(RMSNorm):
    """An RMSNorm that keeps a running RMS of its input."""

    def __init__(self, dim, eps=1e-5):
        super().__init__(dim, eps)
        self.register_buffer("running_rms", torch.ones(1))
        self.momentum = 0.1

    def forward(self, x):
        output = super().forward(x)
        current_rms = x.pow(2).mean().sqrt()
        self.running_rms = (1 - self.momentum) * self.running_rms + self.momentum * current_rms
        return output

    def get_debug_info(self):
        return {
            "running_rms": self.running_rms.item(),
            "weight_mean": self.weight.mean().item(),
            "weight_std": self.weight.std().item(),
        }


# 8.2 RMSNorm variants
class RMSNormWithBias(RMSNorm):
    """RMSNorm with a bias."""

    def __init__(self, dim, eps=1e-5):
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return super().forward(x) + self.bias


class AdaptiveRMSNorm(RMSNorm):
    """Adapts the normalization strength to the input."""

    def __init__(self, dim, eps=1e-5):
        super().__init__(dim, eps)
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x):
        base_output = super().forward(x)
        # scale the output by a statistic of the input
        input_scale = x.std(dim=-1, keepdim=True)
        adaptive_scale = torch.sigmoid(self.alpha * input_scale)
        return base_output * adaptive_scale


# normlab's norm type names -> the article's class building that norm of size dim (default eps).
STABILITY_NORMS = {
    "layernorm": nn.LayerNorm,
    "rmsnorm": RMSNorm,
    "rmsnorm_bias": RMSNormWithBias,
    "adaptive_rmsnorm": AdaptiveRMSNorm,
    "hybridnorm": HybridNorm,
}
