// hvp: torch.autograd.functional.hvp by double backward; Lanczos for the largest eigenvalue of a
// symmetric operator (autograd/functional.h).
#include "autograd/functional.h"

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/rng.h"

namespace nl {

HvpResult hvp(const VarFn& fn, const std::vector<Var>& inputs, const std::vector<Var>& v, bool create_graph,
              bool strict) {
    NL_REQUIRE(!inputs.empty(), "hvp: expected at least one input, found none");
    NL_REQUIRE(v.empty() || v.size() == inputs.size(), "hvp: expected v with one tensor per input (", inputs.size(),
               "), found ", v.size());
    std::vector<Var> xs;  // the variables fn is differentiated at
    std::vector<Tensor> vs;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const Var& x = inputs[i];
        NL_REQUIRE(x.defined() && is_floating(x.dtype()), "hvp: expected input ", i, " to be a floating tensor, found ",
                   x.defined() ? dtype_name(x.dtype()) : std::string("an undefined one"));
        if (v.empty()) {
            NL_REQUIRE(x.numel() == 1, "hvp: v can be omitted only for single-element inputs, found input ", i,
                       " of shape ", shape_str(x.shape()));
            vs.push_back(ones_like(x.data()));
        } else {
            NL_REQUIRE(v[i].defined() && v[i].shape() == x.shape() && v[i].dtype() == x.dtype(), "hvp: expected v[", i,
                       "] of shape ", shape_str(x.shape()), " ", dtype_name(x.dtype()), " (input ", i, "'s), found ",
                       v[i].defined() ? shape_str(v[i].shape()) + " " + dtype_name(v[i].dtype()) : "an undefined one");
            vs.push_back(v[i].data());
        }
        if (x.is_leaf() && x.requires_grad()) {
            xs.push_back(x);  // a parameter: fn may read it directly (no .grad is touched)
        } else if (create_graph && x.requires_grad()) {
            GradModeGuard on(true);
            xs.push_back(alias(x));  // its own variable, whose graph leads back to x
        } else {
            xs.push_back(Var(x.data(), true));
        }
    }

    GradModeGuard on(true);
    const Var out = fn(xs);
    NL_REQUIRE(out.defined() && out.numel() == 1, "hvp: fn must return a single-element tensor, found ",
               out.defined() ? shape_str(out.shape()) : std::string("an undefined one"));
    NL_REQUIRE(out.requires_grad(), "hvp: fn's output does not depend on its inputs (it has no graph)");

    // g = d out / d x, recorded; then H v = d(sum_i <g_i, v_i>)/d x.
    const std::vector<Var> g = partial_gradients(out, xs, Var(), /*create_graph=*/true);
    Var gv;  // sum_i <g_i, v_i>
    for (size_t i = 0; i < xs.size(); ++i) {
        NL_REQUIRE(!strict || g[i].defined(), "hvp: the output of fn is independent of input ", i,
                   ", which strict mode does not allow");
        if (!g[i].defined()) continue;
        NL_REQUIRE(!strict || g[i].requires_grad(), "hvp: the gradient of fn is independent of the inputs at input ",
                   i, " (fn is linear in it), which strict mode does not allow");
        if (!g[i].requires_grad()) continue;
        const Var term = sum(g[i] * Var(vs[i]));
        gv = gv.defined() ? gv + term : term;
    }
    std::vector<Var> hv(xs.size());
    if (gv.defined()) hv = partial_gradients(gv, xs, Var(), create_graph);

    HvpResult result;
    result.output = create_graph ? out : out.detach();
    for (size_t i = 0; i < xs.size(); ++i) {
        NL_REQUIRE(!strict || hv[i].defined(), "hvp: the Hessian-vector product is independent of input ", i,
                   ", which strict mode does not allow");
        if (!hv[i].defined()) hv[i] = Var(zeros_like(xs[i].data()));
        result.hvp.push_back(create_graph ? hv[i] : hv[i].detach());
    }
    return result;
}

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double sum = 0.0;  // in index order: the same bits on any thread count
    for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
    return sum;
}

// The number of eigenvalues of the tridiagonal matrix below x: the negative pivots of the LDL^T
// factorization of T - x I (Sylvester's law of inertia). A zero pivot is nudged, as LAPACK's dstebz does.
int64_t eigenvalues_below(const std::vector<double>& d, const std::vector<double>& e, double x) {
    int64_t count = 0;
    double pivot = 1.0;
    for (size_t i = 0; i < d.size(); ++i) {
        const double off = i == 0 ? 0.0 : e[i - 1];
        pivot = d[i] - x - (i == 0 ? 0.0 : off * off / pivot);
        if (pivot == 0.0) pivot = -1e-300;
        count += pivot < 0.0;
    }
    return count;
}

}  // namespace

double tridiagonal_max_eigenvalue(const std::vector<double>& diagonal, const std::vector<double>& off_diagonal) {
    const size_t m = diagonal.size();
    NL_REQUIRE(m > 0 && off_diagonal.size() + 1 == m, "tridiagonal_max_eigenvalue: expected a diagonal of m > 0 and ",
               "an off-diagonal of m - 1 entries, found ", m, " and ", off_diagonal.size());
    // Gershgorin: every eigenvalue lies in [lo, hi].
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < m; ++i) {
        const double radius = (i > 0 ? std::abs(off_diagonal[i - 1]) : 0.0) + (i + 1 < m ? std::abs(off_diagonal[i]) : 0.0);
        lo = std::min(lo, diagonal[i] - radius);
        hi = std::max(hi, diagonal[i] + radius);
    }
    NL_REQUIRE(std::isfinite(lo) && std::isfinite(hi), "tridiagonal_max_eigenvalue: the matrix has a non-finite entry");
    // Invariant: every eigenvalue is below or at hi, and one is above lo (m - 1 or fewer below lo).
    const int64_t below_all = static_cast<int64_t>(m) - 1;
    for (int i = 0; i < 2000; ++i) {
        const double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi) break;  // lo and hi are adjacent doubles
        if (eigenvalues_below(diagonal, off_diagonal, mid) > below_all) hi = mid;
        else lo = mid;
    }
    return hi;
}

LanczosResult lanczos_max_eigenvalue(const SymmetricOperator& apply, int64_t n, int64_t iterations, uint64_t seed) {
    NL_REQUIRE(n > 0, "lanczos_max_eigenvalue: expected an operator on R^n with n > 0, found n = ", n);
    NL_REQUIRE(iterations > 0, "lanczos_max_eigenvalue: expected at least 1 iteration, found ", iterations);
    const size_t size = static_cast<size_t>(n);
    std::vector<double> q(size), q_prev(size, 0.0), w(size);  // (n,) the Lanczos vectors and A q
    Generator gen(seed);
    gen.fill_normal(q.data(), n);
    const double start_norm = std::sqrt(dot(q, q));
    for (double& x : q) x /= start_norm;
    std::vector<double> alpha, beta;  // T's diagonal (m) and off-diagonal (m - 1)
    double scale = 0.0;               // the largest |alpha| or beta seen: the size of A on the Krylov space
    for (int64_t j = 0; j < iterations; ++j) {
        apply(q, w);
        NL_REQUIRE(w.size() == size, "lanczos_max_eigenvalue: the operator returned ", w.size(), " values for n = ", n);
        const double a = dot(q, w);
        NL_REQUIRE(std::isfinite(a), "lanczos_max_eigenvalue: the operator's product is not finite at iteration ", j + 1);
        alpha.push_back(a);
        scale = std::max(scale, std::abs(a));
        if (j + 1 == iterations) break;
        const double b_prev = beta.empty() ? 0.0 : beta.back();
        for (size_t i = 0; i < size; ++i) w[i] -= a * q[i] + b_prev * q_prev[i];
        const double b = std::sqrt(dot(w, w));
        // An invariant subspace (or an operator of rank below j + 1): T holds A's eigenvalues there.
        if (!(b > 1e-12 * std::max(scale, 1e-300))) break;
        scale = std::max(scale, b);
        beta.push_back(b);
        for (size_t i = 0; i < size; ++i) {
            q_prev[i] = q[i];
            q[i] = w[i] / b;
        }
    }
    LanczosResult result;
    result.iterations = static_cast<int64_t>(alpha.size());
    result.max_eigenvalue = tridiagonal_max_eigenvalue(alpha, beta);
    return result;
}

}  // namespace nl
