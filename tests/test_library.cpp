// The jobs as a library (jobs/): train and the config reader called directly, not through the
// program; bench torch reads its config with train's reader; and normlab as a CMake
// dependency of another project, through add_subdirectory and through an installed package.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/error.h"
#include "jobs/config.h"
#include "jobs/train.h"
#include "test_util.h"

namespace {

using nl_test::CliRun;
using nl_test::TempDir;

std::string shipped_config(const std::string& name) {
    return (std::filesystem::path(NORMLAB_SOURCE_DIR) / "configs" / name).string();
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

// The column `name` of a CSV file as numbers (header removed).
std::vector<double> csv_numbers(const std::string& path, const std::string& name) {
    std::ifstream in(path);
    std::string line;
    REQUIRE(std::getline(in, line));
    std::vector<std::string> header;
    for (size_t start = 0, comma = 0; comma != std::string::npos; start = comma + 1) {
        comma = line.find(',', start);
        header.push_back(line.substr(start, comma - start));
    }
    const auto column = static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
    REQUIRE(column < header.size());
    std::vector<double> values;
    while (std::getline(in, line)) {
        size_t start = 0;
        for (size_t i = 0; i < column; ++i) start = line.find(',', start) + 1;
        values.push_back(std::stod(line.substr(start, line.find(',', start) - start)));
    }
    return values;
}

// Runs `command` through the shell in `dir`: its exit code and output (stdout and stderr).
CliRun run_shell(const TempDir& dir, const std::string& command) {
    return nl_test::run_shell_in(dir.path.string(), command);
}

}  // namespace

TEST_CASE("library: run_train trains the toy config in-process and returns the summary it wrote", "[library]") {
    TempDir dir("library_train");
    nl::TrainJob flags;
    flags.config_path = shipped_config("toy_transformer.json");
    flags.overrides = {"train.steps=30", "optim.warmup_steps=3", "train.eval_every=0", "train.batch_size=16",
                       "data.eval_sequences=64", "train.checkpoint_every=0"};
    flags.out = dir / "run";
    const nl::TrainResult result = nl::run_train(flags);
    const nlohmann::json& summary = result.summary;
    CHECK(result.complete);
    CHECK(result.run_dir == flags.out);

    REQUIRE(summary.is_object());
    CHECK(summary["steps"] == 30);
    CHECK(summary["device"] == "cpu");
    // The returned summary is the one written to the run directory.
    std::ifstream file(dir / "run/summary.json");
    CHECK(nlohmann::json::parse(file) == summary);
    // The run trained: the recorded loss of the last step is the returned one, and below the first's.
    const std::vector<double> losses = csv_numbers(dir / "run/metrics.csv", "train_loss");
    REQUIRE(losses.size() == 30);
    CHECK(summary["final_train_loss"].get<double>() == Approx(losses.back()).epsilon(1e-5));
    CHECK(losses.back() < 0.9 * losses.front());

    // Stopped early, there is no summary to return.
    flags.out = dir / "stopped";
    flags.stop_after = 5;
    const nl::TrainResult stopped = nl::run_train(flags);
    CHECK(stopped.summary.is_null());
    CHECK_FALSE(stopped.complete);
    CHECK(stopped.last_step == 5);
}

TEST_CASE("library: read_train_config fills train's defaults and names the file and key of a mistake",
          "[library]") {
    const std::string path = shipped_config("toy_transformer.json");
    nlohmann::json root = nl::load_json_file(path);
    const nl::TrainConfig config = nl::read_train_config(root, path);
    CHECK(config.model.dim == root["model"]["dim"].get<int64_t>());
    CHECK(config.train.batch_size == root["train"]["batch_size"].get<int64_t>());
    CHECK(config.optim.lr == root["optim"]["lr"].get<double>());
    CHECK(config.resolved["optim"]["eps"] == 1e-8);  // absent from the file: the default, recorded

    nl::apply_override(root, "model.dimm=32");
    CHECK_THROWS_WITH(nl::read_train_config(root, path),
                      Catch::StartsWith(path + ": /model/dimm: unknown key (did you mean 'dim'?"));
}

TEST_CASE("bench torch reads its config with train's reader: a bad key is train's error, exit code 2",
          "[library][bench_cli]") {
    TempDir dir("library_bench_config");
    struct Case {
        std::string key;       // set in a copy of the shipped config
        std::string message;  // train's error, after "normlab: error: bad.json: "
    };
    const Case cases[] = {
        {"/model/dimm", "/model/dimm: unknown key (did you mean 'dim'?"},
        {"/train/lr", "/train/lr: unknown key"},  // the learning rate is /optim/lr
    };
    for (const Case& c : cases) {
        nlohmann::json root = nl::load_json_file(shipped_config("toy_transformer.json"));
        root[nlohmann::json::json_pointer(c.key)] = 32;
        write_text(dir / "bad.json", root.dump(2));
        const CliRun train = nl_test::run_normlab_in(dir.path.string(), "train bad.json --out run");
        const CliRun bench =
            nl_test::run_normlab_in(dir.path.string(), "bench torch --config bad.json --quick --skip-torch");
        INFO(c.key << "\n" << train.output << "\n" << bench.output);
        CHECK(train.status == 2);
        CHECK(bench.status == 2);
        CHECK_THAT(train.output, Catch::StartsWith("normlab: error: bad.json: " + c.message));
        CHECK(bench.output == train.output);
    }

    // A missing config is an error naming it, as for train (no silent built-in defaults).
    const CliRun missing = nl_test::run_normlab_in(dir.path.string(), "bench torch --config none.json --quick --skip-torch");
    CHECK(missing.status == 2);
    CHECK_THAT(missing.output, Catch::Contains("none.json"));
}

TEST_CASE("library: a project adds normlab with add_subdirectory and gets normlab::normlab, without the program",
          "[library][cmake]") {
    TempDir dir("library_add_subdirectory");
    const std::string source = NORMLAB_SOURCE_DIR;
    const CliRun configure = run_shell(
        dir, "cmake -S " + nl_test::shell_arg(source + "/examples/consumer") + " -B build -DNORMLAB_SOURCE_DIR=" +
                 nl_test::shell_arg(source) + " -DNORMLAB_CUDA=OFF && cmake --build build --target help");
    INFO(configure.output);
    REQUIRE(configure.status == 0);
    for (const char* target : {"scalenorm_mlp", "train_from_config", "normlab_core", "normlab_layers", "normlab_optim",
                               "normlab_jobs"})
        CHECK_THAT(configure.output, Catch::Contains(std::string("... ") + target));
    for (const char* target : {"... normlab_tests", "... normlab\n"})
        CHECK_THAT(configure.output, !Catch::Contains(target));
}

#ifdef NORMLAB_BUILD_DIR
TEST_CASE("library: the installed package is found with find_package(normlab), its dependencies with it",
          "[library][cmake]") {
    TempDir dir("library_install");
    const CliRun install = run_shell(dir, "cmake --install " + nl_test::shell_arg(NORMLAB_BUILD_DIR) + " --prefix prefix");
    INFO(install.output);
    REQUIRE(install.status == 0);
    for (const char* file : {"prefix/include/normlab/core/tensor.h", "prefix/include/normlab/layers/norms.h",
                             "prefix/include/normlab/jobs/train.h", "prefix/include/normlab/core/cpu_runtime.h",
                             "prefix/lib/libnormlab_core.a", "prefix/lib/libnormlab_jobs.a",
                             "prefix/lib/cmake/normlab/normlabConfig.cmake",
                             "prefix/lib/cmake/normlab/normlab_openblas.cmake"})
        CHECK(std::filesystem::exists(dir / file));
    // Nothing of the tests, the backends' own headers or the program's is installed.
    CHECK_FALSE(std::filesystem::exists(dir / "prefix/include/normlab/tests"));
    CHECK_FALSE(std::filesystem::exists(dir / "prefix/include/normlab/core/cpu"));
    CHECK_FALSE(std::filesystem::exists(dir / "prefix/include/normlab/examples"));
    // The program is a user of the library like any other: every normlab header it includes, but its
    // own, is installed.
    for (const auto& entry : std::filesystem::directory_iterator(std::string(NORMLAB_SOURCE_DIR) + "/examples/cli")) {
        std::ifstream source(entry.path());
        std::string line;
        while (std::getline(source, line)) {
            if (line.rfind("#include \"", 0) != 0) continue;
            const std::string header = line.substr(10, line.find('"', 10) - 10);
            if (header.rfind("examples/cli/", 0) == 0) continue;
            INFO(entry.path().filename().string() << " includes " << header);
            CHECK(std::filesystem::exists(dir / ("prefix/include/normlab/" + header)));
        }
    }
    const CliRun configure = run_shell(dir, "cmake -S " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/examples/consumer") +
                                                " -B build -DCMAKE_PREFIX_PATH=" + nl_test::shell_arg((dir.path / "prefix").string()));
    INFO(configure.output);
    CHECK(configure.status == 0);
    CHECK_THAT(configure.output, Catch::Contains("Generating done"));
}
#endif

TEST_CASE("library: an OpenBLAS under CMAKE_PREFIX_PATH comes before the system's that pkg-config finds",
          "[library][cmake]") {
    // A GPU machine's image may have its own (pthreads) OpenBLAS, while the build is pointed at Debian's
    // OpenMP build unpacked into a folder (tests/cuda/device_check.sh --deps): the folder named wins.
    TempDir dir("library_openblas_prefix");
    const std::string finder = std::string(NORMLAB_SOURCE_DIR) + "/cmake/normlab_openblas.cmake";
    write_text(dir / "CMakeLists.txt",
               "cmake_minimum_required(VERSION 3.25)\n"
               "project(find_openblas C)\n"
               "if(UNPACKED)\n"
               "  set(unpacked \"${CMAKE_BINARY_DIR}/unpacked/usr\")\n"
               "  file(WRITE \"${unpacked}/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/cblas.h\" \"\")\n"
               "  file(WRITE \"${unpacked}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/libopenblas.so\" \"\")\n"
               "  list(APPEND CMAKE_PREFIX_PATH \"${unpacked}\")\n"
               "endif()\n"
               "include(\"" + finder + "\")\n"
               "normlab_find_openblas()\n"
               "message(STATUS \"where=${NORMLAB_OPENBLAS_WHERE}; openmp=${NORMLAB_OPENBLAS_OPENMP}\")\n");
    const CliRun system = run_shell(dir, "cmake -S . -B system");
    INFO(system.output);
    REQUIRE(system.status == 0);
    // The system's OpenBLAS is there (./setup.sh installs it, with pkg-config) and is not in the folder.
    CHECK_THAT(system.output, Catch::Contains("(pkg-config)"));
    CHECK_THAT(system.output, !Catch::Contains("/unpacked/"));
    const CliRun unpacked = run_shell(dir, "cmake -S . -B unpacked_build -DUNPACKED=ON");
    INFO(unpacked.output);
    REQUIRE(unpacked.status == 0);
    CHECK_THAT(unpacked.output, Catch::Contains("/unpacked/usr/lib/"));
    CHECK_THAT(unpacked.output, Catch::Contains("/openblas-openmp/libopenblas.so, cblas.h in "));
    CHECK_THAT(unpacked.output, Catch::Contains("(found as files under CMAKE_PREFIX_PATH); openmp=ON"));
}

TEST_CASE("library: only test targets compile anything from tests/ (the CUDA emulator included)", "[library][cmake]") {
    // CMake's record of every compile in this build (CMAKE_EXPORT_COMPILE_COMMANDS, on at top level).
    std::ifstream in(std::string(NORMLAB_BINARY_DIR) + "/compile_commands.json");
    REQUIRE(in.good());
    const nlohmann::json commands = nlohmann::json::parse(in);
    const std::string tests_dir = std::string(NORMLAB_SOURCE_DIR) + "/tests";
    int production = 0;
    for (const nlohmann::json& entry : commands) {
        // The test targets (normlab_tests, normlab_cuda_emulated, and the fuzz targets in tests/fuzz)
        // are compiled in the build's tests/ and its sub-folders.
        if (entry.at("directory").get<std::string>().rfind(std::string(NORMLAB_BINARY_DIR) + "/tests", 0) == 0) continue;
        ++production;
        const std::string file = entry.at("file").get<std::string>();
        const std::string command = entry.at("command").get<std::string>();
        INFO(file << ": " << command);
        CHECK(file.rfind(tests_dir, 0) != 0);
        CHECK(command.find(tests_dir) == std::string::npos);
    }
    CHECK(production > 50);  // core, autograd, layers, optim, jobs and the program were all seen
}
