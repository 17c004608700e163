// Row access for the fused CPU kernels (norms, cross-entropy): f32/f64 rows are used in place, bf16/f16
// rows go through a per-thread f32 scratch row, so one kernel body serves every floating dtype and a
// half-precision kernel still moves only half-precision bytes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace nl::cpu_rows {

// True when `dtype` is stored as T itself (no conversion needed).
template <typename T>
bool stored_as(DType dtype) {
    return (std::is_same_v<T, float> && dtype == DType::F32) ||
           (std::is_same_v<T, double> && dtype == DType::F64);
}

// Pointer to row `row` (length n) of `base` as T: the row itself, or `scratch` filled by conversion.
template <typename T>
const T* load(DType dtype, const void* base, int64_t row, int64_t n, T* scratch) {
    if (stored_as<T>(dtype)) return static_cast<const T*>(base) + row * n;
    const uint16_t* src = static_cast<const uint16_t*>(base) + row * n;
    if (dtype == DType::BF16) {
        for (int64_t j = 0; j < n; ++j) scratch[j] = static_cast<T>(bf16_to_f32(src[j]));
    } else {
        for (int64_t j = 0; j < n; ++j) scratch[j] = static_cast<T>(f16_to_f32(src[j]));
    }
    return scratch;
}

// Where to write row `row` as T: the row itself, or `scratch` (then store() converts it back).
template <typename T>
T* output(DType dtype, void* base, int64_t row, int64_t n, T* scratch) {
    if (stored_as<T>(dtype)) return static_cast<T*>(base) + row * n;
    return scratch;
}

// Finishes a row obtained from output(): converts the scratch row into bf16/f16 storage.
template <typename T>
void store(DType dtype, void* base, int64_t row, int64_t n, const T* values) {
    if (stored_as<T>(dtype)) return;
    uint16_t* dst = static_cast<uint16_t*>(base) + row * n;
    if (dtype == DType::BF16) {
        for (int64_t j = 0; j < n; ++j) dst[j] = f32_to_bf16(static_cast<float>(values[j]));
    } else {
        for (int64_t j = 0; j < n; ++j) dst[j] = f32_to_f16(static_cast<float>(values[j]));
    }
}

}  // namespace nl::cpu_rows
