// What the CPU kernels were compiled for and what this CPU runs (core/cpu_runtime.h): compiled with
// core/cpu, so each x86 level's objects report their own target.
#include "core/cpu/cpu_backend.h"

namespace nl {

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

}  // namespace nl
