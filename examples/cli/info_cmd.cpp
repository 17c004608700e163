// `normlab info`: what this build of normlab is and what it finds on this machine: version, build type,
// BLAS library and threads, OpenMP threads, devices (CPU; CUDA GPUs when built with CUDA), dtypes, memory.
#include "examples/cli/commands.h"

#include "core/cpu_runtime.h"


#include <cblas.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "examples/cli/bench_util.h"  // format_bytes

#include "core/cuda/nl_cuda_api.h"

namespace nl::cli {

std::string idle_threads_setting(bool in_this_process) {
    if (const char* wait = std::getenv("OMP_WAIT_POLICY")) return fmt::format("OMP_WAIT_POLICY={}", wait);
    if (const char* spin = std::getenv("GOMP_SPINCOUNT")) return fmt::format("GOMP_SPINCOUNT={}", spin);
    if (in_this_process && !restart_settings().gomp_spincount.empty())
        return fmt::format("GOMP_SPINCOUNT={}, set by normlab", restart_settings().gomp_spincount);
    return "the runtime's default wait policy";
}

namespace {

std::string trim(const std::string& s) {
    size_t begin = s.find_first_not_of(" \t");
    size_t end = s.find_last_not_of(" \t\n");
    return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

// The CPU's model name and its logical / physical core counts, from /proc/cpuinfo (Linux).
struct CpuInfo {
    std::string model = "unknown";
    int logical = 0;
    int physical = 0;  // distinct (physical id, core id) pairs; 0 when the kernel does not say
};

CpuInfo read_cpuinfo() {
    CpuInfo info;
    std::ifstream in("/proc/cpuinfo");
    std::string line, physical_id;
    std::set<std::pair<std::string, std::string>> cores;
    while (std::getline(in, line)) {
        size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string key = trim(line.substr(0, colon));
        std::string value = trim(line.substr(colon + 1));
        if (key == "processor") ++info.logical;
        else if (key == "model name" && info.model == "unknown") info.model = value;
        else if (key == "physical id") physical_id = value;
        else if (key == "core id") cores.insert({physical_id, value});
    }
    info.physical = static_cast<int>(cores.size());
    if (info.logical == 0) info.logical = static_cast<int>(std::thread::hardware_concurrency());
    return info;
}

// One value from /proc/meminfo in bytes ("MemTotal:  24683652 kB"); -1 when missing.
int64_t meminfo_bytes(const std::string& key) {
    std::ifstream in("/proc/meminfo");
    std::string name;
    int64_t kib = 0;
    std::string unit;
    while (in >> name >> kib >> unit) {
        if (name == key + ":") return kib * 1024;
    }
    return -1;
}

void print_row(const std::string& key, const std::string& value) { fmt::print("  {:<10} {}\n", key, value); }

void print_cuda() {
#ifdef NORMLAB_HAVE_CUDA
    const CudaRuntimeInfo cuda = cuda_runtime_info();
    auto version = [](int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); };
    if (!cuda.error.empty()) {
        // No driver (a machine without an NVIDIA GPU) or no device: the CPU backend still works.
        print_row("CUDA", fmt::format("built (runtime {}); no GPU usable: {}", version(cuda.runtime_version),
                                      cuda.error));
        return;
    }
    print_row("CUDA", fmt::format("built (runtime {}), driver {}, {} GPU(s)", version(cuda.runtime_version),
                                  version(cuda.driver_version), cuda.device_count));
    for (int i = 0; i < cuda.device_count; ++i) {
        const CudaDeviceInfo gpu = cuda_device_info(i);
        print_row(fmt::format("cuda:{}", i),
                  fmt::format("{}, sm_{}{}, {} memory, {} SMs", gpu.name, gpu.major, gpu.minor,
                              format_bytes(gpu.memory_bytes), gpu.multiprocessors));
    }
#else
    print_row("CUDA", "not built (configure with -DNORMLAB_CUDA=ON where the CUDA toolkit is installed)");
#endif
}

void run_info() {
    fmt::print("normlab {} ({} build)\n", NORMLAB_VERSION, NORMLAB_BUILD_TYPE);

    fmt::print("Libraries\n");
    // openblas_get_config() names the version and build options, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ...".
    // A fallback: examples/cli/main.cpp restarted the program to correct OpenBLAS's choice.
    const RestartSettings& restart = restart_settings();
    const std::string chosen =
        restart.blas_fallback.empty()
            ? ""
            : fmt::format(", chosen by normlab: OpenBLAS's own detection fell back to {}", restart.blas_fallback);
    print_row("BLAS", fmt::format("{} (kernel: {}{}, {} threads)", trim(openblas_get_config()),
                                  openblas_get_corename(), chosen, openblas_get_num_threads()));
    print_row("f32 gemm", fmt::format("{} ({}; f64 runs on OpenBLAS)", nl::sgemm_engine_name(), nl::sgemm_engine_reason()));
    print_row("bf16 gemm", fmt::format("{} ({})", nl::bgemm_engine_name(), nl::bgemm_engine_reason()));
    print_row("attention",
              std::string(nl::attention_bf16_kernel()) == "vdpbf16ps"
                  ? "bf16 on vdpbf16ps: bf16 products with f32 sums, P and dS rounded to bf16 (head sizes a multiple of 16)"
                  : "bf16 widened to f32 per (batch, kv head), the f32 kernels, each result rounded once");
    print_row("OpenMP", fmt::format("{} max threads (spec {}), idle threads: {}", omp_get_max_threads(), _OPENMP,
                                    idle_threads_setting(true)));
#if defined(__clang__)
    print_row("Compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
    print_row("Compiler", "GCC " __VERSION__);
#endif
    // A portable build (NORMLAB_NATIVE=OFF) on an AVX-512 CPU runs its loops on SSE2: this row says so.
    print_row("SIMD", fmt::format("{} (this CPU has {})", nl::cpu_vector_target(), nl::cpu_vector_support()));

    fmt::print("Devices\n");
    CpuInfo cpu = read_cpuinfo();
    std::string cores = cpu.physical > 0 ? fmt::format("{} logical / {} physical cores", cpu.logical, cpu.physical)
                                         : fmt::format("{} logical cores", cpu.logical);
    print_row("cpu", fmt::format("{}, {}", cpu.model, cores));
    print_cuda();

    fmt::print("DTypes\n");
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        std::string role = dtype == DType::F32   ? "default; math"
                           : dtype == DType::F64 ? "math; gradient checks"
                           : is_half(dtype)      ? "storage; math in f32"
                                                 : "indices (token ids, argmax, gather)";
        print_row(dtype_name(dtype), fmt::format("{} bytes, {}", dtype_size(dtype), role));
    }

    fmt::print("Memory\n");
    int64_t total = meminfo_bytes("MemTotal"), available = meminfo_bytes("MemAvailable");
    if (total >= 0 && available >= 0)
        print_row("system", fmt::format("{} total, {} available", format_bytes(static_cast<double>(total)),
                                        format_bytes(static_cast<double>(available))));
    MemoryStats stats = memory_stats(Device::cpu());
    print_row("cpu alloc", fmt::format("{} current, {} peak, {} allocations (normlab's counting allocator)",
                                       format_bytes(static_cast<double>(stats.current_bytes)),
                                       format_bytes(static_cast<double>(stats.peak_bytes)),
                                       stats.allocations));
}

}  // namespace

void register_info(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("info", "Print version, build, BLAS, threads, devices, dtypes, memory");
    cmd->callback(run_info);
}

}  // namespace nl::cli
