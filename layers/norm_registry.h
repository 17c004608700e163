// The norm registry: one typed description per norm type. An entry says what the norm computes
// (its statistic, its parameters with their shapes and init, its functional form and a plain f64
// loop of its formula), how its gradients are checked, and its help text. make_norm and the modules
// (layers/norms.h), config validation (norm_types()), `normlab norms`, `normlab gradcheck`
// (jobs/gradcheck.h), `normlab graph` (jobs/norm_graph.h) and the tests all read it, so a norm is
// its entry here, its functional form in layers/norms.h (and a module class only where it wants
// accessors or checks of its own: RegistryNorm serves any entry), a row of tests/test_norms.cpp's
// table and docs/norms.md's row.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/norms.h"

namespace nl {

// What a norm divides x by (Elementwise: nothing, for a layer that takes a norm's place).
enum class NormStatistic {
    Variance,        // mean-subtracting: (x - mean(x)) / sqrt(var(x) + eps), var biased (LayerNorm)
    RootMeanSquare,  // x / sqrt(mean(x^2) + eps) (RMSNorm)
    Both,            // a Variance branch and a RootMeanSquare branch, blended (HybridNorm)
    L2Norm,          // x / max(||x||_2, eps) (ScaleNorm)
    Elementwise,     // none: each element on its own, tanh(alpha * x) (DyT, which replaces a norm)
};

// What the fused form (NormOptions::fused, the default) runs.
enum class FusedForm {
    OneKernelNode,   // one autograd node over core/fused.h's norm kernel pair: saves x, rstd (+ mean)
    KernelAndOps,    // the kernel's nodes combined by a few autograd ops
    Composed,        // no kernel of its own: the fused form is the composed form
};

enum class ParameterShape { Features, One };      // [d] or [1]
// 1, 0, sqrt(d) or NormOptions::alpha_init in every element.
enum class ParameterInit { Ones, Zeros, SqrtDim, AlphaInit };
// When the module has the parameter: always, with elementwise_affine, or with elementwise_affine
// and bias (NormOptions).
enum class ParameterPresence { Always, Affine, AffineAndBias };

struct NormParameter {
    std::string child;  // "": the norm's own; else the child module that holds it ("rms_norm")
    std::string name;   // the name inside that module: "weight"
    ParameterShape shape;
    ParameterInit init;
    ParameterPresence presence;

    std::string state_name() const;  // the state-dict name: "weight", "rms_norm.weight"
};

// The norm as a function of x and its parameters, given in the order of NormType::parameters (an
// absent one, e.g. without elementwise_affine, as an undefined Var), with the options' eps, p and
// alpha; fused picks the form. It calls the functional forms of layers/norms.h.
using NormFunction =
    std::function<Var(const Var& x, const std::vector<Var>& params, const NormOptions& options, bool fused)>;

// The norm's formula as plain f64 loops over one row, the tests' ground truth: x and y point at d
// values; params holds each parameter's values in the order of NormType::parameters (an absent one
// as its init: weight 1, bias 0).
using NormReference = std::function<void(const double* x, int64_t d, const std::vector<std::vector<double>>& params,
                                         const NormOptions& options, double* y)>;

// How the f64 gradient checks (tests/test_norms.cpp, jobs/gradcheck.h) run the norm: with these
// options (p and alpha away from their defaults where the norm reads them; type, dim, dtype and
// fused are set by the check) and these pass tolerances, |analytic - numeric| <= atol + rtol |numeric|.
struct NormGradcheck {
    NormOptions options;
    double atol = 1e-5;
    double rtol = 1e-3;
};

// The help texts: `normlab norms`, the CLI's option help and docs/norms.md.
struct NormHelp {
    std::string formula;     // one line
    std::string reference;   // where the formula comes from
    std::string fused_form;  // what the fused form runs
};

// "variance", "RMS", "variance and RMS", "L2 norm" or "none (elementwise)": for help texts.
const char* norm_statistic_name(NormStatistic statistic);
// The enums' names as Python's registry view (normlab.nn.norm_registry()) spells them:
// "one_kernel_node", "kernel_and_ops", "composed"; "ones", "zeros", "sqrt_dim", "alpha_init";
// "always", "affine", "affine_and_bias".
const char* fused_form_name(FusedForm form);
const char* parameter_init_name(ParameterInit init);
const char* parameter_presence_name(ParameterPresence presence);

struct NormType {
    std::string name;        // the config / CLI name: "rmsnorm"
    std::string class_name;  // the PyTorch class (the article's where it defines one): "RMSNorm"
    double default_eps;      // the class's default eps (NormOptions::eps unset)
    NormStatistic statistic;
    bool partial_row = false;  // the statistic covers the first partial_stat_count(d, p) elements of each row (pRMSNorm)
    FusedForm fused;
    std::vector<NormParameter> parameters;  // in state-dict order with the default options
    NormFunction forward;
    NormReference reference;
    NormGradcheck gradcheck;
    NormHelp help;
    // The module: its class's constructor, or RegistryNorm's for an entry without a class.
    std::function<std::shared_ptr<Norm>(const NormOptions&)> make;
};

// Every norm type, in the order help texts and sweeps list them.
const std::vector<NormType>& norm_registry();

// The entry named `name`; an nl::Error naming the choices when there is none.
const NormType& find_norm_type(const std::string& name);

// "layernorm, rmsnorm, ...": the names, for error messages and help texts.
std::string norm_type_choices();

// The state-dict names of the parameters with the default options: {"weight", "bias"}.
std::vector<std::string> norm_parameter_names(const NormType& type);

// A parameter's initial values for a norm over d features built with `options`: d (or 1) ones,
// zeros, sqrt(d) or options.alpha_init.
std::vector<double> norm_parameter_init(const NormParameter& parameter, int64_t d, const NormOptions& options);

// Whether a module built with `options` has the parameter.
bool norm_parameter_present(const NormParameter& parameter, const NormOptions& options);

// The NormOptions fields `type` reads beyond eps, dim, fused and dtype (which every norm reads), in the
// order the Python classes take them: "elementwise_affine" where a parameter's presence depends on it,
// "bias" where one's depends on bias too, "p" for a partial row, "alpha" for a blend of two statistics,
// "alpha_init" where a parameter starts at it (DyT).
// The Python classes' signatures (python/normlab/nn/norms.py, python/normlab/torch.py) come from it.
std::vector<std::string> norm_option_names(const NormType& type);

// The options a gradient check builds `type` with: its gradcheck options, f64, over dim.
NormOptions norm_gradcheck_options(const NormType& type, int64_t dim, bool fused);

// f64 inputs {x, parameters...} for a gradient check of the functional form: x of x_shape from
// N(0, 1) * 1.5 + 0.3 (off center, so a subtracted mean matters) and each parameter at its init plus
// 0.5 N(0, 1) (exact ones and zeros could hide a missing factor); every one a leaf requiring grad.
// The inits read the entry's gradcheck options (alpha_init).
std::vector<Var> norm_gradcheck_inputs(const NormType& type, const Shape& x_shape, Generator& gen);

}  // namespace nl
