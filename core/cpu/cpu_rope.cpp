// CPU kernel for rotary position embedding: one pass over x, pairs rotated in place of the composed
// select/mul/sub/add/copy ops (whose strided 8-element runs cost more in loop overhead than in math).
// bf16 x and out are read and written as they are, each value widened to f32 as it is loaded (the
// tables are f32) and rounded once as it is stored, so a bf16 rotation moves only bf16 bytes.
// The formula is in core/backend.h next to the declaration.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster

// One (b, t) row of heads * head_dim values at position table rows c, s (half each). S: the storage
// (float, double, or uint16_t: bf16 bits), converted as each value is loaded and rounded once as it
// is stored; T: the math type of the tables (f32, f64 for f64).
template <typename S, typename T>
void rope_row(const S* x, const T* c, const T* s, S* out, int64_t heads, int64_t head_dim, bool inverse) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const S* xr = x + h * head_dim;  // (head_dim): pairs (re, im)
        S* o = out + h * head_dim;       // (head_dim)
        for (int64_t i = 0; i < half; ++i) {
            const T re = cpu_rows::math_value(xr[2 * i]), im = cpu_rows::math_value(xr[2 * i + 1]);
            const T si = inverse ? -s[i] : s[i];
            o[2 * i] = cpu_rows::stored_value<S>(re * c[i] - im * si);
            o[2 * i + 1] = cpu_rows::stored_value<S>(re * si + im * c[i]);
        }
    }
}

template <typename S, typename T>
void rope_impl(const void* x, const T* cos, const T* sin, void* out, int64_t batch, int64_t seq, int64_t heads,
               int64_t head_dim, bool inverse) {
    const int64_t half = head_dim / 2, width = heads * head_dim;
    const int64_t rows = batch * seq;  // (b, t) rows of heads * head_dim values
    const S* xs = static_cast<const S*>(x);
    S* os = static_cast<S*>(out);
#pragma omp parallel for schedule(static) if (rows * width > kParallelElements)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t t = row % seq;
        rope_row(xs + row * width, cos + t * half, sin + t * half, os + row * width, heads, head_dim, inverse);
    }
}

}  // namespace

void CpuBackend::rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                      int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
    NL_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim);
    const auto* cos32 = static_cast<const float*>(cos);
    const auto* sin32 = static_cast<const float*>(sin);
    switch (dtype) {
        case DType::F64:
            return rope_impl<double>(x, static_cast<const double*>(cos), static_cast<const double*>(sin), out, batch,
                                     seq, heads, head_dim, inverse);
        case DType::F32: return rope_impl<float>(x, cos32, sin32, out, batch, seq, heads, head_dim, inverse);
        case DType::BF16: return rope_impl<uint16_t>(x, cos32, sin32, out, batch, seq, heads, head_dim, inverse);
        default: NL_CHECK(false, "rope: dtype ", dtype_name(dtype));
    }
}

}  // namespace nl
