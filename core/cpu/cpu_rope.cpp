// CPU kernel for rotary position embedding: one pass over x, pairs rotated in place of the composed
// select/mul/sub/add/copy ops (whose strided 8-element runs cost more in loop overhead than in math).
// bf16 x and out are read and written as they are, each row widened to f32 in a scratch row (the
// tables are f32), so a bf16 rotation moves only bf16 bytes and rounds once per element.
// The formula is in core/backend.h next to the declaration.
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster

// One (b, t) row of heads * head_dim values at position table rows c, s (half each).
template <typename T>
void rope_row(const T* x, const T* c, const T* s, T* out, int64_t heads, int64_t head_dim, bool inverse) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const T* xr = x + h * head_dim;  // (head_dim): pairs (re, im)
        T* o = out + h * head_dim;       // (head_dim)
        for (int64_t i = 0; i < half; ++i) {
            const T re = xr[2 * i], im = xr[2 * i + 1];
            const T si = inverse ? -s[i] : s[i];
            o[2 * i] = re * c[i] - im * si;
            o[2 * i + 1] = re * si + im * c[i];
        }
    }
}

// T: the math type (f32 for f32 and bf16 storage, f64 for f64).
template <typename T>
void rope_impl(DType dtype, const void* x, const T* cos, const T* sin, void* out, int64_t batch, int64_t seq,
               int64_t heads, int64_t head_dim, bool inverse) {
    const int64_t half = head_dim / 2, width = heads * head_dim;
    const int64_t rows = batch * seq;  // (b, t) rows of heads * head_dim values
#pragma omp parallel if (rows * width > kParallelElements)
    {
        std::vector<T> x_row, out_row;  // (width) scratch rows for bf16 storage
        if (!cpu_rows::stored_as<T>(dtype)) {
            x_row.resize(static_cast<size_t>(width));
            out_row.resize(static_cast<size_t>(width));
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < rows; ++row) {
            const int64_t t = row % seq;
            const T* xr = cpu_rows::load<T>(dtype, x, row, width, x_row.data());
            T* o = cpu_rows::output<T>(dtype, out, row, width, out_row.data());
            rope_row(xr, cos + t * half, sin + t * half, o, heads, head_dim, inverse);
            cpu_rows::store<T>(dtype, out, row, width, o);
        }
    }
}

}  // namespace

void CpuBackend::rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                      int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
    NL_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim);
    if (dtype == DType::F64) {
        rope_impl(dtype, x, static_cast<const double*>(cos), static_cast<const double*>(sin), out, batch, seq, heads,
                  head_dim, inverse);
    } else {
        NL_CHECK(dtype == DType::F32 || dtype == DType::BF16, "rope: dtype ", dtype_name(dtype));
        rope_impl(dtype, x, static_cast<const float*>(cos), static_cast<const float*>(sin), out, batch, seq, heads,
                  head_dim, inverse);
    }
}

}  // namespace nl
