// The sweep runner (jobs/grid_runner.h): this rank's runs (of its shard), resumed ones read back, the
// rest pulled one at a time by `jobs` threads from a shared counter; then rank 0 gathers the records.
#include "jobs/grid_runner.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "core/dist.h"
#include "core/error.h"
#include "jobs/run_dir.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

using json = nlohmann::json;

// The record at `path` when it is a complete JSON object (written atomically, so a file that exists
// is whole; anything else is treated as absent and the run is run again).
std::optional<json> read_record(const std::string& path) {
    std::ifstream in(path);
    if (!in.good()) return std::nullopt;
    std::stringstream text;
    text << in.rdbuf();
    json record = json::parse(text.str(), nullptr, false);
    if (record.is_discarded() || !record.is_object()) return std::nullopt;
    return record;
}

}  // namespace

std::vector<int64_t> shard_runs(const GridRunner& grid) {
    NL_CHECK(grid.shards >= 1 && grid.shard >= 0 && grid.shard < grid.shards, "GridRunner: shard ", grid.shard,
             " of ", grid.shards);
    std::vector<int64_t> runs;
    for (int64_t i = grid.shard; i < grid.runs; i += grid.shards) runs.push_back(i);
    return runs;
}

std::vector<int64_t> rank_runs(const GridRunner& grid) {
    const std::vector<int64_t> shard = shard_runs(grid);
    std::vector<int64_t> mine;
    for (size_t k = static_cast<size_t>(dist::rank()); k < shard.size(); k += static_cast<size_t>(dist::world_size()))
        mine.push_back(shard[k]);
    return mine;
}

std::string GridRunner::run_dir(int64_t index) const { return dir + "/runs/" + std::to_string(index); }
std::string GridRunner::record_path(int64_t index) const { return run_dir(index) + "/result.json"; }

std::vector<int64_t> finished_runs(const GridRunner& grid) {
    std::vector<int64_t> done;
    if (grid.dir.empty()) return done;
    for (int64_t i = 0; i < grid.runs; ++i)
        if (read_record(grid.record_path(i))) done.push_back(i);
    return done;
}

std::vector<json> run_grid(const GridRunner& grid) {
    NL_CHECK(!grid.resume || !grid.dir.empty(), "run_grid: resume needs a directory of records");
    std::vector<std::optional<json>> records(static_cast<size_t>(grid.runs));  // (runs,) this rank's
    std::vector<int64_t> todo;
    for (int64_t i : rank_runs(grid)) {
        if (grid.resume)
            if (std::optional<json> record = read_record(grid.record_path(i))) {
                records[static_cast<size_t>(i)] = std::move(*record);
                continue;
            }
        todo.push_back(i);
    }
    dist::run_on_every_rank([&] {
        std::atomic<size_t> next{0};
        std::mutex mutex;  // guards records, error and on_done
        std::exception_ptr error;
        auto worker = [&] {
            dist::SoloGuard solo;  // each run is a world of one (jobs/grid_runner.h)
            while (true) {
                {
                    std::lock_guard<std::mutex> lock(mutex);
                    if (error) return;
                }
                const size_t k = next++;
                if (k >= todo.size()) return;
                const int64_t index = todo[k];
                try {
                    const bool files = !grid.dir.empty();
                    const std::string dir = files ? grid.run_dir(index) : std::string();
                    if (files) {
                        fs::remove_all(dir);  // a half-written run of an interrupted sweep starts over
                        fs::create_directories(dir);
                    }
                    // What is kept is what result.json reads back as (the same on a resume).
                    const json record = json::parse(grid.run(index, dir).dump());
                    if (files) write_file_atomic(grid.record_path(index), record.dump(1) + "\n");  // last: the run is done
                    std::lock_guard<std::mutex> lock(mutex);
                    records[static_cast<size_t>(index)] = record;
                    if (grid.on_done) grid.on_done(index, record);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(mutex);
                    if (!error) error = std::current_exception();
                    return;
                }
            }
        };
        const size_t threads = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(grid.jobs, 1)), todo.size()));
        // The calling thread is one of the workers: with jobs 1 every run is driven from it (where a
        // Python caller's signals are seen), and a callback on it can stop the sweep between runs.
        // A run sets its thread count (train.threads, 1 in a sweep) on the thread that drives it: the
        // calling thread's OpenMP count and OpenBLAS's are put back afterwards for the caller's next job.
        const int omp_threads = omp_get_max_threads();
        const int blas_threads = openblas_get_num_threads();
        std::vector<std::thread> pool;
        for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
        worker();
        for (std::thread& thread : pool) thread.join();
        omp_set_num_threads(omp_threads);
        openblas_set_num_threads(blas_threads);
        if (error) std::rethrow_exception(error);
    });

    // Rank 0 gathers: each rank sends [[index, record], ...] of its runs.
    json mine = json::array();
    for (int64_t i : rank_runs(grid))
        if (records[static_cast<size_t>(i)]) mine.push_back(json::array({i, *records[static_cast<size_t>(i)]}));
    const std::vector<std::string> gathered = dist::gather(mine.dump());
    if (!dist::is_root()) return {};
    for (const std::string& bytes : gathered)
        for (const json& entry : json::parse(bytes)) {
            const int64_t i = entry[0].get<int64_t>();
            NL_CHECK(i >= 0 && i < grid.runs, "gathered run index ", i, " out of range");
            records[static_cast<size_t>(i)] = entry[1];
        }
    std::vector<json> out;
    for (int64_t i : shard_runs(grid)) {
        NL_CHECK(records[static_cast<size_t>(i)].has_value(), "run ", i, "'s record was not gathered");
        out.push_back(std::move(*records[static_cast<size_t>(i)]));
    }
    return out;
}

}  // namespace nl
