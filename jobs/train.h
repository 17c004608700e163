// The train job as library code: a LLaMA-style transformer trained with AdamW, linear warmup +
// cosine decay and global grad-norm clipping on a synthetic task or a character-level text, writing
// a run directory (config.json, metrics.csv, checkpoints/, summary.json; profile.txt/.csv with
// `profile`). `run_train` runs a whole job; `TrainSession` is the same job one step at a time, for a
// program that wants to drive the loop itself (a notebook, a binding, a test).
//
// Nothing here prints or exits: progress reaches the caller through TrainCallbacks (the normlab
// program prints it), errors are nl::Error (a user mistake: config, file, shape) or another
// std::exception, and a failed run leaves error.txt in its run directory. A run stopped between
// steps (`stop_after`, or a callback asking to stop) leaves a checkpoint at that step, which
// `resume` continues bit for bit.
//
// Data parallel over MPI ranks (mpirun -np N; jobs/distributed.h): every rank draws the same global
// batch, computes its shards' gradients, and the gradients are summed over ranks during backward;
// rank 0 alone writes the run directory. A checkpoint is the same whatever N, so a run resumes on
// any number of ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobs/data.h"
#include "jobs/train_config.h"
#include "layers/transformer.h"

namespace nl {

// What to run: the `normlab train` command line as data.
struct TrainJob {
    std::string config_path;            // a JSON config file; empty: `config` below
    nlohmann::json config;              // a config object, used when config_path is empty
    std::string config_name = "config"; // how messages and the default run directory name `config`
    std::vector<std::string> overrides; // "a.b=value", applied in order before validation
    std::string out;                    // run directory; "" for runs/<config name>-<timestamp>
    bool force = false;                 // replace an existing run directory
    bool resume = false;                // continue the run in `out` from its latest checkpoint
    int64_t stop_after = 0;             // > 0: stop after this step as if interrupted
    bool profile = false;               // time the steps' kernels (core/profiler.h)
    // A NaN/Inf train loss is an error (the run stops with error.txt); false: run_step returns that
    // step as usual and the caller decides (a sweep records the run as diverged: jobs/sweep.h).
    bool nonfinite_loss_is_error = true;
};

// One evaluation over the held-out set.
struct EvalResult {
    double loss = 0.0;            // mean cross-entropy per scored token
    double accuracy = NAN;        // exact-sequence accuracy (synthetic tasks only; NaN for text)
    double token_accuracy = 0.0;  // next-token argmax accuracy over scored tokens
};

// One step as metrics.csv records it, plus what a progress line shows.
struct TrainStep {
    int64_t step = 0;             // 1-based
    int64_t steps = 0;            // /train/steps
    double lr = 0.0;
    double train_loss = 0.0;
    double grad_norm = 0.0;       // before clipping
    double z_loss = 0.0;          // the z-loss term the step's loss added (train.z_loss); train_loss excludes it
    double tokens_per_s = 0.0;    // over the steps this session ran
    double elapsed_seconds = 0.0; // since the session's loop started
    bool evaluated = false;       // this step ran an evaluation
    bool has_eval = false;        // some step of this session did; `eval` is the latest
    EvalResult eval;
    int threads = 1;              // CPU threads this step ran on (the governor's choice)
    int max_threads = 1;
    int world_size = 1;           // MPI ranks
    // The stability probes on a probed step (train.probe_every; jobs/probes.h), probes.csv's row
    // after its step column; empty on other steps.
    std::vector<std::pair<std::string, double>> probes;
};

// metrics.csv's row for one step, column by column: the one declaration of its columns (the CSV's
// header and cells, Python's step dicts). An empty value is a blank cell: the val_* columns on a step
// without an evaluation, and val_accuracy where the task has none.
struct MetricsCell {
    std::string column;
    std::optional<double> value;
};
std::vector<MetricsCell> metrics_row(const TrainStep& step);
std::vector<std::string> metrics_columns();

class TrainSession;

// How a caller follows and steers run_train. Each is optional.
struct TrainCallbacks {
    std::function<void(const TrainSession&)> on_start;  // set up, before the first step
    std::function<void(const TrainStep&)> on_step;            // after every step
    // Asked after every step: true stops the run there, with a checkpoint, as stop_after does.
    std::function<bool()> should_stop;
};

struct TrainResult {
    std::string run_dir;
    bool complete = false;           // false: stopped before /train/steps (no summary.json)
    int64_t last_step = 0;           // the step the run is at (its latest checkpoint's)
    nlohmann::json summary;          // what summary.json holds; null when not complete
    std::vector<TrainStep> history;  // the steps this call ran, in order
    std::string profile_table;       // `profile`: the kernel table (also profile.txt); else ""
};

class TrainSession {
public:
    // Reads and validates the config (with the overrides), checks the memory it needs, reads the
    // data, creates (or, with resume, reopens) the run directory, builds the model and AdamW, and
    // loads the latest checkpoint when resuming. Every check happens before anything is written.
    explicit TrainSession(const TrainJob& job);
    ~TrainSession();
    TrainSession(const TrainSession&) = delete;
    TrainSession& operator=(const TrainSession&) = delete;

    // "108224 parameters, reverse data, vocab 11, T = 16, on cpu, 1 process, run directory runs/...".
    std::string description() const;
    const TrainConfig& config() const;
    const Dataset& dataset() const;
    Transformer& model();
    const std::string& run_dir() const;
    int64_t step() const;      // steps done (the checkpoint's step right after a resume)
    int64_t end_step() const;  // where this session stops: /train/steps, or stop_after
    bool done() const;         // step() == end_step()

    // One optimizer step; then the evaluation, the metrics row and the checkpoint when due.
    TrainStep run_step();
    // Stops after the current step: writes its checkpoint (unless it has one) and ends the session.
    void stop_here();
    // The held-out set's loss and accuracies now (no gradient, the model's training mode restored).
    EvalResult evaluate();
    // Ends the session: the profile, then summary.json when every step has run. Call once.
    TrainResult finish();

    struct State;  // the job's internals (jobs/train.cpp)

private:
    std::unique_ptr<State> state_;
};

// The whole job: a TrainSession stepped to its end, reporting through `callbacks`.
TrainResult run_train(const TrainJob& job, const TrainCallbacks& callbacks = {});

}  // namespace nl
