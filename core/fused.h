// Fused kernels at the tensor level (no autograd): the norm forward/backward pair that serves
// LayerNorm, RMSNorm, RMSNorm with bias and pRMSNorm; DyT's pair; soft-capping's pair; cross-entropy
// over logits; one-pass Adam/AdamW and SGD updates. Each checks shapes/dtypes/devices, allocates, and
// calls one backend kernel (core/backend.h has the formulas). bf16/f16 tensors are read and written as
// such by the kernels, with all math in at least f32.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace nl {

// ---- norms over the last dim of x (rows = numel / d) ----

// pRMSNorm's statistic size: ceil(p * d) clamped to [1, d] (p in (0, 1]; 1e-9 of slack so that
// p*d landing a rounding error above an integer does not take one element more).
int64_t partial_stat_count(int64_t d, double p);

struct NormForward {
    Tensor y;     // x's shape and dtype
    Tensor mean;  // x.shape[:-1], f64 for f64 x else f32; undefined unless subtract_mean
    Tensor rstd;  // x.shape[:-1], f64 for f64 x else f32
};
// subtract_mean: LayerNorm, y = (x - mean) * rstd * w + b with rstd = 1/sqrt(var + eps) (biased var).
// Otherwise RMSNorm, y = x * rstd * w + b with rstd = 1/sqrt(mean(x^2) + eps).
// weight/bias: undefined Tensor() for none, else shape [d] with x's dtype and device.
// stat_count: the statistics use the first stat_count elements of each row (-1: all d; pRMSNorm:
// partial_stat_count(d, p)); the normalization applies to all d.
NormForward norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         bool subtract_mean, int64_t stat_count = -1);

struct NormBackward {
    Tensor dx;       // x's shape and dtype
    Tensor dweight;  // [d], weight's dtype; undefined when weight is undefined or !need_dweight
    Tensor dbias;    // [d], x's dtype; undefined when !need_dbias
};
// Closed-form backward given norm_forward's saved mean (LayerNorm only; else pass Tensor()) and rstd.
NormBackward norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, bool subtract_mean, int64_t stat_count = -1,
                           bool need_dweight = true, bool need_dbias = true);

// ---- Dynamic Tanh (DyT) over the last dim of x (rows = numel / d; core/backend.h has the formulas) ----

// y = tanh(alpha * x) * weight + bias (Zhu et al. 2025, Transformers without Normalization), a layer in
// a norm's place: no statistic, so nothing but x is needed for the backward. alpha: shape [1] with x's
// dtype and device; weight/bias: undefined Tensor() for none, else shape [d] with x's dtype and device.
Tensor dyt_forward(const Tensor& x, const Tensor& alpha, const Tensor& weight, const Tensor& bias);

struct DytBackward {
    Tensor dx;       // x's shape and dtype
    Tensor dalpha;   // [1], alpha's dtype; undefined when !need_dalpha
    Tensor dweight;  // [d], weight's dtype; undefined when weight is undefined or !need_dweight
    Tensor dbias;    // [d], x's dtype; undefined when !need_dbias
};
// The closed-form backward, tanh(alpha * x) recomputed from x. dalpha, dweight and dbias sum over rows
// in a fixed order (the same bits for any thread count).
DytBackward dyt_backward(const Tensor& dy, const Tensor& x, const Tensor& alpha, const Tensor& weight,
                         bool need_dalpha = true, bool need_dweight = true, bool need_dbias = true);

// ---- cross-entropy over logits (class dim LAST: logits (..., C), targets (...) of i64) ----

enum class Reduction { None, Mean, Sum };

struct CrossEntropyForward {
    Tensor loss;    // [] for Mean/Sum, targets' shape for None; logits' dtype, or the loss_dtype asked for
    Tensor lse;     // targets' shape, logsumexp of each row (saved for backward); f64 for f64 else f32
    int64_t count;  // rows whose target != ignore_index: Mean's divisor
    Tensor z_loss;  // with z_loss = c > 0: the term that loss includes, c * lse^2 reduced as the loss
                    // (loss's shape and dtype; loss - z_loss is the cross-entropy); undefined when c == 0
};
// PyTorch's F.cross_entropy(logits.view(-1, C), targets.view(-1), ignore_index, reduction), except
// the class dim is the last one. Ignored rows contribute 0 loss and 0 gradient; Mean divides by the
// non-ignored count, so when every row is ignored the mean is 0/0 = NaN, as in PyTorch (and the
// gradient is all zeros, as in PyTorch). Targets outside [0, C) other than ignore_index are errors.
// loss_dtype: the loss's dtype, the logits' by default; f32 for bf16/f16 logits gives the loss of
// their f32 widening (exact, so the same bits) without making the f32 copy: autocast's f32 loss.
// z_loss = c (finite, >= 0): PaLM's auxiliary z-loss (Chowdhery et al. 2022, section 5; Wortsman et
// al. 2023), which pulls each row's log-normalizer lse toward 0: every scored row's loss gains
// c * lse^2, so Mean adds c * mean(lse^2) over the scored rows, Sum c * sum(lse^2), None c * lse^2 per
// row. The kernel squares the lse it computes anyway; c = 0 is the plain cross-entropy, bit for bit.
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                          int64_t ignore_index = -100, Reduction reduction = Reduction::Mean,
                                          std::optional<DType> loss_dtype = std::nullopt, double z_loss = 0.0);
// dloss: [] (or any one-element tensor) for Mean/Sum, targets' shape for None. Returns dlogits with
// logits' shape and dtype. z_loss: the forward's (its gradient 2 c lse softmax joins the kernel's pass).
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100,
                              Reduction reduction = Reduction::Mean, double z_loss = 0.0);
// Just the loss of cross_entropy_forward.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::Mean);

// ---- optimizer updates, in place, one pass; param/state contiguous f32 or f64, one shape ----

struct AdamParams {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;  // note: torch.optim.AdamW's default is 1e-2
    bool decoupled = false;     // false: Adam (L2 added to the gradient); true: AdamW
    bool amsgrad = false;       // needs max_exp_avg_sq
};
// PyTorch's Adam/AdamW step number `step` (1 on the first update). exp_avg, exp_avg_sq (and
// max_exp_avg_sq for amsgrad) start as zeros. grad may be any layout (it is made contiguous).
void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
               const AdamParams& params, int64_t step, const Tensor& max_exp_avg_sq = Tensor());

struct SgdParams {
    double lr = 1e-3;
    double momentum = 0.0;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;  // needs momentum > 0 and dampening == 0, as in PyTorch
};
// PyTorch's SGD step. momentum_buffer: undefined when momentum == 0, else param-shaped; on
// first_step it is overwritten with the gradient (its old contents are ignored).
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdParams& params,
              bool first_step);

// ---- rotary position embedding ----

// x (B, T, H, head_dim) with each (even, odd) pair of position t rotated by t * theta_i, in the order
// of torch's complex product (LLaMA's apply_rotary_emb); cos and sin (T, head_dim / 2) in x's compute
// dtype (f64 for f64, else f32). `inverse` rotates by -angle: the backward. bf16/f16 x is rotated in
// f32 and rounded once.
Tensor rope_rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse = false);

// ---- SwiGLU's gate (core/backend.h has the formulas) ----

// silu(a) * b for a and b of one shape, floating dtype and device; bf16/f16 computed in f32 and
// rounded once.
Tensor swiglu_forward(const Tensor& a, const Tensor& b);
struct SwigluBackward {
    Tensor da;  // a's shape and dtype
    Tensor db;  // b's shape and dtype
};
SwigluBackward swiglu_backward(const Tensor& dout, const Tensor& a, const Tensor& b);

// ---- soft-capping (core/backend.h has the formulas) ----

// cap * tanh(x / cap) for x of a floating dtype and cap > 0 and finite (the caller skips cap 0, which is
// off); bf16/f16 computed in f32 and rounded once.
Tensor softcap_forward(const Tensor& x, double cap);
// dx = dy * (1 - (y / cap)^2) from softcap_forward's output y (x itself is not needed); dy has y's shape.
Tensor softcap_backward(const Tensor& dy, const Tensor& y, double cap);

// ---- causal attention (FlashAttention's algorithm; core/backend.h has the formulas) ----

struct AttentionForward {
    Tensor out;  // (B, T, H, hd), q's dtype
    Tensor lse;  // (B, H, T): each query row's logsumexp of its scores, f64 for f64 q else f32
};
// q (B, T, H, hd), k and v (B, L, KV, hd) with L >= T and KV dividing H: query head h reads kv head
// h / (H / KV), query row i sits at position L - T + i (the first L - T keys are cached positions) and
// sees keys 0..L - T + i; scores are scaled by 1 / sqrt(hd). No (T x L) matrix is stored. bf16/f16
// inputs are computed in f32 and the output rounded once.
// softcap = cap > 0 soft-caps the scaled scores before the mask and the softmax, s -> cap * tanh(s / cap)
// (Gemma 2's attention logit soft-capping); 0 (the default) is off, with the same bits and speed.
// cap must be finite and >= 0.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double softcap = 0.0);

struct AttentionBackward {
    Tensor dq;  // q's shape and dtype
    Tensor dk;  // k's shape and dtype
    Tensor dv;  // v's shape and dtype
};
// The gradients given dout (out's shape) and the forward's out and lse (the probabilities are
// recomputed from lse, tile by tile). softcap: the forward's.
AttentionBackward attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, double softcap = 0.0);

}  // namespace nl
