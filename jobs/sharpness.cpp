// The sharpness probe: Hessian-vector products of the step's objective, summed over its terms and
// MPI ranks, and Lanczos on them (jobs/sharpness.h).
#include "jobs/sharpness.h"

#include <cmath>
#include <map>

#include "autograd/functional.h"
#include "core/dist.h"
#include "core/error.h"
#include "core/ops.h"

namespace nl {

const std::vector<std::string>& sharpness_columns() {
    static const std::vector<std::string> columns = {"sharpness", "sharpness_adam", "sharpness_adam_threshold"};
    return columns;
}

namespace {

int64_t total_numel(const std::vector<Var>& params) {
    int64_t n = 0;
    for (const Var& p : params) n += p.numel();
    return n;
}

// A tensor's values as f64 on the host, in row-major order.
std::vector<double> host_values(const Tensor& t) { return t.to(Device::cpu()).to(DType::F64).contiguous().to_vector(); }

}  // namespace

void hessian_vector_product(const ObjectiveTerms& terms, const std::vector<Var>& params, const std::vector<double>& u,
                            std::vector<double>& out) {
    const int64_t n = total_numel(params);
    NL_REQUIRE(static_cast<int64_t>(u.size()) == n, "hessian_vector_product: expected a vector of ", n,
               " values (the parameters'), found ", u.size());
    std::vector<Var> v;  // one per parameter, its shape, dtype and device
    int64_t offset = 0;
    for (const Var& p : params) {
        const std::vector<double> slice(u.begin() + offset, u.begin() + offset + p.numel());
        v.emplace_back(from_vector(slice, p.shape(), DType::F64).to(p.dtype()).to(p.device()));
        offset += p.numel();
    }
    out.assign(static_cast<size_t>(n), 0.0);
    for (const auto& term : terms) {
        const HvpResult r = hvp([&](const std::vector<Var>&) { return term(); }, params, v);
        offset = 0;
        for (const Var& hv : r.hvp) {
            const std::vector<double> values = host_values(hv.data());
            for (size_t i = 0; i < values.size(); ++i) out[static_cast<size_t>(offset) + i] += values[i];
            offset += hv.numel();
        }
    }
    dist::allreduce_sum(out.data(), n);
}

std::vector<double> adam_inverse_sqrt_preconditioner(const OptimizerState& state, const std::vector<std::string>& names,
                                                     const std::vector<Var>& params, double beta2, double eps) {
    NL_REQUIRE(names.size() == params.size(), "adam_inverse_sqrt_preconditioner: ", names.size(), " names for ",
               params.size(), " parameters");
    std::map<std::string, const Tensor*> buffers;
    for (const auto& [key, t] : state.tensors) buffers[key] = &t;
    std::vector<double> scale;
    scale.reserve(static_cast<size_t>(total_numel(params)));
    for (size_t i = 0; i < params.size(); ++i) {
        const auto v = buffers.find(names[i] + ".exp_avg_sq");
        const auto step = buffers.find(names[i] + ".step");
        if (v == buffers.end() || step == buffers.end()) {
            scale.insert(scale.end(), static_cast<size_t>(params[i].numel()), 0.0);
            continue;
        }
        NL_REQUIRE(v->second->numel() == params[i].numel(), "adam_inverse_sqrt_preconditioner: ", names[i],
                   ".exp_avg_sq has ", v->second->numel(), " values, the parameter ", params[i].numel());
        const double t = host_values(*step->second).at(0);
        const double correction = 1.0 - std::pow(beta2, t);
        for (double second_moment : host_values(*v->second))
            scale.push_back(1.0 / std::sqrt(std::sqrt(second_moment / correction) + eps));
    }
    return scale;
}

double objective_sharpness(const ObjectiveTerms& terms, const std::vector<Var>& params, int64_t iterations,
                           uint64_t seed, const std::vector<double>& scale) {
    const int64_t n = total_numel(params);
    NL_REQUIRE(scale.empty() || static_cast<int64_t>(scale.size()) == n, "objective_sharpness: expected ", n,
               " preconditioner values, found ", scale.size());
    std::vector<double> scaled(scale.empty() ? 0 : static_cast<size_t>(n));  // (n,) P^{-1/2} u
    const SymmetricOperator apply = [&](const std::vector<double>& u, std::vector<double>& out) {
        if (scale.empty()) return hessian_vector_product(terms, params, u, out);
        for (size_t i = 0; i < u.size(); ++i) scaled[i] = scale[i] * u[i];
        hessian_vector_product(terms, params, scaled, out);
        for (size_t i = 0; i < out.size(); ++i) out[i] *= scale[i];
    };
    return lanczos_max_eigenvalue(apply, n, iterations, seed).max_eigenvalue;
}

double adam_sharpness_threshold(double beta1, double lr) { return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * lr); }

}  // namespace nl
