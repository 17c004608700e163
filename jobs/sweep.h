// The sweep job as library code: a grid of train runs (jobs/train.h), the cartesian product of train
// config values (/grid) times seeds, each run a normal train run directory under <sweep>/runs/<i>/,
// stopped and recorded as diverged when its loss blows up; then runs.csv (one row per run),
// summary.json (per variant: Wortsman et al. 2023's learning-rate sensitivity, the best lr, the
// divergence rate, the val loss per lr over seeds with its Student-t 95% interval, and with a
// `baseline` variant the paired differences to it) and plots.gp (PNGs where gnuplot is installed).
// docs/stability.md ("Transformer sweeps") has the config keys, the outputs and the formulas.
//
// The runs go over `jobs` threads in one process (each run on one OpenMP thread unless the config
// says otherwise) and, under mpirun, over the ranks (run i to rank i mod N); rank 0 writes the
// tables. Each finished run leaves runs/<i>/result.json (jobs/grid_runner.h), so `resume` continues
// an interrupted sweep, and its runs.csv equals an uninterrupted sweep's but for `seconds`. A `shard`
// K/N runs only the runs i with i mod N == K and writes no tables: N invocations on machines that
// share the sweep directory (a Slurm job array) run the whole grid, and a `resume` afterwards
// finds every run done and writes the tables (docs/distributed.md).
// Nothing here prints: progress reaches the caller through SweepCallbacks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nl {

struct SweepJob {
    std::string config_path;             // a JSON sweep config; empty: `config` below
    nlohmann::json config;               // a config object, used when config_path is empty
    std::string config_name = "config";  // how messages and the default directory name `config`
    std::vector<std::string> overrides;  // "a.b=value" on the sweep config, applied in order
    std::string out;                     // sweep directory; "" for runs/<config name>-<timestamp>
    bool force = false;                  // replace an existing sweep directory
    bool resume = false;                 // continue the sweep in `out`: run the runs without result.json
    int jobs = 0;                        // runs at once on each rank; 0: the cores / the MPI ranks (at least 1)
    std::string shard;                   // "K/N": only the runs i with i mod N == K, no tables; "": every run
};

// A shard of a sweep: the runs i with i mod count == index.
struct SweepShard {
    int64_t index = 0;
    int64_t count = 1;
};

// `text` "K/N" as a shard (0 <= K < N); an nl::Error naming --shard, what it expects and what it found.
SweepShard parse_shard(const std::string& text);

struct SweepStart {
    std::string description;  // "4 runs (optim.lr 2 x seeds 2), 2 at once -> runs/..."
    int64_t runs = 0;         // in the sweep
    int64_t resumed = 0;      // read back from result.json (resume)
    int64_t mine = 0;         // this rank runs
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SweepStart, description, runs, resumed, mine)

// One run this rank finished.
struct SweepRunDone {
    int64_t index = 0;
    std::string label;         // "optim.lr=0.01 seed=1"
    bool diverged = false;
    int64_t diverged_at_step = 0;
    double final_val_loss = 0.0;  // NaN when diverged
    double seconds = 0.0;
    int64_t done = 0;          // runs this rank has finished so far, of `mine`
    int64_t mine = 0;
    int rank = 0;              // the MPI rank that ran it, of world_size
    int world_size = 1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SweepRunDone, index, label, diverged, diverged_at_step, final_val_loss, seconds,
                                   done, mine, rank, world_size)

struct SweepCallbacks {
    std::function<void(const SweepStart&)> on_start;
    std::function<void(const SweepRunDone&)> on_run;  // one call at a time
};

struct SweepResult {
    std::string run_dir;
    std::vector<std::string> columns;             // runs.csv's header
    std::vector<std::vector<std::string>> rows;   // runs.csv's rows, in run order (rank 0)
    nlohmann::json summary;                       // summary.json (rank 0; null elsewhere)
    std::string table;                            // one line per variant, for the terminal
    std::string plots;                            // which PNGs were drawn, or why none
    int64_t shard_runs = 0;                       // a shard: the runs in it (no tables then)
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SweepResult, run_dir, columns, rows, summary, table, plots, shard_runs)

SweepResult run_sweep(const SweepJob& job, const SweepCallbacks& callbacks = {});

// Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities"),
// learning-rate sensitivity: mean over the lrs of min(L(lr), L_init) - min over lr of L(lr), with
// `losses` (lrs,) L(lr) (a diverged lr's L already replaced by L_init) and `init_loss` L_init.
double lr_sensitivity(const std::vector<double>& losses, double init_loss);

// runs.csv's loss_spikes: the steps whose train loss exceeds kLossSpikeFactor times the median of
// the kLossSpikeWindow steps before it (a non-finite loss counts as a spike). The first
// kLossSpikeWindow steps have no full window and are not judged. `losses`: the run's train loss
// per step, in order. A median, not a mean, so one spike does not raise the bar for the next steps.
inline constexpr double kLossSpikeFactor = 2.0;
inline constexpr size_t kLossSpikeWindow = 20;
int64_t count_loss_spikes(const std::vector<double>& losses);

}  // namespace nl
