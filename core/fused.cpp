// Fused kernels at the tensor level: checks (naming shapes and dtypes), allocation, contiguity, then
// one backend kernel. See core/fused.h for the API and core/backend.h for the formulas.
#include "core/fused.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"

namespace nl {

namespace {

// `t` must match `ref` in shape, dtype and device (and be contiguous when asked: in-place state).
void require_like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref,
                  bool need_contiguous) {
    NL_REQUIRE(t.defined(), op, ": ", name, " is undefined");
    NL_REQUIRE(t.shape() == ref.shape(), op, ": ", name, " has shape ", shape_str(t.shape()), " but ",
               ref_name, " has shape ", shape_str(ref.shape()));
    NL_REQUIRE(t.dtype() == ref.dtype(), op, ": ", name, " has dtype ", dtype_name(t.dtype()), " but ",
               ref_name, " has dtype ", dtype_name(ref.dtype()));
    NL_REQUIRE(t.device() == ref.device(), op, ": ", name, " is on ", t.device().str(), " but ", ref_name,
               " is on ", ref.device().str());
    NL_REQUIRE(!need_contiguous || t.is_contiguous(), op, ": ", name, " must be contiguous (it is updated ",
               "in place), found shape ", shape_str(t.shape()), " with strides ", shape_str(t.strides()));
}

void require_floating(const char* op, const char* name, const Tensor& t) {
    NL_REQUIRE(t.defined(), op, ": ", name, " is undefined");
    NL_REQUIRE(is_floating(t.dtype()), op, ": expected a floating dtype for ", name, ", found ",
               dtype_name(t.dtype()));
}

// The shape without its last dim: the per-row statistics of a norm, or a cross-entropy's targets.
Shape leading_shape(const Shape& shape) { return Shape(shape.begin(), shape.end() - 1); }

// x's last dim d and the statistic size k it asks for (-1: d).
int64_t norm_dims(const char* op, const Tensor& x, int64_t stat_count, int64_t& d) {
    require_floating(op, "x", x);
    NL_REQUIRE(x.dim() >= 1, op, ": expected x with at least 1 dim, found shape ", shape_str(x.shape()));
    d = x.size(-1);
    NL_REQUIRE(d >= 1, op, ": x's last dim must be non-empty, found shape ", shape_str(x.shape()));
    const int64_t k = stat_count < 0 ? d : stat_count;
    NL_REQUIRE(stat_count == -1 || (k >= 1 && k <= d), op, ": stat_count must be -1 or in [1, ", d,
               "] for x of shape ", shape_str(x.shape()), ", found ", stat_count);
    return k;
}

void require_norm_param(const char* op, const char* name, const Tensor& param, const Tensor& x, int64_t d) {
    if (!param.defined()) return;
    NL_REQUIRE(param.shape() == Shape{d}, op, ": ", name, " must have shape [", d, "] for x of shape ",
               shape_str(x.shape()), ", found ", shape_str(param.shape()));
    NL_REQUIRE(param.dtype() == x.dtype(), op, ": ", name, " has dtype ", dtype_name(param.dtype()),
               " but x has dtype ", dtype_name(x.dtype()));
    NL_REQUIRE(param.device() == x.device(), op, ": ", name, " is on ", param.device().str(), " but x is on ",
               x.device().str());
}

// A saved per-row statistic (mean or rstd) of x: shape x.shape[:-1], dtype compute_dtype(x).
void require_norm_stat(const char* op, const char* name, const Tensor& stat, const Tensor& x) {
    const Shape shape = leading_shape(x.shape());
    const DType dtype = compute_dtype(x.dtype());
    NL_REQUIRE(stat.defined(), op, ": the saved ", name, " is undefined");
    NL_REQUIRE(stat.shape() == shape && stat.dtype() == dtype, op, ": ", name, " must have shape ",
               shape_str(shape), " and dtype ", dtype_name(dtype), " for x of shape ", shape_str(x.shape()),
               ", found ", shape_str(stat.shape()), " ", dtype_name(stat.dtype()));
    NL_REQUIRE(stat.device() == x.device(), op, ": ", name, " is on ", stat.device().str(), " but x is on ",
               x.device().str());
}

// Raw pointer of a contiguous tensor, or null for an undefined one (absent weight/bias/state).
const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

int64_t partial_stat_count(int64_t d, double p) {
    NL_REQUIRE(p > 0.0 && p <= 1.0, "pRMSNorm: p must be in (0, 1], found ", p);
    NL_REQUIRE(d >= 1, "pRMSNorm: d must be >= 1, found ", d);
    const int64_t k = static_cast<int64_t>(std::ceil(p * static_cast<double>(d) - 1e-9));
    return std::min(std::max<int64_t>(k, 1), d);
}

NormForward norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         bool subtract_mean, int64_t stat_count) {
    const char* op = "norm_forward";
    int64_t d = 0;
    const int64_t k = norm_dims(op, x, stat_count, d);
    require_norm_param(op, "weight", weight, x, d);
    require_norm_param(op, "bias", bias, x, d);
    NL_REQUIRE(eps >= 0.0, op, ": eps must be >= 0, found ", eps);

    const Tensor xc = x.contiguous();                            // (rows, d)
    const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();  // (d)
    const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();      // (d)
    const int64_t rows = x.numel() / d;
    const DType stat_dtype = compute_dtype(x.dtype());
    NormForward out;
    out.y = Tensor::empty(x.shape(), x.dtype(), x.device());                       // (rows, d)
    out.rstd = Tensor::empty(leading_shape(x.shape()), stat_dtype, x.device());    // (rows)
    if (subtract_mean) out.mean = Tensor::empty(leading_shape(x.shape()), stat_dtype, x.device());  // (rows)
    if (rows == 0) return out;
    backend_for(x.device())
        .norm_forward({.dtype = x.dtype(), .x = xc.data_ptr(), .weight = ptr_or_null(wc), .bias = ptr_or_null(bc),
                       .y = out.y.data_ptr(), .mean = mut_ptr_or_null(out.mean), .rstd = out.rstd.data_ptr(),
                       .rows = rows, .d = d, .eps = eps, .subtract_mean = subtract_mean, .stat_count = k});
    return out;
}

NormBackward norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, bool subtract_mean, int64_t stat_count, bool need_dweight,
                           bool need_dbias) {
    const char* op = "norm_backward";
    int64_t d = 0;
    const int64_t k = norm_dims(op, x, stat_count, d);
    require_like(op, "dy", dy, "x", x, false);
    require_norm_param(op, "weight", weight, x, d);
    require_norm_stat(op, "rstd", rstd, x);
    if (subtract_mean) {
        NL_REQUIRE(mean.defined(), op, ": LayerNorm (subtract_mean) needs the saved mean, found none");
        require_norm_stat(op, "mean", mean, x);
    }

    const Tensor xc = x.contiguous();    // (rows, d)
    const Tensor dyc = dy.contiguous();  // (rows, d)
    const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();  // (d)
    const Tensor mc = subtract_mean ? mean.contiguous() : Tensor();      // (rows)
    const Tensor rc = rstd.contiguous();                                 // (rows)
    const int64_t rows = x.numel() / d;
    NormBackward out;
    out.dx = Tensor::empty(x.shape(), x.dtype(), x.device());  // (rows, d)
    if (weight.defined() && need_dweight) out.dweight = Tensor::empty({d}, weight.dtype(), x.device());
    if (need_dbias) out.dbias = Tensor::empty({d}, x.dtype(), x.device());
    // Called even for rows == 0: the kernel then writes zero dweight/dbias.
    backend_for(x.device())
        .norm_backward({.dtype = x.dtype(), .dy = dyc.data_ptr(), .x = xc.data_ptr(), .weight = ptr_or_null(wc),
                        .mean = ptr_or_null(mc), .rstd = rc.data_ptr(), .dx = out.dx.data_ptr(),
                        .dweight = mut_ptr_or_null(out.dweight), .dbias = mut_ptr_or_null(out.dbias), .rows = rows,
                        .d = d, .subtract_mean = subtract_mean, .stat_count = k});
    return out;
}

namespace {

// x (..., d) floating with d >= 1, and alpha [1] of x's dtype and device; returns d.
int64_t dyt_dims(const char* op, const Tensor& x, const Tensor& alpha) {
    int64_t d = 0;
    norm_dims(op, x, -1, d);
    NL_REQUIRE(alpha.defined(), op, ": alpha is undefined (expected shape [1])");
    NL_REQUIRE(alpha.shape() == Shape{1}, op, ": alpha must have shape [1], found ", shape_str(alpha.shape()));
    NL_REQUIRE(alpha.dtype() == x.dtype(), op, ": alpha has dtype ", dtype_name(alpha.dtype()), " but x has dtype ",
               dtype_name(x.dtype()));
    NL_REQUIRE(alpha.device() == x.device(), op, ": alpha is on ", alpha.device().str(), " but x is on ",
               x.device().str());
    return d;
}

}  // namespace

Tensor dyt_forward(const Tensor& x, const Tensor& alpha, const Tensor& weight, const Tensor& bias) {
    const char* op = "dyt_forward";
    const int64_t d = dyt_dims(op, x, alpha);
    require_norm_param(op, "weight", weight, x, d);
    require_norm_param(op, "bias", bias, x, d);

    const Tensor xc = x.contiguous();                                     // (rows, d)
    const Tensor ac = alpha.contiguous();                                 // (1)
    const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();  // (d)
    const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();      // (d)
    const int64_t rows = x.numel() / d;
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());  // (rows, d)
    if (rows == 0) return y;
    backend_for(x.device())
        .dyt_forward({.dtype = x.dtype(), .x = xc.data_ptr(), .alpha = ac.data_ptr(), .weight = ptr_or_null(wc),
                      .bias = ptr_or_null(bc), .y = y.data_ptr(), .rows = rows, .d = d});
    return y;
}

DytBackward dyt_backward(const Tensor& dy, const Tensor& x, const Tensor& alpha, const Tensor& weight,
                         bool need_dalpha, bool need_dweight, bool need_dbias) {
    const char* op = "dyt_backward";
    const int64_t d = dyt_dims(op, x, alpha);
    require_like(op, "dy", dy, "x", x, false);
    require_norm_param(op, "weight", weight, x, d);

    const Tensor xc = x.contiguous();                                     // (rows, d)
    const Tensor dyc = dy.contiguous();                                   // (rows, d)
    const Tensor ac = alpha.contiguous();                                 // (1)
    const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();  // (d)
    const int64_t rows = x.numel() / d;
    DytBackward out;
    out.dx = Tensor::empty(x.shape(), x.dtype(), x.device());  // (rows, d)
    if (need_dalpha) out.dalpha = Tensor::empty({1}, alpha.dtype(), x.device());
    if (weight.defined() && need_dweight) out.dweight = Tensor::empty({d}, weight.dtype(), x.device());
    if (need_dbias) out.dbias = Tensor::empty({d}, x.dtype(), x.device());
    // Called even for rows == 0: the kernel then writes zero dalpha/dweight/dbias.
    backend_for(x.device())
        .dyt_backward({.dtype = x.dtype(), .dy = dyc.data_ptr(), .x = xc.data_ptr(), .alpha = ac.data_ptr(),
                       .weight = ptr_or_null(wc), .dx = out.dx.data_ptr(), .dalpha = mut_ptr_or_null(out.dalpha),
                       .dweight = mut_ptr_or_null(out.dweight), .dbias = mut_ptr_or_null(out.dbias), .rows = rows,
                       .d = d});
    return out;
}

namespace {

// Checks logits (..., C) against targets (...) of i64, every target in [0, C) or ignore_index.
// Returns the number of non-ignored rows.
int64_t check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
    require_floating(op, "logits", logits);
    NL_REQUIRE(logits.dim() >= 1, op, ": expected logits with at least 1 dim (..., classes), found shape ",
               shape_str(logits.shape()));
    const int64_t classes = logits.size(-1);
    NL_REQUIRE(classes >= 1, op, ": logits need at least one class, found shape ", shape_str(logits.shape()));
    NL_REQUIRE(targets.defined(), op, ": targets is undefined");
    NL_REQUIRE(targets.dtype() == DType::I64, op, ": targets must be i64 class indices, found ",
               dtype_name(targets.dtype()));
    NL_REQUIRE(targets.shape() == leading_shape(logits.shape()), op, ": targets of shape ",
               shape_str(targets.shape()), " do not match logits of shape ", shape_str(logits.shape()),
               " (expected targets of shape ", shape_str(leading_shape(logits.shape())), ")");
    NL_REQUIRE(targets.device() == logits.device(), op, ": targets are on ", targets.device().str(),
               " but logits are on ", logits.device().str());
    int64_t count = 0;
    const std::vector<int64_t> values = targets.to_vector_as<int64_t>();
    for (size_t i = 0; i < values.size(); ++i) {
        const int64_t t = values[i];
        if (t == ignore_index) continue;
        NL_REQUIRE(t >= 0 && t < classes, op, ": target ", t, " at row ", i, " is out of range for ",
                   classes, " classes (ignore_index is ", ignore_index, ")");
        ++count;
    }
    return count;
}

// A stabilizer's coefficient (z_loss, softcap): finite and >= 0, 0 meaning off.
void require_coefficient(const char* op, const char* name, double value) {
    NL_REQUIRE(std::isfinite(value) && value >= 0.0, op, ": ", name, " must be finite and >= 0 (0: off), found ",
               value);
}

}  // namespace

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                          Reduction reduction, std::optional<DType> loss_dtype, double z_loss) {
    const char* op = "cross_entropy";
    require_coefficient(op, "z_loss", z_loss);
    CrossEntropyForward out;
    out.count = check_cross_entropy(op, logits, targets, ignore_index);
    const int64_t classes = logits.size(-1);
    const int64_t rows = targets.numel();
    const DType stat_dtype = compute_dtype(logits.dtype());
    // The rows' losses are computed in stat_dtype whatever the logits' dtype: an f32 loss of half
    // logits is those sums as they are, where the logits' dtype rounds them.
    const DType out_dtype = loss_dtype.value_or(logits.dtype());
    NL_REQUIRE(out_dtype == logits.dtype() || (is_half(logits.dtype()) && out_dtype == DType::F32), op,
               ": a loss in ", dtype_name(out_dtype), " for ", dtype_name(logits.dtype()),
               " logits: expected the logits' dtype, or f32 for bf16/f16 logits");
    const Tensor lc = logits.contiguous();   // (rows, classes)
    const Tensor tc = targets.contiguous();  // (rows)
    Tensor per_row = Tensor::empty(targets.shape(), stat_dtype, logits.device());  // (rows)
    out.lse = Tensor::empty(targets.shape(), stat_dtype, logits.device());        // (rows)
    // (rows): lse^2 of the scored rows, 0 for the ignored ones; only with a z-loss.
    Tensor lse_sq = z_loss > 0.0 ? Tensor::empty(targets.shape(), stat_dtype, logits.device()) : Tensor();
    if (rows > 0) {
        backend_for(logits.device())
            .cross_entropy_forward({.dtype = logits.dtype(), .logits = lc.data_ptr(),
                                    .targets = static_cast<const int64_t*>(tc.data_ptr()),
                                    .loss = per_row.data_ptr(), .lse = out.lse.data_ptr(),
                                    .lse_sq = mut_ptr_or_null(lse_sq), .rows = rows, .classes = classes,
                                    .ignore_index = ignore_index});
    }
    if (reduction == Reduction::None) {
        if (z_loss > 0.0) {
            const Tensor z_rows = lse_sq * z_loss;  // (rows)
            out.z_loss = z_rows.to(out_dtype);
            out.loss = (per_row + z_rows).to(out_dtype);
        } else {
            out.loss = per_row.to(out_dtype);
        }
        return out;
    }
    // Summed in row order in double: deterministic, and exact enough for any batch.
    auto reduce = [&](const Tensor& rows_values) {
        double total = 0.0;
        for (double v : rows_values.to_vector()) total += v;
        // Mean over zero rows is 0/0 = NaN, as PyTorch's cross_entropy gives.
        return reduction == Reduction::Mean ? total / static_cast<double>(out.count) : total;
    };
    const double value = reduce(per_row);
    if (z_loss > 0.0) {
        const double z_value = z_loss * reduce(lse_sq);
        out.z_loss = scalar_tensor(z_value, out_dtype, logits.device());
        out.loss = scalar_tensor(value + z_value, out_dtype, logits.device());
    } else {
        out.loss = scalar_tensor(value, out_dtype, logits.device());
    }
    return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index, Reduction reduction, double z_loss) {
    const char* op = "cross_entropy_backward";
    require_coefficient(op, "z_loss", z_loss);
    const int64_t count = check_cross_entropy(op, logits, targets, ignore_index);
    const int64_t classes = logits.size(-1);
    const int64_t rows = targets.numel();
    const DType stat_dtype = compute_dtype(logits.dtype());
    NL_REQUIRE(lse.defined() && lse.shape() == targets.shape() && lse.dtype() == stat_dtype, op,
               ": lse must be the forward's, of shape ", shape_str(targets.shape()), " and dtype ",
               dtype_name(stat_dtype), ", found ",
               lse.defined() ? shape_str(lse.shape()) + " " + dtype_name(lse.dtype()) : "undefined");
    NL_REQUIRE(lse.device() == logits.device(), op, ": lse is on ", lse.device().str(), " but logits are on ",
               logits.device().str());
    require_floating(op, "dloss", dloss);
    Tensor dloss_rows;  // (rows) in stat_dtype, for Reduction::None
    double scale = 1.0;
    if (reduction == Reduction::None) {
        NL_REQUIRE(dloss.shape() == targets.shape(), op, ": with reduction none dloss must have the targets' ",
                   "shape ", shape_str(targets.shape()), ", found ", shape_str(dloss.shape()));
        dloss_rows = dloss.to(stat_dtype).contiguous();
    } else {
        NL_REQUIRE(dloss.numel() == 1, op, ": with reduction mean/sum dloss must have one element, found ",
                   "shape ", shape_str(dloss.shape()));
        scale = dloss.item();
        // count == 0: every row is ignored and gets zeros, so the scale is never used.
        if (reduction == Reduction::Mean) scale = count > 0 ? scale / static_cast<double>(count) : 0.0;
    }
    const Tensor lc = logits.contiguous();   // (rows, classes)
    const Tensor tc = targets.contiguous();  // (rows)
    const Tensor sc = lse.contiguous();      // (rows)
    Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());  // (rows, classes)
    if (rows > 0) {
        backend_for(logits.device())
            .cross_entropy_backward({.dtype = logits.dtype(), .logits = lc.data_ptr(),
                                     .targets = static_cast<const int64_t*>(tc.data_ptr()), .lse = sc.data_ptr(),
                                     .dloss = ptr_or_null(dloss_rows), .scale = scale,
                                     .dlogits = dlogits.data_ptr(), .rows = rows, .classes = classes,
                                     .ignore_index = ignore_index, .z_loss = z_loss});
    }
    return dlogits;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction) {
    return cross_entropy_forward(logits, targets, ignore_index, reduction).loss;
}

namespace {

void require_optim_param(const char* op, const Tensor& param) {
    NL_REQUIRE(param.defined(), op, ": param is undefined");
    NL_REQUIRE(param.dtype() == DType::F32 || param.dtype() == DType::F64, op,
               ": expected f32 or f64 parameters, found ", dtype_name(param.dtype()));
    NL_REQUIRE(param.is_contiguous(), op, ": param must be contiguous (it is updated in place), found ",
               "shape ", shape_str(param.shape()), " with strides ", shape_str(param.strides()));
}

}  // namespace

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& params,
               int64_t step, const Tensor& max_exp_avg_sq) {
    const char* op = params.decoupled ? "adamw_step" : "adam_step";
    require_optim_param(op, param);
    require_like(op, "grad", grad, "param", param, false);
    require_like(op, "exp_avg", exp_avg, "param", param, true);
    require_like(op, "exp_avg_sq", exp_avg_sq, "param", param, true);
    if (params.amsgrad) {
        require_like(op, "max_exp_avg_sq", max_exp_avg_sq, "param", param, true);
    } else {
        NL_REQUIRE(!max_exp_avg_sq.defined(), op, ": max_exp_avg_sq given but amsgrad is off");
    }
    // PyTorch's constructor checks.
    NL_REQUIRE(params.lr >= 0.0, op, ": invalid learning rate ", params.lr, " (expected >= 0)");
    NL_REQUIRE(params.eps >= 0.0, op, ": invalid eps ", params.eps, " (expected >= 0)");
    NL_REQUIRE(params.beta1 >= 0.0 && params.beta1 < 1.0, op, ": invalid beta1 ", params.beta1,
               " (expected in [0, 1))");
    NL_REQUIRE(params.beta2 >= 0.0 && params.beta2 < 1.0, op, ": invalid beta2 ", params.beta2,
               " (expected in [0, 1))");
    NL_REQUIRE(params.weight_decay >= 0.0, op, ": invalid weight_decay ", params.weight_decay,
               " (expected >= 0)");
    NL_REQUIRE(step >= 1, op, ": step counts from 1, found ", step);
    if (param.numel() == 0) return;
    const Tensor gc = grad.contiguous();
    backend_for(param.device())
        .adam_step({.dtype = param.dtype(), .param = param.data_ptr(), .grad = gc.data_ptr(),
                    .exp_avg = exp_avg.data_ptr(), .exp_avg_sq = exp_avg_sq.data_ptr(),
                    .max_exp_avg_sq = params.amsgrad ? max_exp_avg_sq.data_ptr() : nullptr, .n = param.numel(),
                    .lr = params.lr, .beta1 = params.beta1, .beta2 = params.beta2, .eps = params.eps,
                    .weight_decay = params.weight_decay, .step = step, .decoupled = params.decoupled});
}

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdParams& params,
              bool first_step) {
    const char* op = "sgd_step";
    require_optim_param(op, param);
    require_like(op, "grad", grad, "param", param, false);
    NL_REQUIRE(params.lr >= 0.0, op, ": invalid learning rate ", params.lr, " (expected >= 0)");
    NL_REQUIRE(params.momentum >= 0.0, op, ": invalid momentum ", params.momentum, " (expected >= 0)");
    NL_REQUIRE(params.weight_decay >= 0.0, op, ": invalid weight_decay ", params.weight_decay,
               " (expected >= 0)");
    NL_REQUIRE(!params.nesterov || (params.momentum > 0.0 && params.dampening == 0.0), op,
               ": nesterov momentum requires a momentum and zero dampening, found momentum ", params.momentum,
               " and dampening ", params.dampening);
    if (params.momentum != 0.0) require_like(op, "momentum_buffer", momentum_buffer, "param", param, true);
    if (param.numel() == 0) return;
    const Tensor gc = grad.contiguous();
    backend_for(param.device())
        .sgd_step({.dtype = param.dtype(), .param = param.data_ptr(), .grad = gc.data_ptr(),
                   .momentum_buffer = params.momentum != 0.0 ? momentum_buffer.data_ptr() : nullptr,
                   .n = param.numel(), .lr = params.lr, .momentum = params.momentum, .dampening = params.dampening,
                   .weight_decay = params.weight_decay, .nesterov = params.nesterov, .first_step = first_step});
}

// The dtype the rope, SwiGLU and attention kernels read and write for x: the CPU's read bf16 as it is
// (f32 math), so a bf16 tensor is not widened into an f32 copy and narrowed back; elsewhere, and for
// f16, the compute dtype.
namespace {
DType kernel_io_dtype(const Tensor& x) {
    return x.dtype() == DType::BF16 && x.device().is_cpu() ? DType::BF16 : compute_dtype(x.dtype());
}
}  // namespace

Tensor rope_rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
    const char* op = "rope_rotate";
    require_floating(op, "x", x);
    NL_REQUIRE(x.dim() == 4 && x.size(3) % 2 == 0, op, ": expected x of shape (B, T, H, head_dim) with an even "
               "head_dim, found ", shape_str(x.shape()));
    const int64_t B = x.size(0), T = x.size(1), H = x.size(2), hd = x.size(3);
    const DType compute = compute_dtype(x.dtype());
    auto check_table = [&](const char* name, const Tensor& table) {
        const Shape want{T, hd / 2};
        NL_REQUIRE(table.defined() && table.shape() == want, op, ": ", name, " must have shape [", T,
                   ", ", hd / 2, "] for x of shape ", shape_str(x.shape()), ", found ",
                   table.defined() ? shape_str(table.shape()) : std::string("undefined"));
        NL_REQUIRE(table.dtype() == compute, op, ": ", name, " must be ", dtype_name(compute), " for x of dtype ",
                   dtype_name(x.dtype()), ", found ", dtype_name(table.dtype()));
        NL_REQUIRE(table.device() == x.device(), op, ": ", name, " is on ", table.device().str(), " but x is on ",
                   x.device().str());
    };
    check_table("cos", cos);
    check_table("sin", sin);
    const DType io = kernel_io_dtype(x);
    const Tensor xc = x.to(io).contiguous();  // (B, T, H, hd)
    const Tensor cc = cos.contiguous(), sc = sin.contiguous();  // (T, hd / 2) each
    Tensor out = Tensor::empty(x.shape(), io, x.device());  // (B, T, H, hd)
    if (out.numel() > 0)
        backend_for(x.device()).rope(io, xc.data_ptr(), cc.data_ptr(), sc.data_ptr(), out.data_ptr(), B, T, H, hd, inverse);
    return out.to(x.dtype());
}

Tensor swiglu_forward(const Tensor& a, const Tensor& b) {
    const char* op = "swiglu";
    require_floating(op, "a", a);
    require_like(op, "b", b, "a", a, false);
    const DType io = kernel_io_dtype(a);
    const Tensor ac = a.to(io).contiguous(), bc = b.to(io).contiguous();
    Tensor out = Tensor::empty(a.shape(), io, a.device());
    if (out.numel() > 0)
        backend_for(a.device()).swiglu_forward(io, ac.data_ptr(), bc.data_ptr(), out.data_ptr(), out.numel());
    return out.to(a.dtype());
}

SwigluBackward swiglu_backward(const Tensor& dout, const Tensor& a, const Tensor& b) {
    const char* op = "swiglu_backward";
    require_floating(op, "a", a);
    require_like(op, "b", b, "a", a, false);
    require_like(op, "dout", dout, "a", a, false);
    const DType io = kernel_io_dtype(a);
    const Tensor ac = a.to(io).contiguous(), bc = b.to(io).contiguous(), dc = dout.to(io).contiguous();
    SwigluBackward g{Tensor::empty(a.shape(), io, a.device()), Tensor::empty(a.shape(), io, a.device())};
    if (ac.numel() > 0)
        backend_for(a.device())
            .swiglu_backward(io, ac.data_ptr(), bc.data_ptr(), dc.data_ptr(), g.da.data_ptr(), g.db.data_ptr(),
                             ac.numel());
    g.da = g.da.to(a.dtype());
    g.db = g.db.to(b.dtype());
    return g;
}

namespace {

void require_cap(const char* op, double cap) {
    NL_REQUIRE(std::isfinite(cap) && cap > 0.0, op, ": cap must be finite and > 0, found ", cap);
}

}  // namespace

Tensor softcap_forward(const Tensor& x, double cap) {
    const char* op = "softcap";
    require_floating(op, "x", x);
    require_cap(op, cap);
    const DType io = kernel_io_dtype(x);
    const Tensor xc = x.to(io).contiguous();
    Tensor y = Tensor::empty(x.shape(), io, x.device());
    if (y.numel() > 0) backend_for(x.device()).softcap_forward(io, xc.data_ptr(), y.data_ptr(), y.numel(), cap);
    return y.to(x.dtype());
}

Tensor softcap_backward(const Tensor& dy, const Tensor& y, double cap) {
    const char* op = "softcap_backward";
    require_floating(op, "y", y);
    require_like(op, "dy", dy, "y", y, false);
    require_cap(op, cap);
    const DType io = kernel_io_dtype(y);
    const Tensor yc = y.to(io).contiguous(), dc = dy.to(io).contiguous();
    Tensor dx = Tensor::empty(y.shape(), io, y.device());
    if (dx.numel() > 0)
        backend_for(y.device()).softcap_backward(io, yc.data_ptr(), dc.data_ptr(), dx.data_ptr(), dx.numel(), cap);
    return dx.to(y.dtype());
}

namespace {

// Checks q (B, T, H, hd) and k, v (B, L, KV, hd) of causal attention; returns (B, T, L, H, KV, hd).
std::array<int64_t, 6> attention_dims(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
    require_floating(op, "q", q);
    require_floating(op, "k", k);
    require_floating(op, "v", v);
    NL_REQUIRE(q.dim() == 4, op, ": expected q of shape (B, T, heads, head_dim), found ", shape_str(q.shape()));
    NL_REQUIRE(k.dim() == 4, op, ": expected k of shape (B, L, kv_heads, head_dim), found ", shape_str(k.shape()));
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hd = q.size(3);
    const int64_t L = k.size(1), KV = k.size(2);
    NL_REQUIRE(k.size(0) == B && k.size(3) == hd && KV > 0 && H % KV == 0, op, ": k must have shape (", B,
               ", L, kv_heads, ", hd, ") with kv_heads dividing ", H, " for q of shape ", shape_str(q.shape()),
               ", found ", shape_str(k.shape()));
    NL_REQUIRE(v.shape() == k.shape(), op, ": v must have k's shape ", shape_str(k.shape()), ", found ",
               shape_str(v.shape()));
    NL_REQUIRE(L >= T, op, ": the keys (", L, " positions) must cover the queries (", T, " positions)");
    NL_REQUIRE(hd > 0, op, ": head_dim must be > 0, found ", hd);
    NL_REQUIRE(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op, ": q, k and v must share a dtype, found ",
               dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
    NL_REQUIRE(k.device() == q.device() && v.device() == q.device(), op, ": q, k and v must be on one device, found ",
               q.device().str(), ", ", k.device().str(), ", ", v.device().str());
    return {B, T, L, H, KV, hd};
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double softcap) {
    const auto [B, T, L, H, KV, hd] = attention_dims("attention", q, k, v);
    require_coefficient("attention", "softcap", softcap);
    const DType compute = compute_dtype(q.dtype()), io = kernel_io_dtype(q);
    const Tensor qc = q.to(io).contiguous(), kc = k.to(io).contiguous(), vc = v.to(io).contiguous();
    AttentionForward f;
    f.out = Tensor::empty(q.shape(), io, q.device());       // (B, T, H, hd)
    f.lse = Tensor::empty({B, H, T}, compute, q.device());  // (B, H, T)
    if (f.out.numel() > 0)
        backend_for(q.device())
            .attention_forward({.dtype = io, .dims = {B, T, L, H, KV, hd}, .q = qc.data_ptr(),
                                .k = kc.data_ptr(), .v = vc.data_ptr(), .out = f.out.data_ptr(),
                                .lse = f.lse.data_ptr(), .scale = 1.0 / std::sqrt(static_cast<double>(hd)),
                                .softcap = softcap});
    f.out = f.out.to(q.dtype());
    return f;
}

AttentionBackward attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, double softcap) {
    const char* op = "attention_backward";
    const auto [B, T, L, H, KV, hd] = attention_dims(op, q, k, v);
    require_coefficient(op, "softcap", softcap);
    require_like(op, "dout", dout, "q", q, false);
    require_like(op, "out", out, "q", q, false);
    const DType compute = compute_dtype(q.dtype());
    NL_REQUIRE(lse.defined() && lse.shape() == Shape({B, H, T}) && lse.dtype() == compute, op, ": lse must be ",
               dtype_name(compute), " of shape [", B, ", ", H, ", ", T, "], found ",
               lse.defined() ? std::string(dtype_name(lse.dtype())) + " " + shape_str(lse.shape()) : std::string("undefined"));
    const DType io = kernel_io_dtype(q);
    auto in = [&](const Tensor& t) { return t.to(io).contiguous(); };
    const Tensor qc = in(q), kc = in(k), vc = in(v), oc = in(out), dc = in(dout), lc = lse.contiguous();
    AttentionBackward g;
    g.dq = Tensor::empty(q.shape(), io, q.device());
    g.dk = Tensor::empty(k.shape(), io, q.device());
    g.dv = Tensor::empty(v.shape(), io, q.device());
    Tensor delta = Tensor::empty({B, H, T}, compute, q.device());  // (B, H, T) scratch
    if (g.dk.numel() > 0) {
        if (g.dq.numel() == 0) {  // no queries: nothing reaches the keys
            g.dk.fill_(0.0);
            g.dv.fill_(0.0);
        } else {
            backend_for(q.device())
                .attention_backward({.dtype = io, .dims = {B, T, L, H, KV, hd}, .q = qc.data_ptr(),
                                     .k = kc.data_ptr(), .v = vc.data_ptr(), .out = oc.data_ptr(),
                                     .dout = dc.data_ptr(), .lse = lc.data_ptr(), .delta = delta.data_ptr(),
                                     .dq = g.dq.data_ptr(), .dk = g.dk.data_ptr(), .dv = g.dv.data_ptr(),
                                     .scale = 1.0 / std::sqrt(static_cast<double>(hd)), .softcap = softcap});
        }
    }
    g.dq = g.dq.to(q.dtype());
    g.dk = g.dk.to(k.dtype());
    g.dv = g.dv.to(v.dtype());
    return g;
}

}  // namespace nl
