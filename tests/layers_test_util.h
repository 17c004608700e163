// Small helpers shared by the layers/norms tests: elementwise closeness with a report of the worst
// element, and randomizing a module's parameters so "weight = ones" cannot hide a bug.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>

#include "autograd/autograd.h"
#include "layers/module.h"

namespace nl::test {

// Every element satisfies |actual - expected| <= atol + rtol * |expected| (NaN never passes).
inline void check_close(const Tensor& actual, const Tensor& expected, double atol, double rtol,
                        const std::string& what) {
    INFO(what << ": actual " << shape_str(actual.shape()) << " vs expected " << shape_str(expected.shape()));
    REQUIRE(actual.shape() == expected.shape());
    std::vector<double> a = actual.to_vector();
    std::vector<double> e = expected.to_vector();
    bool ok = true;
    size_t worst = 0;
    double worst_excess = -1e300;
    for (size_t i = 0; i < a.size(); ++i) {
        double excess = std::fabs(a[i] - e[i]) - (atol + rtol * std::fabs(e[i]));
        if (std::isnan(a[i]) || std::isnan(e[i])) excess = 1e300;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
        if (excess > 0) ok = false;
    }
    std::ostringstream msg;
    if (!a.empty())
        msg << "worst element " << worst << ": actual " << a[worst] << ", expected " << e[worst] << " (atol " << atol
            << ", rtol " << rtol << ")";
    INFO(msg.str());
    CHECK(ok);
}

inline void check_close(const Var& actual, const Tensor& expected, double atol, double rtol, const std::string& what) {
    INFO(what << ": the Var is defined");
    REQUIRE(actual.defined());
    check_close(actual.data(), expected, atol, rtol, what);
}

// Each parameter becomes 1 + 0.5 N(0, 1) (weights near one, so norms stay well conditioned).
inline void randomize_parameters(Module& module, Generator& gen) {
    NoGradGuard no_grad;
    for (auto& [name, p] : module.named_parameters()) {
        Tensor r = randn(p.shape(), gen, DType::F64) * 0.5 + 1.0;
        p.data().copy_(r);
    }
}

}  // namespace nl::test
