// The runtime settings normlab chooses for itself: the thread governor's reading of /proc (the cores
// other processes keep busy, and the thread count that follows), train's threads and peak-memory
// report, and the OpenBLAS kernel correction (a fallback to Prescott on a CPU that can do better).
#include <catch2/catch.hpp>

#include <cblas.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli_test_util.h"
#include "core/cpu_runtime.h"
#include "core/thread_governor.h"

using namespace nl;

TEST_CASE("thread governor: /proc/stat and /proc/self/stat are read as busy, total and own ticks", "[threads]") {
    ThreadGovernor::Reading r;
    REQUIRE(ThreadGovernor::parse("cpu  100 5 20 800 10 3 2 7 0 0",
                                  "4242 (normlab (x) y) R 1 2 3 4 5 6 7 8 9 10 60 15 0 0 20 0", r));
    CHECK(r.busy == 100 + 5 + 20 + 3 + 2 + 7);
    CHECK(r.total == r.busy + 800 + 10);
    CHECK(r.self == 60 + 15);  // utime and stime, counted from the last ')' of the command name
    CHECK_FALSE(ThreadGovernor::parse("intr 1 2 3", "1 (a) R 1", r));
    CHECK_FALSE(ThreadGovernor::parse("cpu  1 2 3 4 5 6 7", "no parenthesis here", r));
}

TEST_CASE("thread governor: another process's busy core leaves one thread of two", "[threads]") {
    // Two cores over 100 ticks each (200 in all): this process used 95 ticks, another one 98.
    const ThreadGovernor::Reading before{1000, 5000, 300};
    const ThreadGovernor::Reading after{1000 + 95 + 98, 5000 + 200, 300 + 95};
    const double others = ThreadGovernor::others_busy_cores(before, after, 2);
    CHECK(others == Approx(0.98));
    CHECK(ThreadGovernor::threads_for(2 - others, 2) == 1);
    // Background noise of 0.1 core keeps both threads; nothing busy: both.
    CHECK(ThreadGovernor::threads_for(1.9, 2) == 2);
    CHECK(ThreadGovernor::threads_for(2.0, 2) == 2);
    // Never below one thread or above the maximum.
    CHECK(ThreadGovernor::threads_for(0.0, 2) == 1);
    CHECK(ThreadGovernor::threads_for(16.0, 4) == 4);
    // A reading taken backwards in time (no ticks) reports nothing busy.
    CHECK(ThreadGovernor::others_busy_cores(after, after, 2) == 0.0);
}

TEST_CASE("thread governor: it decides when made, without waiting, and a busy core leaves fewer threads than "
          "cores",
          "[threads]") {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    REQUIRE(online >= 1);
    const int cores = static_cast<int>(online);
    const int saved_threads = omp_get_max_threads();
    const pid_t busy = fork();  // another process keeping one core busy
    REQUIRE(busy >= 0);
    if (busy == 0) {
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the loop is running before the window opens
    const auto start = std::chrono::steady_clock::now();
    ThreadGovernor governor(cores, true);  // decides from the running threads, at once
    const int made_with = governor.threads();
    const int omp_after_made = omp_get_max_threads();  // what a parallel region before the first step gets
    const int threads = governor.update();  // the first call, within the 50 ms window: the decision stands
    const auto waited = std::chrono::steady_clock::now() - start;
    const int64_t decisions_in_window = governor.decisions();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // 15 of /proc/stat's 10 ms ticks
    const int after_window = governor.update();  // past the first window: decided from /proc/stat's ticks
    kill(busy, SIGKILL);
    waitpid(busy, nullptr, 0);
    omp_set_num_threads(saved_threads);
    openblas_set_num_threads(saved_threads);
    CHECK(decisions_in_window == 1);
    CHECK(governor.decisions() == 2);
    const double waited_ms = std::chrono::duration<double, std::milli>(waited).count();
    INFO("making the governor and its first update took " << waited_ms << " ms");
    CHECK(waited < std::chrono::milliseconds(50));  // no wait for the 50 ms window
    CHECK(threads == made_with);
    CHECK(omp_after_made == made_with);
    // The busy loop is at least ~one core of the window's ticks, so at most cores - 1 are free (other
    // tests running beside this one can only lower it further). One core: one thread.
    CHECK(made_with >= 1);
    CHECK(made_with <= std::max(1, cores - 1));
    CHECK(after_window >= 1);
    CHECK(after_window <= std::max(1, cores - 1));
}

TEST_CASE("thread governor: /proc/loadavg's running threads, less this process's, are the others'", "[threads]") {
    CHECK(ThreadGovernor::others_running("0.52 0.58 0.59 3/467 12345", 1) == 2);
    CHECK(ThreadGovernor::others_running("0.00 0.01 0.05 1/90 77\n", 1) == 0);
    CHECK(ThreadGovernor::others_running("1.00 1.00 1.00 2/90 77", 3) == 0);  // never below 0
    CHECK(ThreadGovernor::others_running("garbage", 1) == -1);
    CHECK(ThreadGovernor::others_running("0.1 0.2 0.3", 1) == -1);
}

TEST_CASE("thread governor: a disabled governor keeps its count", "[threads]") {
    ThreadGovernor fixed(3, false);
    CHECK(fixed.update() == 3);
    CHECK_FALSE(fixed.enabled());
}

TEST_CASE("OpenBLAS kernel: a user's OPENBLAS_CORETYPE is never overridden", "[threads]") {
    const char* previous = std::getenv("OPENBLAS_CORETYPE");
    const std::string saved = previous ? previous : "";
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    CHECK(blas_kernel_override() == nullptr);
    if (previous)
        setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
}

TEST_CASE("normlab info: the BLAS kernel is not the Prescott fallback on a CPU with AVX2, unless the user chose it",
          "[threads][cli]") {
    const std::string dir = nl_test::make_temp_dir("blas");
    const nl_test::CliRun chosen = nl_test::run_normlab_env(dir, "OPENBLAS_CORETYPE=Prescott ", "info");
    INFO(chosen.output);
    REQUIRE(chosen.status == 0);
    CHECK_THAT(chosen.output, Catch::Contains("(kernel: Prescott,"));
    const nl_test::CliRun spin = nl_test::run_normlab_env(dir, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ", "info");
    INFO(spin.output);
    CHECK_THAT(spin.output, Catch::Contains("idle threads: GOMP_SPINCOUNT=10000, set by normlab"));
#if defined(__x86_64__)
    if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        const nl_test::CliRun own = nl_test::run_normlab_env(dir, "", "info");
        INFO(own.output);
        REQUIRE(own.status == 0);
        CHECK_THAT(own.output, !Catch::Contains("(kernel: Prescott,"));
    }
#endif
}

// "OpenMP     N max threads" in `normlab info`'s output: N, or -1.
static int openmp_max_threads_in(const std::string& info) {
    const std::string key = "OpenMP ";
    const size_t at = info.find(key);
    if (at == std::string::npos) return -1;
    return std::atoi(info.c_str() + info.find_first_not_of(' ', at + key.size()));
}

TEST_CASE("normlab info: with OMP_PROC_BIND set, the restarted program keeps every CPU it started with",
          "[threads][cli]") {
    // The restart for GOMP_SPINCOUNT follows OpenMP's binding of the first thread to one place; the
    // new process must not see that one place as all the CPUs it has. The same binding without the
    // restart (GOMP_SPINCOUNT set by the caller) is the reference.
    const std::string dir = nl_test::make_temp_dir("bind");
    const std::string restart = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS -u OMP_PLACES ";
    const std::string no_restart = "env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS -u OMP_PLACES GOMP_SPINCOUNT=10000 ";
    const nl_test::CliRun free_run = nl_test::run_normlab_env(dir, restart + "-u OMP_PROC_BIND ", "info");
    const nl_test::CliRun bound = nl_test::run_normlab_env(dir, restart + "OMP_PROC_BIND=true ", "info");
    const nl_test::CliRun bound_in_place = nl_test::run_normlab_env(dir, no_restart + "OMP_PROC_BIND=true ", "info");
    INFO(free_run.output);
    INFO(bound.output);
    INFO(bound_in_place.output);
    REQUIRE(free_run.status == 0);
    REQUIRE(bound.status == 0);
    REQUIRE(bound_in_place.status == 0);
    CHECK_THAT(bound.output, Catch::Contains("set by normlab"));  // it did restart
    CHECK_THAT(bound_in_place.output, !Catch::Contains("set by normlab"));
    const int threads = openmp_max_threads_in(bound_in_place.output);
    REQUIRE(threads >= 1);
    CHECK(openmp_max_threads_in(bound.output) == threads);
#if defined(__GNUC__) && !defined(__clang__)
    // With GCC the program holds one OpenMP runtime (libgomp, which OpenBLAS shares), whose places
    // cover every CPU the process started with. A clang build holds two (libomp, and libgomp through
    // OpenBLAS): libgomp binds the thread as it loads, and libomp makes its places from what is left.
    CHECK(openmp_max_threads_in(free_run.output) == threads);
#endif
}

TEST_CASE("train: train.threads fixes the thread count, and the summary has the peak memory per step",
          "[threads][cli]") {
    const std::string dir = nl_test::make_temp_dir("threads");
    const nl_test::CliRun run = nl_test::run_normlab_in(
        dir, "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json") +
                 " --set train.steps=3 --set optim.warmup_steps=1 --set train.threads=1 --out run");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("MiB per step"));
    const std::string summary = nl_test::read_text(dir + "/run/summary.json");
    CHECK_THAT(summary, Catch::Contains("\"threads\": 1"));
    CHECK_THAT(summary, Catch::Contains("\"peak_step_bytes\""));
    const nl_test::CliRun bad = nl_test::run_normlab_in(
        dir, "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json") +
                 " --set train.threads=-1 --out bad");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("/train/threads"));
    const std::vector<std::pair<std::string, std::string>> bool_keys = {
        {"model.fused_attention", "/model/fused_attention"}, {"model.fused_swiglu", "/model/fused_swiglu"}};
    for (const auto& [key, path] : bool_keys) {
        const nl_test::CliRun not_bool = nl_test::run_normlab_in(
            dir, "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json") +
                     " --set " + key + "=3 --out bad2");
        INFO(not_bool.output);
        CHECK(not_bool.status == 2);
        CHECK_THAT(not_bool.output, Catch::Contains(path + ": expected true or false, got 3"));
    }
}
