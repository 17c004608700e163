// Graph inspection: what each node saved for backward (names, shapes, bytes), the graph's total,
// a text summary, and Graphviz DOT export. This is how normlab answers "how much memory does a
// LayerNorm keep for backward versus an RMSNorm, composed versus fused".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/var.h"

namespace nl {

struct SavedInfo {
    std::string name;   // the name the op gave it ("x", "rstd", "y")
    Shape shape;
    DType dtype;
    int64_t bytes;      // bytes of the storage it keeps alive
};

// Every node reachable from root's grad_fn, root first, each before the nodes it depends on
// (a reverse topological order: the order backward visits them). Empty for a leaf.
std::vector<std::shared_ptr<Node>> graph_nodes(const Var& root);
std::vector<SavedInfo> saved_info(const Node& node);

// Total bytes saved for backward over the graph, counting each distinct storage once (mul saving x
// and square saving x again is one x). Per-node Node::saved_bytes() counts within the node.
int64_t graph_saved_bytes(const Var& root);

// One line per node: "#id op -> [shape]  saved: x [4, 8] f64 256 B, rstd [4, 1] f64 32 B  (288 B)"
// and a total line saying distinct storages are counted once.
std::string graph_summary(const Var& root);

// Graphviz DOT: one box per node labelled with op name, output shape and saved bytes; leaves
// requiring grad as ellipses with their shapes; edges from inputs to the ops that use them.
std::string graph_to_dot(const Var& root);

}  // namespace nl
