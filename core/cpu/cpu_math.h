// Elementary functions the compiler can vectorize, and an explicit multiply-add: glibc's expf is an opaque call per element (its
// vector variants need -ffast-math), which made exp the largest single cost of SiLU in the toy
// transformer. exp_f32 is written with plain arithmetic and bit moves only, so a loop calling it
// compiles to SIMD code at any -march.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NL_CPU_MATH_X86 1
#endif

namespace nl::cpu_math {

// a * b + c for the register-blocked products (the fused attention's). Where the build targets FMA
// hardware (__FMA__: -march=native on any x86-64 CPU since 2013) it is std::fma, one rounding and one
// vector instruction. Elsewhere (the portable build) it is the multiply and the add: there std::fma
// would be a library call per element. So NORMLAB_NATIVE changes these sums' last bits as well as speed.
template <typename T>
inline T mul_add(T a, T b, T c) {
#if defined(__FMA__)
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
}

// exp_f32's constants, shared with its 16-lane form below so the two cannot drift apart.
namespace exp_f32_constants {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;     // exact in 9 bits: n * kLn2Hi has no rounding
constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer (SSE2 has no round)
constexpr float kMin = -87.33654f, kMax = 88.72283f;
// e^r's polynomial beyond 1 + r, highest degree first.
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace exp_f32_constants

// e^x for f32, within 2 ulp of the correctly rounded result over the normal range (checked against
// std::exp in double by tests/test_ops_elementwise.cpp). Cephes' expf: x = n ln2 + r with |r| <= ln2/2
// (ln2 split hi + lo so n * ln2_hi is exact), e^r by a degree-7 polynomial, 2^n by building the
// exponent bits. Below -87.3 (where e^x is subnormal) it returns 0; above 88.7, +inf; NaN stays NaN.
// The reduction and the polynomial are multiply-adds (mul_add: one instruction each where the build
// targets FMA).
inline float exp_f32(float x) {
    using namespace exp_f32_constants;
    // NaN fails both comparisons and lands on kMin: n stays finite, so the int conversion below is
    // defined (converting NaN to int is undefined behaviour); the NaN is restored at the end.
    const float clamped = x > kMin ? (x < kMax ? x : kMax) : kMin;
    const float n = mul_add(clamped, kLog2e, kRound) - kRound;  // nearest integer to x / ln2
    const float r = mul_add(-n, kLn2Lo, mul_add(-n, kLn2Hi, clamped));
    float p = kP0;
    p = mul_add(p, r, kP1);
    p = mul_add(p, r, kP2);
    p = mul_add(p, r, kP3);
    p = mul_add(p, r, kP4);
    p = mul_add(p, r, kP5);
    p = mul_add(p * r, r, r) + 1.0f;
    // 2^n as float bits; n in [-126, 128]: for n = 128 scale by 2^127 twice via the product below.
    const int32_t ni = static_cast<int32_t>(n);
    const int32_t half = ni >> 1;  // 2^n = 2^half * 2^(n - half), each factor a normal float
    const float s1 = std::bit_cast<float>((half + 127) << 23);
    const float s2 = std::bit_cast<float>((ni - half + 127) << 23);
    const float result = p * s1 * s2;
    // Outside the range the clamped value's result is replaced; x != x keeps NaN.
    return x < kMin ? 0.0f : (x > kMax ? __builtin_inff() : (x != x ? x : result));
}

#if defined(__AVX512F__) && defined(__FMA__)
// exp_f32 on 16 lanes, with the same bits: the same clamp, reduction and polynomial (its multiply-
// adds are FMAs here as there, since every AVX-512 CPU has FMA), and 2^n applied by one scalef,
// which rounds p * 2^n once, as exp_f32's two power-of-two products do. Fewer instructions than the
// compiler's vectorization of exp_f32 (the exponent bits, the two products and a clamp as selects):
// for the loops that call it per 16 values, the attention's softmax.
// GCC 12's own headers trip -Wmaybe-uninitialized in these intrinsics (their _mm512_undefined_ps
// operands; GCC bug 105593): the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
inline __m512 exp_f32x16(__m512 x) {
    using namespace exp_f32_constants;
    const __m512 lo = _mm512_set1_ps(kMin), hi = _mm512_set1_ps(kMax), round = _mm512_set1_ps(kRound);
    // max returns its second operand for a NaN x: kMin, as exp_f32's comparisons do.
    const __m512 clamped = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(clamped, _mm512_set1_ps(kLog2e), round), round);
    const __m512 r =
        _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), clamped));
    __m512 p = _mm512_set1_ps(kP0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    __m512 result = _mm512_scalef_ps(p, n);
    result = _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
    result = _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(__builtin_inff()));
    return _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // NaN stays NaN
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// e^x: the vectorizable f32 exp above, std::exp for f64.
template <typename T>
inline T exp_of(T x) {
    if constexpr (std::is_same_v<T, float>) {
        return exp_f32(x);
    } else {
        return std::exp(x);
    }
}

// tanh(x) for f32, vectorizable (both branches computed, one selected; glibc's tanhf is an opaque call
// per element): Cephes' tanhf. |x| < 0.625: its odd polynomial x + x^3 P(x^2); else
// 1 - 2 / (e^(2|x|) + 1) with x's sign, which is exactly +-1 once e^(2|x|) overflows to inf. Over every
// f32 input, within 1.33 ulp of the exact tanh and 2 ulp of glibc's tanhf (tests/test_ops_elementwise.cpp);
// NaN stays NaN. The tanh op (core/cpu/cpu_elementwise.cpp), DyT's and soft-capping's kernels
// (core/cpu/cpu_norms.cpp, cpu_softcap.cpp) and the attention's soft-capping (core/cpu/cpu_attention.cpp).
inline float tanh_f32(float x) {
    const float z = x * x;
    const float p = mul_add(mul_add(mul_add(mul_add(-5.70498872745e-3f, z, 2.06390887954e-2f), z, -5.37397155531e-2f), z,
                                    1.33314422036e-1f),
                            z, -3.33332819422e-1f);
    const float small = mul_add(p * z, x, x);
    const float ax = std::fabs(x);
    const float large = std::copysign(1.0f - 2.0f / (exp_f32(ax + ax) + 1.0f), x);
    return ax < 0.625f ? small : large;
}

// tanh(x): tanh_f32 above for f32, std::tanh for f64.
template <typename T>
inline T tanh_of(T x) {
    if constexpr (std::is_same_v<T, float>) {
        return tanh_f32(x);
    } else {
        return std::tanh(x);
    }
}

// Stable for large |x|: never evaluates exp of a large positive number. One exp of -|x| and a
// select instead of a branch on the sign, which mispredicts half the time on activations. The select
// picks the numerator (1 or e), so the vectorized loop divides once, not once for each side.
template <typename T>
inline T stable_sigmoid(T x) {
    const T e = exp_of(-std::abs(x));
    const T one_plus = T(1) + e;
    const T numerator = x >= T(0) ? T(1) : e;
    return numerator / one_plus;
}


#ifdef NL_CPU_MATH_X86
// AVX-512 helpers for the bf16 kernels, callable from code built for AVX-512 by -march or by a target
// attribute (the bf16 gemm's, in a portable build).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // GCC 12's headers trip these in the shifts (GCC bug 105593, as above)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// f32_to_bf16 (core/dtype.h) on 16 lanes, each lane's bf16 bits in its low half: add 0x7fff plus the
// lowest kept bit and truncate (round to nearest even); a NaN stays a quiet NaN. The one vector form
// of the rule, so a vector-rounded value has the scalar rule's bits.
__attribute__((target("avx512f"), always_inline)) inline __m512i f32x16_to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_blend_epi32(nan, rounded, quiet_nan);
}

// f32x16_to_bf16 narrowed to the 16 bf16 bit patterns as they are stored.
__attribute__((target("avx512f"), always_inline)) inline __m256i f32x16_to_bf16x16(__m512 v) {
    return _mm512_cvtepi32_epi16(f32x16_to_bf16(v));
}

// 16 bf16 bit patterns widened to f32, exactly: a bf16 is an f32's high half.
__attribute__((target("avx512f"), always_inline)) inline __m512 bf16x16_to_f32(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// A (16, 16) matrix of 32-bit words in 16 registers, transposed in place: rows[r][c] <- rows[c][r].
// Unpacks within 128-bit lanes make 4 x 4 transposes, then two rounds of lane shuffles move the blocks.
__attribute__((target("avx512f"), always_inline)) inline void transpose_16x16_words(__m512i rows[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; ++i) {
        a[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // b[4i + j], lane l: column 4l + j of rows 4i .. 4i + 3
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {  // column 4l + j gathers lane l of b[j], b[4 + j], b[8 + j], b[12 + j]
        const __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44), c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xEE);
        const __m512i c2 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44);
        const __m512i c3 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xEE);
        rows[j] = _mm512_shuffle_i32x4(c0, c2, 0x88);
        rows[4 + j] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
        rows[8 + j] = _mm512_shuffle_i32x4(c1, c3, 0x88);
        rows[12 + j] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace nl::cpu_math
