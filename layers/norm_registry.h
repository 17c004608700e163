// The norm registry: the one table of norm types. Each entry gives a type its config name, its
// PyTorch class name, default eps, parameter names, formula and reference, its factory, what its
// fused form is, and its second-order gradcheck case. make_norm, config validation (norm_types()),
// `normlab gradcheck`, `normlab graph`, `normlab norms` and their help texts all read this table, so
// adding a norm is one entry here plus its module, kernels and tests (docs/norms.md shows how).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/norms.h"

namespace nl {

struct NormType {
    std::string name;        // the config / CLI name: "rmsnorm"
    std::string class_name;  // the PyTorch class (the article's where it defines one): "RMSNorm"
    double default_eps;      // the class's default eps (NormOptions::eps unset)
    // State-dict names with the default options (elementwise_affine, bias): {"weight"}.
    std::vector<std::string> parameters;
    std::string formula;     // one line, for help texts and docs/norms.md
    std::string reference;   // where the formula comes from
    std::string fused_form;  // what the fused form (options.fused, the default) runs
    std::function<std::shared_ptr<Norm>(const NormOptions&)> make;

    // `normlab gradcheck`'s second-order case: the composed functional form as a function of
    // (x, parameters...), with the parameters' lengths (0: the norm's dim). First-order checks of
    // both forms go through make() and need nothing here.
    std::vector<int64_t> gradcheck_param_sizes;
    std::function<Var(const std::vector<Var>& x_then_params)> gradcheck_composed;
};

// Every norm type, in the order help texts and sweeps list them.
const std::vector<NormType>& norm_registry();

// The entry named `name`; an nl::Error naming the choices when there is none.
const NormType& find_norm_type(const std::string& name);

// "layernorm, rmsnorm, ...": the names, for error messages and help texts.
std::string norm_type_choices();

}  // namespace nl
