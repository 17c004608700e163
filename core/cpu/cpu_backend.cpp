// The backend registry: one static CpuBackend, and the CUDA backends when built with CUDA.
#include "core/cpu/cpu_backend.h"

#include "core/error.h"
#include "core/profiler.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl {

static Backend& unprofiled_backend_for(Device device) {
    if (device.is_cpu()) {
        static CpuBackend cpu;
        return cpu;
    }
#ifdef NORMLAB_HAVE_CUDA
    return cuda_backend(device.index);
#else
    throw Error("backend_for: normlab was built without CUDA (asked for " + device.str() + ")");
#endif
}

const char* cpu_vector_target() {
#if defined(__AVX512F__) && defined(NORMLAB_VECTOR_LOOPS_512)
    return "AVX-512, 512-bit loops";
#elif defined(__AVX512F__)
    return "AVX-512, 256-bit loops";
#elif defined(__AVX2__) && defined(__FMA__)
    return "AVX2 + FMA";
#elif defined(__AVX__)
    return "AVX";
#elif defined(__SSE2__)
    return "SSE2";
#else
    return "the compiler's default";
#endif
}

const char* cpu_vector_support() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
    if (__builtin_cpu_supports("avx512f")) return "AVX-512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "AVX2 + FMA";
    if (__builtin_cpu_supports("avx")) return "AVX";
    return "SSE2";
#else
    return "a non-x86 vector unit";
#endif
}

Backend& backend_for(Device device) {
    // The profiler's switch (core/profiler.h): one branch when it is off.
    if (profiler::enabled()) return profiler::profiled(unprofiled_backend_for(device));
    return unprofiled_backend_for(device);
}

}  // namespace nl
