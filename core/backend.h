// The one backend interface: one function per kernel, forward and backward next to each other.
// Kernels take raw pointers and explicit sizes; ops.cpp does the checking, broadcasting and
// allocation. A backend implements every pure virtual here, so a missing kernel fails to compile
// (an abstract class cannot be instantiated). Floating kernels see f32 or f64 only: ops convert
// bf16/f16 to f32 first (copy/fill see every dtype).
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

class Backend {
public:
    virtual ~Backend() = default;
    virtual Device device() const = 0;

    // ---- memory ----
    // dst[i] = convert(src[i]) over `shape`; any dtype to any dtype (rounding to nearest even).
    virtual void copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) = 0;
    virtual void fill(const Shape& shape, const StridedArg& dst, double value) = 0;

    // ---- elementwise (out, a, b share the dtype; comparisons write 1/0) ----
    virtual void binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                        const StridedArg& b) = 0;
    virtual void unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) = 0;
    // out = cond != 0 ? a : b; cond may be any dtype, out/a/b share one.
    virtual void where(const Shape& shape, const StridedArg& out, const StridedArg& cond,
                       const StridedArg& a, const StridedArg& b) = 0;

    // ---- reductions: in is contiguous (outer, len, inner); out is contiguous (outer, inner) ----
    // Var uses two passes with `correction` (1 unbiased, 0 biased). ArgMax writes i64.
    virtual void reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len,
                        int64_t inner, int64_t correction) = 0;

    // ---- softmax rows: x, y, dy, dx contiguous (rows, cols) ----
    virtual void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                                 bool log) = 0;
    // dx = y * (dy - sum(dy * y)) for softmax; dx = dy - exp(y) * sum(dy) for log_softmax.
    virtual void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                                  int64_t cols, bool log) = 0;

    // ---- matrix multiply, row-major, batched by element strides (stride 0 broadcasts) ----
    // C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]; op(A) is (m, k), op(B) is (k, n).
    virtual void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                      int64_t ldb, int64_t stride_b, double beta, void* c, int64_t ldc,
                      int64_t stride_c, int64_t batch) = 0;

    // ---- indexing: contiguous operands viewed as (outer, size, inner) along the indexed dim ----
    // out(outer, n, inner) = src(outer, index[j], inner)
    virtual void index_select(DType dtype, const void* src, const int64_t* index, void* out,
                              int64_t outer, int64_t src_size, int64_t inner, int64_t n) = 0;
    // dst(outer, index[j], inner) += src(outer, j, inner), in order of j (deterministic)
    virtual void index_add(DType dtype, void* dst, const int64_t* index, const void* src,
                           int64_t outer, int64_t dst_size, int64_t inner, int64_t n) = 0;
    // out(o, j, i) = src(o, index(o, j, i), i); index and out are (outer, n, inner)
    virtual void gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                        int64_t src_size, int64_t inner, int64_t n) = 0;
    // dst(o, index(o, j, i), i) += src(o, j, i), in order of j (deterministic)
    virtual void scatter_add(DType dtype, void* dst, const int64_t* index, const void* src,
                             int64_t outer, int64_t dst_size, int64_t inner, int64_t n) = 0;

    // ---- fused kernels (norms, loss, optimizer) ----
    // Unlike the kernels above these read and write bf16/f16 themselves (converting to f32 in
    // registers), so a half-precision norm moves only half-precision bytes.

    // One norm over the last dim of contiguous x (rows, d) serves LayerNorm, RMSNorm, RMSNorm with
    // bias and pRMSNorm. Statistics use the first `stat_count` (k, 1..d) elements of each row:
    //   subtract_mean: mean = sum_k(x)/k, var = sum_k((x-mean)^2)/k (two-pass, biased),
    //                  rstd = 1/sqrt(var + eps), y = (x - mean) * rstd * w + b
    //   else (RMS):    rstd = 1/sqrt(sum_k(x^2)/k + eps) (eps inside the sqrt, as LLaMA),
    //                  y = x * rstd * w + b
    // x, y, weight (d), bias (d) have `dtype` (f32, f64, bf16, f16); weight/bias may be null (1, 0).
    // mean (rows; null or ignored unless subtract_mean) and rstd (rows) are f64 for f64, else f32.
    virtual void norm_forward(DType dtype, const void* x, const void* weight, const void* bias, void* y,
                              void* mean, void* rstd, int64_t rows, int64_t d, double eps,
                              bool subtract_mean, int64_t stat_count) = 0;
    // Closed-form backward of norm_forward given its saved mean/rstd. With xhat = (x - mean) * rstd,
    // g = dy * w and S the first k elements (llm.c layernorm_backward, generalized to k <= d):
    //   dx_j = rstd * (g_j - [j in S] * (sum_d(g)/k [subtract_mean only] + xhat_j * sum_d(g*xhat)/k))
    //   dweight = sum_rows(dy * xhat), dbias = sum_rows(dy), deterministic (no atomics; the same
    //   bits for any thread count). dweight/dbias (d, dtype) may be null; weight null means 1.
    virtual void norm_backward(DType dtype, const void* dy, const void* x, const void* weight,
                               const void* mean, const void* rstd, void* dx, void* dweight, void* dbias,
                               int64_t rows, int64_t d, bool subtract_mean, int64_t stat_count) = 0;

    // Cross-entropy over contiguous logits (rows, classes) of `dtype` (f32, f64, bf16, f16) with
    // i64 targets (rows), each in [0, classes) or equal to ignore_index (checked by the caller).
    // Writes lse (rows) = logsumexp(logits row) and loss (rows) = lse - logit[target] (0 for ignored
    // rows), both f64 for f64, else f32.
    virtual void cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets,
                                       void* loss, void* lse, int64_t rows, int64_t classes,
                                       int64_t ignore_index) = 0;
    // dlogits (rows, classes; `dtype`) = (softmax(logits) - onehot(target)) * dloss[r] * scale, with
    // dloss (rows; f64 for f64, else f32) or null meaning 1; ignored rows get exact zeros.
    virtual void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets,
                                        const void* lse, const void* dloss, double scale,
                                        void* dlogits, int64_t rows, int64_t classes,
                                        int64_t ignore_index) = 0;

    // One pass of Adam (decoupled=false, L2 decay added to the gradient) or AdamW (decoupled=true,
    // p *= 1 - lr*wd) over n contiguous elements of f32 or f64, in place, in the exact op order of
    // PyTorch's _single_tensor_adam; `step` counts from 1 (already incremented). max_exp_avg_sq is
    // null, or AMSGrad's running max of exp_avg_sq.
    virtual void adam_step(DType dtype, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                           void* max_exp_avg_sq, int64_t n, double lr, double beta1, double beta2,
                           double eps, double weight_decay, int64_t step, bool decoupled) = 0;
    // SGD as PyTorch: g += wd*p; with momentum: buf = g on the first step, else
    // buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
    // momentum_buffer is null when momentum == 0.
    virtual void sgd_step(DType dtype, void* param, const void* grad, void* momentum_buffer, int64_t n,
                          double lr, double momentum, double dampening, double weight_decay,
                          bool nesterov, bool first_step) = 0;

    // Rotary position embedding (RoFormer; LLaMA's apply_rotary_emb): x and out (batch, seq, heads,
    // head_dim) contiguous, cos and sin (seq, head_dim / 2), all `dtype` (f32 or f64). Each (even, odd)
    // pair i of position t turns by angle t * theta_i, in the order of torch's complex product:
    //   out[2i] = x[2i] cos - x[2i+1] sin,  out[2i+1] = x[2i] sin + x[2i+1] cos
    // With `inverse`, by -angle (sin negated): the backward, since a rotation's transpose is its inverse.
    virtual void rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                      int64_t seq, int64_t heads, int64_t head_dim, bool inverse) = 0;
    // SwiGLU's gate (Shazeer 2020, "GLU Variants Improve Transformer"; LLaMA's FeedForward): over n
    // contiguous elements of f32 or f64, with s = sigmoid(a) and silu(a) = a * s,
    //   forward:  out = silu(a) * b
    //   backward: da = dout * b * s * (1 + a * (1 - s)),  db = dout * silu(a)
    // One pass each way instead of silu, mul and their backwards.
    virtual void swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) = 0;
    virtual void swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                                 int64_t n) = 0;

    // Causal scaled dot-product attention (FlashAttention's algorithm: Dao et al. 2022, and
    // FlashAttention-2, Dao 2023). q and out (batch, q_len, heads, head_dim), k and v (batch, kv_len,
    // kv_heads, head_dim), all contiguous `dtype` (f32 or f64); heads % kv_heads == 0 and query head h
    // reads kv head h / (heads / kv_heads) (grouped-query attention, no repeated copies). Query row i
    // sits at position kv_len - q_len + i (the cached positions come first) and sees the keys j <= it:
    //   s_ij = scale * q_i . k_j,  lse_i = log sum_j exp(s_ij),  out_i = sum_j exp(s_ij - lse_i) v_j
    // Key tiles are visited with an online softmax (running max and sum), so no (q_len x kv_len)
    // matrix is ever stored. lse (batch, heads, q_len) is f64 for f64, else f32: the row statistics
    // the backward recomputes the probabilities from.
    virtual void attention_forward(DType dtype, const void* q, const void* k, const void* v, void* out, void* lse,
                                   int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, double scale) = 0;
    // Its backward (FlashAttention-2's, with p_ij = exp(s_ij - lse_i) recomputed tile by tile):
    //   delta_i = dout_i . out_i,  dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - delta_i)
    //   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_{i, h in j's group} ds_ij q_i,  dv_j = sum p_ij dout_i
    // delta (batch, heads, q_len; lse's dtype) is scratch the caller provides. dq, dk, dv are written,
    // not accumulated; each element is summed by one thread in a fixed order, so the bits do not
    // depend on the thread count.
    virtual void attention_backward(DType dtype, const void* q, const void* k, const void* v, const void* out,
                                    const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                                    int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, double scale) = 0;
};

// The sizes attention_forward/backward accept: the op layer (core/fused.cpp) has already refused bad
// ones with a message for the user, so a backend only checks the invariant (InternalError).
inline void check_attention_sizes(int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim) {
    NL_CHECK(batch >= 0 && q_len >= 0 && kv_len >= q_len && (kv_len > 0 || q_len == 0) && head_dim > 0 &&
                 kv_heads > 0 && heads % kv_heads == 0,
             "attention sizes: batch ", batch, ", q_len ", q_len, ", kv_len ", kv_len, ", heads ", heads,
             ", kv_heads ", kv_heads, ", head_dim ", head_dim);
}

// The backend for a device; throws nl::Error for CUDA when built without it or with no GPU present.
Backend& backend_for(Device device);

}  // namespace nl
