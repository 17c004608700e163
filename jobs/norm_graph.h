// The norm-graph inspection of `normlab graph` as library code: runs one norm forward on a random
// (rows, dim) N(0, 1) input that requires grad, in the asked form and in the other, and returns
// what the recorded autograd graph keeps for backward: the summary (one line per node with what it
// saved), the saved bytes of both forms, and the graph as Graphviz DOT text. Nothing here prints or
// writes files; errors (an unknown norm type, a bad dim) are nl::Error.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace nl {

struct NormGraphJob {
    std::string type;          // a norm registry name: "rmsnorm"
    bool fused = true;         // the form to inspect (the layers' default)
    int64_t rows = 4;
    int64_t dim = 8;
    DType dtype = DType::F32;
};

struct NormGraph {
    std::string summary;          // graph_summary() of the output (autograd/graph.h)
    int64_t saved_bytes = 0;      // saved for backward by the inspected form
    int64_t other_saved_bytes = 0;  // by the other form, for comparison
    std::string dot;              // graph_to_dot() of the output
};

NormGraph inspect_norm_graph(const NormGraphJob& job);

}  // namespace nl
