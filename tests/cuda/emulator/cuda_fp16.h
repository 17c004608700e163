// IEEE half for the emulator (see emulator.h): conversions through the compiler's _Float16, which
// rounds to nearest, ties to even, as CUDA's __float2half_rn.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "emulator.h"

struct __half {
    uint16_t bits;
};

#if defined(__clang__) && __clang_major__ < 15
// clang before 15 has no _Float16 on x86: the core's conversions instead, which also round to
// nearest, ties to even (core/dtype.h).
inline float __half2float(__half h) { return nl::f16_to_f32(h.bits); }
inline __half __float2half_rn(float f) { return {nl::f32_to_f16(f)}; }
#else
inline float __half2float(__half h) {
    _Float16 v;
    std::memcpy(&v, &h.bits, sizeof v);
    return static_cast<float>(v);
}

inline __half __float2half_rn(float f) {
    const _Float16 v = static_cast<_Float16>(f);
    __half h;
    std::memcpy(&h.bits, &v, sizeof h.bits);
    return h;
}
#endif

inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
