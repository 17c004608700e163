// `normlab stability CONFIG`: the command line of the stability job (jobs/stability.h): the header
// and the summary table on stdout, a progress line per epoch on stderr. Under mpirun only rank 0
// prints.
#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "core/dist.h"
#include "examples/cli/commands.h"
#include "examples/cli/progress.h"
#include "jobs/stability.h"

namespace nl::cli {

namespace {

struct StabilityFlags {
    StabilityJob job;
    bool quiet = false;
};

void run(const StabilityFlags& flags) {
    std::unique_ptr<Progress> progress;
    StabilityCallbacks callbacks;
    callbacks.on_start = [&](const StabilityStart& start) {
        if (dist::is_root()) {
            fmt::print("stability: {}{}\n", start.description,
                       start.resumed > 0 ? fmt::format(" ({} runs already done)", start.resumed) : "");
            std::fflush(stdout);
        }
        // The progress line is rank 0's share of the runs.
        progress = std::make_unique<Progress>(start.total, flags.quiet || !dist::is_root(), start.epochs);
    };
    callbacks.on_epoch = [&](const StabilityEpoch& e) {
        const char* label = e.perturbed ? " (perturbed)" : "";
        progress->update(e.done, e.diverged_epoch > 0 ? fmt::format("{}{} diverged at epoch {}", e.run_id, label, e.diverged_epoch)
                                                      : fmt::format("{}{} loss {:.6g}", e.run_id, label, e.loss));
    };
    const StabilityResult result = run_stability(flags.job, callbacks);
    if (progress) progress->finish();
    if (!dist::is_root()) return;
    fmt::print("\n{}", result.table);
    for (const std::string& note : result.notes) fmt::print("{}\n", note);
    fmt::print("plots: {}\nrun directory: {}\n", result.plots, result.run_dir);
}

}  // namespace

void register_stability(CLI::App& app) {
    auto flags = std::make_shared<StabilityFlags>();
    CLI::App* cmd = app.add_subcommand(
        "stability", "The seed article's norm stability experiment (RMSNorm vs LayerNorm), swept over norms, "
                     "depths, learning rates and seeds");
    cmd->add_option("config", flags->job.config_path, "JSON config (configs/stability.json)")->required();
    cmd->add_option("--set", flags->job.overrides, "override a config key: --set epochs=30 (repeatable)");
    cmd->add_option("--out", flags->job.out, "run directory (default runs/<config name>-<timestamp>)");
    cmd->add_option("--jobs", flags->job.jobs,
                    "runs at once (default: one per core, at most the runs, each on one thread; 1 on a GPU)");
    cmd->add_flag("--force", flags->job.force, "overwrite an existing run directory");
    cmd->add_flag("--resume", flags->job.resume, "continue the run in --out: run the runs that have no result.json");
    cmd->add_flag("--quiet", flags->quiet, "no progress lines");
    cmd->callback([flags] { run(*flags); });
}

}  // namespace nl::cli
