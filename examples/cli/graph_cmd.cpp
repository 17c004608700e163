// `normlab graph --layer NAME [--fused|--composed] --dot out.dot`: runs one norm forward on a small
// random batch (jobs/norm_graph.h) and shows the autograd graph it records: one line per node with
// what it saved for backward, the total saved bytes (next to the other form's, for comparison), and
// Graphviz DOT, rendered to PNG when `dot` is installed.
#include "examples/cli/commands.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "core/error.h"
#include "jobs/norm_graph.h"
#include "jobs/run_dir.h"
#include "layers/norm_registry.h"

namespace nl::cli {

namespace {

struct Options {
    std::string layer;
    bool fused = false;
    bool composed = false;
    std::string dot;
    int64_t rows = 4;
    int64_t dim = 8;
    std::string dtype = "f32";
};

std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return out + "'";
}

void run_graph(const Options& opt) {
    NL_REQUIRE(!(opt.fused && opt.composed), "graph: give --fused or --composed, not both");
    NL_REQUIRE(opt.rows >= 1 && opt.dim >= 1, "graph: --rows and --dim must be at least 1, found ", opt.rows, " and ",
               opt.dim);
    const bool fused = !opt.composed;  // the layers' default form
    const NormGraph graph = inspect_norm_graph(
        {.type = opt.layer, .fused = fused, .rows = opt.rows, .dim = opt.dim, .dtype = dtype_from_name(opt.dtype)});
    const char* form = fused ? "fused" : "composed";
    fmt::print("{} ({}), input [{}, {}] {}\n{}", opt.layer, form, opt.rows, opt.dim, opt.dtype, graph.summary);
    fmt::print("saved for backward: {} B ({} form: {} B)\n", graph.saved_bytes, fused ? "composed" : "fused",
               graph.other_saved_bytes);
    if (opt.dot.empty()) return;
    write_file_atomic(opt.dot, graph.dot);
    fmt::print("wrote {}\n", opt.dot);
    if (std::system("command -v dot >/dev/null 2>&1") != 0) {
        fmt::print("Graphviz `dot` not found: no PNG (render later with: dot -Tpng {} -o graph.png)\n", opt.dot);
        return;
    }
    const std::string png = std::filesystem::path(opt.dot).replace_extension(".png").string();
    const std::string command = "dot -Tpng " + shell_quote(opt.dot) + " -o " + shell_quote(png) + " 2>&1";
    NL_REQUIRE(std::system(command.c_str()) == 0, "graph: `dot` failed to render ", opt.dot);
    fmt::print("wrote {}\n", png);
}

}  // namespace

void register_graph(CLI::App& app) {
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand("graph", "Show a norm's autograd graph: saved tensors and bytes, Graphviz DOT");
    cmd->add_option("--layer", opt->layer, "norm type: " + norm_type_choices())
        ->required();
    cmd->add_flag("--fused", opt->fused, "the fused form (one node, closed-form backward; the default)");
    cmd->add_flag("--composed", opt->composed, "the composed form (primitive ops)");
    cmd->add_option("--dot", opt->dot, "write the graph as Graphviz DOT here (and a PNG next to it when `dot` is installed)");
    cmd->add_option("--rows", opt->rows, "rows of the random input (default 4)");
    cmd->add_option("--dim", opt->dim, "normalized dim (default 8)");
    cmd->add_option("--dtype", opt->dtype, "f32 (default), f64, bf16, f16");
    cmd->callback([opt] { run_graph(*opt); });
}

}  // namespace nl::cli
