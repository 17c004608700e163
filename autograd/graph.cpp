// Graph inspection: saved tensors per node, the graph's total saved bytes (each storage once), a
// text summary and Graphviz DOT export. graph_nodes() lives in engine.cpp (backward's order).
#include "autograd/graph.h"

#include <map>
#include <sstream>
#include <unordered_set>

namespace nl {

namespace {

std::string bytes_str(int64_t bytes) { return std::to_string(bytes) + " B"; }

std::string saved_list(const Node& node) {
    std::ostringstream out;
    bool first = true;
    for (const SavedInfo& s : saved_info(node)) {
        out << (first ? "" : ", ") << s.name << " " << shape_str(s.shape) << " " << dtype_name(s.dtype) << " "
            << bytes_str(s.bytes);
        first = false;
    }
    return out.str();
}

}  // namespace

std::vector<SavedInfo> saved_info(const Node& node) {
    std::vector<SavedInfo> info;
    for (const SavedTensor& s : node.saved()) {
        if (!s.tensor.defined()) {  // released by a backward
            info.push_back({s.name + " (freed)", {}, DType::F32, 0});
            continue;
        }
        info.push_back({s.name, s.tensor.shape(), s.tensor.dtype(), s.bytes()});
    }
    return info;
}

int64_t graph_saved_bytes(const Var& root) {
    std::unordered_set<const Storage*> seen;
    int64_t total = 0;
    for (const std::shared_ptr<Node>& node : graph_nodes(root))
        for (const SavedTensor& s : node->saved())
            if (s.tensor.defined() && seen.insert(s.tensor.storage().get()).second) total += s.bytes();
    return total;
}

std::string graph_summary(const Var& root) {
    std::ostringstream out;
    std::vector<std::shared_ptr<Node>> nodes = graph_nodes(root);
    int64_t per_node_total = 0;
    for (const std::shared_ptr<Node>& node : nodes) {
        out << "#" << node->id() << " " << node->name() << " -> " << shape_str(node->output_shape()) << " "
            << dtype_name(node->output_dtype());
        if (!node->saved().empty()) out << "  saved: " << saved_list(*node) << "  (" << bytes_str(node->saved_bytes()) << ")";
        out << "\n";
        per_node_total += node->saved_bytes();
    }
    out << nodes.size() << " nodes; saved for backward: " << bytes_str(graph_saved_bytes(root))
        << " (each distinct storage counted once; " << bytes_str(per_node_total) << " summed per node)\n";
    return out.str();
}

std::string graph_to_dot(const Var& root) {
    std::ostringstream out;
    out << "digraph autograd {\n  rankdir=BT;\n  node [shape=box, fontname=\"monospace\"];\n";
    std::map<const VarImpl*, int> leaves;
    for (const std::shared_ptr<Node>& node : graph_nodes(root)) {
        out << "  n" << node->id() << " [label=\"" << node->name() << "\\n" << shape_str(node->output_shape()) << " "
            << dtype_name(node->output_dtype());
        if (!node->saved().empty())
            out << "\\nsaved " << bytes_str(node->saved_bytes()) << ": " << saved_list(*node);
        out << "\"];\n";
        for (const Edge& edge : node->inputs()) {
            if (edge.node) {
                out << "  n" << edge.node->id() << " -> n" << node->id() << ";\n";
            } else if (edge.leaf) {
                auto [it, added] = leaves.emplace(edge.leaf.get(), static_cast<int>(leaves.size()));
                if (added)
                    out << "  leaf" << it->second << " [shape=ellipse, label=\"leaf\\n" << shape_str(edge.shape) << " "
                        << dtype_name(edge.dtype) << "\"];\n";
                out << "  leaf" << it->second << " -> n" << node->id() << ";\n";
            }
        }
    }
    out << "}\n";
    return out.str();
}

}  // namespace nl
