// The backward engine (micrograd's idea at tensor scale): topologically sort the nodes reachable
// from the root, walk them in reverse, and accumulate each input's gradient through add_grad.
#include <unordered_map>
#include <unordered_set>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/grad_ready.h"
#include "autograd/var.h"
#include "core/profiler.h"

namespace nl {

namespace {

// graph_nodes, not descending below the nodes in `boundary` (they are listed, their inputs are not).
std::vector<std::shared_ptr<Node>> nodes_above(const Var& root, const std::unordered_set<const Node*>& boundary) {
    std::vector<std::shared_ptr<Node>> post_order;  // every node after the nodes it depends on
    if (!root.defined() || !root.grad_fn()) return post_order;
    std::unordered_set<const Node*> visited;
    // Iterative DFS (deep graphs, e.g. long RNN-like chains, would overflow a recursive one).
    std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
    stack.emplace_back(root.grad_fn(), 0);
    visited.insert(root.grad_fn().get());
    while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->inputs().size() && (boundary.empty() || !boundary.count(node.get()))) {
            const std::shared_ptr<Node>& child = node->inputs()[next++].node;
            if (child && visited.insert(child.get()).second) stack.emplace_back(child, 0);
        } else {
            post_order.push_back(node);
            stack.pop_back();
        }
    }
    return {post_order.rbegin(), post_order.rend()};
}

}  // namespace

// Declared in graph.h; defined here because backward walks the same order.
std::vector<std::shared_ptr<Node>> graph_nodes(const Var& root) { return nodes_above(root, {}); }

namespace {

thread_local GradReadyFn t_grad_ready;  // GradReadyGuard's hook; empty when none

// True when `grad` is the only handle to its tensor and its storage, and contiguous: nothing else can
// see it, so it can become a .grad as it is (PyTorch's AccumulateGrad steals such a gradient too).
// A gradient handed to two inputs (add's backward), the caller's own backward(grad), or a view of a
// tensor someone still holds has another reference and is copied instead.
bool owned_alone(const Var& grad) {
    return grad.impl().use_count() == 1 && grad.data().storage().use_count() == 1 && grad.data().is_contiguous();
}

// The one accumulation path: checks the gradient against the shape and dtype it must have, then
// adds it to what `slot` holds (as a Var op, so under create_graph the sum is recorded too).
Var add_grad(const Var& slot, Var grad, const Shape& shape, DType dtype, const Node& node,
             size_t input) {
    NL_REQUIRE(grad.shape() == shape, "backward of ", node.name(), ": the gradient for input ", input,
               " has shape ", shape_str(grad.shape()), " but the input has shape ", shape_str(shape));
    NL_REQUIRE(grad.dtype() == dtype, "backward of ", node.name(), ": the gradient for input ", input,
               " has dtype ", dtype_name(grad.dtype()), " but the input has dtype ", dtype_name(dtype));
    if (!slot.defined()) return grad;
    // Summed into the slot's own tensor when nothing else holds it and no graph is being recorded
    // (create_graph): a new sum would be a second buffer of the same size, written instead of one
    // already in cache.
    if (!is_grad_enabled() && owned_alone(slot)) {
        Tensor sum = slot.data();
        add_(sum, grad.data());
        return slot;
    }
    return add(slot, grad);
}

// .grad of a leaf (or retain_grad non-leaf). Without create_graph the stored grad is a fresh
// contiguous tensor that aliases nothing (add's backward hands the same gradient to both inputs,
// and optimizers scale grads in place): a gradient nobody else holds is taken as it is, any other
// is copied. `grad` is taken by value so the caller can move its last handle in.
void accumulate_into(VarImpl& target, Var grad, bool create_graph) {
    if (create_graph) {
        target.grad = (target.grad ? add(Var(target.grad), grad) : grad).impl();
    } else if (!target.grad) {
        target.grad = owned_alone(grad) ? Var(grad.data()).impl() : Var(grad.data().clone()).impl();
    } else {
        target.grad->data = add(target.grad->data, grad.data());
    }
}

// The gradient backward starts from, after checking the root: grad_root, or ones for a
// single-element root when none is given.
Var root_gradient(const Var& root, const Var& grad_root) {
    NL_REQUIRE(root.defined(), "backward: the Var is undefined");
    NL_REQUIRE(root.requires_grad(), "backward: the Var does not require grad and has no grad_fn "
               "(was it computed under NoGradGuard, or from inputs that do not require grad?)");
    Var grad = grad_root;
    if (!grad.defined()) {
        NL_REQUIRE(root.numel() == 1, "backward: a gradient can be created implicitly only for a "
                   "single-element output, found shape ", shape_str(root.shape()),
                   "; pass backward(grad) with a gradient of that shape");
        grad = Var(ones_like(root.data()));
    }
    NL_REQUIRE(grad.shape() == root.shape(), "backward: the gradient has shape ", shape_str(grad.shape()),
               " but the output has shape ", shape_str(root.shape()));
    NL_REQUIRE(grad.dtype() == root.dtype(), "backward: the gradient has dtype ", dtype_name(grad.dtype()),
               " but the output has dtype ", dtype_name(root.dtype()));
    return grad;
}

// One backward walk: where the gradients go (accumulated into .grad, or, with `capture`
// (gradients()), returned for those inputs instead), and for GradReadyGuard the count of edges not
// yet walked into each leaf.
class BackwardWalk {
public:
    // stop_at_capture: a captured non-leaf is where the walk ends (partial_gradients), not a node
    // it goes through.
    BackwardWalk(const std::vector<Var>* capture, bool create_graph, bool stop_at_capture = false);

    // A leaf's gradient: accumulated into its .grad, or summed into its captured slot.
    void to_leaf(VarImpl& leaf, Var g);
    // Walks `order` (graph_nodes of the root), starting from root_grad at root_node.
    void walk(const std::vector<std::shared_ptr<Node>>& order, const Node* root_node, const Var& root_grad,
              bool retain_graph);
    // The captured inputs' gradients (empty without `capture`).
    std::vector<Var> take_captured() { return std::move(captured_); }

private:
    void count_leaf_edges(const std::vector<std::shared_ptr<Node>>& order);
    void edge_done(VarImpl* leaf);
    void to_node_output(const Node& node, const Var& g);
    void to_inputs(const Node& node, std::vector<Var>& input_grads, std::unordered_map<const Node*, Var>& grads);

    const bool capture_;
    const bool create_graph_;
    const bool stop_at_capture_;
    // Where captured gradients go: leaves by their impl, non-leaves by their producing node.
    std::unordered_map<const VarImpl*, size_t> capture_leaf_;
    std::unordered_map<const Node*, size_t> capture_node_;
    std::vector<Var> captured_;
    // GradReadyGuard: a leaf's .grad is final once every edge into it has been walked (or skipped),
    // so the edges are counted first and the hook is called when a leaf's count reaches zero.
    bool report_ready_ = false;
    std::unordered_map<VarImpl*, int64_t> edges_left_;  // leaf -> edges into it not yet walked
};

BackwardWalk::BackwardWalk(const std::vector<Var>* capture, bool create_graph, bool stop_at_capture)
    : capture_(capture != nullptr), create_graph_(create_graph), stop_at_capture_(stop_at_capture) {
    if (capture) {
        captured_.resize(capture->size());
        for (size_t i = 0; i < capture->size(); ++i) {
            const Var& v = (*capture)[i];
            NL_REQUIRE(v.defined() && v.requires_grad(), "gradients: input ", i, " does not require grad");
            if (v.grad_fn()) capture_node_[v.grad_fn().get()] = i;
            else capture_leaf_[v.impl().get()] = i;
        }
    }
}

void BackwardWalk::to_leaf(VarImpl& leaf, Var g) {
    if (!capture_) return accumulate_into(leaf, std::move(g), create_graph_);
    auto it = capture_leaf_.find(&leaf);
    if (it != capture_leaf_.end()) captured_[it->second] = captured_[it->second].defined()
                                                              ? add(captured_[it->second], g) : g;
}

void BackwardWalk::count_leaf_edges(const std::vector<std::shared_ptr<Node>>& order) {
    report_ready_ = t_grad_ready && !capture_;
    if (report_ready_)
        for (const std::shared_ptr<Node>& node : order)
            for (const Edge& edge : node->inputs())
                if (edge.leaf) ++edges_left_[edge.leaf.get()];
}

void BackwardWalk::edge_done(VarImpl* leaf) {
    if (report_ready_ && --edges_left_[leaf] == 0 && leaf->grad) t_grad_ready(*leaf);
}

// The gradient w.r.t. a node's output, where it is wanted: a captured non-leaf, or a retain_grad one.
void BackwardWalk::to_node_output(const Node& node, const Var& g) {
    if (capture_) {
        auto c = capture_node_.find(&node);
        if (c != capture_node_.end()) captured_[c->second] = g;
    } else if (auto out = node.output.lock(); out && out->retains_grad) {
        accumulate_into(*out, g, create_graph_);
    }
}

// A node's input gradients, each to where its edge leads: summed into the gradient of the node that
// produced the input (grads), or sent to the leaf.
void BackwardWalk::to_inputs(const Node& node, std::vector<Var>& input_grads,
                             std::unordered_map<const Node*, Var>& grads) {
    for (size_t i = 0; i < input_grads.size(); ++i) {
        const Edge& edge = node.inputs()[i];
        if (!edge.requires_grad() || !input_grads[i].defined()) {
            if (edge.leaf) edge_done(edge.leaf.get());
            continue;
        }
        if (edge.node) {
            Var& slot = grads[edge.node.get()];
            slot = add_grad(slot, input_grads[i], edge.shape, edge.dtype, node, i);
        } else {
            // Moved: when this was the gradient's last handle, the leaf takes it without a copy.
            to_leaf(*edge.leaf, add_grad(Var(), std::move(input_grads[i]), edge.shape, edge.dtype, node, i));
            edge_done(edge.leaf.get());
        }
    }
}

void BackwardWalk::walk(const std::vector<std::shared_ptr<Node>>& order, const Node* root_node,
                        const Var& root_grad, bool retain_graph) {
    count_leaf_edges(order);
    std::unordered_map<const Node*, Var> grads;  // gradient w.r.t. each node's output, so far
    grads[root_node] = root_grad;
    for (const std::shared_ptr<Node>& node : order) {
        auto it = grads.find(node.get());
        if (it == grads.end()) {  // no gradient reached this node
            for (const Edge& edge : node->inputs())
                if (edge.leaf) edge_done(edge.leaf.get());
            continue;
        }
        Var g = std::move(it->second);
        grads.erase(it);
        to_node_output(*node, g);
        if (stop_at_capture_ && capture_node_.count(node.get())) continue;  // an input of partial_gradients
        std::vector<Var> input_grads = node->apply(g);
        g = Var();
        to_inputs(*node, input_grads, grads);
        if (!retain_graph) node->release();  // free saved tensors as soon as they are used
    }
    if (!retain_graph)
        for (const std::shared_ptr<Node>& node : order) node->release();
}

// Runs backward from `root`. With `capture` (gradients()), the grads of those inputs are returned
// instead of accumulated into any .grad.
// With stop_at_capture, the walk ends at the captured inputs (partial_gradients).
std::vector<Var> run_backward(const Var& root, const Var& grad_root, bool retain_graph, bool create_graph,
                              const std::vector<Var>* capture, bool stop_at_capture = false) {
    const Var grad = root_gradient(root, grad_root);
    retain_graph = retain_graph || create_graph;
    GradModeGuard mode(create_graph);  // record the backward pass only when asked
    profiler::PhaseGuard phase(profiler::Phase::Backward);  // the profiler's table separates backward kernels
    BackwardWalk walk(capture, create_graph, stop_at_capture);
    if (!root.grad_fn()) {  // a leaf: its gradient is the given one
        walk.to_leaf(*root.impl(), grad);
        return walk.take_captured();
    }
    std::unordered_set<const Node*> boundary;
    if (stop_at_capture)
        for (const Var& v : *capture)
            if (v.grad_fn()) boundary.insert(v.grad_fn().get());
    const std::vector<std::shared_ptr<Node>> order = nodes_above(root, boundary);
    walk.walk(order, root.grad_fn().get(), grad, retain_graph);
    return walk.take_captured();
}

}  // namespace

GradReadyGuard::GradReadyGuard(GradReadyFn fn) : previous_(std::move(t_grad_ready)) { t_grad_ready = std::move(fn); }
GradReadyGuard::~GradReadyGuard() { t_grad_ready = std::move(previous_); }

void Var::backward(const Var& grad, bool retain_graph, bool create_graph) const {
    run_backward(*this, grad, retain_graph, create_graph, nullptr);
}

std::vector<Var> gradients(const Var& output, const std::vector<Var>& inputs, const Var& grad_output,
                           bool retain_graph, bool create_graph) {
    return run_backward(output, grad_output, retain_graph, create_graph, &inputs);
}

std::vector<Var> partial_gradients(const Var& output, const std::vector<Var>& inputs, const Var& grad_output,
                                   bool create_graph) {
    return run_backward(output, grad_output, /*retain_graph=*/true, create_graph, &inputs, /*stop_at_capture=*/true);
}

}  // namespace nl
