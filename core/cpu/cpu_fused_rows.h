// Row access for the fused CPU kernels (norms, cross-entropy): f32/f64 rows are used in place, bf16/f16
// rows go through a per-thread f32 scratch row, so one kernel body serves every floating dtype and a
// half-precision kernel still moves only half-precision bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "core/dtype.h"

namespace nl::cpu_rows {

// True when `dtype` is stored as T itself (no conversion needed).
template <typename T>
bool stored_as(DType dtype) {
    return (std::is_same_v<T, float> && dtype == DType::F32) ||
           (std::is_same_v<T, double> && dtype == DType::F64);
}

// The address of element `index` of `base`, whose elements are `dtype`.
inline const void* offset(DType dtype, const void* base, int64_t index) {
    return static_cast<const char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}
inline void* offset(DType dtype, void* base, int64_t index) {
    return static_cast<char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
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

// One stored element as its math type and back, for kernels that fuse the conversion into their one
// pass instead of converting rows through scratch: f32 and f64 as they are, bf16 (its bits, uint16_t)
// widened exactly and rounded to nearest even (f32_to_bf16). Written inline so the loops vectorize.
inline float math_value(float v) { return v; }
inline double math_value(double v) { return v; }
inline float math_value(uint16_t bf16) { return bf16_to_f32(bf16); }
template <typename S, typename T>
inline S stored_value(T v) {
    if constexpr (std::is_same_v<S, uint16_t>) {
        return f32_to_bf16(static_cast<float>(v));
    } else {
        return static_cast<S>(v);
    }
}

// True when an output of `bytes` should be written with non-temporal (streaming) stores: it is larger
// than the last-level cache, so its lines would be evicted before anyone reads them, and a plain store
// would first read each line in (read-for-ownership), moving every output byte twice. glibc's memcpy
// makes the same choice for large copies. Outputs that fit stay in cache for the next op.
bool stream_output(int64_t bytes);

// The size in bytes of one last-level cache instance (the cache this CPU's cores share).
int64_t last_level_cache_bytes();

// Outputs above `bytes` stream; a negative value restores the default, last_level_cache_bytes().
// Tests set 0 to run the streaming path on small shapes.
void set_stream_threshold_bytes(int64_t bytes);

// Writes `n` values computed in `block` (a small L1 buffer) to `dst` with streaming stores (a plain copy
// when `dst` is not 16-byte aligned). After a kernel's last streaming store, each thread calls
// stream_fence() so the data is ordered before the kernel returns.
template <typename T>
void stream_block(T* dst, const T* block, int64_t n) {
#if defined(__SSE2__)
    if ((reinterpret_cast<uintptr_t>(dst) % 16) == 0) {
        int64_t j = 0;
        if constexpr (std::is_same_v<T, float>) {
            for (; j + 4 <= n; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(block + j));
        } else if constexpr (std::is_same_v<T, double>) {
            for (; j + 2 <= n; j += 2) _mm_stream_pd(dst + j, _mm_loadu_pd(block + j));
        }
        for (; j < n; ++j) dst[j] = block[j];
        return;
    }
#endif
    std::memcpy(dst, block, static_cast<size_t>(n) * sizeof(T));
}

// body(begin, length) over n elements in chunks of kElementBlock (the last one shorter), across
// OpenMP's threads above kParallelElements: the one elementwise pass of the fused kernels that run
// along contiguous elements (SwiGLU's gate, the logit soft-cap).
inline constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster
inline constexpr int64_t kElementBlock = 4096;       // elements per thread's chunk
template <typename Body>
void for_element_blocks(int64_t n, Body body) {
    const int64_t blocks = (n + kElementBlock - 1) / kElementBlock;
#pragma omp parallel for schedule(static) if (n > kParallelElements)
    for (int64_t q = 0; q < blocks; ++q) body(q * kElementBlock, std::min(kElementBlock, n - q * kElementBlock));
}

inline void stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

}  // namespace nl::cpu_rows
