// The "device" config key of `normlab train`, `normlab stability` and `normlab bench norms`: "cpu" by
// default and recorded in the resolved config; a malformed value is a one-line error naming the file
// and /device; "cuda" branches on the machine: without a usable GPU (or a build without CUDA) it is a
// one-line error before any work, exit code 2 and no run directory; with one, the jobs run on it and
// agree with the CPU. Which branch ran is reported through Catch's WARN, never skipped silently.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "test_util.h"
#ifdef NORMLAB_HAVE_CUDA
#endif

namespace fs = std::filesystem;

namespace {

using nl_test::CliRun;
using nl_test::cuda_devices;
using nl_test::read_text;
using nl_test::shell_arg;
using nl_test::TempDir;

CliRun run_in(const TempDir& dir, const std::string& args) {
    return nl_test::run_normlab_env(dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ", args);
}

std::string config(const std::string& name) { return (std::filesystem::path(NORMLAB_SOURCE_DIR) / "configs" / name).string(); }

// One short invocation of each job, writing into `out` (a run directory, or the bench's CSV folder).
struct Job {
    std::string name;
    std::string config_file;
    std::string args;  // everything but --out and the device override
};

const std::vector<Job>& jobs() {
    static const std::vector<Job> all = {
        {"train", config("toy_transformer.json"),
         "train " + shell_arg(config("toy_transformer.json")) +
             " --quiet --set train.steps=8 --set optim.warmup_steps=2 --set train.eval_every=4 "
             "--set train.batch_size=16 --set data.eval_sequences=32"},
        {"stability", config("stability.json"),
         "stability " + shell_arg(config("stability.json")) +
             " --quiet --set epochs=3 --set samples=64 --set hidden=32 --set plots=false"},
        {"bench norms", config("bench_norms.json"),
         "bench norms " + shell_arg(config("bench_norms.json")) +
             " --set hidden=64 --set batch=8 --set 'large_shapes=[\"16x64\"]' --set reps=2 --set large_reps=2 "
             "--set min_sample_ms=0 --set 'impls=[\"kernel\",\"fused\"]'"},
    };
    return all;
}

// An expected error: exit code 2, exactly one line, containing every part, and no output folder.
void check_refused(const TempDir& dir, const Job& job, const std::string& device, const std::vector<std::string>& parts) {
    CliRun run = run_in(dir, job.args + " --out out --set " + shell_arg("device=" + device));
    INFO(job.name << " with device " << device << ":\n" << run.output);
    CHECK(run.status == 2);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK_THAT(run.output, Catch::StartsWith("normlab: error: "));
    for (const std::string& part : parts) CHECK_THAT(run.output, Catch::Contains(part));
    CHECK_FALSE(fs::exists(dir / "out"));  // refused before any work: no run directory, no CSV
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

// A CSV column by name (header removed).
std::vector<std::string> csv_column(const std::string& path, const std::string& name) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    std::vector<std::string> header;
    std::stringstream head(line);
    for (std::string cell; std::getline(head, cell, ',');) header.push_back(cell);
    const size_t index = std::find(header.begin(), header.end(), name) - header.begin();
    REQUIRE(index < header.size());
    std::vector<std::string> values;
    while (std::getline(in, line)) {
        std::stringstream cells(line);
        std::string cell;
        for (size_t i = 0; i <= index; ++i) std::getline(cells, cell, ',');
        values.push_back(cell);
    }
    return values;
}

std::vector<double> as_numbers(const std::vector<std::string>& cells) {
    std::vector<double> out;
    for (const std::string& cell : cells) out.push_back(std::stod(cell));
    return out;
}

}  // namespace

TEST_CASE("device: the default is cpu, recorded in the resolved config, and cpu given explicitly works", "[device]") {
    TempDir dir("device_default");
    // train and stability record the resolved value in the run directory's config.json.
    for (const Job& job : {jobs()[0], jobs()[1]}) {
        INFO(job.name);
        CliRun run = run_in(dir, job.args + " --out default_run");
        INFO(run.output);
        REQUIRE(run.status == 0);
        CHECK(read_json(dir / "default_run/config.json")["device"] == "cpu");
        CHECK(read_json(dir / "default_run/summary.json")["device"] == "cpu");

        CliRun explicit_cpu = run_in(dir, job.args + " --out cpu_run --set device=cpu");
        INFO(explicit_cpu.output);
        REQUIRE(explicit_cpu.status == 0);
        CHECK(read_json(dir / "cpu_run/config.json")["device"] == "cpu");
        fs::remove_all(dir / "default_run");
        fs::remove_all(dir / "cpu_run");
    }
    // bench norms writes no resolved config: its CSV names the device of every row.
    CliRun bench = run_in(dir, jobs()[2].args + " --out bench");
    INFO(bench.output);
    REQUIRE(bench.status == 0);
    CHECK_THAT(bench.output, Catch::Contains("f32 on cpu"));
    const std::vector<std::string> devices = csv_column(dir / "bench/bench_norms.csv", "device");
    CHECK(devices.size() == 2 * 2 * 2 * 2);  // 2 shapes x 2 norms x 2 impls x 2 passes
    for (const std::string& device : devices) CHECK(device == "cpu");
    CliRun bench_cpu = run_in(dir, jobs()[2].args + " --out bench --force --set device=cpu");
    INFO(bench_cpu.output);
    CHECK(bench_cpu.status == 0);
}

TEST_CASE("device: a malformed device is one error line naming the file and /device", "[device]") {
    TempDir dir("device_bad");
    for (const Job& job : jobs()) {
        for (const std::string bad : {"gpu", "cuda:x", "cuda:", "CUDA"}) {
            check_refused(dir, job, bad,
                          {job.config_file + ": /device: expected \"cpu\", \"cuda\" or \"cuda:N\"",
                           "got \"" + bad + "\""});
        }
        check_refused(dir, job, "1", {job.config_file + ": /device: expected a string, got 1"});
    }
    // A typo of the key itself is an unknown key with the suggestion.
    CliRun typo = run_in(dir, jobs()[0].args + " --out out --set devise=cpu");
    INFO(typo.output);
    CHECK(typo.status == 2);
    CHECK_THAT(typo.output, Catch::Contains("/devise: unknown key (did you mean 'device'?"));
    CHECK_FALSE(fs::exists(dir / "out"));
}

TEST_CASE("device: cuda fails cleanly without a GPU, and runs on one when present", "[device]") {
    TempDir dir("device_cuda");
    const int gpus = cuda_devices();
    if (gpus == 0) {
#ifdef NORMLAB_HAVE_CUDA
        WARN("device branch: no CUDA device on this machine (cuda_device_count() == 0): checking that "
             "\"cuda\" is refused cleanly; the GPU runs of this test are owed to a machine with a GPU");
        const std::string reason = "asks for a GPU, but this machine has no usable CUDA device";
#else
        WARN("device branch: this build has no CUDA backend: checking that \"cuda\" is refused cleanly; "
             "the GPU runs of this test are owed to a CUDA build on a machine with a GPU");
        const std::string reason = "asks for a GPU, but this normlab was built without the CUDA backend";
#endif
        for (const Job& job : jobs()) {
            check_refused(dir, job, "cuda", {job.config_file + ": /device: \"cuda:0\" " + reason, "use \"cpu\""});
            check_refused(dir, job, "cuda:1", {job.config_file + ": /device: \"cuda:1\" " + reason});
        }
        return;
    }

    WARN("device branch: " << gpus << " CUDA device(s) present: running train, stability and bench norms on cuda:0");
    // An index past the last GPU is still refused before any work.
    for (const Job& job : jobs())
        check_refused(dir, job, "cuda:" + std::to_string(gpus),
                      {job.config_file + ": /device: \"cuda:" + std::to_string(gpus) + "\" asks for GPU " +
                       std::to_string(gpus) + ", but this machine has " + std::to_string(gpus)});

    // train: the same batches and initial weights on both devices, so the losses agree closely (the
    // GPU sums in another order: a relative 1e-3 over 8 steps is far above f32 rounding drift and far
    // below what a wrong kernel or a missed device move would give).
    const Job& train = jobs()[0];
    CliRun cpu_run = run_in(dir, train.args + " --out train_cpu");
    CliRun gpu_run = run_in(dir, train.args + " --out train_gpu --set device=cuda");
    INFO(cpu_run.output << gpu_run.output);
    REQUIRE(cpu_run.status == 0);
    REQUIRE(gpu_run.status == 0);
    CHECK(read_json(dir / "train_gpu/config.json")["device"] == "cuda");
    CHECK(read_json(dir / "train_gpu/summary.json")["device"] == "cuda:0");
    const std::vector<double> cpu_losses = as_numbers(csv_column(dir / "train_cpu/metrics.csv", "train_loss"));
    const std::vector<double> gpu_losses = as_numbers(csv_column(dir / "train_gpu/metrics.csv", "train_loss"));
    REQUIRE(gpu_losses.size() == cpu_losses.size());
    for (size_t i = 0; i < cpu_losses.size(); ++i) CHECK(gpu_losses[i] == Approx(cpu_losses[i]).epsilon(1e-3));
    // A checkpoint written from the GPU samples on the CPU (sample reads its config's device for form only).
    CliRun sample = run_in(dir, "sample train_gpu --num 4 --temperature 0");
    INFO(sample.output);
    CHECK(sample.status == 0);

    // train with bf16 autocast on the GPU trains.
    CliRun amp = run_in(dir, train.args + " --out train_amp --set device=cuda --set train.autocast=bf16 "
                                          "--set train.steps=30 --set train.eval_every=15");
    INFO(amp.output);
    REQUIRE(amp.status == 0);
    const std::vector<double> amp_losses = as_numbers(csv_column(dir / "train_amp/metrics.csv", "train_loss"));
    REQUIRE(amp_losses.size() == 30);
    CHECK(amp_losses.back() < amp_losses.front());

    // stability: the same curves within 1e-4 relative over 3 epochs.
    const Job& stability = jobs()[1];
    CliRun stab_cpu = run_in(dir, stability.args + " --out stab_cpu");
    CliRun stab_gpu = run_in(dir, stability.args + " --out stab_gpu --set device=cuda");
    INFO(stab_cpu.output << stab_gpu.output);
    REQUIRE(stab_cpu.status == 0);
    REQUIRE(stab_gpu.status == 0);
    CHECK(read_json(dir / "stab_gpu/summary.json")["device"] == "cuda:0");
    for (const std::string norm : {"rmsnorm", "layernorm"}) {
        const std::string curve = "/curves/" + norm + "_d2_lr0.001_s42.csv";
        const std::vector<double> a = as_numbers(csv_column(dir / ("stab_cpu" + curve), "loss"));
        const std::vector<double> b = as_numbers(csv_column(dir / ("stab_gpu" + curve), "loss"));
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == Approx(a[i]).epsilon(1e-4));
    }

    // bench norms: every case runs on the GPU and says so.
    CliRun bench = run_in(dir, jobs()[2].args + " --out bench --set device=cuda");
    INFO(bench.output);
    REQUIRE(bench.status == 0);
    CHECK_THAT(bench.output, Catch::Contains("f32 on cuda:0"));
    for (const std::string& device : csv_column(dir / "bench/bench_norms.csv", "device")) CHECK(device == "cuda:0");
}
