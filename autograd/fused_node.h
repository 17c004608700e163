// A fused node with a composed twin: one make_result node whose first-order backward is a kernel
// and whose backward under create_graph is the autograd of the same function written with Var ops,
// so backward(create_graph=true), gradgradcheck and Hessian-vector products go through fused ops.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/var.h"

namespace nl {

// The composed twin of a fused op: the same function of the node's inputs (in input order, an
// absent one as an undefined Var) written with differentiable Var ops (functions.h).
using TwinFn = std::function<Var(const std::vector<Var>& inputs)>;

// make_result for a fused op that has a composed twin. The node's backward is
//   - grad mode off (a plain backward): kernel_backward(dy, saved), as make_result would run it:
//     nothing is recorded or kept for the twin, so the first-order path costs what it did;
//   - grad mode on (backward(create_graph=true)): the twin re-run on the inputs and differentiated
//     with create_graph (partial_gradients), so the gradients it returns carry a graph back to the
//     inputs and to dy, and can be differentiated again (to any order: the twin is composed).
// The twin needs the inputs again. input_saved[i] says where input i is: the index of the saved
// entry made from it (save it as a Var, {"x", x}: the same storage as a Tensor, no extra memory,
// so saved_bytes and the saved names do not change), or -1 for an input the node holds itself
// (a parameter such as a norm's weight: alive anyway, and not counted as saved, as PyTorch's
// graph inspection does not count it either). Only the inputs that require grad are differentiated;
// the others are constants of the twin.
//
//   return make_fused_result(y, "rms_norm", {x, w}, {{"x", x}, {"rstd", rstd}}, {0, -1},
//       [](const Var& dy, const std::vector<Var>& saved) { ... kernels on .data() ... },
//       [eps](const std::vector<Var>& in) { return in[0] * rsqrt(mean(square(in[0]), {-1}, true) + eps) * in[1]; });
Var make_fused_result(Tensor out, std::string name, std::vector<Var> inputs, std::vector<SavedTensor> saved,
                      std::vector<int> input_saved, BackwardFn kernel_backward, TwinFn twin);

}  // namespace nl
