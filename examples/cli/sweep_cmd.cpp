// `normlab sweep CONFIG`: the command line of the sweep job (jobs/sweep.h): a header, one line per
// finished run on stderr (its index, grid values and final val loss, or the step it diverged at),
// then the per-variant table on stdout (for a --shard, where its runs are and how to finish the sweep).
// Under mpirun each rank prints its own runs' lines; rank 0 the header and the table.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "core/dist.h"
#include "examples/cli/commands.h"
#include "jobs/sweep.h"

namespace nl::cli {

namespace {

struct SweepFlags {
    SweepJob job;
    bool quiet = false;
};

void run(const SweepFlags& flags) {
    SweepCallbacks callbacks;
    callbacks.on_start = [&](const SweepStart& start) {
        if (flags.quiet || !dist::is_root()) return;
        fmt::print(stderr, "sweep: {}{}\n", start.description,
                   start.resumed > 0 ? fmt::format(" ({} runs already done)", start.resumed) : "");
    };
    callbacks.on_run = [&](const SweepRunDone& r) {
        if (flags.quiet) return;
        const std::string outcome = r.diverged ? fmt::format("diverged at step {}", r.diverged_at_step)
                                               : fmt::format("val loss {:.4f}", r.final_val_loss);
        fmt::print(stderr, "sweep: run {} ({}/{}{}) {}: {} ({:.2f} s)\n", r.index, r.done, r.mine,
                   r.world_size > 1 ? fmt::format(" on rank {}", r.rank) : "", r.label, outcome,
                   r.seconds);
        std::fflush(stderr);
    };
    const SweepResult result = run_sweep(flags.job, callbacks);
    if (!dist::is_root() || flags.quiet) return;
    if (!flags.job.shard.empty()) {
        fmt::print("sweep: shard {} done: its {} runs are in {}/runs; once every shard is done, "
                   "`normlab sweep {} --out {} --resume` writes runs.csv, summary.json and the plots\n",
                   flags.job.shard, result.shard_runs, result.run_dir, flags.job.config_path, result.run_dir);
        return;
    }
    fmt::print("\n{}plots: {}\nsweep directory: {}\n", result.table, result.plots, result.run_dir);
}

}  // namespace

void register_sweep(CLI::App& app) {
    auto flags = std::make_shared<SweepFlags>();
    SweepJob& job = flags->job;
    CLI::App* cmd = app.add_subcommand(
        "sweep", "A grid of train runs (train config values x seeds): runs.csv, learning-rate sensitivity per "
                 "variant (summary.json), plots");
    cmd->add_option("config", job.config_path, "JSON sweep config (configs/sweep.json)")->required();
    cmd->add_option("--set", job.overrides, "Override a sweep config key: --set seeds=[0,1] (repeatable)");
    cmd->add_option("--out", job.out, "Sweep directory (default runs/<config name>-<timestamp>)");
    cmd->add_option("--jobs", job.jobs, "Runs at once (default: one per core, each on one thread)");
    cmd->add_flag("--force", job.force, "Overwrite an existing sweep directory");
    cmd->add_flag("--resume", job.resume, "Continue the sweep in --out: run the runs that have no result.json");
    cmd->add_option("--shard", job.shard,
                    "K/N: run only the runs i with i mod N == K (K from 0), no tables; N such invocations sharing "
                    "--out run the whole sweep, then --resume writes the tables (docs/distributed.md)");
    cmd->add_flag("--quiet", flags->quiet, "No progress lines or table");
    cmd->callback([flags] { run(*flags); });
}

}  // namespace nl::cli
