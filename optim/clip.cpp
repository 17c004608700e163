// Global L2-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ (norm_type 2,
// error_if_nonfinite false): one norm over all grads, one scale for all.
#include "optim/clip.h"

#include <cmath>

#include "core/ops.h"

namespace nl {

double grad_norm(const std::vector<Var>& params) {
    // Each grad's sum of squares is summed in double by the kernel (a sum over millions of f32 squares
    // loses digits in f32), in one pass over the grad; the totals are added in double.
    double total = 0.0;
    for (const Var& p : params) {
        NL_REQUIRE(p.defined(), "clip_grad_norm_: a parameter is undefined");
        const Var g = p.grad();
        if (!g.defined() || g.numel() == 0) continue;
        total += sum_of_squares(g.data()).item();
    }
    return std::sqrt(total);
}

double clip_grad_norm_(const std::vector<Var>& params, double max_norm) {
    NL_REQUIRE(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, found ", max_norm);
    const double total = grad_norm(params);
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.0, and always applied.
    const double scale = std::min(max_norm / (total + 1e-6), 1.0);
    if (scale == 1.0) return total;  // multiplying by 1 changes nothing
    for (const Var& p : params) {
        const Var g = p.grad();
        if (!g.defined()) continue;
        // A fresh tensor, not an in-place scale: a grad may share storage with another tensor.
        Var handle = p;  // shares the parameter
        handle.set_grad(Var(mul(g.data(), scale)));
    }
    return total;
}

double clip_grad_norm_(const NamedVars& params, double max_norm) {
    std::vector<Var> vars;
    vars.reserve(params.size());
    for (const auto& entry : params) vars.push_back(entry.second);
    return clip_grad_norm_(vars, max_norm);
}

}  // namespace nl
