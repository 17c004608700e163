// The norm-graph inspection of `normlab graph` (see norm_graph.h).
#include "jobs/norm_graph.h"

#include <memory>

#include "autograd/autograd.h"
#include "autograd/graph.h"
#include "layers/norms.h"

namespace nl {

namespace {

// The norm's output on a (rows, dim) N(0, 1) input from Generator(0), which requires grad so the
// graph is recorded.
Var norm_output(const NormGraphJob& job, bool fused) {
    NormOptions options;
    options.type = job.type;
    options.dim = job.dim;
    options.fused = fused;
    options.dtype = job.dtype;
    std::shared_ptr<Norm> norm = make_norm(options);
    Generator gen(0);
    Var x(randn({job.rows, job.dim}, gen, options.dtype), true);  // (rows, dim)
    return norm->forward(x);
}

}  // namespace

NormGraph inspect_norm_graph(const NormGraphJob& job) {
    const Var y = norm_output(job, job.fused);
    const Var other = norm_output(job, !job.fused);
    NormGraph out;
    out.summary = graph_summary(y);
    out.saved_bytes = graph_saved_bytes(y);
    out.other_saved_bytes = graph_saved_bytes(other);
    out.dot = graph_to_dot(y);
    return out;
}

}  // namespace nl
