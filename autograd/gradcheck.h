// Numerical gradient checks: central differences in f64 against the analytic backward
// (gradcheck), and against the backward of the backward (gradgradcheck, via create_graph).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/var.h"

namespace nl {

using VarFn = std::function<Var(const std::vector<Var>&)>;

struct GradcheckResult {
    bool ok = true;
    int64_t input = -1;      // worst input (index into `inputs`), -1 when nothing was compared
    int64_t element = -1;    // worst element, row-major flat index into that input
    double analytic = 0.0;   // the worst element's values
    double numeric = 0.0;
    double abs_error = 0.0;
    double rel_error = 0.0;  // abs_error / max(|numeric|, tiny)
    std::string message;     // "gradcheck: ok (...)" or what failed, with index and both values
};

// Checks every input that requires grad (f64, on the CPU, no overlapping elements such as expanded
// views). A non-scalar output y is reduced to sum(y * v) with a fixed random v, so the check covers
// the vector-Jacobian product backward computes. An element passes when
// |analytic - numeric| <= atol + rtol * |numeric|; the worst element (largest excess) is reported.
GradcheckResult gradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps = 1e-6,
                          double atol = 1e-5, double rtol = 1e-3);

// Second order: with g = d(sum(fn(x) * v))/dx computed with create_graph, checks
// d(sum_i g_i . u_i)/dx (u fixed random) against central differences of the first-order grads.
GradcheckResult gradgradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps = 1e-6,
                              double atol = 1e-5, double rtol = 1e-3);

// Throw nl::Error with the result's message when the check fails.
void require_gradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps = 1e-6,
                       double atol = 1e-5, double rtol = 1e-3);
void require_gradgradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps = 1e-6,
                           double atol = 1e-5, double rtol = 1e-3);

}  // namespace nl
