// `normlab train CONFIG`: the command line of the train job (jobs/train.h): parses the flags, runs
// the job with callbacks that print its header, a progress line per step and the final report.
// Under mpirun only rank 0 prints.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/dist.h"
#include "core/error.h"
#include "examples/cli/commands.h"
#include "examples/cli/progress.h"
#include "jobs/train.h"

namespace nl::cli {

namespace {

struct TrainFlags {
    TrainJob job;
    bool quiet = false;
};

// "loss 1.6990 lr 3.00e-03 | 115535 tok/s | val 0.0001 acc 100.00%": what follows "step N/total".
std::string progress_fields(const TrainStep& t) {
    std::string fields = fmt::format("loss {:.4f} lr {:.2e} | {:.0f} tok/s", t.train_loss, t.lr, t.tokens_per_s);
    if (t.world_size > 1) fields += fmt::format(" | {} ranks", t.world_size);
    if (t.threads < t.max_threads)
        fields += fmt::format(" | {} of {} threads (cores busy elsewhere)", t.threads, t.max_threads);
    if (t.has_eval)
        fields += std::isnan(t.eval.accuracy) ? fmt::format(" | val {:.4f}", t.eval.loss)
                                              : fmt::format(" | val {:.4f} acc {:.2f}%", t.eval.loss, 100 * t.eval.accuracy);
    return fields;
}

// "train: step 1500: train loss 0.0000, val loss 0.0000, exact-sequence accuracy ..., 115687 tokens/s,
// peak memory 11.7 MiB per step, 13.5 s -> runs/...".
void print_report(const TrainResult& result) {
    const nlohmann::json& s = result.summary;
    const std::string accuracy =
        s.contains("val_accuracy")
            ? fmt::format(", exact-sequence accuracy {:.2f}% on {} held-out sequences",
                          100 * s["val_accuracy"].get<double>(), s["held_out_sequences"].get<int64_t>())
            : "";
    fmt::print("train: step {}: train loss {:.4f}, val loss {:.4f}{}, {:.0f} tokens/s, peak memory {:.1f} MiB per "
               "step, {:.1f} s -> {}\n",
               s["steps"].get<int64_t>(), s["final_train_loss"].get<double>(), s["val_loss"].get<double>(), accuracy,
               s["tokens_per_s"].get<double>(), static_cast<double>(s["peak_step_bytes"].get<int64_t>()) / (1 << 20),
               s["wall_seconds"].get<double>(), result.run_dir);
}

void run(const TrainFlags& flags) {
    const bool quiet = flags.quiet || !dist::is_root();  // one progress line: rank 0's
    std::unique_ptr<Progress> progress;
    int64_t steps = 0;
    TrainCallbacks callbacks;
    callbacks.on_start = [&](const TrainSession& session) {
        if (!quiet) fmt::print(stderr, "train: {}\n", session.description());
        steps = session.config().train.steps;
        progress = std::make_unique<Progress>(steps, quiet, session.config().train.log_every);
    };
    callbacks.on_step = [&](const TrainStep& step) { progress->update(step.step, progress_fields(step)); };
    const TrainResult result = run_train(flags.job, callbacks);
    if (progress) progress->finish();
    if (quiet) return;
    fmt::print("{}", result.profile_table);
    if (!result.complete) {
        fmt::print(stderr, "train: stopped after step {} of {} (--stop-after); continue with --resume\n",
                   result.last_step, steps);
        return;
    }
    print_report(result);
}

}  // namespace

void register_train(CLI::App& app) {
    auto flags = std::make_shared<TrainFlags>();
    TrainJob& job = flags->job;
    CLI::App* cmd = app.add_subcommand("train", "Train the toy transformer from a JSON config");
    cmd->add_option("config", job.config_path, "JSON config (configs/toy_transformer.json)")->required();
    cmd->add_option("--set", job.overrides, "Override a config key: --set train.steps=200 (repeatable)");
    cmd->add_option("--out", job.out, "Run directory (default runs/<config name>-<timestamp>)");
    cmd->add_flag("--force", job.force, "Overwrite an existing run directory");
    cmd->add_flag("--resume", job.resume, "Continue the run in --out from its latest checkpoint");
    cmd->add_flag("--quiet", flags->quiet, "No progress line or report");
    cmd->add_flag("--profile", job.profile,
                  "Time every kernel by op and phase (forward, backward, optimizer) and print the table "
                  "(calls, ms/step, share of the step, GFLOP/s or GB/s); also written to the run directory "
                  "as profile.txt and profile.csv (docs/profiling.md)");
    cmd->add_option("--stop-after", job.stop_after,
                    "Stop after this step as if interrupted, leaving a checkpoint to --resume from");
    cmd->callback([flags] {
        const TrainJob& job = flags->job;
        NL_REQUIRE(!job.resume || !job.out.empty(), "train: --resume needs --out naming the run directory");
        NL_REQUIRE(!(job.resume && job.force), "train: --resume and --force cannot be combined");
        NL_REQUIRE(job.stop_after >= 0, "train: --stop-after must be >= 0, found ", job.stop_after);
        run(*flags);
    });
}

}  // namespace nl::cli
