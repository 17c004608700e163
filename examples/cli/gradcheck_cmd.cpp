// `normlab gradcheck`: checks the analytic backward of every norm (fused and composed; the composed
// forms also to second order) and of every layer and loss against central differences in f64, and
// prints one table row per check with its worst error. Exits 1 when any check fails.
#include "examples/cli/commands.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/error.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "layers/transformer.h"

namespace nl::cli {

namespace {

// The pass/fail tolerances (gradcheck's defaults): |analytic - numeric| <= atol + rtol |numeric|.
struct Tolerance {
    double atol = 1e-5;
    double rtol = 1e-3;
};

struct Check {
    std::string name;   // "rmsnorm", "linear", ...
    std::string form;   // "fused", "composed" or "-"
    std::string order;  // "1st" or "2nd"
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

// (rows, d) f64 input, N(0,1) * 2 + 0.5 so that centering matters for the norms.
Var random_input(const Shape& shape, uint64_t seed, bool requires_grad = true) {
    Generator gen(seed);
    return Var(add(mul(randn(shape, gen, DType::F64), 2.0), 0.5), requires_grad);
}

std::vector<Check> all_checks() {
    std::vector<Check> checks;
    const int64_t d = 8;

    // Every norm of the registry in both forms, through its module (first order), and its composed
    // form to second order through the registry's functional case (double backward).
    for (const NormType& type : norm_registry()) {
        for (bool fused : {true, false}) {
            checks.push_back({type.name, fused ? "fused" : "composed", "1st", [&type, fused, d](const Tolerance& tol) {
                                  NormOptions options;
                                  options.type = type.name;
                                  options.dim = d;
                                  options.fused = fused;
                                  options.dtype = DType::F64;
                                  std::shared_ptr<Norm> norm = type.make(options);
                                  Var x = random_input({3, 4, d}, 1);
                                  return check_module(*norm, x, [norm](const Var& in) { return norm->forward(in); }, 2, tol);
                              }});
        }
    }
    for (const NormType& type : norm_registry()) {
        checks.push_back({type.name, "composed", "2nd", [&type, d](const Tolerance& tol) {
                              std::vector<Var> inputs{random_input({3, d}, 3)};
                              int64_t seed = 4;
                              for (int64_t size : type.gradcheck_param_sizes)
                                  inputs.push_back(random_input({size == 0 ? d : size}, seed++));
                              return gradgradcheck(type.gradcheck_composed, inputs, 1e-6, tol.atol, tol.rtol);
                          }});
    }

    // Layers.
    checks.push_back({"linear", "-", "1st", [](const Tolerance& tol) {
                          LinearOptions options{5, 4, true, DType::F64};
                          auto linear = std::make_shared<Linear>(options);
                          return check_module(*linear, random_input({2, 3, 5}, 5),
                                              [linear](const Var& in) { return linear->forward(in); }, 6, tol);
                      }});
    checks.push_back({"embedding", "-", "1st", [](const Tolerance& tol) {
                          EmbeddingOptions options{10, 6, DType::F64};
                          auto table = std::make_shared<Embedding>(options);
                          Tensor ids = from_vector(std::vector<int64_t>{1, 3, 3, 9, 0, 1}, {2, 3});
                          Var unused(zeros({}, DType::F64));  // the ids are not differentiable
                          return check_module(*table, unused, [table, ids](const Var&) { return table->forward(ids); }, 7, tol);
                      }});
    checks.push_back({"swiglu", "-", "1st", [](const Tolerance& tol) {
                          FeedForwardOptions options{16, 64, 8, DType::F64};
                          auto ffn = std::make_shared<FeedForward>(options);
                          return check_module(*ffn, random_input({2, 3, 16}, 8),
                                              [ffn](const Var& in) { return ffn->forward(in); }, 9, tol);
                      }});
    checks.push_back({"attention", "-", "1st", [](const Tolerance& tol) {
                          AttentionOptions options;
                          options.dim = 16;
                          options.n_heads = 4;
                          options.n_kv_heads = 2;
                          options.dtype = DType::F64;
                          auto attention = std::make_shared<Attention>(options);
                          return check_module(*attention, random_input({2, 5, 16}, 10),
                                              [attention](const Var& in) { return attention->forward(in); }, 11, tol);
                      }});
    for (bool pre_norm : {true, false}) {
        checks.push_back({pre_norm ? "block (pre-norm)" : "block (post-norm)", "-", "1st", [pre_norm](const Tolerance& tol) {
                              TransformerBlockOptions options;
                              options.dim = 16;
                              options.n_heads = 4;
                              options.n_kv_heads = 2;
                              options.ffn_hidden_dim = 64;
                              options.multiple_of = 8;
                              options.pre_norm = pre_norm;
                              options.dtype = DType::F64;
                              options.norm.dtype = DType::F64;
                              auto block = std::make_shared<TransformerBlock>(options);
                              return check_module(*block, random_input({2, 4, 16}, 12),
                                                  [block](const Var& in) { return block->forward(in); }, 13, tol);
                          }});
    }
    for (const char* name : {"relu", "silu", "gelu"}) {
        checks.push_back({name, "-", "1st", [name = std::string(name)](const Tolerance& tol) {
                              VarFn fn = [name](const std::vector<Var>& v) {
                                  return name == "relu" ? relu(v[0]) : name == "silu" ? silu(v[0]) : gelu(v[0]);
                              };
                              return gradcheck(fn, {random_input({4, 6}, 14)}, 1e-6, tol.atol, tol.rtol);
                          }});
    }

    // Losses.
    checks.push_back({"mse_loss", "-", "1st", [](const Tolerance& tol) {
                          return gradcheck([](const std::vector<Var>& v) { return mse_loss(v[0], v[1]); },
                                           {random_input({4, 5}, 15), random_input({4, 5}, 16)}, 1e-6, tol.atol, tol.rtol);
                      }});
    for (bool fused : {true, false}) {
        checks.push_back({"cross_entropy", fused ? "fused" : "composed", "1st", [fused](const Tolerance& tol) {
                              Tensor targets = from_vector(std::vector<int64_t>{1, -100, 3, 0, 6}, {5});
                              return gradcheck(
                                  [fused, targets](const std::vector<Var>& v) {
                                      return fused ? cross_entropy_loss(v[0], targets)
                                                   : cross_entropy_loss_composed(v[0], targets);
                                  },
                                  {random_input({5, 7}, 17)}, 1e-6, tol.atol, tol.rtol);
                          }});
    }
    return checks;
}

struct Options {
    std::string filter;
    bool list = false;
};

// One check: pass/fail at the default tolerances, and the largest absolute error over every
// element (a second pass with zero tolerances, where the "worst" element is the one with the
// largest error; the first pass reports the element nearest its tolerance, often an exact zero).
struct Outcome {
    bool ok = false;
    double max_abs = 0.0;
    double rel_at_max = 0.0;
    std::string message;
};

Outcome run_check(const Check& check) {
    Outcome out;
    try {
        GradcheckResult verdict = check.run(Tolerance{});
        GradcheckResult largest = check.run(Tolerance{0.0, 0.0});
        out.ok = verdict.ok;
        out.message = verdict.message;
        out.max_abs = largest.abs_error;
        out.rel_at_max = largest.rel_error;
    } catch (const std::exception& e) {  // a check that throws is a failed check, not a crash
        out.message = e.what();
    }
    return out;
}

void run_gradcheck(const Options& opt) {
    std::vector<const Check*> selected;
    const std::vector<Check> checks = all_checks();
    for (const Check& check : checks)
        if (opt.filter.empty() || check.name.find(opt.filter) != std::string::npos) selected.push_back(&check);
    NL_REQUIRE(!selected.empty(), "gradcheck: no check matches --filter '", opt.filter, "'");
    if (opt.list) {
        for (const Check* check : selected) fmt::print("{:<18} {:<9} {}\n", check->name, check->form, check->order);
        return;
    }
    fmt::print("{:<18} {:<9} {:<5} {:>13} {:>13}  {}\n", "check", "form", "order", "max abs err", "its rel err",
               "result");
    std::vector<std::string> failures;
    for (const Check* check : selected) {
        Outcome out = run_check(*check);
        fmt::print("{:<18} {:<9} {:<5} {:>13.3e} {:>13.3e}  {}\n", check->name, check->form, check->order, out.max_abs,
                   out.rel_at_max, out.ok ? "ok" : "FAILED");
        std::fflush(stdout);
        if (!out.ok) failures.push_back(check->name + " " + check->form + " " + check->order + ": " + out.message);
    }
    fmt::print("\n{} of {} checks passed (f64 central differences, eps 1e-6; an element passes when "
               "|analytic - numeric| <= 1e-5 + 1e-3 |numeric|)\n",
               selected.size() - failures.size(), selected.size());
    for (const std::string& failure : failures) fmt::print("FAILED {}\n", failure);
    if (!failures.empty()) throw CLI::RuntimeError(1);  // exit code 1; main.cpp prints nothing more
}

}  // namespace

void register_gradcheck(CLI::App& app) {
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand(
        "gradcheck", "Check every norm's (fused and composed) and layer's backward against f64 central differences");
    cmd->add_option("--filter", opt->filter, "only the checks whose name contains this text");
    cmd->add_flag("--list", opt->list, "list the checks without running them");
    cmd->callback([opt] { run_gradcheck(*opt); });
}

}  // namespace nl::cli
