// The `normlab` program: builds the command line from each job's register function (examples/cli/commands.h)
// and turns any exception into one line on stderr and a non-zero exit (docs/architecture.md: errors):
// exit 2 for a user mistake (nl::Error, a command-line mistake, a path that cannot be used), 1 for
// anything else. Under mpirun (core/dist.h) an error all ranks agree on is printed once, by rank 0; an
// error of one rank alone is printed with its rank and ends the whole job (MPI_Abort), so no rank
// waits forever for it.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <stdexcept>

#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "core/cpu_runtime.h"

#include "core/dist.h"
#include "core/error.h"
#include "examples/cli/commands.h"

namespace {

// An error this process met alone: one line; over several ranks it names the rank and ends the job.
int fail_alone(const std::exception& e, int exit_code) {
    if (nl::dist::world_size() == 1) {
        fmt::print(stderr, "normlab: error: {}\n", e.what());
        return exit_code;
    }
    fmt::print(stderr, "normlab: rank {} of {}: error: {}\n", nl::dist::rank(), nl::dist::world_size(), e.what());
    std::fflush(stderr);
    nl::dist::abort(exit_code);
}

// OpenBLAS and the OpenMP runtime read their settings from the environment when they are loaded,
// before main. Two defaults cost normlab dearly on small machines, so where the user has set neither
// variable, the program starts again (the same program, arguments and process id, so mpirun's ranks
// are unaffected) with:
// - OPENBLAS_CORETYPE, where OpenBLAS fell back to its slowest kernels on a CPU that can run faster
//   ones (core/cpu_runtime.h: blas_kernel_override);
// - GOMP_SPINCOUNT=10000 (libgomp), unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set: an idle OpenMP
//   thread spins about 10 us instead of the default 300,000 spins before it sleeps. A training step
//   runs thousands of short parallel regions with serial work between them; threads spinning through
//   those gaps take the core from whatever must run next (another process, or the thread they wait
//   for when two virtual CPUs share a core); docs/benchmarks.md has it measured.
// With OMP_PROC_BIND set, an OpenMP runtime binds this thread to its first place when it loads or
// first runs, and a restarted process inherits that one place: its runtime would count the CPUs of one
// place, start one thread, and put every thread there. The runtime's own places cannot undo that: a
// program holding two runtimes (clang's libomp, and libgomp through OpenBLAS) has libgomp bind the
// thread before libomp makes its places from the narrowed mask. So the mask the process started with
// is read before any library's initializer runs (.preinit_array: the executable's own, run first by
// the dynamic loader), and the restart runs on it again.
cpu_set_t g_starting_cpus;
bool g_starting_cpus_known = false;

void record_starting_cpus(int, char**, char**) {
#if defined(__linux__)
    CPU_ZERO(&g_starting_cpus);
    g_starting_cpus_known = sched_getaffinity(0, sizeof(g_starting_cpus), &g_starting_cpus) == 0;
#endif
}
[[gnu::used, gnu::section(".preinit_array")]] void (*const g_record_starting_cpus)(int, char**, char**) =
    &record_starting_cpus;

void restore_starting_cpus() {
#if defined(__linux__)
    if (g_starting_cpus_known && CPU_COUNT(&g_starting_cpus) > 0)
        sched_setaffinity(0, sizeof(g_starting_cpus), &g_starting_cpus);
#endif
}

// The new process finds the variables set and does not restart again; if the restart fails, carry on.
void restart_with_better_runtime_settings(char** argv) {
    // Not under an MPI launcher: OpenMPI's process setup does not survive an exec before MPI_Init
    // (orte_init fails). There, pass the variables with the launcher (docs/distributed.md).
    for (const char* launcher_variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(launcher_variable) != nullptr) return;
    bool set_blas = false, set_spin = false;
    if (const char* core = nl::blas_kernel_override()) {
        setenv("NORMLAB_BLAS_FALLBACK", nl::blas_kernel_name(), 1);  // for `normlab info`
        setenv("OPENBLAS_CORETYPE", core, 1);
        set_blas = true;
    }
    if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
        setenv("GOMP_SPINCOUNT", "10000", 1);
        setenv("NORMLAB_SET_SPINCOUNT", "1", 1);  // for `normlab info`
        set_spin = true;
    }
    if (!set_blas && !set_spin) return;
    restore_starting_cpus();
    execv("/proc/self/exe", argv);
    // Still here: the libraries never read the variables, so this process runs without them.
    if (set_blas) {
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("NORMLAB_BLAS_FALLBACK");
    }
    if (set_spin) {
        unsetenv("GOMP_SPINCOUNT");
        unsetenv("NORMLAB_SET_SPINCOUNT");
    }
}

nl::cli::RestartSettings g_restart_settings;

// The restart's variables did their work as the libraries loaded. They are kept for `normlab info`
// and taken out of the environment, so that a program normlab starts (PyTorch under `bench torch`,
// gnuplot, dot) runs with the environment the user gave normlab, not with normlab's own settings.
void take_restart_settings_from_environment() {
    if (std::getenv("NORMLAB_SET_SPINCOUNT") != nullptr) {
        if (const char* spin = std::getenv("GOMP_SPINCOUNT")) g_restart_settings.gomp_spincount = spin;
        unsetenv("GOMP_SPINCOUNT");
        unsetenv("NORMLAB_SET_SPINCOUNT");
    }
    if (const char* fallback = std::getenv("NORMLAB_BLAS_FALLBACK")) {
        g_restart_settings.blas_fallback = fallback;
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("NORMLAB_BLAS_FALLBACK");
    }
}

int run_program(int argc, char** argv) {
    restart_with_better_runtime_settings(argv);
    take_restart_settings_from_environment();
    // With OpenBLAS's OpenMP build (what CMake links when libopenblas-openmp-dev is installed) the
    // gemms share normlab's OpenMP thread pool and follow OMP_NUM_THREADS. With the pthreads build,
    // OpenBLAS's own pool and the OpenMP pool would both claim every core, and OpenBLAS's idle workers
    // spin (sched_yield) between calls, starving the OpenMP workers that run the elementwise and norm
    // kernels (a toy-transformer step runs some 30x slower on a loaded 2-core machine); there BLAS
    // runs on the calling thread unless OPENBLAS_NUM_THREADS asks for more.
    // openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP.
    if (openblas_get_parallel() == 1 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);

    CLI::App app{"normlab: a small from-scratch C++20 training framework", "normlab"};
    app.set_version_flag("--version", std::string("normlab ") + NORMLAB_VERSION);
    app.require_subcommand(1);

    nl::cli::register_info(app);
    nl::cli::register_train(app);
    nl::cli::register_sample(app);
    nl::cli::register_export(app);
    nl::cli::register_convert(app);
    nl::cli::register_analyze(app);
    nl::cli::register_stability(app);
    nl::cli::register_sweep(app);
    nl::cli::register_gradcheck(app);
    nl::cli::register_graph(app);
    nl::cli::register_norms(app);
    nl::cli::register_config(app);
    CLI::App* bench = app.add_subcommand("bench", "Benchmarks (ours vs a reference, in one run)");
    bench->require_subcommand(1);
    nl::cli::register_bench_core(*bench);
    nl::cli::register_bench_norms(*bench);
    nl::cli::register_bench_torch(*bench);

    // Subcommand callbacks run inside parse(), so a job's exceptions arrive here too.
    try {
        nl::sgemm_engine_name();  // a bad NORMLAB_GEMM is a user mistake: report it before any work
        nl::bgemm_engine_name();  // and NORMLAB_GEMM_BF16
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return nl::dist::is_root() ? app.exit(e) : 0;  // --help, --version
        // A command-line mistake is a user mistake like any other: one line, exit 2. Every rank parses
        // the same arguments, so rank 0 speaks for all.
        if (nl::dist::is_root()) fmt::print(stderr, "normlab: error: {} (see normlab --help)\n", e.what());
        return 2;
    } catch (const nl::dist::JobError& e) {
        if (nl::dist::is_root()) fmt::print(stderr, "normlab: error: {}\n", e.what());
        return e.exit_code;
    } catch (const nl::Error& e) {
        return fail_alone(e, 2);  // a user mistake: bad shape, config, file
    } catch (const std::filesystem::filesystem_error& e) {
        // A path that cannot be created or read (a full disk, permissions, a symlink loop): the
        // message names the path(s); the user has to act on it.
        return fail_alone(e, 2);
    } catch (const std::bad_alloc&) {
        // Sizes are checked against the memory available before a job starts, so this is rare.
        return fail_alone(std::runtime_error("out of memory (std::bad_alloc)"), 1);
    } catch (const std::exception& e) {
        return fail_alone(e, 1);  // a bug or a system failure
    }
    return 0;
}

}  // namespace

const nl::cli::RestartSettings& nl::cli::restart_settings() { return g_restart_settings; }

void nl::cli::with_starting_cpus(const std::function<void()>& start_child) {
#if defined(__linux__)
    cpu_set_t now;
    CPU_ZERO(&now);
    const bool known = g_starting_cpus_known && CPU_COUNT(&g_starting_cpus) > 0 &&
                       sched_getaffinity(0, sizeof(now), &now) == 0;
    if (known) sched_setaffinity(0, sizeof(g_starting_cpus), &g_starting_cpus);
    start_child();
    if (known) sched_setaffinity(0, sizeof(now), &now);
#else
    start_child();
#endif
}

int main(int argc, char** argv) {
    nl::dist::init(&argc, &argv);
    const int code = run_program(argc, argv);
    nl::dist::finalize();
    return code;
}
