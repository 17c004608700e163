// CPU kernel for rotary position embedding: one pass over x, pairs rotated in place of the composed
// select/mul/sub/add/copy ops (whose strided 8-element runs cost more in loop overhead than in math).
// The formula is in core/backend.h next to the declaration.
#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster

template <typename T>
void rope_impl(const T* x, const T* cos, const T* sin, T* out, int64_t batch, int64_t seq, int64_t heads,
               int64_t head_dim, bool inverse) {
    const int64_t half = head_dim / 2;
    const int64_t rows = batch * seq;  // (b, t) rows of heads * head_dim values
#pragma omp parallel for schedule(static) if (rows * heads * head_dim > kParallelElements)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t t = row % seq;
        const T* c = cos + t * half;  // (half)
        const T* s = sin + t * half;  // (half)
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t base = (row * heads + h) * head_dim;
            const T* xr = x + base;  // (head_dim): pairs (re, im)
            T* o = out + base;       // (head_dim)
            for (int64_t i = 0; i < half; ++i) {
                const T re = xr[2 * i], im = xr[2 * i + 1];
                const T si = inverse ? -s[i] : s[i];
                o[2 * i] = re * c[i] - im * si;
                o[2 * i + 1] = re * si + im * c[i];
            }
        }
    }
}

}  // namespace

void CpuBackend::rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                      int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
    NL_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim);
    if (dtype == DType::F64) {
        rope_impl(static_cast<const double*>(x), static_cast<const double*>(cos), static_cast<const double*>(sin),
                  static_cast<double*>(out), batch, seq, heads, head_dim, inverse);
    } else {
        NL_CHECK(dtype == DType::F32, "rope: dtype ", dtype_name(dtype));
        rope_impl(static_cast<const float*>(x), static_cast<const float*>(cos), static_cast<const float*>(sin),
                  static_cast<float*>(out), batch, seq, heads, head_dim, inverse);
    }
}

}  // namespace nl
