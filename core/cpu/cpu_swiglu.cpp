// CPU kernels for SwiGLU's gate, out = silu(a) * b, and its backward (formulas in core/backend.h):
// one vectorizable pass each way over contiguous elements, threads over chunks for large n. bf16
// operands are read and written as they are, widened to f32 as each is loaded and rounded once as
// each output is stored, in the same pass (so a bf16 gate moves only bf16 bytes).
#include <algorithm>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

// S: the storage (float, double, or uint16_t: bf16 bits); the math runs in f32 (f64 for f64), each
// element converted as it is loaded and rounded once as it is stored, in the same vectorized pass.
template <typename S>
void forward_block(const S* a, const S* b, S* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const auto x = cpu_rows::math_value(a[i]);
        out[i] = cpu_rows::stored_value<S>(x * cpu_math::stable_sigmoid(x) * cpu_rows::math_value(b[i]));
    }
}

template <typename S>
void backward_block(const S* a, const S* b, const S* dout, S* da, S* db, int64_t n) {
    using T = decltype(cpu_rows::math_value(S{}));
    for (int64_t i = 0; i < n; ++i) {
        const T x = cpu_rows::math_value(a[i]), s = cpu_math::stable_sigmoid(x), g = cpu_rows::math_value(dout[i]);
        da[i] = cpu_rows::stored_value<S>(g * cpu_rows::math_value(b[i]) * (s * (T(1) + x * (T(1) - s))));
        db[i] = cpu_rows::stored_value<S>(g * (x * s));
    }
}

template <typename S>
void forward_impl(const void* a, const void* b, void* out, int64_t n) {
    const S *as = static_cast<const S*>(a), *bs = static_cast<const S*>(b);
    S* os = static_cast<S*>(out);
    cpu_rows::for_element_blocks(n, [&](int64_t at, int64_t len) { forward_block(as + at, bs + at, os + at, len); });
}

template <typename S>
void backward_impl(const void* a, const void* b, const void* dout, void* da, void* db, int64_t n) {
    const S *as = static_cast<const S*>(a), *bs = static_cast<const S*>(b), *gs = static_cast<const S*>(dout);
    S *das = static_cast<S*>(da), *dbs = static_cast<S*>(db);
    cpu_rows::for_element_blocks(n, [&](int64_t at, int64_t len) {
        backward_block(as + at, bs + at, gs + at, das + at, dbs + at, len);
    });
}

}  // namespace

void CpuBackend::swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) {
    switch (dtype) {
        case DType::F64: return forward_impl<double>(a, b, out, n);
        case DType::F32: return forward_impl<float>(a, b, out, n);
        case DType::BF16: return forward_impl<uint16_t>(a, b, out, n);
        default: NL_CHECK(false, "swiglu: dtype ", dtype_name(dtype));
    }
}

void CpuBackend::swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                                 int64_t n) {
    switch (dtype) {
        case DType::F64: return backward_impl<double>(a, b, dout, da, db, n);
        case DType::F32: return backward_impl<float>(a, b, dout, da, db, n);
        case DType::BF16: return backward_impl<uint16_t>(a, b, dout, da, db, n);
        default: NL_CHECK(false, "swiglu: dtype ", dtype_name(dtype));
    }
}

}  // namespace nl
