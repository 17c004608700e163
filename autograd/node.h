// Node: one recorded op of the graph. It holds its inputs (edges to their producer nodes or to the
// leaves that receive .grad), the tensors it saved for backward (each with a name, so the graph can
// report what a LayerNorm keeps versus an RMSNorm), and the backward closure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace nl {

class Var;
struct VarImpl;
class Node;

// A tensor saved for backward, with a name for inspection ({"x", x}, {"rstd", rstd}).
// - From a Tensor: a constant (no gradient flows into it on a second-order backward).
// - From a Var: backward sees that Var itself, so backward(create_graph=true) differentiates
//   through it (mul saves its inputs this way).
// - SavedTensor::output("y"): the node's own output (exp, sigmoid, softmax save their result);
//   stored as data only, so the node and its output do not keep each other alive.
struct SavedTensor {
    std::string name;
    Tensor tensor;                  // the saved values: what saved_bytes() counts
    std::shared_ptr<VarImpl> var;   // set when saved from a Var that requires grad
    bool is_output = false;

    SavedTensor(std::string name, Tensor tensor);
    SavedTensor(std::string name, const Var& var);
    static SavedTensor output(std::string name);
    int64_t bytes() const;          // bytes of the storage it keeps alive (0 once released)
};

// One backward step: given the gradient of the node's output and the saved values (as Vars, in the
// order they were saved), return one gradient per input, in input order, each with that input's
// shape; an undefined Var means "no gradient" (zero). Write it with differentiable Var ops so
// backward(create_graph=true) can record it; the engine runs it under NoGradGuard otherwise.
using BackwardFn = std::function<std::vector<Var>(const Var& grad_output, const std::vector<Var>& saved)>;

// Where a node's input gradient goes: the input's producer node (a non-leaf), or a leaf that
// requires grad (its .grad is accumulated), or nowhere (a constant; both null).
struct Edge {
    std::shared_ptr<Node> node;
    std::shared_ptr<VarImpl> leaf;
    Shape shape;                    // the input's shape and dtype, checked by add_grad
    DType dtype = DType::F32;
    bool requires_grad() const { return node != nullptr || leaf != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
public:
    Node(std::string name, std::vector<Edge> inputs, std::vector<SavedTensor> saved, BackwardFn fn,
         Shape output_shape, DType output_dtype);
    ~Node();  // tears long chains down iteratively (a recursive teardown could overflow the stack)
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;

    const std::string& name() const { return name_; }
    const std::vector<Edge>& inputs() const { return inputs_; }
    const std::vector<SavedTensor>& saved() const { return saved_; }
    const Shape& output_shape() const { return output_shape_; }
    DType output_dtype() const { return output_dtype_; }
    int64_t id() const { return id_; }  // creation order; unique per process
    // Bytes of the storages this node's saved tensors keep alive; a storage saved twice by this
    // node counts once. 0 after the graph has been freed.
    int64_t saved_bytes() const;
    bool released() const { return released_; }

    // ---- engine interface ----
    // Runs the backward closure; throws nl::Error if the saved tensors were freed by an earlier
    // backward (names the op and says to pass retain_graph=true).
    std::vector<Var> apply(const Var& grad_output);
    // Drops the saved tensors (and the closure) after a backward without retain_graph.
    void release();
    // The node's output, for retain_grad() and for materializing SavedTensor::output.
    std::weak_ptr<VarImpl> output;

private:
    std::string name_;
    std::vector<Edge> inputs_;
    std::vector<SavedTensor> saved_;
    BackwardFn fn_;
    Shape output_shape_;
    DType output_dtype_;
    int64_t id_;
    bool released_ = false;
    bool saved_anything_ = false;  // a released node that saved nothing can run again
};

}  // namespace nl
