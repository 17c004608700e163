// A small runner for sweeps: N independent runs, run i a function returning its record (a JSON
// object), dealt over MPI ranks (run i to rank i mod ranks) and, on each rank, over `jobs` threads;
// each finished run's record is written atomically to <dir>/runs/<i>/result.json, last, so a sweep
// killed at any moment can resume: the runs with a record are read back, the others (their
// half-written directories deleted) are run again. Rank 0 ends with every record, in run order.
// A shard K of N runs only the runs i with i mod N == K (other processes, perhaps on other machines
// sharing the directory, run the others) and ends with its own runs' records.
//
// Each run is driven on its thread under a dist::SoloGuard: the job inside sees a world of one (it
// writes its own files, its collectives are no-ops), whatever rank or thread it was dealt to. The
// threads share the process: every run must keep its state to itself (grad mode, autocast and the
// profiler's phase are thread_local; the CPU allocator is locked), and use one OpenMP thread unless
// the caller knows better. `normlab sweep` (jobs/sweep.h) and `normlab stability` (jobs/stability.h)
// run on it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nl {

struct GridRunner {
    std::string dir;     // the sweep's directory: run i lives in <dir>/runs/<i>/; "": no files (records in memory, no resume)
    int64_t runs = 0;    // N
    int jobs = 1;        // threads on each rank (the calling thread and jobs - 1 more), one run at a time each
    bool resume = false; // read back the records that exist; otherwise every run runs
    int64_t shard = 0;   // this process's share: the runs i with i mod shards == shard
    int64_t shards = 1;
    // Runs run i in run_dir(i) (an empty directory when it is called; "" without `dir`) and returns its
    // record (a JSON object: doubles round-trip, NaN and Inf do not: encode them). It may
    // throw: the other threads finish their current run, start no other, and the error reaches the
    // caller of run_grid (on every rank).
    std::function<nlohmann::json(int64_t index, const std::string& run_dir)> run;
    // After each run this rank finishes (not for records read back), one call at a time.
    std::function<void(int64_t index, const nlohmann::json& record)> on_done;

    std::string run_dir(int64_t index) const;      // "<dir>/runs/<index>"
    std::string record_path(int64_t index) const;  // "<dir>/runs/<index>/result.json"
};

// Runs the grid; returns every run's record of the shard (every run without shards) in run order on
// rank 0 (an empty list on other ranks). Every rank must call it. With resume, a run whose
// result.json reads back as a JSON object is not run again.
std::vector<nlohmann::json> run_grid(const GridRunner& grid);

// The runs of the shard (i mod shards == shard), in order.
std::vector<int64_t> shard_runs(const GridRunner& grid);

// This rank's runs: the k-th run of the shard goes to rank k mod ranks.
std::vector<int64_t> rank_runs(const GridRunner& grid);

// The runs with a record already (what resume would skip), in order; rank-local file reads.
std::vector<int64_t> finished_runs(const GridRunner& grid);

}  // namespace nl
