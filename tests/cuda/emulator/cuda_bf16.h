// bfloat16 for the emulator (see emulator.h): storage and CUDA's conversions, written from the format's
// definition (the top 16 bits of an IEEE f32) rather than shared with normlab's own dtype.cpp, so the
// CPU-vs-GPU tests compare two implementations.
#pragma once

#include <cstdint>
#include <cstring>

#include "emulator.h"

struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = uint32_t{h.bits} << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Round to nearest, ties to even; NaN becomes CUDA's canonical 0x7fff.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<uint16_t>(u >> 16)};
}

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
