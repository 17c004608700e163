// The one backend interface: one function per kernel, forward and backward next to each other.
// Kernels take raw pointers and explicit sizes (the wide fused ones as one argument struct each);
// the ops (ops*.cpp, fused.cpp) do the user-facing checking, broadcasting and allocation. A backend
// implements every pure virtual here, so a missing kernel fails to compile (an abstract class cannot
// be instantiated). Floating kernels see f32 or f64 only: ops convert bf16/f16 to f32 first
// (copy/fill see every dtype; the norm and cross-entropy kernels read and write bf16/f16 too, and
// the CPU's gemm takes bf16: bf16 operands, f32 sums, a bf16 C rounded once; the CPU's rope, SwiGLU,
// soft-capping and attention kernels take bf16 too, with f32 math).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace nl {

// One operand as a strided kernel sees it: data at element [0, ...] and one stride (in elements)
// per dim of the iteration shape; a broadcast dim has stride 0.
struct StridedArg {
    void* data = nullptr;
    DType dtype = DType::F32;
    Shape strides;
};

// SiluBackward(g, x) = g * d silu(x) / dx = g * s * (1 + x * (1 - s)), s = sigmoid(x): SiLU's backward
// in one pass (autograd's first-order path; the composed form serves create_graph).
enum class BinaryOp { Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, SiluBackward };
enum class UnaryOp { Neg, Exp, Log, Sqrt, Rsqrt, Abs, Relu, Silu, Sigmoid, Tanh, Gelu, Sign, Square };
// SumSquares is sum(x * x) without the squared tensor (gradient clipping's norms).
enum class ReduceOp { Sum, Mean, Max, Min, Var, ArgMax, SumSquares };

// ---- the wide kernels' arguments: one struct per kernel ----
// The fused kernels (norms, DyT, cross-entropy, optimizers, attention) take their many pointers and sizes
// as one struct, so each parameter list is written once, here: the Backend methods, both backends
// and the profiler name the struct only, and callers fill it field by field by name. Unlike the
// kernels above, the norm and cross-entropy kernels read and write bf16/f16 themselves (converting to
// f32 in registers), so a half-precision norm moves only half-precision bytes.
//
// Checks: the op layer (core/fused.cpp) refuses bad user input with a message for the user; a
// backend calls check_kernel_args, which only asserts the invariants (InternalError).

// One norm over the last dim of contiguous x, serving LayerNorm, RMSNorm, RMSNorm with bias and
// pRMSNorm. Statistics use each row's first k = stat_count (1..d) elements:
//   subtract_mean: mean = sum_k(x)/k, var = sum_k((x-mean)^2)/k (two-pass, biased),
//                  rstd = 1/sqrt(var + eps), y = (x - mean) * rstd * w + b
//   else (RMS):    rstd = 1/sqrt(sum_k(x^2)/k + eps) (eps inside the sqrt, as LLaMA),
//                  y = x * rstd * w + b
// x, y, weight and bias have `dtype`; mean and rstd are f64 for f64, else f32.
struct NormForwardArgs {
    DType dtype = DType::F32;      // f32, f64, bf16 or f16
    const void* x = nullptr;       // [rows, d]
    const void* weight = nullptr;  // [d], or null: 1
    const void* bias = nullptr;    // [d], or null: 0
    void* y = nullptr;             // [rows, d]
    void* mean = nullptr;          // [rows]; null or ignored unless subtract_mean
    void* rstd = nullptr;          // [rows]
    int64_t rows = 0;
    int64_t d = 0;
    double eps = 0.0;
    bool subtract_mean = false;  // LayerNorm; else RMS
    int64_t stat_count = 0;      // k
};
// Closed-form backward of norm_forward given its saved mean/rstd. With xhat = (x - mean) * rstd,
// g = dy * w and S the first k elements (llm.c layernorm_backward, generalized to k <= d):
//   dx_j = rstd * (g_j - [j in S] * (sum_d(g)/k [subtract_mean only] + xhat_j * sum_d(g*xhat)/k))
//   dweight = sum_rows(dy * xhat), dbias = sum_rows(dy), deterministic (no atomics; the same
//   bits for any thread count). With rows == 0, dweight and dbias are written as zeros.
struct NormBackwardArgs {
    DType dtype = DType::F32;      // f32, f64, bf16 or f16: dy, x, weight, dx, dweight, dbias
    const void* dy = nullptr;      // [rows, d]
    const void* x = nullptr;       // [rows, d]
    const void* weight = nullptr;  // [d], or null: 1
    const void* mean = nullptr;    // [rows], f64 for f64 else f32; needed when subtract_mean
    const void* rstd = nullptr;    // [rows], f64 for f64 else f32
    void* dx = nullptr;            // [rows, d]
    void* dweight = nullptr;       // [d], or null: not wanted
    void* dbias = nullptr;         // [d], or null: not wanted
    int64_t rows = 0;
    int64_t d = 0;
    bool subtract_mean = false;
    int64_t stat_count = 0;  // k
};

// Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization"; the paper's
// DyT module) over the last dim of contiguous x, a layer in a norm's place with no statistic:
//   y = tanh(alpha * x) * w + b,  alpha one scalar for the whole tensor
// x, alpha, weight, bias and y have `dtype` (f32, f64, bf16 or f16; halves computed in f32, rounded once).
struct DytForwardArgs {
    DType dtype = DType::F32;
    const void* x = nullptr;       // [rows, d]
    const void* alpha = nullptr;   // [1], read on the kernel's device (no copy to the host)
    const void* weight = nullptr;  // [d], or null: 1
    const void* bias = nullptr;    // [d], or null: 0
    void* y = nullptr;             // [rows, d]
    int64_t rows = 0;
    int64_t d = 0;
};
// Backward of dyt_forward, t = tanh(alpha * x) recomputed from x (d tanh(u) / du = 1 - tanh(u)^2):
//   dx_j    = dy_j * w_j * alpha * (1 - t_j^2)
//   dalpha  = sum over every element of dy * w * x * (1 - t^2)
//   dweight = sum_rows(dy * t),  dbias = sum_rows(dy)
// deterministic as norm_backward's (no atomics; the same bits for any thread count). With rows == 0,
// dalpha, dweight and dbias are written as zeros.
struct DytBackwardArgs {
    DType dtype = DType::F32;      // dy, x, alpha, weight, dx, dalpha, dweight, dbias
    const void* dy = nullptr;      // [rows, d]
    const void* x = nullptr;       // [rows, d]
    const void* alpha = nullptr;   // [1]
    const void* weight = nullptr;  // [d], or null: 1
    void* dx = nullptr;            // [rows, d]
    void* dalpha = nullptr;        // [1], or null: not wanted
    void* dweight = nullptr;       // [d], or null: not wanted
    void* dbias = nullptr;         // [d], or null: not wanted
    int64_t rows = 0;
    int64_t d = 0;
};

// Cross-entropy over contiguous logits with i64 targets, each in [0, classes) or equal to
// ignore_index (checked by the caller). Writes lse = logsumexp(logits row) and loss = lse -
// logit[target] (0 for ignored rows), and, when asked, lse_sq = lse^2 (0 for ignored rows): the
// z-loss's statistic (PaLM, Chowdhery et al. 2022, section 5), from the lse already at hand.
struct CrossEntropyForwardArgs {
    DType dtype = DType::F32;         // of logits: f32, f64, bf16 or f16
    const void* logits = nullptr;     // [rows, classes]
    const int64_t* targets = nullptr;  // [rows]
    void* loss = nullptr;             // [rows], f64 for f64 else f32
    void* lse = nullptr;              // [rows], f64 for f64 else f32
    void* lse_sq = nullptr;           // [rows], f64 for f64 else f32; or null: not wanted
    int64_t rows = 0;
    int64_t classes = 0;
    int64_t ignore_index = -100;
};
// dlogits = (softmax(logits) - onehot(target)) * dloss[r] * scale; ignored rows get exact zeros.
// With z_loss = c > 0 the row's loss also has c * lse^2, whose gradient is 2 c lse softmax(logits):
//   dlogits = (softmax(logits) * (1 + 2 c lse) - onehot(target)) * dloss[r] * scale
struct CrossEntropyBackwardArgs {
    DType dtype = DType::F32;          // of logits and dlogits: f32, f64, bf16 or f16
    const void* logits = nullptr;      // [rows, classes]
    const int64_t* targets = nullptr;  // [rows]
    const void* lse = nullptr;         // [rows], f64 for f64 else f32: the forward's
    const void* dloss = nullptr;       // [rows], f64 for f64 else f32; or null: 1
    double scale = 1.0;
    void* dlogits = nullptr;  // [rows, classes]
    int64_t rows = 0;
    int64_t classes = 0;
    int64_t ignore_index = -100;
    double z_loss = 0.0;  // c >= 0; 0: plain cross-entropy
};

// One pass of Adam (decoupled = false, L2 decay added to the gradient) or AdamW (decoupled = true,
// p *= 1 - lr*wd) over n contiguous elements, in place, in the exact op order of PyTorch's
// _single_tensor_adam.
struct AdamStepArgs {
    DType dtype = DType::F32;           // f32 or f64, every buffer
    void* param = nullptr;              // [n]
    const void* grad = nullptr;         // [n]
    void* exp_avg = nullptr;            // [n]
    void* exp_avg_sq = nullptr;         // [n]
    void* max_exp_avg_sq = nullptr;     // [n]: AMSGrad's running max of exp_avg_sq; or null
    int64_t n = 0;
    double lr = 0.0;
    double beta1 = 0.0;
    double beta2 = 0.0;
    double eps = 0.0;
    double weight_decay = 0.0;
    int64_t step = 0;  // counts from 1 (already incremented)
    bool decoupled = false;
};
// SGD as PyTorch: g += wd*p; with momentum: buf = g on the first step, else
// buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
struct SgdStepArgs {
    DType dtype = DType::F32;         // f32 or f64, every buffer
    void* param = nullptr;            // [n]
    const void* grad = nullptr;       // [n]
    void* momentum_buffer = nullptr;  // [n]; null when momentum == 0
    int64_t n = 0;
    double lr = 0.0;
    double momentum = 0.0;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
    bool first_step = false;
};

// The sizes of one causal attention: q and out [batch, q_len, heads, head_dim], k and v [batch,
// kv_len, kv_heads, head_dim]; heads % kv_heads == 0 and query head h reads kv head h / (heads /
// kv_heads) (grouped-query attention, no repeated copies).
struct AttentionDims {
    int64_t batch = 0;
    int64_t q_len = 0;
    int64_t kv_len = 0;
    int64_t heads = 0;
    int64_t kv_heads = 0;
    int64_t head_dim = 0;
};
// Causal scaled dot-product attention (FlashAttention's algorithm: Dao et al. 2022, and
// FlashAttention-2, Dao 2023). Query row i sits at position kv_len - q_len + i (the cached positions
// come first) and sees the keys j <= it:
//   s_ij = scale * q_i . k_j,  lse_i = log sum_j exp(s_ij),  out_i = sum_j exp(s_ij - lse_i) v_j
// Key tiles are visited with an online softmax (running max and sum), so no (q_len x kv_len)
// matrix is ever stored. lse holds the row statistics the backward recomputes the probabilities from.
// With softcap = cap > 0 each scaled score is soft-capped before the mask and the softmax (Gemma 2,
// Gemma Team 2024): s_ij = cap * tanh(scale * q_i . k_j / cap); 0 leaves the scores as they are.
struct AttentionForwardArgs {
    DType dtype = DType::F32;  // f32 or f64, every buffer; on the CPU also bf16: q, k, v, out bf16, lse f32
    AttentionDims dims;
    const void* q = nullptr;  // [batch, q_len, heads, head_dim]
    const void* k = nullptr;  // [batch, kv_len, kv_heads, head_dim]
    const void* v = nullptr;  // [batch, kv_len, kv_heads, head_dim]
    void* out = nullptr;      // [batch, q_len, heads, head_dim]
    void* lse = nullptr;      // [batch, heads, q_len]
    double scale = 1.0;
    double softcap = 0.0;  // cap >= 0; 0: off
};
// Its backward (FlashAttention-2's, with p_ij = exp(s_ij - lse_i) recomputed tile by tile):
//   delta_i = dout_i . out_i,  dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - delta_i) [* (1 - (s_ij / cap)^2)
//   with a softcap: tanh's derivative, from the capped score]
//   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_{i, h in j's group} ds_ij q_i,  dv_j = sum p_ij dout_i
// dq, dk, dv are written, not accumulated; each element is summed by one thread in a fixed order, so
// the bits do not depend on the thread count.
struct AttentionBackwardArgs {
    DType dtype = DType::F32;  // f32 or f64, every buffer; on the CPU also bf16: lse, delta f32, the rest bf16
    AttentionDims dims;
    const void* q = nullptr;     // [batch, q_len, heads, head_dim]
    const void* k = nullptr;     // [batch, kv_len, kv_heads, head_dim]
    const void* v = nullptr;     // [batch, kv_len, kv_heads, head_dim]
    const void* out = nullptr;   // [batch, q_len, heads, head_dim]: the forward's
    const void* dout = nullptr;  // [batch, q_len, heads, head_dim]
    const void* lse = nullptr;   // [batch, heads, q_len]: the forward's
    void* delta = nullptr;       // [batch, heads, q_len]: scratch the caller provides
    void* dq = nullptr;          // [batch, q_len, heads, head_dim]
    void* dk = nullptr;          // [batch, kv_len, kv_heads, head_dim]
    void* dv = nullptr;          // [batch, kv_len, kv_heads, head_dim]
    double scale = 1.0;
    double softcap = 0.0;  // the forward's
};

// The invariants of each struct (dtype, sizes, the pointers a flag requires), as NL_CHECKs: every
// backend calls these first, so the two backends assert the same things.
void check_kernel_args(const NormForwardArgs& a);
void check_kernel_args(const NormBackwardArgs& a);
void check_kernel_args(const DytForwardArgs& a);
void check_kernel_args(const DytBackwardArgs& a);
void check_kernel_args(const CrossEntropyForwardArgs& a);
void check_kernel_args(const CrossEntropyBackwardArgs& a);
void check_kernel_args(const AdamStepArgs& a);
void check_kernel_args(const SgdStepArgs& a);
void check_kernel_args(const AttentionForwardArgs& a);
void check_kernel_args(const AttentionBackwardArgs& a);

class Backend {
public:
    virtual ~Backend() = default;
    virtual Device device() const = 0;

    // Every kernel of the kernel table (core/kernels.def: each row's signature and what it computes),
    // pure virtual: a backend that lacks one cannot be instantiated, so it fails to compile.
#define NL_KERNEL(name, params, args, profile_label, flops, bytes) virtual void name params = 0;
#include "core/kernels.def"
#undef NL_KERNEL
};

// The kernel table's names, in its order ("copy", "fill", ..., "softcap_backward"), for tests that
// check every kernel is covered.
const std::vector<const char*>& kernel_names();

// The backend for a device; throws nl::Error for CUDA when built without it or with no GPU present.
Backend& backend_for(Device device);

}  // namespace nl
