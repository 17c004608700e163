// Var: the differentiable handle (a torch tensor's analogue). A cheap-to-copy shared pointer to a
// VarImpl holding the data Tensor, its .grad, requires_grad and the node that produced it.
// Copies share everything (grad included); detach() makes a new handle on the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"

namespace nl {

struct VarImpl {
    Tensor data;
    std::shared_ptr<VarImpl> grad;   // .grad as a Var impl (so create_graph grads keep their graph)
    std::shared_ptr<Node> grad_fn;   // null for leaves
    bool requires_grad = false;
    bool retains_grad = false;       // non-leaf that keeps its .grad (retain_grad())
};

class Var {
public:
    Var() = default;  // undefined: defined() is false
    explicit Var(Tensor data, bool requires_grad = false);
    explicit Var(std::shared_ptr<VarImpl> impl) : impl_(std::move(impl)) {}

    bool defined() const { return impl_ != nullptr; }

    // ---- data ----
    const Tensor& data() const;
    Tensor& data();                  // mutable: optimizers update parameters in place through it
    void set_data(Tensor data);      // replaces the values (any shape/dtype, like torch's .data =)
    const Shape& shape() const { return data().shape(); }
    DType dtype() const { return data().dtype(); }
    Device device() const { return data().device(); }
    int64_t dim() const { return data().dim(); }
    int64_t size(int64_t d) const { return data().size(d); }
    int64_t numel() const { return data().numel(); }
    double item() const { return data().item(); }

    // ---- gradient ----
    Var grad() const;                // undefined Var when there is none
    void set_grad(const Var& grad);  // undefined clears; else shape and dtype must match data
    void zero_grad();                // set_to_none semantics: grad() becomes undefined
    bool requires_grad() const;
    void set_requires_grad(bool requires_grad);  // leaves only; floating dtypes only
    bool is_leaf() const;            // no grad_fn (user-created, or made under NoGradGuard)
    void retain_grad();              // a non-leaf keeps its .grad after backward (PyTorch rule)
    bool retains_grad() const;
    const std::shared_ptr<Node>& grad_fn() const;
    Var detach() const;              // same data, no graph, requires_grad false

    // Reverse-mode: accumulate d(this)/d(leaf) into every leaf's .grad (and retain_grad non-leaves).
    // `grad` defaults to 1 and is required unless this is a single-element Var. The graph's saved
    // tensors are freed unless retain_graph; create_graph records the backward pass itself (and
    // implies retain_graph) so grads can be differentiated again. Such a .grad holds a graph that
    // holds the leaf (a reference cycle, as in PyTorch): zero_grad() when done, or prefer gradients().
    void backward(const Var& grad = Var(), bool retain_graph = false, bool create_graph = false) const;

    // ---- views and casts as members (the free functions in functions.h do the work) ----
    Var reshape(const Shape& shape) const;
    Var view(const Shape& shape) const;
    Var transpose(int64_t dim0, int64_t dim1) const;
    Var t() const;
    Var permute(const std::vector<int64_t>& dims) const;
    Var narrow(int64_t dim, int64_t start, int64_t length) const;
    Var slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
    Var select(int64_t dim, int64_t index) const;
    Var expand(const Shape& shape) const;
    Var squeeze(int64_t dim) const;
    Var unsqueeze(int64_t dim) const;
    Var flatten() const;
    Var contiguous() const;
    Var to(DType dtype) const;

    std::string str() const;         // "Var(requires_grad, grad_fn=mul)\n" + data().str()
    const std::shared_ptr<VarImpl>& impl() const { return impl_; }

private:
    std::shared_ptr<VarImpl> impl_;
};

// ---- extension point for fused ops ----
// Wraps a forward result `out` as a Var. When grad mode is on and some input requires grad, it
// records one node named `name` with `inputs` (undefined Vars allowed, e.g. an absent bias), the
// `saved` tensors, and `fn`, which must return one gradient per input. Otherwise it returns a plain
// Var(out) and drops `saved`. Example, a fused RMSNorm that keeps only x and rstd for backward:
//
//   Var rms_norm_fused(const Var& x, const Var& w, double eps) {
//       Tensor y = ..., rstd = ...;                 // forward kernel; rstd (rows)
//       return make_result(y, "rms_norm", {x, w}, {{"x", x.data()}, {"rstd", rstd}},
//           [d = x.size(-1)](const Var& dy, const std::vector<Var>& saved) -> std::vector<Var> {
//               const Var& x = saved[0];
//               const Var& rstd = saved[1];
//               ...                                  // closed-form backward (a kernel pair)
//               return {dx, dw};
//           });
//   }
//
// Saved tensors from Tensors are constants to a second-order backward; to support create_graph
// through a fused op, save the inputs as Vars ({"x", x}) and write fn with Var ops.
Var make_result(Tensor out, std::string name, std::vector<Var> inputs, std::vector<SavedTensor> saved,
                BackwardFn fn);

// torch.autograd.grad: d(output)/d(inputs) returned instead of accumulated into .grad (no leaf's
// .grad is touched). An input the output does not depend on gets an undefined Var. With
// create_graph the returned grads carry a graph (Hessian-vector products, gradgradcheck).
std::vector<Var> gradients(const Var& output, const std::vector<Var>& inputs,
                           const Var& grad_output = Var(), bool retain_graph = false,
                           bool create_graph = false);

// d(output)/d(inputs[i]) with each input an independent variable: the walk ends at the inputs and
// never goes below them, so it covers only the graph between output and inputs (kept: no saved
// tensor is freed), holding the other inputs fixed even where one input was computed from another.
// A node's own backward in terms of a graph recorded inside it (make_fused_result). Inputs must be
// distinct Vars that require grad; one the output does not depend on gets an undefined Var.
std::vector<Var> partial_gradients(const Var& output, const std::vector<Var>& inputs, const Var& grad_output,
                                   bool create_graph);

}  // namespace nl
