// make_fused_result: a kernel backward for first order, the composed twin's autograd under create_graph.
#include "autograd/fused_node.h"

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace nl {

Var make_fused_result(Tensor out, std::string name, std::vector<Var> inputs, std::vector<SavedTensor> saved,
                      std::vector<int> input_saved, BackwardFn kernel_backward, TwinFn twin) {
    NL_CHECK(input_saved.size() == inputs.size(), "make_fused_result(", name, "): ", input_saved.size(),
             " input_saved entries for ", inputs.size(), " inputs");
    bool any_requires_grad = false;
    for (const Var& v : inputs) any_requires_grad = any_requires_grad || (v.defined() && v.requires_grad());
    if (!is_grad_enabled() || !any_requires_grad) return Var(std::move(out));  // no node: nothing to build
    std::vector<Var> held;  // the inputs not saved (input_saved -1), held by the node; empty when none
    for (size_t i = 0; i < inputs.size(); ++i) {
        const int s = input_saved[i];
        NL_CHECK(s >= -1 && s < static_cast<int>(saved.size()), "make_fused_result(", name, "): input ", i,
                 " points at saved entry ", s, " of ", saved.size());
        if (s != -1) continue;
        if (held.empty()) held.resize(inputs.size());
        held[i] = inputs[i];
    }
    BackwardFn fn = [kernel_backward = std::move(kernel_backward), twin = std::move(twin),
                     input_saved = std::move(input_saved), held = std::move(held)](
                        const Var& dy, const std::vector<Var>& s) -> std::vector<Var> {
        if (!is_grad_enabled()) return kernel_backward(dy, s);
        // create_graph: Node::apply hands a saved input that requires grad over as the Var itself
        // (its graph), and one that does not as a constant.
        std::vector<Var> twin_inputs(input_saved.size());
        std::vector<Var> variables;  // the stand-ins of the inputs that require grad, in input order
        std::vector<size_t> variable_input;
        for (size_t i = 0; i < input_saved.size(); ++i) {
            const Var x = input_saved[i] >= 0 ? s[static_cast<size_t>(input_saved[i])] : held[i];
            if (!x.defined()) continue;  // an absent input (no bias)
            if (!x.requires_grad()) {
                twin_inputs[i] = Var(x.data());
                continue;
            }
            // Its own node (alias), where partial_gradients stops: the twin's gradient with respect
            // to this input alone, whose graph still leads back to x.
            twin_inputs[i] = alias(x);
            variables.push_back(twin_inputs[i]);
            variable_input.push_back(i);
        }
        const Var y = twin(twin_inputs);
        const std::vector<Var> partial = partial_gradients(y, variables, dy, /*create_graph=*/true);
        std::vector<Var> grads(input_saved.size());
        for (size_t k = 0; k < partial.size(); ++k) grads[variable_input[k]] = partial[k];
        return grads;
    };
    return make_result(std::move(out), std::move(name), std::move(inputs), std::move(saved), std::move(fn));
}

}  // namespace nl
