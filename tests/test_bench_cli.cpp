// `normlab bench norms --quick` and `normlab bench torch --quick --skip-torch` run end to end, print
// their tables and write the CSV (no timing assertions: a shared CI machine's timings mean nothing).
// Runs the built binary (NORMLAB_BINARY) through the shell.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "cli_test_util.h"

namespace {

using BenchRun = nl_test::CliRun;
using nl_test::read_text;

// From the source tree (the default config path is relative to it), on two threads.
BenchRun run_bench(const std::string& args) {
    return nl_test::run_normlab_env(NORMLAB_SOURCE_DIR, "OMP_NUM_THREADS=2 ", args);
}

std::filesystem::path fresh_dir(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    return dir;
}

}  // namespace

TEST_CASE("bench norms --quick prints the tables and writes the CSV", "[bench_cli]") {
    const auto dir = fresh_dir("normlab-bench-norms");
    BenchRun run = run_bench("bench norms configs/bench_norms.json --quick --out '" + dir.string() + "'");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const char* part : {"forward (8 B/element", "forward+backward (20 B/element", "RMSNorm time / LayerNorm time",
                             "geomean seed", "memory per call", "32x128", "4096x512", "layernorm", "rmsnorm",
                             "kernel", "composed", "x copy"})
        CHECK_THAT(run.output, Catch::Contains(part));

    const std::string csv = read_text(dir / "bench_norms.csv");
    CHECK_THAT(csv, Catch::StartsWith("group,rows,hidden,norm,impl,pass,"));
    // 3 shapes x 2 norms x 4 impls x 2 passes, plus the header.
    CHECK(std::count(csv.begin(), csv.end(), '\n') == 3 * 2 * 4 * 2 + 1);
    CHECK_THAT(csv, Catch::Contains("large,4096,512,rmsnorm,fused,fwd+bwd,3,1,"));

    // The CSV is not overwritten without --force.
    BenchRun again = run_bench("bench norms --quick --out '" + dir.string() + "'");
    CHECK(again.status == 2);
    CHECK_THAT(again.output, Catch::Contains("exists (pass --force"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench norms rejects a bad config key or value with the JSON path", "[bench_cli]") {
    BenchRun typo = run_bench("bench norms --quick --set rep=3 --csv /dev/null --force");
    CHECK(typo.status == 2);
    CHECK_THAT(typo.output, Catch::Contains("/rep: unknown key") && Catch::Contains("reps"));
    BenchRun shape = run_bench("bench norms --quick --set 'large_shapes=[\"32768by512\"]' --csv /dev/null --force");
    CHECK(shape.status == 2);
    CHECK_THAT(shape.output, Catch::Contains("/large_shapes") && Catch::Contains("32768by512"));
}

TEST_CASE("bench torch --quick --skip-torch times normlab and says why PyTorch was skipped", "[bench_cli]") {
    BenchRun run = run_bench("bench torch --quick --skip-torch");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("stability layernorm s/epoch"));
    CHECK_THAT(run.output, Catch::Contains("transformer tokens/s"));
    CHECK_THAT(run.output, Catch::Contains("PyTorch side skipped: --skip-torch was given"));
}
