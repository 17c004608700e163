// The `normlab` program end to end: subcommands run, and mistakes become one line on stderr with the
// documented exit code (nl::Error -> 2). Runs the built binary (NORMLAB_BINARY) through the shell.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu_runtime.h"

namespace {

using Run = nl_test::CliRun;

// Runs in the test's own working directory, with the caller's environment as is.
Run run_normlab(const std::string& args) { return nl_test::run_normlab_env(".", "", args); }

}  // namespace

TEST_CASE("normlab info prints version, BLAS, threads, devices and dtypes", "[cli]") {
    Run run = run_normlab("info");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::StartsWith(std::string("normlab ") + NORMLAB_VERSION));
    for (const char* part : {"BLAS", "OpenBLAS", "threads", "OpenMP", "cpu", "CUDA", "f32", "f64", "bf16", "f16",
                             "i64", "cpu alloc"}) {
        CHECK_THAT(run.output, Catch::Contains(part));
    }
}

TEST_CASE("normlab info names the vector code the kernels were built for, which this CPU runs", "[cli]") {
    const std::string target = nl::cpu_vector_target();
    Run run = run_normlab("info");
    INFO(run.output);
    REQUIRE(run.status == 0);
    const std::string support = nl::cpu_vector_support();
    CHECK_THAT(run.output, Catch::Contains("SIMD ") && Catch::Contains(target) &&
                               Catch::Contains("(this CPU has " + support + ")"));
#if defined(__AVX512F__) && (defined(__GNUC__) || defined(__clang__))
    // This test is compiled with the library's flags: an AVX-512 build must vectorize its loops
    // 512 bits wide (the attention's 16-lane loops spill at 256; CMakeLists.txt).
    CHECK(target == "AVX-512, 512-bit loops");
    CHECK(support == "AVX-512");
#elif defined(__AVX2__) && defined(__x86_64__)
    CHECK(target == "AVX2 + FMA");
    CHECK((support == "AVX2 + FMA" || support == "AVX-512"));
#endif
}

TEST_CASE("normlab --version prints the version", "[cli]") {
    Run run = run_normlab("--version");
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains(NORMLAB_VERSION));
}

TEST_CASE("normlab turns a user mistake into one error line and exit code 2", "[cli]") {
    Run run = run_normlab("bench core --reps 0");
    CHECK(run.status == 2);
    CHECK(run.output == "normlab: error: bench core: --reps must be at least 1, found 0\n");
}

TEST_CASE("normlab rejects a missing or unknown subcommand", "[cli]") {
    Run none = run_normlab("");
    CHECK(none.status != 0);
    CHECK_THAT(none.output, Catch::Contains("subcommand"));
    Run unknown = run_normlab("no-such-job");
    CHECK(unknown.status != 0);
    CHECK_THAT(unknown.output, Catch::Contains("subcommand"));
}

TEST_CASE("normlab bench core --quick prints both tables (no timing assertions)", "[cli]") {
    Run run = run_normlab("bench core --quick --reps 1");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const char* part : {"square 256", "1000x100 @ 100x256", "1000x256 @ 256x10", "(1000x100)^T @ 1000x256",
                             "cblas_sgemm", "add", "mul", "relu", "memcpy", "target >= 0.95", "target >= 0.7",
                             "arithmetic peak of one core", "cross-entropy, 256 x 50304 logits", "f32 fused",
                             "bf16 autocast, logits read as bf16", "bf16 autocast, through an f32 copy"}) {
        CHECK_THAT(run.output, Catch::Contains(part));
    }
#if defined(__x86_64__)
    // Each peak is measured where the CPU has the instruction and said skipped, by name, where it does not.
    if (__builtin_cpu_supports("avx512f"))
        CHECK_THAT(run.output, Catch::Contains("f32 FMA (vfmadd231ps zmm)"));
    if (__builtin_cpu_supports("avx512f") && !__builtin_cpu_supports("avx512bf16"))
        CHECK_THAT(run.output, Catch::Contains("vdpbf16ps: skipped (this CPU lacks AVX512-BF16)"));
    if (__builtin_cpu_supports("avx512bf16"))
        CHECK_THAT(run.output, Catch::Contains("x the f32 FMA"));
    // The AMX tiles' peak where the amx engine runs, else skipped with the reason.
    const std::vector<std::string> engines = nl::bgemm_kernels_this_cpu_runs();
    if (__builtin_cpu_supports("avx512bf16")) {
        if (std::find(engines.begin(), engines.end(), "amx") != engines.end())
            CHECK_THAT(run.output, Catch::Contains("bf16 tiles (AMX tdpbf16ps)"));
        else
            CHECK_THAT(run.output, Catch::Contains("tdpbf16ps: skipped (the AMX register loop cannot run here: "));
    }
#endif
    // The bench fails (exit 1) when nl::matmul and cblas_sgemm disagree, so exit 0 also checks the products.
    CHECK_THAT(run.output, !Catch::Contains("nan"));
}
