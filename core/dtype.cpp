// DType names, sizes and the bf16/f16 <-> f32 conversions (round to nearest even).
#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace nl {

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::F32: return 4;
        case DType::F64: return 8;
        case DType::BF16: return 2;
        case DType::F16: return 2;
        case DType::I64: return 8;
    }
    NL_CHECK(false, "unknown dtype");
    return 0;
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F32: return "f32";
        case DType::F64: return "f64";
        case DType::BF16: return "bf16";
        case DType::F16: return "f16";
        case DType::I64: return "i64";
    }
    NL_CHECK(false, "unknown dtype");
    return "";
}

DType dtype_from_name(const std::string& name) {
    for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64})
        if (name == dtype_name(d)) return d;
    throw Error("dtype: expected one of f32, f64, bf16, f16, i64, found \"" + name + "\"");
}

bool is_floating(DType dtype) { return dtype != DType::I64; }
bool is_half(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16; }
DType compute_dtype(DType dtype) { return dtype == DType::F64 ? DType::F64 : DType::F32; }

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. IEEE 754-2008 section 3.6.
float f16_to_f32(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24, exact in f32.
        float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));  // rebias 15 -> 127
}

uint16_t f32_to_f16(float value) {
    uint32_t bits = f32_bits(value);
    uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (abs < 0x38800000u) {
        // Below the smallest normal (2^-14): subnormal result in units of 2^-24, rounded to nearest
        // even. Shift the full 24-bit significand right by the extra exponent distance.
        if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 itself is a tie -> 0)
        uint32_t exp = abs >> 23;
        uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp;  // value = mant * 2^(exp-150); units of 2^-24 -> shift 126-exp
        uint32_t result = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (result & 1u))) result += 1u;
        return static_cast<uint16_t>(sign | result);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even. A carry out of
    // the mantissa correctly bumps the exponent (and 65504 < x < 65520 stays finite by the check above).
    uint32_t lsb = (abs >> 13) & 1u;
    abs += 0xfffu + lsb;
    return static_cast<uint16_t>(sign | ((abs - 0x38000000u) >> 13));
}

}  // namespace nl
