// Data parallel and distributed sweeps (core/dist.h, jobs/distributed.h): the fixed-order shard sum
// and the backward engine's ready hook in one process, then the normlab program under
// `mpirun -np 2` (MPI builds): the same losses and checkpoints as one process, a sweep's results,
// a resume on another number of ranks, and failures that end the job instead of hanging it.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/cpu_runtime.h"
#include "autograd/autograd.h"
#include "autograd/grad_ready.h"
#include "cli_test_util.h"
#include "core/ops.h"
#include "jobs/distributed.h"
#include "layers/linear.h"
#include "test_util.h"

// AddressSanitizer builds: GCC defines __SANITIZE_ADDRESS__, clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define NL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NL_TEST_ASAN 1
#endif
#endif
#ifndef NL_TEST_ASAN
#define NL_TEST_ASAN 0
#endif

namespace {

using nl::Var;

// ---- in one process ----

TEST_CASE("NCCL is opened on first use, not at start, and has the functions normlab calls", "[mpi]") {
    // Not linked: the first library of a soname a process loads is the one it keeps, and PyTorch
    // imported after normlab's Python package needs its own libnccl.so.2.
    auto mapped = [] {
        std::ifstream maps("/proc/self/maps");
        return std::string(std::istreambuf_iterator<char>(maps), {}).find("libnccl") != std::string::npos;
    };
    CHECK_FALSE(mapped());
    if (nl::dist::built_with_nccl()) {
        const std::string path = nl::dist::load_nccl();
        CHECK(path.find("libnccl") != std::string::npos);
        CHECK(mapped());
    } else {
        CHECK_THROWS_WITH(nl::dist::load_nccl(), Catch::Contains("built without NCCL"));
    }
}

TEST_CASE("tree_sum halves while the count is even, then adds left to right", "[mpi]") {
    // 1e8 + 1 rounds to 1e8 in f32, so the order of the additions shows in the result.
    const std::vector<float> a = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f, 0.5f};
    std::vector<const float*> shards;
    for (const float& v : a) shards.push_back(&v);
    float out = 0.0f;
    nl::tree_sum({shards.begin(), shards.begin() + 4}, 0, 1, &out);
    CHECK(out == (a[0] + a[1]) + (a[2] + a[3]));  // 0 in f32
    CHECK(out != ((a[0] + a[1]) + a[2]) + a[3]);  // left to right would give 1
    nl::tree_sum({shards.begin(), shards.begin() + 3}, 0, 1, &out);
    CHECK(out == (a[0] + a[1]) + a[2]);
    nl::tree_sum(shards, 0, 1, &out);  // 6 = 2 x 3: two halves, each left to right
    CHECK(out == ((a[0] + a[1]) + a[2]) + ((a[3] + a[4]) + a[5]));
    CHECK(nl::tree_sum(std::vector<double>{1e17, 1.0, -1e17, 1.0}) == (1e17 + 1.0) + (-1e17 + 1.0));
}

TEST_CASE("plan_shards: equal shards per rank, mistakes named with both numbers", "[mpi]") {
    nl::ShardPlan plan = nl::plan_shards(64, 8, 2, 1, "c.json: /train");
    CHECK(plan.shards == 8);
    CHECK(plan.local_shards == 4);
    CHECK(plan.shard_rows == 8);
    CHECK(plan.first_shard == 4);
    CHECK(nl::plan_shards(64, 0, 4, 3, "w").shards == 4);  // 0: one shard per rank
    CHECK_THROWS_WITH(nl::plan_shards(15, 0, 2, 0, "c.json: /train"),
                      Catch::Contains("c.json: /train/batch_size") && Catch::Contains("2 ranks") &&
                          Catch::Contains("got 15"));
    CHECK_THROWS_WITH(nl::plan_shards(16, 3, 2, 0, "c.json: /train"),
                      Catch::Contains("/train/grad_shards") && Catch::Contains("2 ranks") && Catch::Contains("got 3"));
    CHECK_THROWS_WITH(nl::plan_shards(16, 6, 2, 0, "c.json: /train"),
                      Catch::Contains("/train/grad_shards") && Catch::Contains("batch_size = 16") &&
                          Catch::Contains("got 6"));
}

TEST_CASE("the ready hook sees each leaf once, after its last gradient is added", "[mpi][autograd]") {
    Var w(nl::from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}, {3}), true);
    Var b(nl::from_vector(std::vector<float>{0.5f, 0.5f, 0.5f}, {3}), true);
    Var unused(nl::from_vector(std::vector<float>{1.0f}, {1}), true);
    // w is used twice, so its .grad is final only after both paths: 2w (from w*w) + 1 (from + w).
    Var loss = nl::sum(w * w + w + b);
    std::vector<std::pair<const nl::VarImpl*, std::vector<float>>> seen;
    {
        nl::GradReadyGuard guard([&](nl::VarImpl& leaf) {
            seen.emplace_back(&leaf, Var(leaf.grad).data().to_vector_as<float>());
        });
        loss.backward();
    }
    REQUIRE(seen.size() == 2);  // w and b; `unused` is not in the graph
    for (const auto& [leaf, grad] : seen) {
        if (leaf == w.impl().get()) CHECK(grad == std::vector<float>{3.0f, 5.0f, 7.0f});
        else CHECK(leaf == b.impl().get());
    }
    // Without a guard the hook is gone.
    seen.clear();
    nl::sum(w * b).backward();
    CHECK(seen.empty());
}

TEST_CASE("DataParallel in one process: two local shards' gradients summed in the fixed order", "[mpi]") {
    nl::Generator gen(7);
    nl::Linear layer(4, 3, true);
    const nl::NamedVars params = layer.named_parameters();
    const nl::Tensor x = nl::randn({6, 4}, gen);  // (6, 4): shard 0 is rows 0-2, shard 1 rows 3-5
    auto shard_loss = [&](int64_t shard) { return nl::sum(layer.forward(Var(x.narrow(0, 3 * shard, 3).contiguous()))); };

    // The reference: each shard's gradient alone, then g0 + g1.
    std::vector<std::vector<float>> expected;
    for (const auto& [name, p] : params) expected.emplace_back(p.numel(), 0.0f);
    std::vector<std::vector<std::vector<float>>> per_shard(2);
    for (int64_t shard = 0; shard < 2; ++shard) {
        for (const auto& [name, p] : params) Var(p).zero_grad();
        shard_loss(shard).backward();
        for (const auto& [name, p] : params) per_shard[shard].push_back(p.grad().data().to_vector_as<float>());
    }
    for (size_t i = 0; i < params.size(); ++i)
        for (size_t k = 0; k < expected[i].size(); ++k) expected[i][k] = per_shard[0][i][k] + per_shard[1][i][k];

    nl::DataParallel data_parallel(params, 2, 8, true);  // 8-byte buckets: bias (3 numbers), then weight (12)
    CHECK(data_parallel.bucket_count() == 2);
    for (const auto& [name, p] : params) Var(p).zero_grad();
    for (int64_t shard = 0; shard < 2; ++shard) data_parallel.backward(shard_loss(shard), shard);
    for (size_t i = 0; i < params.size(); ++i) {
        INFO(params[i].first);
        CHECK(params[i].second.grad().data().to_vector_as<float>() == expected[i]);
    }
}

#ifdef NORMLAB_MPIEXEC

// ---- the normlab program under mpirun ----

namespace fs = std::filesystem;
using nl_test::CliRun;
using nl_test::read_text;
using nl_test::shell_arg;
using nl_test::TempDir;

const std::string kSource = NORMLAB_SOURCE_DIR;

// One OpenMP thread per rank (results are bit-identical across rank counts at a fixed thread count),
// passive waiting on this oversubscribed machine, and a time limit: a hang fails the test (status 124).
// The same OpenBLAS kernel everywhere: the ranks do not restart to correct OpenBLAS's choice, a
// process alone would (examples/cli/main.cpp), and two kernels sum in different orders. This process
// (not restarted) runs the kernel OpenBLAS picked by itself, which the ranks would get too.
const std::string kEnv = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OPENBLAS_CORETYPE=" +
                         std::string(nl::blas_kernel_name()) + " ";

struct Timed {
    CliRun cli;
    double seconds = 0.0;
};

// `normlab ARGS` in `dir`, launched by mpirun with `ranks` processes (0: plain, no mpirun). With
// `mpirun_quiet`, mpirun adds no banner of its own to a failed job's output (but then does not say
// which rank died either).
Timed run_ranks(const TempDir& dir, int ranks, const std::string& args, const std::string& env = "",
                int limit_seconds = 120, bool mpirun_quiet = false) {
    std::string launch_env = kEnv + env;
    std::string launcher;
    if (ranks > 0) {
        launcher = shell_arg(NORMLAB_MPIEXEC) + (mpirun_quiet ? " --quiet" : "") +
                   " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
                   " -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x OPENBLAS_CORETYPE" + (env.empty() ? "" : " -x NORMLAB_TEST_FAULT");
#if NL_TEST_ASAN
        // A sanitizer build (CI's second build): OpenMPI never frees what MPI_Init allocates, through
        // components it has unloaded by exit, so LeakSanitizer would fail every rank, and suppressions
        // only match with its slow unwinder (minutes here). The ranks keep ASan and UBSan but not leak
        // checks; the same code in one process (the tests above, CI's other train tests) is leak-checked.
        launch_env += "ASAN_OPTIONS=\"${ASAN_OPTIONS}:detect_leaks=0\" ";
        launcher += " -x ASAN_OPTIONS";
#endif
        launcher += " ";
    }
    const auto t0 = std::chrono::steady_clock::now();
    Timed timed;
    timed.cli = nl_test::run_normlab_env(
        dir.path.string(), launch_env + "timeout -k 10 " + std::to_string(limit_seconds) + " " + launcher, args);
    timed.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return timed;
}

std::string config(const std::string& name) { return shell_arg(kSource + "/configs/" + name); }

// 20 short steps of the toy transformer, evaluated at 10 and 20.
const std::string kTrain = " --quiet --set train.steps=20 --set optim.warmup_steps=3 --set train.eval_every=10 "
                           "--set train.batch_size=16 --set data.eval_sequences=64 --set train.checkpoint_every=0";

// A metrics.csv column as text cells (header removed).
std::vector<std::string> column(const std::string& path, const std::string& name) {
    std::istringstream text(read_text(path));
    std::string line, cell;
    REQUIRE(std::getline(text, line));
    std::vector<std::string> header;
    for (std::istringstream row(line); std::getline(row, cell, ',');) header.push_back(cell);
    const size_t index = static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
    REQUIRE(index < header.size());
    std::vector<std::string> values;
    while (std::getline(text, line)) {
        std::vector<std::string> cells;
        for (std::istringstream row(line); std::getline(row, cell, ',');) cells.push_back(cell);
        values.push_back(index < cells.size() ? cells[index] : "");
    }
    return values;
}

TEST_CASE("mpi: 2 ranks train bit-identically to 1 process with the same grad_shards", "[mpi][mpirun]") {
    TempDir dir("mpi_train");
    // With the sharpness every 10 steps: its Hessian-vector products are summed over the shards, then
    // over the ranks (two f64 terms: the same sum in either order).
    const std::string args = "train " + config("toy_transformer.json") + kTrain +
                             " --set train.grad_shards=2 --set train.sharpness_every=10 --set train.sharpness_iters=4";
    Timed one = run_ranks(dir, 0, args + " --out one");
    INFO(one.cli.output);
    REQUIRE(one.cli.status == 0);
    Timed two = run_ranks(dir, 2, args + " --out two");
    INFO(two.cli.output);
    REQUIRE(two.cli.status == 0);
    for (const char* name : {"train_loss", "grad_norm", "val_loss", "val_accuracy", "val_token_accuracy"}) {
        INFO(name);
        CHECK(column(dir / "one/metrics.csv", name) == column(dir / "two/metrics.csv", name));
    }
    for (const char* name : {"sharpness", "sharpness_adam"}) {
        INFO(name);
        CHECK(column(dir / "one/probes.csv", name).size() == 2);
        CHECK(column(dir / "one/probes.csv", name) == column(dir / "two/probes.csv", name));
    }
    CHECK(read_text(dir / "one/checkpoints/step_00000020.safetensors") ==
          read_text(dir / "two/checkpoints/step_00000020.safetensors"));
    const auto summary = nlohmann::json::parse(read_text(dir / "two/summary.json"));
    CHECK(summary["world_size"] == 2);
    CHECK(summary["grad_shards"] == 2);
}

TEST_CASE("mpi: 4 ranks end with 1 process's checkpoint bit for bit with grad_shards 4", "[mpi][mpirun]") {
    TempDir dir("mpi_train");
    const std::string args = "train " + config("toy_transformer.json") + kTrain + " --set train.grad_shards=4";
    REQUIRE(run_ranks(dir, 0, args + " --out one").cli.status == 0);
    Timed four = run_ranks(dir, 4, args + " --out four");
    INFO(four.cli.output);
    REQUIRE(four.cli.status == 0);
    CHECK(column(dir / "one/metrics.csv", "train_loss") == column(dir / "four/metrics.csv", "train_loss"));
    CHECK(read_text(dir / "one/checkpoints/step_00000020.safetensors") ==
          read_text(dir / "four/checkpoints/step_00000020.safetensors"));
}

TEST_CASE("mpi: 2 ranks with one shard each follow 1 process within 1e-4 over 20 steps", "[mpi][mpirun]") {
    TempDir dir("mpi_train");
    const std::string args = "train " + config("toy_transformer.json") + kTrain;
    REQUIRE(run_ranks(dir, 0, args + " --out one").cli.status == 0);
    Timed two = run_ranks(dir, 2, args + " --out two");
    INFO(two.cli.output);
    REQUIRE(two.cli.status == 0);
    const auto a = column(dir / "one/metrics.csv", "train_loss"), b = column(dir / "two/metrics.csv", "train_loss");
    REQUIRE(a.size() == 20);
    REQUIRE(b.size() == 20);
    for (size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1 << ": " << a[i] << " vs " << b[i]);
        CHECK(std::fabs(std::stod(a[i]) - std::stod(b[i])) <= 1e-4 * std::fabs(std::stod(a[i])));
    }
    CHECK(column(dir / "one/metrics.csv", "val_accuracy").back() == column(dir / "two/metrics.csv", "val_accuracy").back());
}

TEST_CASE("mpi: a run stopped on 2 ranks resumes on 1 and ends with the uninterrupted run's checkpoint",
          "[mpi][mpirun]") {
    TempDir dir("mpi_resume");
    const std::string args = "train " + config("toy_transformer.json") + kTrain +
                             " --set train.grad_shards=2 --set train.checkpoint_every=6";
    REQUIRE(run_ranks(dir, 2, args + " --out full").cli.status == 0);
    Timed stopped = run_ranks(dir, 2, args + " --out part --stop-after 8");
    INFO(stopped.cli.output);
    REQUIRE(stopped.cli.status == 0);
    fs::remove(dir / "part/checkpoints/step_00000008.safetensors");  // resume from step 6
    Timed resumed = run_ranks(dir, 0, args + " --out part --resume");
    INFO(resumed.cli.output);
    REQUIRE(resumed.cli.status == 0);
    CHECK(nlohmann::json::parse(read_text(dir / "part/summary.json"))["resumed_from_step"] == 6);
    CHECK(column(dir / "full/metrics.csv", "train_loss") == column(dir / "part/metrics.csv", "train_loss"));
    CHECK(read_text(dir / "full/checkpoints/step_00000020.safetensors") ==
          read_text(dir / "part/checkpoints/step_00000020.safetensors"));
}

TEST_CASE("mpi: a 2-rank stability sweep writes one process's per-run results, and resumes", "[mpi][mpirun]") {
    TempDir dir("mpi_sweep");
    const std::string args = "stability " + shell_arg(kSource + "/configs/stability_sweep.json") +
                             " --quiet --set 'norms=[\"layernorm\",\"rmsnorm\"]' --set depths=[2] --set lrs=[0.01]"
                             " --set seeds=[0,1,2] --set epochs=6 --set samples=64 --set hidden=32 --set plots=false";
    Timed one = run_ranks(dir, 0, args + " --out one");
    INFO(one.cli.output);
    REQUIRE(one.cli.status == 0);
    Timed two = run_ranks(dir, 2, args + " --out two");
    INFO(two.cli.output);
    REQUIRE(two.cli.status == 0);
    const auto a = nlohmann::json::parse(read_text(dir / "one/summary.json"));
    const auto b = nlohmann::json::parse(read_text(dir / "two/summary.json"));
    REQUIRE(a["runs"].size() == 6);
    REQUIRE(b["runs"].size() == 6);
    for (size_t i = 0; i < 6; ++i) {
        nlohmann::json ra = a["runs"][i], rb = b["runs"][i];
        INFO(ra.dump());
        for (auto* run : {&ra, &rb})
            for (auto it = run->begin(); it != run->end();)  // timings differ; everything else must not
                it = it.key().find("second") != std::string::npos ? run->erase(it) : std::next(it);
        CHECK(ra == rb);
        const std::string curve = "/curves/" + a["runs"][i]["id"].get<std::string>() + ".csv";
        CHECK(read_text(dir / ("one" + curve)) == read_text(dir / ("two" + curve)));
        CHECK(fs::exists(dir / ("two/runs/" + std::to_string(i) + "/result.json")));  // each rank's records
    }
    CHECK(b["world_size"] == 2);

    // Runs 1 and 4 (rank 1's) and 2 (rank 0's) lost, as in a killed job: --resume over 2 ranks runs
    // exactly those and writes the same curves.
    const std::string kept = read_text(dir / "two/runs/3/result.json");
    for (int i : {1, 2, 4}) fs::remove(dir / ("two/runs/" + std::to_string(i) + "/result.json"));
    fs::remove(dir / "two/summary.json");
    Timed resumed = run_ranks(dir, 2, args + " --out two --resume");
    INFO(resumed.cli.output);
    REQUIRE(resumed.cli.status == 0);
    CHECK(read_text(dir / "two/runs/3/result.json") == kept);
    const auto c = nlohmann::json::parse(read_text(dir / "two/summary.json"));
    REQUIRE(c["runs"].size() == 6);
    for (size_t i = 0; i < 6; ++i) {
        const std::string curve = "/curves/" + a["runs"][i]["id"].get<std::string>() + ".csv";
        CHECK(read_text(dir / ("one" + curve)) == read_text(dir / ("two" + curve)));
        CHECK(c["runs"][i]["final_loss"] == a["runs"][i]["final_loss"]);
    }
}

TEST_CASE("mpi: a 2-rank transformer sweep writes one process's runs.csv and run files", "[mpi][mpirun]") {
    TempDir dir("mpi_transformer_sweep");
    const std::string args = "sweep " + shell_arg(kSource + "/configs/sweep.json") +
                             " --quiet --jobs 1 --set base.train.steps=6 --set base.optim.warmup_steps=2"
                             " --set base.data.eval_sequences=32 --set base.train.probe_every=3 --set 'seeds=[0,1]' --set plots=false";
    Timed one = run_ranks(dir, 0, args + " --out one");
    INFO(one.cli.output);
    REQUIRE(one.cli.status == 0);
    Timed two = run_ranks(dir, 2, args + " --out two");
    INFO(two.cli.output);
    REQUIRE(two.cli.status == 0);
    // runs.csv but its wall-clock column; each run's config, metrics (train columns) and probes.
    const std::vector<std::string> same = {"index", "model.qk_norm", "optim.lr", "seed", "init_loss", "final_train_loss",
                                           "final_val_loss", "diverged", "diverged_at_step", "attn_score_max.block1"};
    for (const std::string& name : same) CHECK(column(dir / "one/runs.csv", name) == column(dir / "two/runs.csv", name));
    CHECK(column(dir / "two/runs.csv", "index").size() == 20);
    for (int i : {0, 1, 7}) {
        const std::string run = "/runs/" + std::to_string(i);
        CHECK(read_text(dir / ("one" + run + "/config.json")) == read_text(dir / ("two" + run + "/config.json")));
        CHECK(read_text(dir / ("one" + run + "/probes.csv")) == read_text(dir / ("two" + run + "/probes.csv")));
        CHECK(column(dir / ("one" + run + "/metrics.csv"), "train_loss") ==
              column(dir / ("two" + run + "/metrics.csv"), "train_loss"));
    }
    CHECK(nlohmann::json::parse(read_text(dir / "two/summary.json"))["world_size"] == 2);
}

// An expected error of the whole job: exit 2, one line (rank 0's), within the time limit.
void check_job_error(const Timed& run, const std::vector<std::string>& parts) {
    INFO(run.cli.output);
    CHECK(run.cli.status == 2);
    CHECK(std::count(run.cli.output.begin(), run.cli.output.end(), '\n') == 1);
    CHECK_THAT(run.cli.output, Catch::StartsWith("normlab: error: "));
    for (const std::string& part : parts) CHECK_THAT(run.cli.output, Catch::Contains(part));
}

TEST_CASE("mpi: a bad config fails on every rank with one line from rank 0 and exit 2", "[mpi][mpirun]") {
    TempDir dir("mpi_errors");
    const std::string train = "train " + config("toy_transformer.json") + " --quiet --out run";
    check_job_error(run_ranks(dir, 2, train + " --set train.batch_size=15", "", 60, true),
                    {"/train/batch_size", "2 ranks", "got 15"});
    check_job_error(run_ranks(dir, 2, train + " --set train.grad_shards=3", "", 60, true),
                    {"/train/grad_shards", "got 3"});
    check_job_error(run_ranks(dir, 2, train + " --set optim.lr=fast", "", 60, true), {"/optim/lr"});
    // Without --quiet, mpirun reports the exit code 2 in a banner after normlab's line.
    Timed loud = run_ranks(dir, 2, train + " --set train.batch_size=15", "", 60);
    CHECK(loud.cli.status == 2);
    CHECK_THAT(loud.cli.output, Catch::Contains("normlab: error: ") && Catch::Contains("got 15"));
    CHECK_FALSE(fs::exists(dir / "run"));
    // Rank 0 alone meets this one (its run directory exists): every rank still stops.
    fs::create_directories(dir / "taken");
    std::ofstream(dir / "taken/file.txt") << "x";
    check_job_error(run_ranks(dir, 2, "train " + config("toy_transformer.json") + " --quiet --out taken", "", 60, true),
                    {"taken", "already exists"});
    // The same in a stability sweep.
    check_job_error(run_ranks(dir, 2, "stability " + shell_arg(kSource + "/configs/stability_sweep.json") +
                                          " --quiet --out sweep --set epochs=0", "", 60, true),
                    {"/epochs"});
}

TEST_CASE("mpi: a rank that throws or dies brings the job down within seconds, naming the rank",
          "[mpi][mpirun]") {
    TempDir dir("mpi_faults");
    const std::string args = "train " + config("toy_transformer.json") + kTrain;
    Timed thrown = run_ranks(dir, 2, args + " --out a", "NORMLAB_TEST_FAULT=1:3:throw ", 60);
    INFO(thrown.cli.output);
    CHECK(thrown.cli.status != 0);
    CHECK(thrown.cli.status != 124);  // not the time limit
    CHECK_THAT(thrown.cli.output, Catch::Contains("normlab: rank 1 of 2: error: NORMLAB_TEST_FAULT"));
    // (mpirun's own "MPI_ABORT was invoked on rank 1" banner follows, but OpenMPI 4.1 sometimes loses
    // it to an "ORTE_ERROR_LOG: Data unpack would read past end of buffer" race; normlab's line is the one
    // this test relies on.)
    CHECK(thrown.seconds < 30);

    Timed died = run_ranks(dir, 2, args + " --out b", "NORMLAB_TEST_FAULT=1:3:die ", 60);
    INFO(died.cli.output);
    CHECK(died.cli.status != 0);
    CHECK(died.cli.status != 124);
    CHECK_THAT(died.cli.output, Catch::Contains("process rank 1") && Catch::Contains("signal 9"));
    CHECK(died.seconds < 30);
}

#endif  // NORMLAB_MPIEXEC

}  // namespace
