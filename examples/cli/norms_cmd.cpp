// `normlab norms`: lists the norm registry (name, PyTorch class, default eps, statistic, parameters,
// formula, fused form);
// `normlab norms --example` runs the RMSNorm explainer's worked example, x = [1, 2, 3, 4], through
// normlab's LayerNorm and RMSNorm (weight 1, bias 0, default eps) and prints each step.
#include "examples/cli/commands.h"

#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"

namespace nl::cli {

namespace {

struct Options {
    bool example = false;
};

std::string join(const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& part : parts) out += (out.empty() ? "" : ", ") + part;
    return out;
}

std::string vector_str(const std::vector<double>& values, const char* format) {
    std::string out = "[";
    for (size_t i = 0; i < values.size(); ++i)
        out += (i ? ", " : "") + fmt::format(fmt::runtime(format), values[i]);
    return out + "]";
}

void print_registry() {
    fmt::print("{:<17} {:<16} {:>7}  {:<22} {}\n", "type", "class", "eps", "statistic", "parameters");
    for (const NormType& t : norm_registry())
        fmt::print("{:<17} {:<16} {:>7g}  {:<22} {}\n", t.name, t.class_name, t.default_eps,
                   norm_statistic_name(t.statistic) + std::string(t.partial_row ? " (part of the row)" : ""),
                   join(norm_parameter_names(t)));
    fmt::print("\n");
    for (const NormType& t : norm_registry())
        fmt::print("{:<17} {}\n{:<17} ({})\n{:<17} fused form: {}\n", t.name, t.help.formula, "", t.help.reference, "",
                   t.help.fused_form);
    fmt::print("\nEvery type also has a composed form (\"fused\": false: autograd ops, differentiable twice). "
               "`normlab norms --example` shows the explainer's worked example.\n");
}

// The explainer's section 3: x = [1, 2, 3, 4] by hand, then through the modules (weight 1, bias 0).
void print_example() {
    const std::vector<double> x_values{1.0, 2.0, 3.0, 4.0};
    const Var x(from_vector(x_values, {1, 4}, DType::F64));  // (1, 4): one row of d = 4
    auto run = [&](const std::string& type) {
        NormOptions options;
        options.type = type;
        options.dim = 4;
        options.dtype = DType::F64;
        std::shared_ptr<Norm> norm = make_norm(options);
        NoGradGuard no_grad;
        return std::make_pair(norm->eps(), norm->forward(x).data().to_vector());
    };
    double mean = 0.0, mean_square = 0.0;
    for (double v : x_values) mean += v / 4.0, mean_square += v * v / 4.0;
    double variance = 0.0;
    for (double v : x_values) variance += (v - mean) * (v - mean) / 4.0;

    fmt::print("x = {}\n\n", vector_str(x_values, "{:g}"));
    const auto [ln_eps, ln] = run("layernorm");
    fmt::print("LayerNorm (eps {:g}, weight 1, bias 0):\n", ln_eps);
    fmt::print("  mean     = {:g}\n  variance = {:g}  (biased: divide by d)\n", mean, variance);
    fmt::print("  y = (x - mean) / sqrt(variance + eps) = {}\n\n", vector_str(ln, "{:.4f}"));
    const auto [rms_eps, rms] = run("rmsnorm");
    fmt::print("RMSNorm (eps {:g}, weight 1):\n", rms_eps);
    fmt::print("  mean(x^2) = {:g}\n", mean_square);
    fmt::print("  y = x / sqrt(mean(x^2) + eps) = {}\n\n", vector_str(rms, "{:.4f}"));
    fmt::print("(the explainer: LayerNorm ~ [-1.34, -0.45, 0.45, 1.34], RMSNorm ~ [0.37, 0.73, 1.10, 1.46])\n");
}

}  // namespace

void register_norms(CLI::App& app) {
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand("norms", "List the norm types (" + norm_type_choices() +
                                                    "), or run the RMSNorm explainer's worked example");
    cmd->add_flag("--example", opt->example, "LayerNorm and RMSNorm of x = [1, 2, 3, 4], step by step");
    cmd->callback([opt] {
        if (opt->example)
            print_example();
        else
            print_registry();
    });
}

}  // namespace nl::cli
