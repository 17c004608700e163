// Element types: f32 (default), f64 (gradient checks), bf16 and f16 (storage only; math in f32),
// and i64 (indices: token ids, argmax results, index_select/gather). Conversions for the half types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace nl {

enum class DType { F32, F64, BF16, F16, I64 };

size_t dtype_size(DType dtype);          // bytes per element
const char* dtype_name(DType dtype);     // "f32", "f64", "bf16", "f16", "i64"
DType dtype_from_name(const std::string& name);  // inverse of dtype_name; throws nl::Error naming the choices
bool is_floating(DType dtype);           // f32, f64, bf16, f16
bool is_half(DType dtype);               // bf16, f16: stored narrow, computed in f32
// The dtype math runs in: f64 stays f64, everything floating else computes in f32.
DType compute_dtype(DType dtype);

// An f32's bit pattern and back (memcpy, not std::bit_cast: nvcc compiles this header as C++17).
inline uint32_t f32_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    return bits;
}
inline float bits_f32(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

// bf16: the top 16 bits of an f32; conversion from f32 rounds to nearest even (NaN stays NaN).
// Inline: they sit in the inner loops of every bf16 kernel (a call per element made the bf16 norm
// kernels ~20x slower than f32), and written branch-free so those loops vectorize.
inline float bf16_to_f32(uint16_t bits) { return bits_f32(static_cast<uint32_t>(bits) << 16); }
inline uint16_t f32_to_bf16(float value) {
    const uint32_t bits = f32_bits(value);
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    // NaN: keep it quiet and a NaN (the rounding could carry it into inf).
    const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
// f16: IEEE 754 binary16; conversion from f32 rounds to nearest even, overflows to inf.
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

}  // namespace nl
