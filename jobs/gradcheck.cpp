// The gradient checks of `normlab gradcheck` (see gradcheck.h): the check list and its running.
#include "jobs/gradcheck.h"

#include <memory>
#include <utility>

#include "autograd/autograd.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "layers/transformer.h"

namespace nl {

namespace {

// |analytic - numeric| <= atol + rtol |numeric|; gradcheck's defaults unless a norm says otherwise.
struct Tolerance {
    double atol = 1e-5;
    double rtol = 1e-3;
};

struct Check {
    GradcheckCase what;
    Tolerance tolerance;
    std::function<GradcheckResult(const Tolerance&)> run;
};

// A module's forward as a function of its input and its parameters, so gradcheck can treat the
// parameters as inputs. gradcheck calls fn with fresh leaves that share storage with the Vars it
// was given (so its perturbations reach the module), but the module's graph ends at its own
// parameter Vars; this one node hands the gradients of that inner graph to the leaves instead.
// First order only (the inner gradients are computed without create_graph).
VarFn module_fn(std::function<Var(const Var&)> forward, std::vector<Var> params) {
    return [forward, params](const std::vector<Var>& in) -> Var {
        const Var x(in[0].data(), in[0].requires_grad());
        Var y = forward(x);
        if (!y.grad_fn()) return y;  // grad mode off (the central differences): no graph needed
        std::vector<Var> wrt{x};
        wrt.insert(wrt.end(), params.begin(), params.end());
        return make_result(y.data(), "module", in, {}, [y, wrt](const Var& dy, const std::vector<Var>&) {
            std::vector<Var> differentiable;
            for (const Var& v : wrt)
                if (v.requires_grad()) differentiable.push_back(v);
            std::vector<Var> grads = gradients(y, differentiable, dy, /*retain_graph=*/true);
            std::vector<Var> out;
            size_t next = 0;
            for (const Var& v : wrt) out.push_back(v.requires_grad() ? grads[next++] : Var());
            return out;
        });
    };
}

// Gradcheck of `module` on input `x` (a constant when it does not require grad) and every
// parameter. Vector and scalar parameters (norm weights of ones, biases of zeros, alpha) get
// 0.5 N(0,1) added first: ones and zeros would hide mistakes such as a missing weight factor in a
// backward. Matrices keep their (random) PyTorch-default init, which keeps attention unsaturated.
GradcheckResult check_module(Module& module, const Var& x, std::function<Var(const Var&)> forward, uint64_t seed,
                             const Tolerance& tol) {
    Generator gen(seed);
    std::vector<Var> params = module.parameters();
    for (Var& p : params)
        if (p.dim() <= 1) p.data().copy_(add(p.data(), mul(randn(p.shape(), gen, DType::F64), 0.5)));
    std::vector<Var> inputs{x};
    inputs.insert(inputs.end(), params.begin(), params.end());
    return gradcheck(module_fn(std::move(forward), params), inputs, 1e-6, tol.atol, tol.rtol);
}

// An f64 input of `shape`, N(0,1) * 2 + 0.5 so that centering matters for the norms.
Var random_input(const Shape& shape, uint64_t seed, bool requires_grad = true) {
    Generator gen(seed);
    return Var(add(mul(randn(shape, gen, DType::F64), 2.0), 0.5), requires_grad);
}

// Every norm of the registry in both forms through its module (first order), then each composed
// functional form to second order, all with the entry's gradcheck options and tolerances.
void add_norm_checks(std::vector<Check>& checks) {
    const int64_t d = 8;
    for (const NormType& type : norm_registry()) {
        for (bool fused : {true, false}) {
            checks.push_back({{type.name, fused ? "fused" : "composed", "1st"},
                              {type.gradcheck.atol, type.gradcheck.rtol},
                              [&type, fused](const Tolerance& tol) {
                                  std::shared_ptr<Norm> norm = make_norm(norm_gradcheck_options(type, d, fused));
                                  Var x = random_input({3, 4, d}, 1);
                                  return check_module(*norm, x, [norm](const Var& in) { return norm->forward(in); }, 2, tol);
                              }});
        }
    }
    for (const NormType& type : norm_registry()) {
        checks.push_back({{type.name, "composed", "2nd"},
                          {type.gradcheck.atol, type.gradcheck.rtol},
                          [&type](const Tolerance& tol) {
                              Generator gen(3);
                              const std::vector<Var> inputs = norm_gradcheck_inputs(type, {3, d}, gen);
                              const NormOptions options = norm_gradcheck_options(type, d, false);
                              VarFn composed = [&type, options](const std::vector<Var>& in) {
                                  return type.forward(in[0], std::vector<Var>(in.begin() + 1, in.end()), options, false);
                              };
                              return gradgradcheck(composed, inputs, 1e-6, tol.atol, tol.rtol);
                          }});
    }
}

// A first-order check of a module built by `make` on the f64 input (shape, seed); the module's
// parameters are perturbed from `param_seed`.
Check module_check(const std::string& name, std::function<std::shared_ptr<UnaryModule>()> make, Shape shape,
                   uint64_t seed, uint64_t param_seed) {
    return {{name, "-", "1st"}, {}, [make, shape, seed, param_seed](const Tolerance& tol) {
                std::shared_ptr<UnaryModule> module = make();
                return check_module(*module, random_input(shape, seed),
                                    [module](const Var& in) { return module->forward(in); }, param_seed, tol);
            }};
}

void add_layer_checks(std::vector<Check>& checks) {
    checks.push_back(module_check("linear", [] { return std::make_shared<Linear>(LinearOptions{5, 4, true, DType::F64}); },
                                          {2, 3, 5}, 5, 6));
    checks.push_back({{"embedding", "-", "1st"}, {}, [](const Tolerance& tol) {
                          auto table = std::make_shared<Embedding>(EmbeddingOptions{10, 6, DType::F64});
                          Tensor ids = from_vector(std::vector<int64_t>{1, 3, 3, 9, 0, 1}, {2, 3});
                          Var unused(zeros({}, DType::F64));  // the ids are not differentiable
                          return check_module(*table, unused, [table, ids](const Var&) { return table->forward(ids); }, 7, tol);
                      }});
    checks.push_back(module_check(
        "swiglu", [] { return std::make_shared<FeedForward>(FeedForwardOptions{16, 64, 8, DType::F64}); }, {2, 3, 16}, 8, 9));
    checks.push_back(module_check("attention", [] {
        AttentionOptions options;
        options.dim = 16;
        options.n_heads = 4;
        options.n_kv_heads = 2;
        options.dtype = DType::F64;
        return std::make_shared<Attention>(options);
    }, {2, 5, 16}, 10, 11));
    for (const std::string& placement : norm_placement_names()) {
        if (placement == "mix") continue;  // the model's: its blocks are post or pre
        checks.push_back(module_check("block (" + placement + ")", [placement] {
            TransformerBlockOptions options;
            options.dim = 16;
            options.n_heads = 4;
            options.n_kv_heads = 2;
            options.ffn_hidden_dim = 64;
            options.multiple_of = 8;
            options.norm_placement = placement;
            options.dtype = DType::F64;
            options.norm.dtype = DType::F64;
            return std::make_shared<TransformerBlock>(options);
        }, {2, 4, 16}, 12, 13));
    }
}

void add_function_checks(std::vector<Check>& checks) {
    for (const char* name : {"relu", "silu", "gelu"}) {
        checks.push_back({{name, "-", "1st"}, {}, [name = std::string(name)](const Tolerance& tol) {
                              VarFn fn = [name](const std::vector<Var>& v) {
                                  return name == "relu" ? relu(v[0]) : name == "silu" ? silu(v[0]) : gelu(v[0]);
                              };
                              return gradcheck(fn, {random_input({4, 6}, 14)}, 1e-6, tol.atol, tol.rtol);
                          }});
    }
    checks.push_back({{"mse_loss", "-", "1st"}, {}, [](const Tolerance& tol) {
                          return gradcheck([](const std::vector<Var>& v) { return mse_loss(v[0], v[1]); },
                                           {random_input({4, 5}, 15), random_input({4, 5}, 16)}, 1e-6, tol.atol, tol.rtol);
                      }});
    for (bool fused : {true, false}) {
        checks.push_back({{"cross_entropy", fused ? "fused" : "composed", "1st"}, {}, [fused](const Tolerance& tol) {
                              Tensor targets = from_vector(std::vector<int64_t>{1, -100, 3, 0, 6}, {5});
                              return gradcheck(
                                  [fused, targets](const std::vector<Var>& v) {
                                      return fused ? cross_entropy_loss(v[0], targets)
                                                   : cross_entropy_loss_composed(v[0], targets);
                                  },
                                  {random_input({5, 7}, 17)}, 1e-6, tol.atol, tol.rtol);
                          }});
    }
}

// The checks matching `filter`, in run order.
std::vector<Check> selected_checks(const std::string& filter) {
    std::vector<Check> all;
    add_norm_checks(all);
    add_layer_checks(all);
    add_function_checks(all);
    std::vector<Check> out;
    for (Check& check : all)
        if (filter.empty() || check.what.name.find(filter) != std::string::npos) out.push_back(std::move(check));
    return out;
}

GradcheckOutcome run_check(const Check& check) {
    GradcheckOutcome out;
    out.check = check.what;
    out.atol = check.tolerance.atol;
    out.rtol = check.tolerance.rtol;
    try {
        GradcheckResult verdict = check.run(check.tolerance);
        GradcheckResult largest = check.run(Tolerance{0.0, 0.0});
        out.ok = verdict.ok;
        out.message = verdict.message;
        out.max_abs_error = largest.abs_error;
        out.rel_error_at_max = largest.rel_error;
    } catch (const std::exception& e) {  // a check that throws is a failed check, not a crash
        out.message = e.what();
    }
    return out;
}

}  // namespace

std::vector<GradcheckCase> list_gradchecks(const std::string& filter) {
    std::vector<GradcheckCase> out;
    for (const Check& check : selected_checks(filter)) out.push_back(check.what);
    return out;
}

std::vector<GradcheckOutcome> run_gradchecks(const std::string& filter,
                                             const std::function<void(const GradcheckOutcome&)>& on_outcome) {
    std::vector<GradcheckOutcome> outcomes;
    for (const Check& check : selected_checks(filter)) {
        outcomes.push_back(run_check(check));
        if (on_outcome) on_outcome(outcomes.back());
    }
    return outcomes;
}

}  // namespace nl
