// CPU kernels for SwiGLU's gate, out = silu(a) * b, and its backward (formulas in core/backend.h):
// one vectorizable pass each way over contiguous elements, threads over chunks for large n. bf16
// operands are read and written as they are, widened to f32 as each is loaded and rounded once as
// each output is stored, in the same pass (so a bf16 gate moves only bf16 bytes).
#include <algorithm>
#include <type_traits>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // GCC 12's headers trip these in the AVX-512 shifts (GCC bug 105593)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(__AVX512F__) && defined(__FMA__)
// 16 lanes of the loops below for f32 and bf16 storage, written out so that exp is
// cpu_math::exp_f32x16 (exp_f32's bits in fewer instructions than the compiler's vectorization of
// exp_f32): the same operations in the same order, so the same bits.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
    return cpu_math::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), cpu_math::f32x16_to_bf16x16(v));
}
// cpu_math::stable_sigmoid on 16 lanes: exp(-|x|), the numerator 1 or e by x's sign, one division.
inline __m512 stable_sigmoid16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = cpu_math::exp_f32x16(_mm512_or_ps(x, _mm512_set1_ps(-0.0f)));
    const __m512 numerator = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), e, one);
    return _mm512_div_ps(numerator, _mm512_add_ps(one, e));
}
#endif

// S: the storage (float, double, or uint16_t: bf16 bits); the math runs in f32 (f64 for f64), each
// element converted as it is loaded and rounded once as it is stored, in the same vectorized pass.
template <typename S>
void forward_block(const S* a, const S* b, S* out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (!std::is_same_v<S, double>) {
        for (; i + 16 <= n; i += 16) {
            const __m512 x = load16(a + i);
            store16(out + i, _mm512_mul_ps(_mm512_mul_ps(x, stable_sigmoid16(x)), load16(b + i)));
        }
    }
#endif
    for (; i < n; ++i) {
        const auto x = cpu_rows::math_value(a[i]);
        out[i] = cpu_rows::stored_value<S>(x * cpu_math::stable_sigmoid(x) * cpu_rows::math_value(b[i]));
    }
}

template <typename S>
void backward_block(const S* a, const S* b, const S* dout, S* da, S* db, int64_t n) {
    using T = decltype(cpu_rows::math_value(S{}));
    int64_t i = 0;
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (!std::is_same_v<S, double>) {
        const __m512 one = _mm512_set1_ps(1.0f);
        for (; i + 16 <= n; i += 16) {
            const __m512 x = load16(a + i), s = stable_sigmoid16(x), g = load16(dout + i);
            const __m512 slope = _mm512_mul_ps(s, _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, s))));
            store16(da + i, _mm512_mul_ps(_mm512_mul_ps(g, load16(b + i)), slope));
            store16(db + i, _mm512_mul_ps(g, _mm512_mul_ps(x, s)));
        }
    }
#endif
    for (; i < n; ++i) {
        const T x = cpu_rows::math_value(a[i]), s = cpu_math::stable_sigmoid(x), g = cpu_rows::math_value(dout[i]);
        da[i] = cpu_rows::stored_value<S>(g * cpu_rows::math_value(b[i]) * (s * (T(1) + x * (T(1) - s))));
        db[i] = cpu_rows::stored_value<S>(g * (x * s));
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

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
