// Higher-order functional autograd: the Hessian-vector product of a scalar function
// (torch.autograd.functional.hvp), by double backward, and the largest eigenvalue of a symmetric
// operator given by its products (Lanczos), which turns Hessian-vector products into sharpness.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/var.h"

namespace nl {

struct HvpResult {
    Var output;              // fn(inputs): detached unless create_graph
    std::vector<Var> hvp;    // H v, one per input with its shape: detached unless create_graph
};

// torch.autograd.functional.hvp(func, inputs, v, create_graph, strict): H v for the Hessian H of
// the single-element output of fn at `inputs`, with v one tensor per input of that input's shape
// (v may be empty only when every input has one element: v = 1). Computed by double backward:
// g = d fn/d x with create_graph, then H v = d(sum_i <g_i, v_i>)/d x (H is symmetric, so this is
// also torch's v^T H). fn is called with one variable per input, holding its values: an input that
// is a leaf requiring grad is passed as it is, so fn may as well read a module's parameters itself
// (pass model.parameters() as the inputs, where PyTorch needs torch.func.functional_call); any
// other input as a new leaf, or, with create_graph, as an alias whose graph leads back to it.
// No .grad is touched. An input fn does not use, or whose gradient does not depend on the inputs
// (fn linear in it), gets a zero H v, or an nl::Error with strict (PyTorch's rule).
HvpResult hvp(const VarFn& fn, const std::vector<Var>& inputs, const std::vector<Var>& v,
              bool create_graph = false, bool strict = false);

// The largest algebraic eigenvalue (not the largest |eigenvalue|: a Hessian's negative curvature does
// not count) of a symmetric operator A on R^n, given as out = A in, by `iterations` steps of Lanczos
// (Golub & Van Loan, Matrix Computations, 4th ed., Algorithm 10.1.1) from a standard normal start
// drawn from Generator(seed), then the largest eigenvalue of the tridiagonal matrix T it builds.
// Without reorthogonalization: three vectors of n doubles are kept, and lost orthogonality only
// repeats eigenvalues T has found, so the estimate is a Ritz value, below or at the true one, that
// rises to it as the iterations grow (fastest where the top eigenvalue is separated from the rest).
// Stops early when the Krylov space is invariant (the next vector's norm is at rounding level): T's
// eigenvalues are then A's own.
struct LanczosResult {
    double max_eigenvalue = 0.0;
    int64_t iterations = 0;  // products of A taken (at most the iterations asked)
};
using SymmetricOperator = std::function<void(const std::vector<double>& in, std::vector<double>& out)>;
LanczosResult lanczos_max_eigenvalue(const SymmetricOperator& apply, int64_t n, int64_t iterations, uint64_t seed);

// The largest eigenvalue of the symmetric tridiagonal matrix with `diagonal` (m) and `off_diagonal`
// (m - 1) by bisection on Sturm sequence counts (Golub & Van Loan, Algorithm 8.4.1), to the last bits.
double tridiagonal_max_eigenvalue(const std::vector<double>& diagonal, const std::vector<double>& off_diagonal);

}  // namespace nl
