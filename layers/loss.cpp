// Losses: MSE, and cross-entropy fused (one node over the core kernels) and composed (autograd ops).
#include "layers/loss.h"

#include <cmath>
#include <optional>

#include "autograd/fused_node.h"
#include "layers/autocast.h"

namespace nl {

Var mse_loss(const Var& input, const Var& target) {
    NL_REQUIRE(input.defined() && target.defined(), "mse_loss: input and target must be defined");
    NL_REQUIRE(input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()),
               " and target ", shape_str(target.shape()), " must have the same shape");
    return mean(square(input - target));
}

namespace {

const char* reduction_name(Reduction reduction) {
    switch (reduction) {
        case Reduction::None: return "none";
        case Reduction::Mean: return "mean";
        case Reduction::Sum: return "sum";
    }
    return "?";
}

void check_z_loss(const char* op, double z_loss) {
    NL_REQUIRE(std::isfinite(z_loss) && z_loss >= 0.0, op, ": z_loss must be finite and >= 0 (0: off), found ",
               z_loss);
}

void check_cross_entropy_args(const char* op, const Var& logits, const Tensor& targets) {
    NL_REQUIRE(logits.defined() && targets.defined(), op, ": logits and targets must be defined");
    NL_REQUIRE(targets.dtype() == DType::I64, op, ": expected i64 targets, found ", dtype_name(targets.dtype()));
    NL_REQUIRE(logits.dim() >= 1, op, ": expected logits (..., C), found ", shape_str(logits.shape()));
    Shape rows(logits.shape().begin(), logits.shape().end() - 1);
    NL_REQUIRE(targets.shape() == rows, op, ": logits ", shape_str(logits.shape()), " need targets of shape ",
               shape_str(rows), ", found ", shape_str(targets.shape()));
}

}  // namespace

namespace {

// The fused node: cross_entropy_loss with z_loss = 0, and its z term (undefined at 0) through z_term.
Var fused_cross_entropy(const Var& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction,
                        double z_loss, Tensor* z_term) {
    // Under autocast the loss is computed in f32 (torch.autocast's fp32 list): the kernel reads half
    // logits as they are, widening each row exactly, so the f32 loss is that of an f32 copy without
    // the copy, and the backward rounds dlogits to the logits' dtype once, as the copy's cast would.
    const std::optional<DType> loss_dtype =
        autocast_widens(logits.dtype()) ? std::optional<DType>(DType::F32) : std::nullopt;
    CrossEntropyForward f = cross_entropy_forward(logits.data(), targets, ignore_index, reduction, loss_dtype, z_loss);
    if (z_term != nullptr) *z_term = f.z_loss;
    // Saves the logits, each row's logsumexp and the targets: the backward recomputes
    // softmax = exp(logit - lse) instead of keeping a (..., C) probability tensor.
    // The logits are saved as a Var (the same storage): under create_graph the backward is the
    // composed form's autograd (make_fused_result), which differentiates through them.
    return make_fused_result(
        f.loss, "cross_entropy", {logits},
        {{"logits", logits}, {"lse", f.lse}, {"targets", targets}}, {0},
        [ignore_index, reduction, z_loss](const Var& dloss, const std::vector<Var>& saved) -> std::vector<Var> {
            Tensor dlogits = cross_entropy_backward(dloss.data(), saved[0].data(), saved[2].data(),
                                                    saved[1].data(), ignore_index, reduction, z_loss);
            return {Var(dlogits)};
        },
        [targets, ignore_index, reduction, z_loss, loss_dtype = f.loss.dtype()](const std::vector<Var>& in) {
            // Half logits give an f32 loss whether or not autocast is still on when backward runs.
            const Var logits = in[0].dtype() == loss_dtype ? in[0] : to(in[0], loss_dtype);
            return cross_entropy_z_loss_composed(logits, targets, z_loss, ignore_index, reduction).loss;
        });
}

// The composed cross-entropy's rows: -log_softmax(logits)[target] (0 for ignored rows), and the 0/1
// mask of the scored rows with their count. `logits` is already autocast's f32 where it applies.
struct ComposedRows {
    Var losses;   // (...)
    Tensor mask;  // (...) in the logits' dtype: 1 scored, 0 ignored
    int64_t count = 0;
};

ComposedRows composed_rows(const char* op, const Var& logits, const Tensor& targets, int64_t ignore_index) {
    const int64_t classes = logits.size(-1);
    // Host-side mask: ignored rows gather class 0 (any valid index) and are multiplied by 0.
    std::vector<int64_t> ids = targets.to_vector_as<int64_t>();
    std::vector<double> keep(ids.size());
    ComposedRows rows;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == ignore_index) {
            ids[i] = 0;
            keep[i] = 0.0;
            continue;
        }
        NL_REQUIRE(ids[i] >= 0 && ids[i] < classes, op, ": target ", ids[i], " at row ", i,
                   " is out of range for ", classes, " classes (ignore_index ", ignore_index, ")");
        keep[i] = 1.0;
        ++rows.count;
    }
    Tensor safe = from_vector(ids, targets.shape()).to(logits.device());               // (...)
    rows.mask = from_vector(keep, targets.shape(), logits.dtype()).to(logits.device());  // (...)
    Var logp = log_softmax(logits, -1);                                                  // (..., C)
    Var picked = squeeze(gather(logp, -1, safe.unsqueeze(-1)), -1);                      // (...)
    rows.losses = -(picked * Var(rows.mask));                                            // (...)
    return rows;
}

// Mean (over the scored rows), Sum or None of per-row values.
Var reduce_rows(const Var& rows, Reduction reduction, int64_t count) {
    switch (reduction) {
        case Reduction::None: return rows;
        case Reduction::Sum: return sum(rows);
        case Reduction::Mean: return sum(rows) / static_cast<double>(count);  // 0/0 = NaN as PyTorch
    }
    throw InternalError("cross_entropy: unknown reduction");
}

}  // namespace

Var cross_entropy_loss(const Var& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction) {
    check_cross_entropy_args("cross_entropy", logits, targets);
    return fused_cross_entropy(logits, targets, ignore_index, reduction, 0.0, nullptr);
}

Var cross_entropy_loss_composed(const Var& logits_in, const Tensor& targets, int64_t ignore_index,
                                Reduction reduction) {
    const char* op = "cross_entropy_composed";
    check_cross_entropy_args(op, logits_in, targets);
    const Var logits = autocast_f32(logits_in);  // under autocast, log_softmax runs in f32
    const ComposedRows rows = composed_rows(op, logits, targets, ignore_index);
    return reduce_rows(rows.losses, reduction, rows.count);
}

CrossEntropyTerms cross_entropy_z_loss(const Var& logits, const Tensor& targets, double z_loss, int64_t ignore_index,
                                       Reduction reduction) {
    const char* op = "cross_entropy_z_loss";
    check_cross_entropy_args(op, logits, targets);
    check_z_loss(op, z_loss);
    CrossEntropyTerms terms;
    terms.loss = fused_cross_entropy(logits, targets, ignore_index, reduction, z_loss, &terms.z_loss);
    if (!terms.z_loss.defined()) terms.z_loss = zeros_like(terms.loss.data());  // z_loss == 0
    return terms;
}

CrossEntropyTerms cross_entropy_z_loss_composed(const Var& logits_in, const Tensor& targets, double z_loss,
                                                int64_t ignore_index, Reduction reduction) {
    const char* op = "cross_entropy_z_loss_composed";
    check_cross_entropy_args(op, logits_in, targets);
    check_z_loss(op, z_loss);
    const Var logits = autocast_f32(logits_in);
    const ComposedRows rows = composed_rows(op, logits, targets, ignore_index);
    CrossEntropyTerms terms;
    if (z_loss == 0.0) {
        terms.loss = reduce_rows(rows.losses, reduction, rows.count);
        terms.z_loss = zeros_like(terms.loss.data());
        return terms;
    }
    // lse = m + log(sum(exp(logits - m))) with m each row's max as a constant: any m gives the same
    // lse and gradient (softmax); the max keeps exp from overflowing.
    const Var m(max(logits.data(), {-1}, true));                            // (..., 1), no grad
    const Var lse = squeeze(log(sum(exp(logits - m), {-1}, true)) + m, -1);  // (...)
    const Var z = reduce_rows(square(lse) * Var(rows.mask), reduction, rows.count) * z_loss;
    terms.loss = reduce_rows(rows.losses, reduction, rows.count) + z;
    terms.z_loss = z.data().clone();
    return terms;
}

std::string CrossEntropyLoss::extra_repr() const {
    return detail::concat("ignore_index=", options_.ignore_index, ", reduction=", reduction_name(options_.reduction),
                          ", fused=", options_.fused ? "true" : "false",
                          options_.z_loss != 0.0 ? detail::concat(", z_loss=", options_.z_loss) : std::string());
}

Var CrossEntropyLoss::forward(const Var& logits, const Tensor& targets) {
    if (options_.z_loss != 0.0) return forward_terms(logits, targets).loss;
    return options_.fused ? cross_entropy_loss(logits, targets, options_.ignore_index, options_.reduction)
                          : cross_entropy_loss_composed(logits, targets, options_.ignore_index, options_.reduction);
}

CrossEntropyTerms CrossEntropyLoss::forward_terms(const Var& logits, const Tensor& targets) {
    return options_.fused
               ? cross_entropy_z_loss(logits, targets, options_.z_loss, options_.ignore_index, options_.reduction)
               : cross_entropy_z_loss_composed(logits, targets, options_.z_loss, options_.ignore_index,
                                               options_.reduction);
}

}  // namespace nl
