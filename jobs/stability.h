// The stability job as library code: the seed article's normalization stability experiment, swept.
// SimpleModel (fc1 Linear 100->256, norm1, ReLU, fc2 Linear 256->256, norm2, ReLU, fc3 Linear 256->10),
// MSE on x ~ N(0,1) (1000, 100) and y ~ N(0,1) (1000, 10), Adam lr 1e-3, 100 full-batch epochs,
// RMSNorm vs LayerNorm; the config sweeps norms x depths x learning rates x seeds. Every run also
// trains a copy with fc1.weight scaled by (1 + perturb): the late epochs of this experiment are
// chaotic, so the summary reports how much the final loss moves under that tiny perturbation next to
// its spread over seeds, and nobody reads one seed's final loss as a verdict on a norm.
// The run directory gets config.json, curves/<run>.csv, runs.csv, plots.gp (and PNGs where gnuplot
// is installed) and summary.json. docs/stability.md has the config keys and the article's results.
//
// The runs go over `jobs` threads in one process (each run on one OpenMP thread when jobs > 1) and,
// under mpirun (core/dist.h), over the ranks (run i to rank i mod N), on the grid runner
// (jobs/grid_runner.h); rank 0 gathers every curve and writes the same run directory, tables and
// plots as one process. Each finished run leaves its record in runs/<i>/result.json, so `resume`
// continues an interrupted job: its curves, runs.csv and summary.json equal an uninterrupted job's
// but for the wall-clock fields.
// Nothing here prints: progress reaches the caller through StabilityCallbacks. A callback may throw
// to cancel the job between epochs (the runs in flight on other threads finish first); the run
// directory then holds error.txt, and the finished runs' records, which `resume` reads back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nl {

struct StabilityJob {
    std::string config_path;             // a JSON config file; empty: `config` below
    nlohmann::json config;               // a config object, used when config_path is empty
    std::string config_name = "config";  // how messages and the default run directory name `config`
    std::vector<std::string> overrides;  // "a.b=value", applied in order before validation
    std::string out;                     // run directory; "" for runs/<config name>-<timestamp>
    bool force = false;                  // replace an existing run directory
    bool resume = false;                 // continue the job in `out`: run the runs without result.json
    int jobs = 0;                        // runs at once on each rank; 0: the cores / the MPI ranks, at most the
                                         // runs per rank (1 on a GPU)
};

// The job as it starts, for a header line.
struct StabilityStart {
    std::string description;  // "4 runs (2 norms x 1 depths x 1 lrs x 2 seeds), 100 epochs, f32 on cpu, ... -> runs/..."
    int64_t epochs = 0;       // per run (and per perturbed copy)
    int64_t total = 0;        // epochs this rank trains, over its runs and their copies
    int64_t runs = 0;         // in the sweep
    int64_t resumed = 0;      // read back from their result.json (resume), over all ranks
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StabilityStart, description, epochs, total, runs, resumed)

// One epoch of one run (or of its perturbed copy), on this rank.
struct StabilityEpoch {
    std::string run_id;       // "rmsnorm_d2_lr0.001_s42"
    bool perturbed = false;   // the copy with fc1.weight scaled by (1 + perturb)
    int64_t epoch = 0;        // 1-based
    double loss = 0.0;        // the loss before this epoch's update
    int64_t done = 0;         // epochs this rank has trained so far, of StabilityStart::total
    int64_t diverged_epoch = 0;  // > 0 on the event that ends a diverged run: the epoch it diverged at
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StabilityEpoch, run_id, perturbed, epoch, loss, done, diverged_epoch)

struct StabilityCallbacks {
    std::function<void(const StabilityStart&)> on_start;
    std::function<void(const StabilityEpoch&)> on_epoch;  // from the runs' threads, one call at a time
};

// One run's curves (rank 0's result holds every rank's runs, in sweep order).
struct StabilityRun {
    std::string id;
    std::string norm;
    int64_t depth = 0;
    double lr = 0.0;
    int64_t seed = 0;
    std::vector<double> losses;            // (epochs run,) the loss before each epoch's update
    std::vector<double> perturbed_losses;  // the perturbed copy's; empty when perturb is 0
    std::vector<double> grad_norms;        // (epochs run,) the gradient's L2 norm over all parameters
    int64_t diverged_epoch = 0;            // 0: did not diverge
    double seconds = 0.0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StabilityRun, id, norm, depth, lr, seed, losses, perturbed_losses, grad_norms,
                                   diverged_epoch, seconds)

struct StabilityResult {
    std::string run_dir;
    nlohmann::json summary;             // what summary.json holds (rank 0; null on the other ranks)
    std::string table;                  // the summary table, one row per (norm, depth, lr)
    std::vector<std::string> notes;     // how to read the table (sensitivity, one seed per row)
    std::string plots;                  // which plots were drawn, or why none
    std::vector<StabilityRun> runs;     // rank 0: every run
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StabilityResult, run_dir, summary, table, notes, plots, runs)

StabilityResult run_stability(const StabilityJob& job, const StabilityCallbacks& callbacks = {});

}  // namespace nl
