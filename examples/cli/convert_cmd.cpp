// `normlab convert CHECKPOINT --to rmsnorm OUT`: the command line of the convert job (jobs/convert.h):
// a pre-norm LayerNorm model written as the pre-norm RMSNorm model with the same function, and one
// line saying what was written.
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "examples/cli/commands.h"
#include "jobs/convert.h"

namespace nl::cli {

void register_convert(CLI::App& app) {
    struct Args {
        std::string checkpoint;
        std::vector<std::string> to;
        bool force = false;
    };
    auto args = std::make_shared<Args>();
    CLI::App* cmd = app.add_subcommand(
        "convert", "Rewrite a pre-norm LayerNorm checkpoint as the pre-norm RMSNorm model with the same function");
    cmd->add_option("checkpoint", args->checkpoint, "A checkpoint file, or a run directory (its latest checkpoint)")
        ->required();
    cmd->add_option("--to", args->to, "rmsnorm FILE: the converted checkpoint to write")->expected(2)->required();
    cmd->add_flag("--force", args->force, "Replace an existing output");
    cmd->callback([args] {
        ConvertOptions options;
        options.to = args->to.at(0);
        options.out = args->to.at(1);
        options.force = args->force;
        const ConvertResult r = run_convert(args->checkpoint, options);
        fmt::print("convert: {} (step {}) -> {} ({} LayerNorms as RMSNorms, {} weights re-centered, {} parameters)\n",
                   r.source, r.step, options.out, r.norms, r.recentered, r.parameters);
    });
}

}  // namespace nl::cli
