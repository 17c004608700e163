// CPU copy and fill: any dtype to any dtype over strided views. Dims are coalesced first, then a
// contiguous fast path (memcpy, or a converting loop) or a strided row loop runs, in parallel
// chunks for large sizes. Half types convert through f32 with round-to-nearest-even.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include <omp.h>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelMin = 32768;  // elements below which one thread does the copy

// The two 16-bit float formats, as distinct types so overloads and templates can tell them apart.
struct Bf16 {
    uint16_t bits;
};
struct Half {
    uint16_t bits;
};

// A stored element as the value it represents (half types widen to f32).
inline float load(Bf16 v) { return bf16_to_f32(v.bits); }
inline float load(Half v) { return f16_to_f32(v.bits); }
inline float load(float v) { return v; }
inline double load(double v) { return v; }
inline int64_t load(int64_t v) { return v; }

// Float -> i64 truncates toward zero like a C cast, but NaN becomes 0 and out-of-range values
// saturate, because the plain cast is undefined behaviour there.
template <typename V>
int64_t float_to_i64(V v) {
    if (std::isnan(v)) return 0;
    if (v >= static_cast<V>(9.2233720368547758e18)) return std::numeric_limits<int64_t>::max();
    if (v <= static_cast<V>(-9.2233720368547758e18)) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(v);
}

// A value (f32, f64 or i64) stored as dtype D. Half types round from f32 (as PyTorch does).
template <typename D, typename V>
D store(V v) {
    if constexpr (std::is_same_v<D, Bf16>)
        return Bf16{f32_to_bf16(static_cast<float>(v))};
    else if constexpr (std::is_same_v<D, Half>)
        return Half{f32_to_f16(static_cast<float>(v))};
    else if constexpr (std::is_same_v<D, int64_t> && std::is_floating_point_v<V>)
        return float_to_i64(v);
    else
        return static_cast<D>(v);
}

// One element from S to D; the same type copies bits (so NaN payloads survive).
template <typename D, typename S>
inline D convert(S s) {
    if constexpr (std::is_same_v<D, S>)
        return s;
    else
        return store<D>(load(s));
}

// Calls f(T{}) with T the storage type of `dtype`.
template <typename F>
void with_storage_type(DType dtype, F&& f) {
    switch (dtype) {
        case DType::F32: f(float{}); return;
        case DType::F64: f(double{}); return;
        case DType::BF16: f(Bf16{}); return;
        case DType::F16: f(Half{}); return;
        case DType::I64: f(int64_t{}); return;
    }
    NL_CHECK(false, "unknown dtype");
}

// Merges adjacent dims that both operands walk contiguously and drops size-1 dims, so a packed view
// becomes 1-D and a transposed one stays 2-D. Result has at least one dim.
void coalesce(Shape& shape, Shape& a, Shape& b) {
    Shape s, sa, sb;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 1) continue;
        if (!s.empty() && sa.back() == a[i] * shape[i] && sb.back() == b[i] * shape[i]) {
            s.back() *= shape[i];
            sa.back() = a[i];
            sb.back() = b[i];
        } else {
            s.push_back(shape[i]);
            sa.push_back(a[i]);
            sb.push_back(b[i]);
        }
    }
    if (s.empty()) {
        s = {1};
        sa = {1};
        sb = {1};
    }
    shape = s;
    a = sa;
    b = sb;
}

// Runs body(begin, end) over [0, n) in chunks, across threads when total work is large.
template <typename Body>
void for_chunks(int64_t n, int64_t work, Body body) {
    if (work < kParallelMin || n < 2 || omp_in_parallel()) {
        body(int64_t{0}, n);
        return;
    }
    const int64_t chunks = std::min<int64_t>(n, 4 * omp_get_max_threads());
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) body(n * c / chunks, n * (c + 1) / chunks);
}

// dst[i] = convert(src[i]) over a coalesced shape (see coalesce); strides in elements.
template <typename D, typename S>
void copy_typed(const Shape& shape, D* dst, const Shape& ds, const S* src, const Shape& ss) {
    const int64_t nd = static_cast<int64_t>(shape.size());
    const int64_t numel = shape_numel(shape);
    if (nd == 1 && ds[0] == 1 && ss[0] == 1) {
        // Contiguous fast path.
        for_chunks(numel, numel, [&](int64_t begin, int64_t end) {
            if constexpr (std::is_same_v<D, S>) {
                std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(D));
            } else {
                for (int64_t i = begin; i < end; ++i) dst[i] = convert<D>(src[i]);
            }
        });
        return;
    }
    // Strided path: rows are all dims but the last; each chunk walks its rows with an odometer.
    const int64_t inner = shape[nd - 1];
    const int64_t dsi = ds[nd - 1], ssi = ss[nd - 1];
    const int64_t rows = numel / inner;
    for_chunks(rows, numel, [&](int64_t begin, int64_t end) {
        Shape index(static_cast<size_t>(nd), 0);  // (nd - 1) outer indices of the current row
        int64_t doff = 0, soff = 0;
        int64_t rest = begin;
        for (int64_t d = nd - 2; d >= 0; --d) {
            index[d] = rest % shape[d];
            rest /= shape[d];
            doff += index[d] * ds[d];
            soff += index[d] * ss[d];
        }
        for (int64_t r = begin; r < end; ++r) {
            D* drow = dst + doff;
            const S* srow = src + soff;
            for (int64_t i = 0; i < inner; ++i) drow[i * dsi] = convert<D>(srow[i * ssi]);
            for (int64_t d = nd - 2; d >= 0; --d) {  // advance to the next row
                doff += ds[d];
                soff += ss[d];
                if (++index[d] < shape[d]) break;
                doff -= index[d] * ds[d];
                soff -= index[d] * ss[d];
                index[d] = 0;
            }
        }
    });
}

}  // namespace

void CpuBackend::copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) {
    NL_CHECK(dst.strides.size() == shape.size() && src.strides.size() == shape.size());
    if (shape_numel(shape) == 0) return;
    Shape s = shape, ds = dst.strides, ss = src.strides;
    coalesce(s, ds, ss);
    with_storage_type(dst.dtype, [&](auto d) {
        using D = decltype(d);
        with_storage_type(src.dtype, [&](auto sv) {
            using S = decltype(sv);
            copy_typed(s, static_cast<D*>(dst.data), ds, static_cast<const S*>(src.data), ss);
        });
    });
}

void CpuBackend::fill(const Shape& shape, const StridedArg& dst, double value) {
    NL_CHECK(dst.strides.size() == shape.size());
    if (shape_numel(shape) == 0) return;
    // A fill is a copy from one converted element broadcast with stride 0.
    Shape s = shape, ds = dst.strides, ss(shape.size(), 0);
    coalesce(s, ds, ss);
    with_storage_type(dst.dtype, [&](auto d) {
        using D = decltype(d);
        const D element = store<D>(value);
        copy_typed(s, static_cast<D*>(dst.data), ds, &element, ss);
    });
}

}  // namespace nl
