// Higher-order functional autograd: the Hessian-vector product of a scalar function
// (torch.autograd.functional.hvp), by double backward.
#pragma once

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

}  // namespace nl
