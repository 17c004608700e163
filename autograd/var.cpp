// Var's members, SavedTensor, Node, and make_result: how a forward result joins the graph.
#include "autograd/var.h"

#include <atomic>
#include <unordered_set>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace nl {

// ---- SavedTensor ----

SavedTensor::SavedTensor(std::string name, Tensor tensor) : name(std::move(name)), tensor(std::move(tensor)) {}

SavedTensor::SavedTensor(std::string name, const Var& v) : name(std::move(name)) {
    NL_REQUIRE(v.defined(), "SavedTensor '", this->name, "': the Var is undefined");
    tensor = v.data();
    // Only a Var that requires grad needs its graph kept; a constant is just data.
    if (v.requires_grad()) var = v.impl();
}

SavedTensor SavedTensor::output(std::string name) {
    SavedTensor s(std::move(name), Tensor());
    s.is_output = true;
    return s;
}

int64_t SavedTensor::bytes() const {
    return tensor.defined() ? static_cast<int64_t>(tensor.storage()->nbytes()) : 0;
}

// ---- Node ----

namespace {
std::atomic<int64_t> next_node_id{0};
}

Node::Node(std::string name, std::vector<Edge> inputs, std::vector<SavedTensor> saved, BackwardFn fn,
           Shape output_shape, DType output_dtype)
    : name_(std::move(name)),
      inputs_(std::move(inputs)),
      saved_(std::move(saved)),
      fn_(std::move(fn)),
      output_shape_(std::move(output_shape)),
      output_dtype_(output_dtype),
      id_(next_node_id.fetch_add(1)),
      saved_anything_(!saved_.empty()) {}

namespace {
// Moves out the producer nodes `node` keeps alive (through its edges and through saved Vars only it
// holds), so they can be destroyed one by one instead of recursively.
void take_producers(std::vector<Edge>& inputs, std::vector<SavedTensor>& saved,
                    std::vector<std::shared_ptr<Node>>& pending) {
    for (Edge& edge : inputs)
        if (edge.node) pending.push_back(std::move(edge.node));
    for (SavedTensor& s : saved)
        if (s.var && s.var.use_count() == 1 && s.var->grad_fn) pending.push_back(std::move(s.var->grad_fn));
}
}  // namespace

Node::~Node() {
    // A graph is a chain of shared_ptrs; tearing it down recursively would overflow the stack on
    // long chains, so the producers only this node keeps alive die here, each with no inputs left.
    std::vector<std::shared_ptr<Node>> pending;
    take_producers(inputs_, saved_, pending);
    while (!pending.empty()) {
        std::shared_ptr<Node> node = std::move(pending.back());
        pending.pop_back();
        if (node.use_count() == 1) take_producers(node->inputs_, node->saved_, pending);
    }
}

int64_t Node::saved_bytes() const {
    std::unordered_set<const Storage*> seen;
    int64_t total = 0;
    for (const SavedTensor& s : saved_) {
        if (!s.tensor.defined()) continue;
        if (seen.insert(s.tensor.storage().get()).second) total += s.bytes();
    }
    return total;
}

std::vector<Var> Node::apply(const Var& grad_output) {
    NL_REQUIRE(!(released_ && saved_anything_), "backward: the graph was freed: node '", name_,
               "' (#", id_, ") already released its saved tensors in an earlier backward(); call "
               "backward(retain_graph=true) the first time to backpropagate through it again");
    NL_CHECK(fn_ != nullptr, "node ", name_, " has no backward function");
    std::vector<Var> saved;
    saved.reserve(saved_.size());
    for (const SavedTensor& s : saved_) {
        if (s.is_output && is_grad_enabled()) {
            // create_graph: the output as a Var made by this node, so grads flow back through it.
            auto impl = std::make_shared<VarImpl>();
            impl->data = s.tensor;
            impl->grad_fn = shared_from_this();
            impl->requires_grad = true;
            saved.emplace_back(std::move(impl));
        } else if (s.var && is_grad_enabled()) {
            saved.emplace_back(s.var);
        } else {
            saved.emplace_back(s.tensor);
        }
    }
    std::vector<Var> grads = fn_(grad_output, saved);
    NL_REQUIRE(grads.size() == inputs_.size(), "backward of ", name_, ": the backward function returned ",
               grads.size(), " gradients for ", inputs_.size(), " inputs");
    return grads;
}

void Node::release() {
    for (SavedTensor& s : saved_) {
        s.tensor = Tensor();
        s.var.reset();
    }
    released_ = true;
}

// ---- Var ----

Var::Var(Tensor data, bool requires_grad) : impl_(std::make_shared<VarImpl>()) {
    NL_REQUIRE(data.defined(), "Var: the tensor is undefined");
    impl_->data = std::move(data);
    if (requires_grad) set_requires_grad(true);
}

namespace {
VarImpl& checked(const std::shared_ptr<VarImpl>& impl, const char* what) {
    NL_REQUIRE(impl != nullptr, what, ": the Var is undefined");
    return *impl;
}
}  // namespace

const Tensor& Var::data() const { return checked(impl_, "data").data; }
Tensor& Var::data() { return checked(impl_, "data").data; }

void Var::set_data(Tensor data) {
    NL_REQUIRE(data.defined(), "set_data: the tensor is undefined");
    checked(impl_, "set_data").data = std::move(data);
}

Var Var::grad() const {
    const VarImpl& impl = checked(impl_, "grad");
    return impl.grad ? Var(impl.grad) : Var();
}

void Var::set_grad(const Var& grad) {
    VarImpl& impl = checked(impl_, "set_grad");
    if (!grad.defined()) {
        impl.grad.reset();
        return;
    }
    NL_REQUIRE(grad.shape() == impl.data.shape() && grad.dtype() == impl.data.dtype(),
               "set_grad: expected a gradient of shape ", shape_str(impl.data.shape()), " ",
               dtype_name(impl.data.dtype()), ", found ", shape_str(grad.shape()), " ",
               dtype_name(grad.dtype()));
    impl.grad = grad.impl();
}

void Var::zero_grad() { checked(impl_, "zero_grad").grad.reset(); }

bool Var::requires_grad() const { return checked(impl_, "requires_grad").requires_grad; }

void Var::set_requires_grad(bool requires_grad) {
    VarImpl& impl = checked(impl_, "set_requires_grad");
    NL_REQUIRE(impl.grad_fn == nullptr, "set_requires_grad: only leaves can change requires_grad; this Var "
               "was made by '", impl.grad_fn ? impl.grad_fn->name() : "", "' (use detach() for a leaf)");
    NL_REQUIRE(!requires_grad || is_floating(impl.data.dtype()),
               "set_requires_grad: only floating tensors can require grad, found ",
               dtype_name(impl.data.dtype()));
    impl.requires_grad = requires_grad;
}

bool Var::is_leaf() const { return checked(impl_, "is_leaf").grad_fn == nullptr; }

void Var::retain_grad() {
    VarImpl& impl = checked(impl_, "retain_grad");
    NL_REQUIRE(impl.requires_grad, "retain_grad: the Var does not require grad");
    if (impl.grad_fn) impl.retains_grad = true;  // leaves keep their grad anyway
}

bool Var::retains_grad() const { return checked(impl_, "retains_grad").retains_grad; }

const std::shared_ptr<Node>& Var::grad_fn() const { return checked(impl_, "grad_fn").grad_fn; }

Var Var::detach() const { return Var(data()); }

Var Var::reshape(const Shape& shape) const { return nl::reshape(*this, shape); }
Var Var::view(const Shape& shape) const { return nl::view(*this, shape); }
Var Var::transpose(int64_t dim0, int64_t dim1) const { return nl::transpose(*this, dim0, dim1); }
Var Var::t() const { return nl::t(*this); }
Var Var::permute(const std::vector<int64_t>& dims) const { return nl::permute(*this, dims); }
Var Var::narrow(int64_t dim, int64_t start, int64_t length) const { return nl::narrow(*this, dim, start, length); }
Var Var::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
    return nl::slice(*this, dim, start, end, step);
}
Var Var::select(int64_t dim, int64_t index) const { return nl::select(*this, dim, index); }
Var Var::expand(const Shape& shape) const { return nl::expand(*this, shape); }
Var Var::squeeze(int64_t dim) const { return nl::squeeze(*this, dim); }
Var Var::unsqueeze(int64_t dim) const { return nl::unsqueeze(*this, dim); }
Var Var::flatten() const { return nl::flatten(*this); }
Var Var::contiguous() const { return nl::contiguous(*this); }
Var Var::to(DType dtype) const { return nl::to(*this, dtype); }

std::string Var::str() const {
    if (!defined()) return "Var(undefined)";
    std::string head = "Var(";
    head += requires_grad() ? "requires_grad" : "no grad";
    if (grad_fn()) head += ", grad_fn=" + grad_fn()->name();
    return head + ")\n" + data().str();
}

// ---- make_result ----

Var make_result(Tensor out, std::string name, std::vector<Var> inputs, std::vector<SavedTensor> saved,
                BackwardFn fn) {
    bool any_requires_grad = false;
    for (const Var& v : inputs) any_requires_grad = any_requires_grad || (v.defined() && v.requires_grad());
    if (!is_grad_enabled() || !any_requires_grad) return Var(std::move(out));

    std::vector<Edge> edges(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].defined()) continue;
        edges[i].shape = inputs[i].shape();
        edges[i].dtype = inputs[i].dtype();
        if (inputs[i].grad_fn()) edges[i].node = inputs[i].grad_fn();
        else if (inputs[i].requires_grad()) edges[i].leaf = inputs[i].impl();
    }
    for (SavedTensor& s : saved)
        if (s.is_output) s.tensor = out;
    auto node = std::make_shared<Node>(std::move(name), std::move(edges), std::move(saved), std::move(fn),
                                       out.shape(), out.dtype());
    auto impl = std::make_shared<VarImpl>();
    impl->data = std::move(out);
    impl->grad_fn = node;
    impl->requires_grad = true;
    node->output = impl;
    return Var(impl);
}

}  // namespace nl
