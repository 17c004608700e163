// hvp: torch.autograd.functional.hvp by double backward (autograd/functional.h).
#include "autograd/functional.h"

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace nl {

HvpResult hvp(const VarFn& fn, const std::vector<Var>& inputs, const std::vector<Var>& v, bool create_graph,
              bool strict) {
    NL_REQUIRE(!inputs.empty(), "hvp: expected at least one input, found none");
    NL_REQUIRE(v.empty() || v.size() == inputs.size(), "hvp: expected v with one tensor per input (", inputs.size(),
               "), found ", v.size());
    std::vector<Var> xs;  // the variables fn is differentiated at
    std::vector<Tensor> vs;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const Var& x = inputs[i];
        NL_REQUIRE(x.defined() && is_floating(x.dtype()), "hvp: expected input ", i, " to be a floating tensor, found ",
                   x.defined() ? dtype_name(x.dtype()) : std::string("an undefined one"));
        if (v.empty()) {
            NL_REQUIRE(x.numel() == 1, "hvp: v can be omitted only for single-element inputs, found input ", i,
                       " of shape ", shape_str(x.shape()));
            vs.push_back(ones_like(x.data()));
        } else {
            NL_REQUIRE(v[i].defined() && v[i].shape() == x.shape() && v[i].dtype() == x.dtype(), "hvp: expected v[", i,
                       "] of shape ", shape_str(x.shape()), " ", dtype_name(x.dtype()), " (input ", i, "'s), found ",
                       v[i].defined() ? shape_str(v[i].shape()) + " " + dtype_name(v[i].dtype()) : "an undefined one");
            vs.push_back(v[i].data());
        }
        if (x.is_leaf() && x.requires_grad()) {
            xs.push_back(x);  // a parameter: fn may read it directly (no .grad is touched)
        } else if (create_graph && x.requires_grad()) {
            GradModeGuard on(true);
            xs.push_back(alias(x));  // its own variable, whose graph leads back to x
        } else {
            xs.push_back(Var(x.data(), true));
        }
    }

    GradModeGuard on(true);
    const Var out = fn(xs);
    NL_REQUIRE(out.defined() && out.numel() == 1, "hvp: fn must return a single-element tensor, found ",
               out.defined() ? shape_str(out.shape()) : std::string("an undefined one"));
    NL_REQUIRE(out.requires_grad(), "hvp: fn's output does not depend on its inputs (it has no graph)");

    // g = d out / d x, recorded; then H v = d(sum_i <g_i, v_i>)/d x.
    const std::vector<Var> g = partial_gradients(out, xs, Var(), /*create_graph=*/true);
    Var gv;  // sum_i <g_i, v_i>
    for (size_t i = 0; i < xs.size(); ++i) {
        NL_REQUIRE(!strict || g[i].defined(), "hvp: the output of fn is independent of input ", i,
                   ", which strict mode does not allow");
        if (!g[i].defined()) continue;
        NL_REQUIRE(!strict || g[i].requires_grad(), "hvp: the gradient of fn is independent of the inputs at input ",
                   i, " (fn is linear in it), which strict mode does not allow");
        if (!g[i].requires_grad()) continue;
        const Var term = sum(g[i] * Var(vs[i]));
        gv = gv.defined() ? gv + term : term;
    }
    std::vector<Var> hv(xs.size());
    if (gv.defined()) hv = partial_gradients(gv, xs, Var(), create_graph);

    HvpResult result;
    result.output = create_graph ? out : out.detach();
    for (size_t i = 0; i < xs.size(); ++i) {
        NL_REQUIRE(!strict || hv[i].defined(), "hvp: the Hessian-vector product is independent of input ", i,
                   ", which strict mode does not allow");
        if (!hv[i].defined()) hv[i] = Var(zeros_like(xs[i].data()));
        result.hvp.push_back(create_graph ? hv[i] : hv[i].detach());
    }
    return result;
}

}  // namespace nl
