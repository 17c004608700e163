// Numerical gradient checks in f64: central differences (f(x + eps) - f(x - eps)) / 2 eps, element
// by element, against the analytic backward (gradcheck) and against the backward of a backward
// recorded with create_graph (gradgradcheck). Outputs are reduced to sum(y * v) with a fixed
// random v, which checks the vector-Jacobian product (PyTorch's "fast" gradcheck idea).
#include "autograd/gradcheck.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace nl {

namespace {

// Fresh leaves sharing each input's storage: perturbing them perturbs what fn reads, and the
// user's Vars (and their .grad) are left alone.
std::vector<Var> check_inputs(const std::vector<Var>& inputs, const char* op) {
    std::vector<Var> leaves;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const Var& x = inputs[i];
        NL_REQUIRE(x.defined(), op, ": input ", i, " is undefined");
        if (x.requires_grad()) {
            NL_REQUIRE(x.dtype() == DType::F64 && x.device().is_cpu(), op, ": input ", i,
                       " must be f64 on the cpu for central differences, found ", dtype_name(x.dtype()), " on ",
                       x.device().str());
            for (int64_t d = 0; d < x.dim(); ++d)
                NL_REQUIRE(x.data().strides()[d] != 0 || x.size(d) <= 1, op, ": input ", i,
                           " has overlapping elements (an expanded view, stride 0 at dim ", d,
                           "); pass a contiguous input and expand inside fn");
        }
        leaves.emplace_back(x.data(), x.requires_grad());
    }
    return leaves;
}

// Element `flat` (row-major) of a strided f64 tensor, for in-place perturbation.
double& element(const Tensor& t, int64_t flat) {
    int64_t offset = 0;
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
        offset += (flat % t.shape()[d]) * t.strides()[d];
        flat /= t.shape()[d];
    }
    return t.data<double>()[offset];
}

std::string index_str(const Shape& shape, int64_t flat) {
    Shape index(shape.size());
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        index[d] = flat % shape[d];
        flat /= shape[d];
    }
    return shape_str(index);
}

std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.10g", x);
    return buf;
}

// Fixed random projection weights with y's shape (the same on every call).
Tensor projection(const Shape& shape, DType dtype, uint64_t seed) {
    Generator gen(seed);
    return randn(shape, gen, dtype);
}

double dot(const Var& y, const Tensor& v) { return sum(mul(y.data(), v)).to(DType::F64).item(); }

// Compares analytic[i] (undefined = zero) against central differences of `value` for every input
// that requires grad; fills the worst element into a result.
GradcheckResult compare(const char* op, const std::vector<Var>& xs, const std::vector<Var>& analytic,
                        const std::function<double()>& value, double eps, double atol, double rtol) {
    GradcheckResult r;
    double worst_excess = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < xs.size(); ++i) {
        if (!xs[i].requires_grad()) continue;
        const Tensor& x = xs[i].data();
        Tensor a;
        if (analytic[i].defined()) {
            NL_REQUIRE(analytic[i].shape() == x.shape(), op, ": the gradient of input ", i, " has shape ",
                       shape_str(analytic[i].shape()), " but the input has shape ", shape_str(x.shape()));
            a = analytic[i].data().to(DType::F64).contiguous();
        }
        for (int64_t k = 0; k < x.numel(); ++k) {
            double& xk = element(x, k);
            const double saved = xk;
            xk = saved + eps;
            const double plus = value();
            xk = saved - eps;
            const double minus = value();
            xk = saved;
            const double numeric = (plus - minus) / (2.0 * eps);
            const double an = a.defined() ? a.data<double>()[k] : 0.0;
            const double abs_error = std::fabs(an - numeric);
            double excess = abs_error - (atol + rtol * std::fabs(numeric));
            if (std::isnan(an) != std::isnan(numeric) || (std::isnan(an) && std::isnan(numeric)))
                excess = std::numeric_limits<double>::infinity();
            if (excess > worst_excess) {
                worst_excess = excess;
                r.input = static_cast<int64_t>(i);
                r.element = k;
                r.analytic = an;
                r.numeric = numeric;
                r.abs_error = abs_error;
                r.rel_error = abs_error / std::max(std::fabs(numeric), 1e-300);
                r.message = index_str(x.shape(), k);  // filled in below
            }
        }
    }
    r.ok = !(worst_excess > 0.0);
    if (r.input < 0) {
        r.message = std::string(op) + ": ok (no input requires grad; nothing compared)";
        return r;
    }
    r.message = std::string(op) + (r.ok ? ": ok, worst" : ": FAILED at") + " input " + std::to_string(r.input) +
                " element " + std::to_string(r.element) + " (index " + r.message + "): analytic " +
                number(r.analytic) + " vs numeric " + number(r.numeric) + " (abs error " + number(r.abs_error) +
                ", rel error " + number(r.rel_error) + "; atol " + number(atol) + ", rtol " + number(rtol) +
                ", eps " + number(eps) + ")";
    return r;
}

std::vector<Var> requiring_grad(const std::vector<Var>& xs) {
    std::vector<Var> out;
    for (const Var& x : xs)
        if (x.requires_grad()) out.push_back(x);
    return out;
}

// gradients() for the inputs that require grad, scattered back to one slot per input.
std::vector<Var> grads_for(const Var& out, const std::vector<Var>& xs, bool create_graph) {
    std::vector<Var> result(xs.size());
    if (!out.requires_grad()) return result;  // out does not depend on any input: all zero
    std::vector<Var> wanted = requiring_grad(xs);
    std::vector<Var> got = gradients(out, wanted, Var(), false, create_graph);
    for (size_t i = 0, j = 0; i < xs.size(); ++i)
        if (xs[i].requires_grad()) result[i] = got[j++];
    return result;
}

}  // namespace

GradcheckResult gradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps, double atol, double rtol) {
    std::vector<Var> xs = check_inputs(inputs, "gradcheck");
    GradModeGuard mode(true);
    Var y = fn(xs);
    NL_REQUIRE(y.defined() && is_floating(y.dtype()), "gradcheck: fn must return a defined floating Var");
    Tensor v = projection(y.shape(), y.dtype(), 1234);
    std::vector<Var> analytic = grads_for(sum(y * Var(v)), xs, false);
    auto value = [&] {
        NoGradGuard no_grad;
        return dot(fn(xs), v);
    };
    return compare("gradcheck", xs, analytic, value, eps, atol, rtol);
}

GradcheckResult gradgradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps, double atol,
                              double rtol) {
    std::vector<Var> xs = check_inputs(inputs, "gradgradcheck");
    GradModeGuard mode(true);
    Var y = fn(xs);
    NL_REQUIRE(y.defined() && is_floating(y.dtype()), "gradgradcheck: fn must return a defined floating Var");
    Tensor v = projection(y.shape(), y.dtype(), 1234);
    std::vector<Tensor> u;  // random directions for the first-order grads
    for (size_t i = 0; i < xs.size(); ++i) u.push_back(projection(xs[i].shape(), DType::F64, 5678 + i));

    // H(x) = sum_i <d(sum(y v))/dx_i, u_i>, differentiated analytically through create_graph.
    std::vector<Var> first = grads_for(sum(y * Var(v)), xs, true);
    Var h;
    for (size_t i = 0; i < xs.size(); ++i) {
        if (!first[i].defined()) continue;
        Var term = sum(first[i] * Var(u[i]));
        h = h.defined() ? h + term : term;
    }
    std::vector<Var> analytic(xs.size());
    if (h.defined()) analytic = grads_for(h, xs, false);
    auto value = [&] {
        std::vector<Var> g = grads_for(sum(fn(xs) * Var(v)), xs, false);
        double total = 0.0;
        for (size_t i = 0; i < xs.size(); ++i)
            if (g[i].defined()) total += dot(g[i], u[i]);
        return total;
    };
    return compare("gradgradcheck", xs, analytic, value, eps, atol, rtol);
}

void require_gradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps, double atol, double rtol) {
    GradcheckResult r = gradcheck(fn, inputs, eps, atol, rtol);
    NL_REQUIRE(r.ok, r.message);
}

void require_gradgradcheck(const VarFn& fn, const std::vector<Var>& inputs, double eps, double atol,
                           double rtol) {
    GradcheckResult r = gradgradcheck(fn, inputs, eps, atol, rtol);
    NL_REQUIRE(r.ok, r.message);
}

}  // namespace nl
