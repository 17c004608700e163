// CPU indexing kernels: index_select / index_add and gather / scatter_add on contiguous operands
// viewed as (outer, size, inner). Indices were range-checked by the ops on the host.
// The accumulating kernels add in order of j for every output element, whatever the thread count,
// so results are bitwise reproducible (torch's CPU index_add_ is too; its CUDA one is not).
#include <algorithm>
#include <cstdint>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {

namespace {

// Below this many elements moved, threads cost more than they save.
constexpr int64_t kParallelMin = 32768;
// The accumulating kernels split `inner` into blocks this wide, so each task owns whole output
// columns (keeping the order of j fixed) while still giving threads work when outer == 1.
constexpr int64_t kInnerBlock = 256;

template <typename T>
void index_select_typed(const T* src, const int64_t* index, T* out, int64_t outer, int64_t src_size,
                        int64_t inner, int64_t n) {
    // src (outer, src_size, inner) -> out (outer, n, inner)
    const int64_t rows = outer * n;
#pragma omp parallel for schedule(static) if (rows * inner > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n, j = r % n;
        const T* from = src + (o * src_size + index[j]) * inner;
        std::copy(from, from + inner, out + r * inner);
    }
}

// dst (outer, dst_size, inner) += src (outer, n, inner): element (o, j, i) of src is added to dst row
// dst_row(o, j, i) of slice o. The one accumulation loop behind index_add (a row per j) and scatter_add
// (a row per element).
template <typename T, typename DstRow>
void add_rows(T* dst, const T* src, int64_t outer, int64_t dst_size, int64_t inner, int64_t n, DstRow dst_row) {
    const int64_t blocks = (inner + kInnerBlock - 1) / kInnerBlock;
    const int64_t tasks = outer * blocks;
#pragma omp parallel for schedule(static) if (outer * n * inner > kParallelMin && tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t o = task / blocks;
        const int64_t i0 = (task % blocks) * kInnerBlock, i1 = std::min(inner, i0 + kInnerBlock);
        T* base = dst + o * dst_size * inner;  // (dst_size, inner)
        for (int64_t j = 0; j < n; ++j) {
            const T* from = src + (o * n + j) * inner;  // (inner)
            for (int64_t i = i0; i < i1; ++i) base[dst_row(o, j, i) * inner + i] += from[i];
        }
    }
}

template <typename T>
void gather_typed(const T* src, const int64_t* index, T* out, int64_t outer, int64_t src_size,
                  int64_t inner, int64_t n) {
    // out (outer, n, inner) = src (outer, src_size, inner) at index (outer, n, inner)
    const int64_t rows = outer * n;
#pragma omp parallel for schedule(static) if (rows * inner > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n;
        const T* base = src + o * src_size * inner;
        const int64_t* idx = index + r * inner;
        T* to = out + r * inner;
        for (int64_t i = 0; i < inner; ++i) to[i] = base[idx[i] * inner + i];
    }
}

}  // namespace

void CpuBackend::index_select(DType dtype, const void* src, const int64_t* index, void* out,
                              int64_t outer, int64_t src_size, int64_t inner, int64_t n) {
    if (dtype == DType::F32)
        return index_select_typed(static_cast<const float*>(src), index, static_cast<float*>(out), outer,
                                  src_size, inner, n);
    NL_CHECK(dtype == DType::F64, "index_select: kernels see f32/f64 only, found ", dtype_name(dtype));
    index_select_typed(static_cast<const double*>(src), index, static_cast<double*>(out), outer, src_size,
                       inner, n);
}

void CpuBackend::index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                           int64_t dst_size, int64_t inner, int64_t n) {
    // index (n): src row j goes to dst row index[j].
    auto dst_row = [index](int64_t, int64_t j, int64_t) { return index[j]; };
    if (dtype == DType::F32)
        return add_rows(static_cast<float*>(dst), static_cast<const float*>(src), outer, dst_size, inner, n, dst_row);
    NL_CHECK(dtype == DType::F64, "index_add: kernels see f32/f64 only, found ", dtype_name(dtype));
    add_rows(static_cast<double*>(dst), static_cast<const double*>(src), outer, dst_size, inner, n, dst_row);
}

void CpuBackend::gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                        int64_t src_size, int64_t inner, int64_t n) {
    if (dtype == DType::F32)
        return gather_typed(static_cast<const float*>(src), index, static_cast<float*>(out), outer,
                            src_size, inner, n);
    NL_CHECK(dtype == DType::F64, "gather: kernels see f32/f64 only, found ", dtype_name(dtype));
    gather_typed(static_cast<const double*>(src), index, static_cast<double*>(out), outer, src_size,
                 inner, n);
}

void CpuBackend::scatter_add(DType dtype, void* dst, const int64_t* index, const void* src,
                             int64_t outer, int64_t dst_size, int64_t inner, int64_t n) {
    // index (outer, n, inner): element (o, j, i) goes to dst row index[o, j, i].
    auto dst_row = [index, n, inner](int64_t o, int64_t j, int64_t i) { return index[(o * n + j) * inner + i]; };
    if (dtype == DType::F32)
        return add_rows(static_cast<float*>(dst), static_cast<const float*>(src), outer, dst_size, inner, n, dst_row);
    NL_CHECK(dtype == DType::F64, "scatter_add: kernels see f32/f64 only, found ", dtype_name(dtype));
    add_rows(static_cast<double*>(dst), static_cast<const double*>(src), outer, dst_size, inner, n, dst_row);
}

}  // namespace nl
