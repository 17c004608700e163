// The gradient checks of `normlab gradcheck` as library code: every norm of the registry
// (layers/norm_registry.h) in both forms through its module (first order) and in its composed
// functional form to second order (double backward), then every layer and loss, each against f64
// central differences (eps 1e-6). A check passes when every element satisfies
// |analytic - numeric| <= atol + rtol |numeric| (the norm's registry tolerances; 1e-5 and 1e-3
// elsewhere). Nothing here prints: each result reaches the caller as it is ready.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace nl {

// One check, by what it checks.
struct GradcheckCase {
    std::string name;   // "rmsnorm", "linear", "block (pre-norm)", ...
    std::string form;   // "fused", "composed" or "-"
    std::string order;  // "1st" or "2nd"
};

// One check's outcome: pass or fail at its tolerances, and the largest absolute error over every
// element with its relative error (a second pass at zero tolerances, whose "worst" element is the
// one with the largest error; the first pass reports the element nearest its tolerance).
struct GradcheckOutcome {
    GradcheckCase check;
    double atol = 0.0;  // the tolerances it passed or failed at
    double rtol = 0.0;
    bool ok = false;
    double max_abs_error = 0.0;
    double rel_error_at_max = 0.0;
    std::string message;  // gradcheck's report; a check that throws fails with the error's text
};

// The checks whose name contains `filter` ("" for all), in run order; empty when none matches.
std::vector<GradcheckCase> list_gradchecks(const std::string& filter = "");

// Runs the checks whose name contains `filter`, in list_gradchecks' order, calling on_outcome (when
// given) after each. Returns every outcome; empty when none matches.
std::vector<GradcheckOutcome> run_gradchecks(const std::string& filter = "",
                                             const std::function<void(const GradcheckOutcome&)>& on_outcome = {});

}  // namespace nl
