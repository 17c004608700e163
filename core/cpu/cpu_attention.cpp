// CPU kernels for fused causal attention (the formulas are in core/backend.h next to the declarations):
// FlashAttention's tiling on the CPU. A forward task is one (batch, head, tile of query rows), a
// backward task one (batch, kv head) with its group of query heads; tasks are independent, so OpenMP
// hands them out dynamically (causal tiles differ in cost, and a thread that loses its core to
// another process does not hold the others up) without changing a bit.
// References: Dao et al. 2022, "FlashAttention" (Algorithm 1: tiles and the online softmax); Dao 2023,
// "FlashAttention-2" (the backward from the saved logsumexp, delta = rowsum(dO * O)).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_math.h"
#include "core/cpu/cpu_prefetch.h"
#include "core/cpu/cpu_sgemm.h"
#include "core/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace nl {

namespace {

constexpr int64_t kKeyTile = 64;    // keys per inner tile, at most
constexpr int64_t kKeyStep = 16;    // a tile's width is a multiple of this (one AVX-512 vector of f32)
constexpr int64_t kRowBlock = 4;    // backward: query rows computed together (one packed column load serves four)
constexpr int64_t kRowChunk = 64;   // backward: query rows whose P and dS are kept (a multiple of kRowBlock)

// The accumulators of the backward's register tiles (rows_times_packed, rows_accumulate), in bytes:
// half the vector registers, so the values a tile loads and broadcasts fit beside them. AVX-512 has
// 32 of 64 B, AVX2 16 of 32 B; tiles sized for AVX-512 spill their accumulators to the stack on
// AVX2, so AVX2 gets smaller ones. A smaller tile makes more passes over a product's columns; each
// element's sum runs in the same order either way, so the bits do not depend on it. (The forward's
// 16 x 16 tiles are the same on both.)
#if defined(__AVX512F__)
constexpr int64_t kTileBytes = 16 * 64;
#else
constexpr int64_t kTileBytes = 8 * 32;
#endif
template <typename T>
constexpr int64_t kTileValues = kTileBytes / static_cast<int64_t>(sizeof(T));

// The columns a register tile of `cap` values per row takes of a product `width` columns wide: the
// widest that divides width, so every pass is whole (f64 on AVX-512: 24 of 48 with a cap of 32).
constexpr int64_t pass_columns(int64_t width, int64_t cap) {
    int64_t pass = std::min(width, cap);
    while (width % pass != 0) --pass;
    return pass;
}

// The width of a tile holding `count` keys: rounded up to whole vectors, so a short tile (a small T,
// the causal diagonal) does not compute the full kKeyTile columns.
inline int64_t tile_width(int64_t count) { return std::min(kKeyTile, (count + kKeyStep - 1) / kKeyStep * kKeyStep); }
constexpr double kParallelFlops = 1 << 18;  // below this much work one thread is faster

// The sizes of one call, and where row i of a head starts in each operand.
// The sizes (core/backend.h) with the index arithmetic the kernels use.
struct Dims : AttentionDims {
    int64_t group() const { return heads / kv_heads; }  // query heads per kv head
    int64_t offset() const { return kv_len - q_len; }   // query row i is at position offset + i
    int64_t q_row(int64_t b, int64_t i, int64_t h) const { return ((b * q_len + i) * heads + h) * head_dim; }
    int64_t kv_row(int64_t b, int64_t j, int64_t g) const { return ((b * kv_len + j) * kv_heads + g) * head_dim; }
    int64_t stat(int64_t b, int64_t h, int64_t i) const { return (b * heads + h) * q_len + i; }
    // The keys query row i sees: [0, visible(i)).
    int64_t visible(int64_t i) const { return std::min(kv_len, offset() + i + 1); }
    double work() const {
        return static_cast<double>(batch * heads) * static_cast<double>(q_len) * static_cast<double>(kv_len) *
               static_cast<double>(head_dim);
    }
};

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
    return s;
}

// n values from src to dst, and n zeros at dst: 64 bytes at a time with a size the compiler knows,
// so a head row (128 bytes at head size 32) is a few vector moves rather than a C library call (a
// backward task makes a few hundred of these).
template <typename T>
inline void copy_values(T* dst, const T* src, int64_t n) {
    constexpr int64_t kPiece = 64 / static_cast<int64_t>(sizeof(T));
    int64_t i = 0;
    for (; i + kPiece <= n; i += kPiece) std::memcpy(dst + i, src + i, 64);
    for (; i < n; ++i) dst[i] = src[i];
}

template <typename T>
inline void zero_values(T* dst, int64_t n) {
    constexpr int64_t kPiece = 64 / static_cast<int64_t>(sizeof(T));
    int64_t i = 0;
    for (; i + kPiece <= n; i += kPiece) std::memset(dst + i, 0, 64);
    for (; i < n; ++i) dst[i] = T(0);
}

using cpu_math::exp_of;  // the vectorizable exp for f32; std::exp for f64 (gradient checks)

// rows (<= width) rows of hd values, ld apart, transposed into dst (hd, width) with zero columns
// past rows.
template <typename T>
void transpose_rows(const T* src, int64_t ld, int64_t rows, int64_t hd, T* dst, int64_t width) {
    std::fill(dst, dst + hd * width, T(0));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < hd; ++d) dst[d * width + r] = src[r * ld + d];
}

// f32: the gemm engine's block transpose (16 x 16 AVX-512 shuffles instead of the scalar moves above).
void transpose_rows(const float* src, int64_t ld, int64_t rows, int64_t hd, float* dst, int64_t width) {
    transpose_pad_f32(src, ld, rows, hd, dst, width, width);
}

// Keys [j0, j0 + count) of kv head g, transposed into packed (head_dim, width) with zero columns
// past count (width = tile_width(count)), so a row of scores is one loop over contiguous keys that
// vectorizes without horizontal sums.
template <typename T>
void pack_transposed(const Dims& s, const T* src, int64_t b, int64_t j0, int64_t count, int64_t g, T* packed) {
    transpose_rows(src + s.kv_row(b, j0, g), s.kv_heads * s.head_dim, count, s.head_dim, packed, tile_width(count));
}

#if defined(__AVX512F__) && defined(__FMA__)
// The backward's two products below for f32 on AVX-512 (V vectors of 16 columns a row): the same
// multiply-adds in the same order, so the same bits. Written out because the compiler, left to the
// loops, folds the load of a shared vector into each of the four rows' multiply-adds: four loads of it
// where one serves. On one Zen 4 core the backward went from 58 to 77 GFLOP/s this way
// (docs/benchmarks.md).

// 16 floats from p, kept in a register: the empty asm stops the compiler from folding the load
// back into every multiply-add that reads it.
inline __m512 load_kept(const float* p) {
    __m512 v = _mm512_loadu_ps(p);
    __asm__("" : "+v"(v));
    return v;
}

// acc[r][v] += scalar(r, i) * (vector v at row(i)) for each step i in order, one multiply-add each:
// scalar(r, i) is row r's multiplier at step i, row(i) where step i's V vectors start.
template <int V, typename Scalar, typename Row>
inline void four_rows_times_vectors(__m512 (&acc)[kRowBlock][V], int64_t steps, Scalar scalar, Row row) {
    for (int64_t i = 0; i < steps; ++i) {
        const float* x = row(i);
        __m512 xv[V];
        for (int v = 0; v < V; ++v) xv[v] = load_kept(x + 16 * v);
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const __m512 s = _mm512_set1_ps(scalar(r, i));
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(s, xv[v], acc[r][v]);
        }
    }
}
#endif

// out[r][c] = sum_d a[r][d] * packed[d][c] for kRowBlock rows and the first `width` columns of a
// packed tile whose rows are `stride` apart, summed over d in order: every pass computes a score (or
// dp) the same way, whatever block a row is in and however many columns it takes, and the same way
// as the forward's keys_times_rows, so the backward's scores are the forward's. The width is a compile-time constant inside (16, 32, 48 or 64),
// so the block's accumulators stay in vector registers and each packed column loaded serves four
// rows. A block of fewer rows passes a row of zeros for the rest.
template <int64_t Width, typename T>
inline void rows_times_packed_fixed(const T* const a[kRowBlock], const T* packed, int64_t stride, int64_t hd,
                                    T (*out)[kKeyTile]) {
    constexpr int64_t Pass = pass_columns(Width, kTileValues<T> / kRowBlock);  // columns per register tile
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float> && Pass % 16 == 0) {
        constexpr int V = static_cast<int>(Pass / 16);
        for (int64_t c0 = 0; c0 < Width; c0 += Pass) {
            __m512 acc[kRowBlock][V];
            for (auto& row : acc)
                for (__m512& v : row) v = _mm512_setzero_ps();
            four_rows_times_vectors<V>(acc, hd, [&](int64_t r, int64_t d) { return a[r][d]; },
                                       [&](int64_t d) { return packed + d * stride + c0; });
            for (int64_t r = 0; r < kRowBlock; ++r)
                for (int v = 0; v < V; ++v) _mm512_storeu_ps(out[r] + c0 + 16 * v, acc[r][v]);
        }
        return;
    }
#endif
    for (int64_t c0 = 0; c0 < Width; c0 += Pass) {
        T acc[kRowBlock][Pass] = {};
        for (int64_t d = 0; d < hd; ++d) {
            const T* col = packed + d * stride + c0;
            for (int64_t r = 0; r < kRowBlock; ++r) {
                const T ad = a[r][d];
#pragma omp simd
                for (int64_t c = 0; c < Pass; ++c) acc[r][c] = cpu_math::mul_add(ad, col[c], acc[r][c]);
            }
        }
        for (int64_t r = 0; r < kRowBlock; ++r) std::copy_n(acc[r], Pass, out[r] + c0);
    }
}

// Calls fn(std::integral_constant<int64_t, W>{}) for a tile width W (16, 32, 48 or 64) given at run time:
// the one place the widths are listed, so each per-tile loop gets a compile-time trip count.
template <typename Fn>
inline void with_tile_width(int64_t width, Fn&& fn) {
    static_assert(kKeyTile == 4 * kKeyStep, "one case per tile width");
    switch (width) {
        case kKeyStep: return fn(std::integral_constant<int64_t, kKeyStep>{});
        case 2 * kKeyStep: return fn(std::integral_constant<int64_t, 2 * kKeyStep>{});
        case 3 * kKeyStep: return fn(std::integral_constant<int64_t, 3 * kKeyStep>{});
        default: return fn(std::integral_constant<int64_t, kKeyTile>{});
    }
}

template <typename T>
inline void rows_times_packed(const T* const a[kRowBlock], const T* packed, int64_t stride, int64_t hd, int64_t width,
                              T (*out)[kKeyTile]) {
    with_tile_width(width, [&](auto w) { rows_times_packed_fixed<decltype(w)::value>(a, packed, stride, hd, out); });
}

// x[c] = exp(x[c] - shift) for Width values (a multiple of kKeyStep): 16 lanes at a time on AVX-512
// (cpu_math::exp_f32x16, the same bits as exp_of), else the compiler's vectorization of exp_of.
template <int64_t Width, typename T>
inline void exp_shifted(T* x, T shift) {
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float>) {
        const __m512 s = _mm512_set1_ps(shift);
        for (int64_t c = 0; c < Width; c += kKeyStep)
            _mm512_storeu_ps(x + c, cpu_math::exp_f32x16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s)));
        return;
    }
#endif
#pragma omp simd
    for (int64_t c = 0; c < Width; ++c) x[c] = exp_of(x[c] - shift);
}

// A soft-capped score (Gemma 2): cap * tanh(x / cap) of the scaled score x, and tanh's derivative
// 1 - tanh^2 through `slope`. One expression for the forward and the backward, so the backward's
// recomputed scores are the forward's bits.
template <typename T>
inline T soft_cap(T x, T cap, T inv_cap, T& slope) {
    const T t = cpu_math::tanh_of(x * inv_cap);
    slope = T(1) - t * t;
    return cap * t;
}

// p and ds of the keys [Width, kKeyTile) of a tile row, which no row of the block sees: zero. A size
// known at compile time, so the zeros are a few vector stores; a loop over a run-time count becomes a
// memset call, around which the backward's live vector registers were all saved and reloaded.
template <int64_t Width, typename T>
inline void zero_past_width(T* p, T* ds) {
    if constexpr (Width < kKeyTile) {
        std::memset(p + Width, 0, (kKeyTile - Width) * sizeof(T));
        std::memset(ds + Width, 0, (kKeyTile - Width) * sizeof(T));
    }
}

// The backward's p = exp(scale * s - lse) (0 past n) and ds = p * (dp - delta) * scale of one row of
// a tile: `p` holds the scores s and `ds` the products dp = dout . v on entry. (ds carries the scale
// that dq and dk take.) With softcap = cap > 0 the score is cap * tanh(scale * s / cap) and ds also
// carries tanh's derivative; cap = 0 takes the plain loops. p and ds are rows of kKeyTile values:
// past Width they are zeroed.
template <int64_t Width, typename T>
inline void gradient_tile_row_fixed(T* p, T* ds, int64_t n, T scale, T lse, T delta, T softcap) {
    zero_past_width<Width>(p, ds);
    if (softcap > T(0)) {
        const T inv_cap = T(1) / softcap;
        T slope[Width];  // (Width): d capped / d scaled score, times scale
#pragma omp simd
        for (int64_t c = 0; c < Width; ++c) {
            T d = T(0);
            p[c] = c < n ? soft_cap(p[c] * scale, softcap, inv_cap, d) : -std::numeric_limits<T>::infinity();
            slope[c] = d * scale;
        }
        exp_shifted<Width>(p, lse);
#pragma omp simd
        for (int64_t c = 0; c < Width; ++c) ds[c] = p[c] * (ds[c] - delta) * slope[c];
        return;
    }
#pragma omp simd
    for (int64_t c = 0; c < Width; ++c) p[c] = c < n ? p[c] * scale : -std::numeric_limits<T>::infinity();
    exp_shifted<Width>(p, lse);  // exp(scale * s - lse); the masked keys' -inf gives 0
#pragma omp simd
    for (int64_t c = 0; c < Width; ++c) ds[c] = p[c] * (ds[c] - delta) * scale;
}

template <typename T>
inline void gradient_tile_row(int64_t width, T* p, T* ds, int64_t n, T scale, T lse, T delta, T softcap) {
    with_tile_width(width, [&](auto w) {
        gradient_tile_row_fixed<decltype(w)::value>(p, ds, n, scale, lse, delta, softcap);
    });
}

// y[r] = y[r] * y_scale[r] (when given) + sum_{c < count} w[r][c] * x[c] for kRowBlock rows, where x[c]
// is the row at x + c * x_stride and w[r][c] is at w + r * w_rs + c * w_cs (so P^T is P read the
// other way, not a copy): the products P V, dS K, P^T dO and dS^T Q, each a small gemm over the tile. The y rows are summed in registers over the whole count,
// a chunk of columns at a time (Chunk a compile-time width: 4, 2 or 1 vectors), and in order of c.
template <int64_t Chunk, typename T>
inline void rows_accumulate_fixed(const T* w, int64_t w_rs, int64_t w_cs, int64_t count, const T* x,
                                  int64_t x_stride, T* const y[kRowBlock], const T* y_scale, int64_t d0) {
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float> && Chunk % 16 == 0) {
        constexpr int V = static_cast<int>(Chunk / 16);
        __m512 acc[kRowBlock][V];
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const __m512 f = _mm512_set1_ps(y_scale != nullptr ? y_scale[r] : 1.0f);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(y[r] + d0 + 16 * v), f);
        }
        four_rows_times_vectors<V>(acc, count, [&](int64_t r, int64_t c) { return w[r * w_rs + c * w_cs]; },
                                   [&](int64_t c) { return x + c * x_stride + d0; });
        for (int64_t r = 0; r < kRowBlock; ++r)
            for (int v = 0; v < V; ++v) _mm512_storeu_ps(y[r] + d0 + 16 * v, acc[r][v]);
        return;
    }
#endif
    T acc[kRowBlock][Chunk];
    for (int64_t r = 0; r < kRowBlock; ++r) {
        const T f = y_scale != nullptr ? y_scale[r] : T(1);
#pragma omp simd
        for (int64_t d = 0; d < Chunk; ++d) acc[r][d] = y[r][d0 + d] * f;
    }
    for (int64_t c = 0; c < count; ++c) {
        const T* xc = x + c * x_stride + d0;
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const T wr = w[r * w_rs + c * w_cs];
#pragma omp simd
            for (int64_t d = 0; d < Chunk; ++d) acc[r][d] = cpu_math::mul_add(wr, xc[d], acc[r][d]);
        }
    }
    for (int64_t r = 0; r < kRowBlock; ++r) std::copy_n(acc[r], Chunk, y[r] + d0);
}

template <typename T>
inline void rows_accumulate(const T* w, int64_t w_rs, int64_t w_cs, int64_t count, const T* x, int64_t x_stride,
                            T* const y[kRowBlock], const T* y_scale, int64_t hd) {
    constexpr int64_t kChunk = kTileValues<T> / kRowBlock;  // the widest chunk: a whole register tile
    int64_t d0 = 0;
    for (; d0 + kChunk <= hd; d0 += kChunk) rows_accumulate_fixed<kChunk>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
    if (d0 + kChunk / 2 <= hd) {
        rows_accumulate_fixed<kChunk / 2>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
        d0 += kChunk / 2;
    }
    if (d0 + kChunk / 4 <= hd) {
        rows_accumulate_fixed<kChunk / 4>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
        d0 += kChunk / 4;
    }
    for (; d0 < hd; ++d0) rows_accumulate_fixed<1>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
}

// ---- forward ----
// A task is kLanes query rows of one head. Its scores are kept transposed, S^T (keys, kLanes), so
// that each query row is one vector lane: the online softmax's max, rescale and sum run down the
// key rows as vector operations (no horizontal reductions, one vector exp for all the rows'
// rescales), and the three products are register tiles in which each value loaded from memory
// feeds one FMA per vector (the gemm engine's 16 x 16 tile: broadcasts fold into the FMAs).

constexpr int64_t kLanes = 16;  // query rows per task, one per vector lane (16 f32 lanes of AVX-512)

// st[c][r] = sum_d keys_t[d][c] * q_t[d][r] for a group of kKeyStep keys (packed (hd, kKeyStep)) and
// kLanes rows (packed (hd, kLanes)), summed over d in order: the scores of the fused backward's
// rows_times_packed, bit for bit (the same products in the same order).
template <typename T>
inline void keys_times_rows(const T* keys_t, const T* q_t, int64_t hd, T (*st)[kLanes]) {
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float> && kLanes == 16) {  // the loops below in registers: the same bits
        __m512 acc[kKeyStep];
        for (__m512& a : acc) a = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; ++d) {
            const __m512 qd = _mm512_loadu_ps(q_t + d * kLanes);
            for (int64_t c = 0; c < kKeyStep; ++c) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(keys_t[d * kKeyStep + c]), qd, acc[c]);
        }
#pragma GCC unroll 16  // unrolled before GCC can make the stores one memcpy from acc kept on the stack
        for (int64_t c = 0; c < kKeyStep; ++c) _mm512_storeu_ps(st[c], acc[c]);
        return;
    }
#endif
    T acc[kKeyStep][kLanes] = {};
    for (int64_t d = 0; d < hd; ++d) {
        const T* kd = keys_t + d * kKeyStep;
        const T* qd = q_t + d * kLanes;
        for (int64_t c = 0; c < kKeyStep; ++c) {
            const T kc = kd[c];
#pragma omp simd
            for (int64_t r = 0; r < kLanes; ++r) acc[c][r] = cpu_math::mul_add(kc, qd[r], acc[c][r]);
        }
    }
    for (int64_t c = 0; c < kKeyStep; ++c) std::copy_n(acc[c], kLanes, st[c]);
}

// x[r] = exp(x[r] - shift[r]) on kLanes lanes (cpu_math::exp_f32x16 on AVX-512: exp_of's bits).
template <typename T>
inline void exp_lanes(T* x, const T* shift) {
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float> && kLanes == 16) {
        _mm512_storeu_ps(x, cpu_math::exp_f32x16(_mm512_sub_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(shift))));
        return;
    }
#endif
#pragma omp simd
    for (int64_t r = 0; r < kLanes; ++r) x[r] = exp_of(x[r] - shift[r]);
}

// acc_t[d0 + e][r] = acc_t[d0 + e][r] * rescale[r] + sum_{c < count} v[c][d0 + e] * p_t[c][r] for
// e < Chunk: Chunk columns of the output, transposed (hd, kLanes), over the tile's keys in order
// (v row c at v + c * v_stride). Each value of V feeds one FMA.
template <int64_t Chunk, typename T>
inline void values_times_probabilities_fixed(const T (*p_t)[kLanes], int64_t count, const T* v, int64_t v_stride,
                                             const T* rescale, int64_t d0, T* acc_t) {
#if defined(__AVX512F__) && defined(__FMA__)
    // The loops below with the sums in registers and stored to acc_t from them: left to the loops, GCC
    // kept them in a stack array and copied that to acc_t with a memcpy call. The same bits.
    if constexpr (std::is_same_v<T, float> && kLanes == 16) {
        const __m512 scale = _mm512_loadu_ps(rescale);
        __m512 acc[Chunk];
        for (int64_t e = 0; e < Chunk; ++e) acc[e] = _mm512_mul_ps(_mm512_loadu_ps(acc_t + (d0 + e) * kLanes), scale);
        for (int64_t c = 0; c < count; ++c) {
            const T* vc = v + c * v_stride + d0;
            const __m512 pc = _mm512_loadu_ps(p_t[c]);
            for (int64_t e = 0; e < Chunk; ++e) acc[e] = _mm512_fmadd_ps(_mm512_set1_ps(vc[e]), pc, acc[e]);
        }
#pragma GCC unroll 16  // as in keys_times_rows
        for (int64_t e = 0; e < Chunk; ++e) _mm512_storeu_ps(acc_t + (d0 + e) * kLanes, acc[e]);
        return;
    }
#endif
    T acc[Chunk][kLanes];
    for (int64_t e = 0; e < Chunk; ++e) {
#pragma omp simd
        for (int64_t r = 0; r < kLanes; ++r) acc[e][r] = acc_t[(d0 + e) * kLanes + r] * rescale[r];
    }
    for (int64_t c = 0; c < count; ++c) {
        const T* vc = v + c * v_stride + d0;
        const T* pc = p_t[c];
        for (int64_t e = 0; e < Chunk; ++e) {
            const T ve = vc[e];
#pragma omp simd
            for (int64_t r = 0; r < kLanes; ++r) acc[e][r] = cpu_math::mul_add(ve, pc[r], acc[e][r]);
        }
    }
    for (int64_t e = 0; e < Chunk; ++e) std::copy_n(acc[e], kLanes, acc_t + (d0 + e) * kLanes);
}

// All hd columns: chunks of 16, then 8, 4, 2 and 1 for a head size that is not a multiple of 16.
template <typename T>
inline void values_times_probabilities(const T (*p_t)[kLanes], int64_t count, const T* v, int64_t v_stride,
                                       const T* rescale, int64_t hd, T* acc_t) {
    int64_t d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) values_times_probabilities_fixed<16>(p_t, count, v, v_stride, rescale, d0, acc_t);
    if (d0 + 8 <= hd) values_times_probabilities_fixed<8>(p_t, count, v, v_stride, rescale, d0, acc_t), d0 += 8;
    if (d0 + 4 <= hd) values_times_probabilities_fixed<4>(p_t, count, v, v_stride, rescale, d0, acc_t), d0 += 4;
    if (d0 + 2 <= hd) values_times_probabilities_fixed<2>(p_t, count, v, v_stride, rescale, d0, acc_t), d0 += 2;
    if (d0 < hd) values_times_probabilities_fixed<1>(p_t, count, v, v_stride, rescale, d0, acc_t);
}

// Rows [i0, i0 + rows) of head h, transposed into q_t (hd, kLanes), zero lanes past rows.
template <typename T>
void pack_query_rows(const Dims& s, const T* q, int64_t b, int64_t i0, int64_t rows, int64_t h, T* q_t) {
    transpose_rows(q + s.q_row(b, i0, h), s.heads * s.head_dim, rows, s.head_dim, q_t, kLanes);
}

// The forward's operands (core/backend.h): q, out (batch, q_len, heads, hd); k, v (batch, kv_len,
// kv_heads, hd); lse (batch, heads, q_len).
template <typename T>
struct ForwardOperands {
    const T *q, *k, *v;
    T *out, *lse;
    T scale;
    T softcap;  // 0: off
};

// One thread's buffers and running state for its forward tasks.
template <typename T>
struct ForwardBuffers {
    ForwardBuffers(int64_t hd, int64_t key_groups)
        : q_t(static_cast<size_t>(hd * kLanes)), acc_t(static_cast<size_t>(hd * kLanes)),
          head_keys_t(static_cast<size_t>(key_groups * hd * kKeyStep)),
          head_values(static_cast<size_t>(key_groups * hd * kKeyStep)) {}
    std::vector<T> q_t;    // (hd, kLanes): the task's query rows
    std::vector<T> acc_t;  // (hd, kLanes): unnormalized output, transposed
    // The keys of one (batch, kv head), transposed in groups of kKeyStep: (key_groups, hd, kKeyStep),
    // and its values, contiguous: (key_groups * kKeyStep, hd) (in place, a value row is a stride
    // of kv_heads * hd away from the next, and the products waited on those loads). A thread's
    // tasks come mostly in order, the query tiles of one head after another, so it packs a head's
    // groups once as they are first needed instead of once per task. The contents are copies of
    // K and V, the same whichever thread packs them: the bits do not depend on the schedule.
    std::vector<T> head_keys_t;  // (key_groups, hd, kKeyStep)
    std::vector<T> head_values;  // (key_groups * kKeyStep, hd)
    int64_t packed_head = -1, packed_groups = 0;  // groups [0, packed_groups) of packed_head are packed
    T st[kKeyTile][kLanes];                       // (keys of a tile, kLanes): scores, then probabilities
    T row_max[kLanes], row_sum[kLanes], visible[kLanes];  // (kLanes) each: a task's running max and sum, keys seen
    T tile_max[kLanes], rescale[kLanes], sum[kLanes];     // (kLanes) each: one key tile's
};

// Packs the groups of kv head g of batch b up to `group` that are not packed yet: keys into
// head_keys_t, values into head_values.
template <typename T>
void pack_key_groups(const Dims& s, const ForwardOperands<T>& o, int64_t b, int64_t g, int64_t group,
                     ForwardBuffers<T>& f) {
    const int64_t hd = s.head_dim, group_floats = hd * kKeyStep;
    for (; f.packed_groups <= group; ++f.packed_groups) {
        const int64_t p0 = f.packed_groups * kKeyStep;
        const int64_t group_keys = std::min(kKeyStep, s.kv_len - p0);
        pack_transposed(s, o.k, b, p0, group_keys, g, f.head_keys_t.data() + f.packed_groups * group_floats);
        for (int64_t c = 0; c < group_keys; ++c)
            copy_values(f.head_values.data() + (p0 + c) * hd, o.v + s.kv_row(b, p0 + c, g), hd);
    }
}

// The rows the head's next query tile packs first: its kLanes query rows, and the group of kKeyStep
// keys and values after the ones this tile packs, asked for a share per key group of this tile while
// it computes (cpu_prefetch::RowLines). A thread takes a head's tiles in order, so its next task is
// mostly that tile; otherwise the requests cost a few instructions and nothing else.
struct NextTaskRows {
    cpu_prefetch::RowLines q, k, v;
    void share() {
        q.share();
        k.share();
        v.share();
    }
};

// For the query tile of head h (kv head g) that starts at next_row, after one that sees `keys` keys;
// q, k, v as the forward's operands (E: their element, f32 or bf16 bits).
template <typename E>
NextTaskRows next_task_rows(const Dims& s, const E* q, const E* k, const E* v, int64_t b, int64_t h, int64_t g,
                            int64_t next_row, int64_t keys) {
    NextTaskRows next;
    const int64_t row_bytes = s.head_dim * static_cast<int64_t>(sizeof(E)), shares = (keys + kKeyStep - 1) / kKeyStep;
    if (next_row < s.q_len)
        next.q = cpu_prefetch::RowLines(q + s.q_row(b, next_row, h), s.heads * row_bytes,
                                        std::min(kLanes, s.q_len - next_row), row_bytes, shares);
    const int64_t next_key = (keys + kKeyStep - 1) / kKeyStep * kKeyStep;  // the first group not packed yet
    if (next_key < s.kv_len) {
        const int64_t count = std::min(kKeyStep, s.kv_len - next_key);
        next.k = cpu_prefetch::RowLines(k + s.kv_row(b, next_key, g), s.kv_heads * row_bytes, count, row_bytes, shares);
        next.v = cpu_prefetch::RowLines(v + s.kv_row(b, next_key, g), s.kv_heads * row_bytes, count, row_bytes, shares);
    }
    return next;
}

// S^T of the task's query rows (q_t) and keys [j0, j0 + count) of kv head g into st, for the tile's
// groups of kKeyStep keys (a group past count is not computed), packing groups as they are needed.
template <typename T>
void tile_scores(const Dims& s, const ForwardOperands<T>& o, int64_t b, int64_t g, int64_t j0, int64_t count,
                 ForwardBuffers<T>& f, NextTaskRows& next) {
    const int64_t hd = s.head_dim, group_floats = hd * kKeyStep;
    for (int64_t c0 = 0; c0 < count; c0 += kKeyStep) {
        const int64_t group = (j0 + c0) / kKeyStep;
        next.share();
        pack_key_groups(s, o, b, g, group, f);
        keys_times_rows(f.head_keys_t.data() + group * group_floats, f.q_t.data(), hd, f.st + c0);
    }
}

// online_softmax_tile's max and probabilities for f32 on AVX-512: its loops below with the running
// max and sum in registers, where the compiler keeps f.tile_max and f.sum in memory across keys and
// each key waits on the last one's store. The same operations in the same order: the same bits.
// Leaves f.st, f.tile_max, f.rescale and f.sum as those loops do.
#if defined(__AVX512F__) && defined(__FMA__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // GCC 12's headers trip these in _mm512_max_ps (GCC bug 105593)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
inline void tile_max_and_probabilities_f32x16(ForwardBuffers<float>& f, int64_t j0, int64_t count, float scale) {
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const __m512 visible = _mm512_loadu_ps(f.visible), scale16 = _mm512_set1_ps(scale);
    __m512 tile_max = neg_inf;
    for (int64_t c = 0; c < count; ++c) {
        const __mmask16 sees = _mm512_cmp_ps_mask(_mm512_set1_ps(static_cast<float>(j0 + c)), visible, _CMP_LT_OQ);
        const __m512 x = _mm512_mask_mul_ps(neg_inf, sees, _mm512_loadu_ps(f.st[c]), scale16);
        _mm512_storeu_ps(f.st[c], x);
        tile_max = _mm512_max_ps(x, tile_max);  // x > max ? x : max, as below (a NaN x keeps max)
    }
    tile_max = _mm512_max_ps(tile_max, _mm512_loadu_ps(f.row_max));
    _mm512_storeu_ps(f.tile_max, tile_max);
    std::copy_n(f.row_max, kLanes, f.rescale);
    exp_lanes(f.rescale, f.tile_max);  // exp(row_max - new max)
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < count; ++c) {
        const __m512 p = cpu_math::exp_f32x16(_mm512_sub_ps(_mm512_loadu_ps(f.st[c]), tile_max));
        _mm512_storeu_ps(f.st[c], p);
        sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(f.sum, sum);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// The online softmax over keys [j0, j0 + count), each lane its own row (Dao et al. 2022, Algorithm
// 1): the scaled scores (soft-capped when softcap > 0), -inf where a row does not see the key; the
// new running max; the rescale of the earlier sums (0 on the first tile, where row_max is -inf; 1 for
// a row that sees no key here); the probabilities exp(scaled - max) (into st) and their sum.
template <typename T>
void online_softmax_tile(ForwardBuffers<T>& f, int64_t j0, int64_t count, T scale, T softcap) {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    if (softcap > T(0)) {
        // Capped in place, so the mask below multiplies by 1 (exact); off, the scores are as before.
        const T inv_cap = T(1) / softcap;
        T slope = T(0);  // unused here
        for (int64_t c = 0; c < count; ++c) {
#pragma omp simd
            for (int64_t r = 0; r < kLanes; ++r) f.st[c][r] = soft_cap(f.st[c][r] * scale, softcap, inv_cap, slope);
        }
        scale = T(1);
    }
#if defined(__AVX512F__) && defined(__FMA__)
    if constexpr (std::is_same_v<T, float> && kLanes == 16) {
        tile_max_and_probabilities_f32x16(f, j0, count, scale);
    } else
#endif
    {
        std::fill(f.tile_max, f.tile_max + kLanes, kNegInf);
        for (int64_t c = 0; c < count; ++c) {
            const T key = static_cast<T>(j0 + c);
#pragma omp simd
            for (int64_t r = 0; r < kLanes; ++r) {
                const T x = key < f.visible[r] ? f.st[c][r] * scale : kNegInf;
                f.st[c][r] = x;
                f.tile_max[r] = x > f.tile_max[r] ? x : f.tile_max[r];
            }
        }
#pragma omp simd
        for (int64_t r = 0; r < kLanes; ++r) f.tile_max[r] = f.tile_max[r] > f.row_max[r] ? f.tile_max[r] : f.row_max[r];
        std::copy_n(f.row_max, kLanes, f.rescale);
        exp_lanes(f.rescale, f.tile_max);  // exp(row_max - new max)
        std::fill(f.sum, f.sum + kLanes, T(0));
        for (int64_t c = 0; c < count; ++c) {
            exp_lanes(f.st[c], f.tile_max);  // the masked keys' -inf gives 0
#pragma omp simd
            for (int64_t r = 0; r < kLanes; ++r) f.sum[r] += f.st[c][r];
        }
    }
#pragma omp simd
    for (int64_t r = 0; r < kLanes; ++r) {
        f.row_sum[r] = f.row_sum[r] * f.rescale[r] + f.sum[r];
        f.row_max[r] = f.tile_max[r];
    }
}

// out[r] = acc[r] / row_sum[r] and lse[r] = row_max[r] + log(row_sum[r]) for the task's rows: the
// output rows from acc_t (hd, kLanes), transposed back.
template <typename T>
void write_output_rows(const Dims& s, const ForwardOperands<T>& o, int64_t b, int64_t h, int64_t i0, int64_t rows,
                       const ForwardBuffers<T>& f) {
    const int64_t hd = s.head_dim;
    int64_t d0 = 0;  // columns [0, d0) written by the vector blocks
#if defined(__AVX512F__) && defined(__FMA__)
    // 16 columns of every lane's row at a time, scaled in their lanes and transposed to rows in
    // registers (the loop below reads acc_t down its columns, one scalar at a time): the same
    // product per value, so the same bits.
    if constexpr (std::is_same_v<T, float> && kLanes == 16) {
        const __m512 inv16 = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(f.row_sum));
        for (; d0 + 16 <= hd; d0 += 16) {
            __m512i columns[16];  // columns[e]: lane r holds out[r][d0 + e]; then rows[r]: out[r][d0, d0 + 16)
            for (int64_t e = 0; e < 16; ++e)
                columns[e] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(f.acc_t.data() + (d0 + e) * kLanes), inv16));
            cpu_math::transpose_16x16_words(columns);
            for (int64_t r = 0; r < rows; ++r)
                _mm512_storeu_ps(o.out + s.q_row(b, i0 + r, h) + d0, _mm512_castsi512_ps(columns[r]));
        }
    }
#endif
    for (int64_t r = 0; r < rows; ++r) {
        const T inv = T(1) / f.row_sum[r];
        T* out = o.out + s.q_row(b, i0 + r, h);
        for (int64_t d = d0; d < hd; ++d) out[d] = f.acc_t[d * kLanes + r] * inv;
        o.lse[s.stat(b, h, i0 + r)] = f.row_max[r] + std::log(f.row_sum[r]);
    }
}

// One task: query tile `tile` (kLanes rows from i0) of head h of batch b, over the keys its rows see
// a key tile at a time; then its output rows and their logsumexps.
template <typename T>
void forward_task(const Dims& s, const ForwardOperands<T>& o, int64_t task, int64_t tiles, ForwardBuffers<T>& f) {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const int64_t hd = s.head_dim;
    const int64_t tile = task % tiles, h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
    const int64_t g = h / s.group();
    const int64_t i0 = tile * kLanes, rows = std::min(kLanes, s.q_len - i0);
    pack_query_rows(s, o.q, b, i0, rows, h, f.q_t.data());
    std::fill(f.acc_t.begin(), f.acc_t.end(), T(0));
    std::fill(f.row_max, f.row_max + kLanes, kNegInf);
    std::fill(f.row_sum, f.row_sum + kLanes, T(0));
    // The keys each lane sees; a padding lane (past rows) sees all, so that its all-zero
    // scores stay finite (its results are not written).
    for (int64_t r = 0; r < kLanes; ++r) f.visible[r] = static_cast<T>(r < rows ? s.visible(i0 + r) : s.kv_len);
    const int64_t keys = s.visible(i0 + rows - 1);  // the tile's last row sees the most keys
    if (f.packed_head != b * s.kv_heads + g) {
        f.packed_head = b * s.kv_heads + g;
        f.packed_groups = 0;
    }
    NextTaskRows next = next_task_rows(s, o.q, o.k, o.v, b, h, g, i0 + rows, keys);
    for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
        const int64_t count = std::min(kKeyTile, keys - j0);  // keys of the tile some row sees
        tile_scores(s, o, b, g, j0, count, f, next);
        online_softmax_tile(f, j0, count, o.scale, o.softcap);
        // acc = acc * rescale + P V over the tile's keys.
        values_times_probabilities(f.st, count, f.head_values.data() + j0 * hd, hd, f.rescale, hd, f.acc_t.data());
    }
    write_output_rows(s, o, b, h, i0, rows, f);
}

// The forward: one task per (batch, head, tile of kLanes query rows), the tasks shared out among
// the threads, each with its own buffers.
template <typename T>
void forward_impl(const Dims& s, const T* q, const T* k, const T* v, T* out, T* lse, T scale, T softcap) {
    const ForwardOperands<T> o{q, k, v, out, lse, scale, softcap};
    const int64_t tiles = (s.q_len + kLanes - 1) / kLanes;
    const int64_t tasks = s.batch * s.heads * tiles;
    const int64_t key_groups = (s.kv_len + kKeyStep - 1) / kKeyStep;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        ForwardBuffers<T> buffers(s.head_dim, key_groups);
        // A thread takes a head's query tiles together where there are heads enough to share out
        // (four per thread or more): handed out one by one, consecutive tiles went to alternate
        // threads and each packed most of every head's keys (at T 64, four tiles a head, 1.75 times
        // over). With few heads, tile by tile, so every thread has work.
        const int64_t chunk = s.batch * s.heads >= 4 * omp_get_num_threads() ? tiles : 1;
#pragma omp for schedule(dynamic, chunk)
        for (int64_t task = 0; task < tasks; ++task) forward_task(s, o, task, tiles, buffers);
    }
}

// ---- backward ----
// (Dao 2023, Algorithm 2, with the outer loop over key tiles; the dq sums stay in the task.)

// p and ds of a block of query rows i0.. (rows of them, n[r] keys of the packed tile each; 0 past n
// up to the tile's width `stride`; padding rows get 0). Only the first `width` columns (the keys the
// block's last row sees, in whole vectors) are computed: on the causal diagonal that is half the tile.
template <typename T>
inline void probabilities(const Dims& s, const T* q, const T* dout, const T* lse, const T* delta, const T* keys_t,
                          const T* values_t, int64_t stride, int64_t width, int64_t b, int64_t h, int64_t i0,
                          int64_t rows, const int64_t* n, T scale, T softcap, const T* zero_row,
                          T (*p)[kKeyTile], T (*ds)[kKeyTile]) {
    const int64_t hd = s.head_dim;
    const T* q_rows[kRowBlock];
    const T* dout_rows[kRowBlock];
    for (int64_t r = 0; r < kRowBlock; ++r) {
        q_rows[r] = r < rows ? q + s.q_row(b, i0 + r, h) : zero_row;
        dout_rows[r] = r < rows ? dout + s.q_row(b, i0 + r, h) : zero_row;
    }
    rows_times_packed(q_rows, keys_t, stride, hd, width, p);
    rows_times_packed(dout_rows, values_t, stride, hd, width, ds);
    for (int64_t r = 0; r < kRowBlock; ++r) {
        const int64_t nr = r < rows ? n[r] : 0;
        const T l = r < rows ? lse[s.stat(b, h, i0 + r)] : T(0), di = r < rows ? delta[s.stat(b, h, i0 + r)] : T(0);
        // The keys past n get -inf, so their probability is exp(-inf) = 0.
        gradient_tile_row(width, p[r], ds[r], nr, scale, l, di, softcap);  // zeros past width
    }
}

// delta_i = dout_i . out_i, one per query row and head: delta (batch, heads, q_len).
template <typename T>
void row_deltas(const Dims& s, const T* out, const T* dout, T* delta, bool parallel) {
    const int64_t hd = s.head_dim;
    const int64_t rows = s.batch * s.q_len * s.heads;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t h = row % s.heads, i = (row / s.heads) % s.q_len, b = row / (s.heads * s.q_len);
        delta[s.stat(b, h, i)] = dot(dout + row * hd, out + row * hd, hd);
    }
}

// The backward's operands (core/backend.h): q, dout, dq (batch, q_len, heads, hd); k, v, dk, dv
// (batch, kv_len, kv_heads, hd); lse, delta (batch, heads, q_len).
template <typename T>
struct BackwardOperands {
    const T *q, *k, *v, *dout, *lse, *delta;
    T *dq, *dk, *dv;
    T scale;
    T softcap;  // 0: off
};

// One thread's buffers for its backward tasks.
template <typename T>
struct BackwardBuffers {
    explicit BackwardBuffers(int64_t hd)
        : keys_t(static_cast<size_t>(hd * kKeyTile)), values_t(keys_t.size()),
          dk_acc(static_cast<size_t>(kKeyTile * hd)), dv_acc(dk_acc.size()),
          p(static_cast<size_t>(kRowChunk * kKeyTile)), ds(p.size()), zero_row(static_cast<size_t>(hd), T(0)),
          spare_row(static_cast<size_t>(hd)) {}
    std::vector<T> keys_t, values_t;  // (hd, kKeyTile)
    std::vector<T> dk_acc, dv_acc;    // (kKeyTile, hd)
    std::vector<T> p, ds;             // (kRowChunk, kKeyTile)
    const std::vector<T> zero_row;    // (hd): stands in for a block's missing rows
    std::vector<T> spare_row;         // (hd): their dq goes here, unread
};

// Keys [j0, j0 + count) of kv head g of batch b: one key tile of a backward task, width =
// tile_width(count) columns, count4 = count in whole blocks of kRowBlock keys (at most width).
struct KeyTile {
    int64_t b, g, j0, count, width, count4;
};

// P and dS of query rows [c0, c0 + chunk) of head h against the tile, into buffers.p and buffers.ds
// (chunk, kKeyTile), four rows at a time (rows past the chunk get zeros), and dq += dS K for those rows.
template <typename T>
void chunk_probabilities(const Dims& s, const BackwardOperands<T>& o, const KeyTile& t, int64_t h, int64_t c0,
                         int64_t chunk, BackwardBuffers<T>& buffers) {
    const int64_t hd = s.head_dim;
    const T* key_rows = o.k + s.kv_row(t.b, t.j0, t.g);
    for (int64_t r0 = 0; r0 < chunk; r0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, chunk - r0);
        int64_t n[kRowBlock];
        for (int64_t r = 0; r < rows; ++r)
            n[r] = std::min(s.visible(c0 + r0 + r) - t.j0, t.count);  // keys of the tile row r sees
        T(*p_block)[kKeyTile] = reinterpret_cast<T(*)[kKeyTile]>(buffers.p.data() + r0 * kKeyTile);
        T(*ds_block)[kKeyTile] = reinterpret_cast<T(*)[kKeyTile]>(buffers.ds.data() + r0 * kKeyTile);
        probabilities(s, o.q, o.dout, o.lse, o.delta, buffers.keys_t.data(), buffers.values_t.data(), t.width,
                      tile_width(n[rows - 1]), t.b, h, c0 + r0, rows, n, o.scale, o.softcap, buffers.zero_row.data(),
                      p_block, ds_block);
        T* dq_rows[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r)
            dq_rows[r] = r < rows ? o.dq + s.q_row(t.b, c0 + r0 + r, h) : buffers.spare_row.data();
        rows_accumulate(&ds_block[0][0], kKeyTile, 1, n[rows - 1], key_rows, s.kv_heads * hd, dq_rows,
                        static_cast<const T*>(nullptr), hd);
    }
}

// dV and dK of the tile's keys from query rows [c0, c0 + chunk) of head h, transposed, four keys per
// pass: dV[c] += sum_r P[r][c] dO[r], dK[c] += sum_r dS[r][c] Q[r] over the chunk's rows from the first
// that sees key c (P and dS are zero above it, where a row does not see key c, and past count).
template <typename T>
void chunk_key_gradients(const Dims& s, const BackwardOperands<T>& o, const KeyTile& t, int64_t h, int64_t c0,
                         int64_t chunk, BackwardBuffers<T>& buffers) {
    const int64_t hd = s.head_dim;
    for (int64_t c = 0; c < t.count4; c += kRowBlock) {
        const int64_t r_first = std::max<int64_t>(0, t.j0 + c - s.offset() - c0);
        if (r_first >= chunk) break;  // nor the keys after c
        const T* dout_rows = o.dout + s.q_row(t.b, c0 + r_first, h);
        const T* q_rows = o.q + s.q_row(t.b, c0 + r_first, h);
        T* dv_rows[kRowBlock];
        T* dk_rows[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r) {
            dv_rows[r] = buffers.dv_acc.data() + (c + r) * hd;
            dk_rows[r] = buffers.dk_acc.data() + (c + r) * hd;
        }
        rows_accumulate(buffers.p.data() + r_first * kKeyTile + c, 1, kKeyTile, chunk - r_first, dout_rows,
                        s.heads * hd, dv_rows, static_cast<const T*>(nullptr), hd);
        rows_accumulate(buffers.ds.data() + r_first * kKeyTile + c, 1, kKeyTile, chunk - r_first, q_rows,
                        s.heads * hd, dk_rows, static_cast<const T*>(nullptr), hd);
    }
}

// Key tile `tile` of kv head g of batch b: its keys and values packed, dK and dV of its keys summed
// over the group's query heads and their rows from the first that sees key j0, in chunks of
// kRowChunk rows (dq gathering their dS K on the way), then stored.
template <typename T>
void backward_key_tile(const Dims& s, const BackwardOperands<T>& o, int64_t b, int64_t g, int64_t tile,
                       BackwardBuffers<T>& buffers) {
    const int64_t hd = s.head_dim;
    const int64_t j0 = tile * kKeyTile, count = std::min(s.kv_len - j0, kKeyTile);
    const int64_t width = tile_width(count);
    const KeyTile t{b, g, j0, count, width, std::min(width, (count + kRowBlock - 1) / kRowBlock * kRowBlock)};
    pack_transposed(s, o.k, b, j0, count, g, buffers.keys_t.data());
    pack_transposed(s, o.v, b, j0, count, g, buffers.values_t.data());
    std::fill(buffers.dk_acc.begin(), buffers.dk_acc.end(), T(0));
    std::fill(buffers.dv_acc.begin(), buffers.dv_acc.end(), T(0));
    const int64_t first_row = std::max<int64_t>(0, j0 - s.offset());  // the first row that sees key j0
    const int64_t h_begin = g * s.group(), h_end = h_begin + s.group();
    for (int64_t h = h_begin; h < h_end; ++h) {
        for (int64_t c0 = first_row; c0 < s.q_len; c0 += kRowChunk) {
            const int64_t chunk = std::min(kRowChunk, s.q_len - c0);
            chunk_probabilities(s, o, t, h, c0, chunk, buffers);
            chunk_key_gradients(s, o, t, h, c0, chunk, buffers);
        }
    }
    for (int64_t c = 0; c < count; ++c) {
        copy_values(o.dk + s.kv_row(b, j0 + c, g), buffers.dk_acc.data() + c * hd, hd);
        copy_values(o.dv + s.kv_row(b, j0 + c, g), buffers.dv_acc.data() + c * hd, hd);
    }
}

// One backward task, kv head g of batch b (task = b * kv_heads + g): dq of its group's query heads
// zeroed, then its key tiles in order.
template <typename T>
void backward_task(const Dims& s, const BackwardOperands<T>& o, int64_t task, int64_t key_tiles,
                   BackwardBuffers<T>& buffers) {
    const int64_t hd = s.head_dim;
    const int64_t g = task % s.kv_heads, b = task / s.kv_heads;
    const int64_t h_begin = g * s.group(), h_end = h_begin + s.group();
    for (int64_t h = h_begin; h < h_end; ++h)
        for (int64_t i = 0; i < s.q_len; ++i) zero_values(o.dq + s.q_row(b, i, h), hd);
    for (int64_t tile = 0; tile < key_tiles; ++tile) backward_key_tile(s, o, b, g, tile, buffers);
}

// The backward: the rows' deltas, then the (batch, kv head) tasks shared out among the threads, each
// with its own buffers.
template <typename T>
void backward_impl(const Dims& s, const T* q, const T* k, const T* v, const T* out, const T* dout, const T* lse,
                   T* delta, T* dq, T* dk, T* dv, T scale, T softcap) {
    const bool parallel = s.work() > kParallelFlops;
    row_deltas(s, out, dout, delta, parallel);

    // One task per (batch, kv head): it owns dk and dv of its keys and dq of its group's query heads,
    // so each probability tile is computed once and every sum has one owner and a fixed order (key
    // tiles in order, then heads, then rows; no atomics, the same bits for any thread count). The
    // query rows go in chunks of kRowChunk: P and dS of a chunk are kept so that dV
    // += P^T dO and dK += dS^T Q are register-blocked sums over the chunk's rows, four keys at a time.
    const BackwardOperands<T> o{q, k, v, dout, lse, delta, dq, dk, dv, scale, softcap};
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile;
    const int64_t tasks = s.batch * s.kv_heads;
#pragma omp parallel if (parallel)
    {
        BackwardBuffers<T> buffers(s.head_dim);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) backward_task(s, o, task, key_tiles, buffers);
    }
}

// ---- bf16 operands ----
// q, k, v, out, dout, dq, dk and dv in bf16 (lse and delta f32): each (batch, kv head) is widened into
// the thread's f32 slices, laid out as a problem of one batch and one kv head (q, out, dout, dq:
// (q_len, group, hd); k, v, dk, dv: (kv_len, hd); lse, delta: (group, q_len)); the f32 tasks above run
// on the slices, and the results are rounded to bf16 once. A slice's sums are those of the f32 kernel
// on widened copies of the whole tensors, in the same order: the same bits, without the f32 copies.

// The sizes of one (batch, kv head) slice.
Dims slice_dims(const Dims& s) {
    Dims sub = s;
    sub.batch = 1;
    sub.kv_heads = 1;
    sub.heads = s.group();
    return sub;
}

// The thread's f32 slices of one (batch, kv head).
struct Bf16Slices {
    Bf16Slices(const Dims& s, bool backward)
        : q(static_cast<size_t>(s.q_len * s.group() * s.head_dim)), k(static_cast<size_t>(s.kv_len * s.head_dim)),
          v(k.size()), out(q.size()), lse(static_cast<size_t>(s.group() * s.q_len)) {
        if (!backward) return;
        dout.resize(q.size());
        dq.resize(q.size());
        dk.resize(k.size());
        dv.resize(k.size());
        delta.resize(lse.size());
    }
    std::vector<float> q, k, v, out, lse;         // (q_len, group, hd), (kv_len, hd) x 2, (q_len, group, hd), (group, q_len)
    std::vector<float> dout, dq, dk, dv, delta;  // backward only: as q, q, k, k, lse
};

// Head rows of one (batch, kv head) between a bf16 tensor (batch, len, heads, hd) and its f32 slice
// (len, heads_per_slice, hd): heads [h0, h0 + heads_per_slice) of batch b.
void widen_rows(const uint16_t* src, int64_t b, int64_t len, int64_t heads, int64_t h0, int64_t heads_per_slice,
                int64_t hd, float* dst) {
    for (int64_t i = 0; i < len; ++i) {
        const uint16_t* row = src + ((b * len + i) * heads + h0) * hd;  // (heads_per_slice * hd)
        float* to = dst + i * heads_per_slice * hd;
        for (int64_t e = 0; e < heads_per_slice * hd; ++e) to[e] = bf16_to_f32(row[e]);
    }
}

void narrow_rows(const float* src, int64_t b, int64_t len, int64_t heads, int64_t h0, int64_t heads_per_slice,
                 int64_t hd, uint16_t* dst) {
    for (int64_t i = 0; i < len; ++i) {
        uint16_t* row = dst + ((b * len + i) * heads + h0) * hd;
        const float* from = src + i * heads_per_slice * hd;
        for (int64_t e = 0; e < heads_per_slice * hd; ++e) row[e] = f32_to_bf16(from[e]);
    }
}

void forward_bf16(const Dims& s, const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse,
                  float scale, float softcap) {
    const Dims sub = slice_dims(s);
    const int64_t group = s.group(), hd = s.head_dim;
    const int64_t tiles = (s.q_len + kLanes - 1) / kLanes;
    const int64_t key_groups = (s.kv_len + kKeyStep - 1) / kKeyStep;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        Bf16Slices slices(s, false);
        ForwardBuffers<float> buffers(hd, key_groups);
        const ForwardOperands<float> o{slices.q.data(), slices.k.data(), slices.v.data(), slices.out.data(),
                                       slices.lse.data(), scale, softcap};
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.batch * s.kv_heads; ++task) {
            const int64_t b = task / s.kv_heads, g = task % s.kv_heads;
            widen_rows(q, b, s.q_len, s.heads, g * group, group, hd, slices.q.data());
            widen_rows(k, b, s.kv_len, s.kv_heads, g, 1, hd, slices.k.data());
            widen_rows(v, b, s.kv_len, s.kv_heads, g, 1, hd, slices.v.data());
            buffers.packed_head = -1;  // new keys in the slice
            for (int64_t t = 0; t < group * tiles; ++t) forward_task(sub, o, t, tiles, buffers);
            narrow_rows(slices.out.data(), b, s.q_len, s.heads, g * group, group, hd, out);
            for (int64_t h = 0; h < group; ++h)
                std::copy_n(slices.lse.data() + h * s.q_len, s.q_len, lse + s.stat(b, g * group + h, 0));
        }
    }
}

void backward_bf16(const Dims& s, const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* out,
                   const uint16_t* dout, const float* lse, float* delta, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                   float scale, float softcap) {
    const Dims sub = slice_dims(s);
    const int64_t group = s.group(), hd = s.head_dim;
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        Bf16Slices slices(s, true);
        BackwardBuffers<float> buffers(hd);
        const BackwardOperands<float> o{slices.q.data(),     slices.k.data(),  slices.v.data(),  slices.dout.data(),
                                        slices.lse.data(),   slices.delta.data(), slices.dq.data(), slices.dk.data(),
                                        slices.dv.data(),    scale,            softcap};
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.batch * s.kv_heads; ++task) {
            const int64_t b = task / s.kv_heads, g = task % s.kv_heads, h0 = g * group;
            widen_rows(q, b, s.q_len, s.heads, h0, group, hd, slices.q.data());
            widen_rows(out, b, s.q_len, s.heads, h0, group, hd, slices.out.data());
            widen_rows(dout, b, s.q_len, s.heads, h0, group, hd, slices.dout.data());
            widen_rows(k, b, s.kv_len, s.kv_heads, g, 1, hd, slices.k.data());
            widen_rows(v, b, s.kv_len, s.kv_heads, g, 1, hd, slices.v.data());
            for (int64_t h = 0; h < group; ++h)
                std::copy_n(lse + s.stat(b, h0 + h, 0), s.q_len, slices.lse.data() + h * s.q_len);
            row_deltas(sub, slices.out.data(), slices.dout.data(), slices.delta.data(), false);
            backward_task(sub, o, 0, key_tiles, buffers);
            narrow_rows(slices.dq.data(), b, s.q_len, s.heads, h0, group, hd, dq);
            narrow_rows(slices.dk.data(), b, s.kv_len, s.kv_heads, g, 1, hd, dk);
            narrow_rows(slices.dv.data(), b, s.kv_len, s.kv_heads, g, 1, hd, dv);
            for (int64_t h = 0; h < group; ++h)
                std::copy_n(slices.delta.data() + h * s.q_len, s.q_len, delta + s.stat(b, h0 + h, 0));
        }
    }
}

// ---- bf16 operands on vdpbf16ps ----
// Where the build targets AVX512-BF16, bf16 attention multiplies bf16 operands with f32 sums, twice
// the f32 FMA's products per instruction on a CPU that retires vdpbf16ps at the FMA's rate (Zen 4),
// as PyTorch's CPU flash attention does for bf16 (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp):
// the scores, the online softmax and the backward's P and dS in f32 as above, and P and dS rounded to
// bf16 (f32_to_bf16) before the products that take them (P V; dS K, P^T dO, dS^T Q). The tasks and
// tiles are the f32 kernels'; every sum runs in a fixed order, so the bits do not depend on the
// thread count. vdpbf16ps (Intel SDM, "VDPBF16PS") adds the products of a pair of bf16 to each f32
// lane, so both operands are read in pairs along the summed index: a row's pair of head columns is one
// 32-bit word of its storage, and the operands are packed by the bf16 gemm's pack_bf16_pairs into
// panels of words, 16 lines each. Head sizes that are not a multiple of 16 (a vector of f32 columns)
// take the widened kernels.
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define NL_ATTENTION_VDPBF16PS 1
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // GCC 12's headers trip these in the shifts (GCC bug 105593)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

constexpr int64_t kPanel = 16;  // lines per panel of words (pack_bf16_pairs)
static_assert(kLanes == 16 && kKeyStep == kPanel, "a vector of 16 f32 lanes per query tile and key group");

// Word p of bf16 storage at `row`: elements 2p and 2p + 1, the pair vdpbf16ps reads.
inline uint32_t word_at(const uint16_t* row, int64_t p) {
    uint32_t w;
    std::memcpy(&w, row + 2 * p, sizeof w);
    return w;
}
inline __m512bh broadcast_word(uint32_t w) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(w)); }
// 16 words from p, kept in a register (see load_kept): one load for every row that uses it.
inline __m512bh load_words_kept(const uint32_t* p) {
    __m512i v = _mm512_loadu_si512(p);
    __asm__("" : "+v"(v));
    return (__m512bh)v;
}

// Columns [0, hd) of the rows of a (k, hd) storage (row stride ld) as hd / 16 panels of k pairs:
// panels[d / 16][p][d % 16] = (x[2p][d], x[2p + 1][d]), pairs past k zero, each panel `pairs_stride`
// rows apart (pairs_stride >= ceil(k / 2)). The form of dS K's K, P^T dO's dO and dS^T Q's Q.
inline void pack_column_panels(const uint16_t* x, int64_t ld, int64_t k, int64_t hd, int64_t pairs_stride,
                               uint32_t* panels) {
    for (int64_t d0 = 0; d0 < hd; d0 += kPanel)
        pack_bf16_pairs(x, ld, false, k, d0, kPanel, pairs_stride, panels + d0 / kPanel * pairs_stride * kPanel);
}

// y[r][d0, d0 + 16 V) += sum_{p < pairs} (word p * w_stride of w[r]) . x's pair p of those columns, for
// kRowBlock rows, over p in order: dS K, P^T dO and dS^T Q, with x in column panels
// (pack_column_panels, panel_words apart).
template <int V>
inline void rows_accumulate_words_fixed(const uint16_t* const w[kRowBlock], int64_t w_stride, const uint32_t* x,
                                        int64_t panel_words, int64_t pairs, float* const y[kRowBlock], int64_t d0) {
    __m512 acc[kRowBlock][V];
    for (int64_t r = 0; r < kRowBlock; ++r)
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_loadu_ps(y[r] + d0 + 16 * v);
    const uint32_t* xp = x + d0 / kPanel * panel_words;
    for (int64_t p = 0; p < pairs; ++p) {
        __m512bh xv[V];
        for (int v = 0; v < V; ++v) xv[v] = load_words_kept(xp + v * panel_words + p * kPanel);
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const __m512bh wr = broadcast_word(word_at(w[r], p * w_stride));
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], wr, xv[v]);
        }
    }
    for (int64_t r = 0; r < kRowBlock; ++r)
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(y[r] + d0 + 16 * v, acc[r][v]);
}

// All hd columns (a multiple of 16): 64 at a time (16 accumulators), then 32 and 16.
inline void rows_accumulate_words(const uint16_t* const w[kRowBlock], int64_t w_stride, const uint32_t* x,
                                  int64_t panel_words, int64_t pairs, float* const y[kRowBlock], int64_t hd) {
    int64_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) rows_accumulate_words_fixed<4>(w, w_stride, x, panel_words, pairs, y, d0);
    if (d0 + 32 <= hd) rows_accumulate_words_fixed<2>(w, w_stride, x, panel_words, pairs, y, d0), d0 += 32;
    if (d0 + 16 <= hd) rows_accumulate_words_fixed<1>(w, w_stride, x, panel_words, pairs, y, d0);
}

// ---- forward on vdpbf16ps ----

struct Bf16ForwardOperands {
    const uint16_t *q, *k, *v;
    uint16_t* out;
    float* lse;
    float scale, softcap;
};

// One thread's buffers: the f32 forward's (accumulators, scores, running max and sum), with the
// query rows, keys and values as panels of words.
struct Bf16ForwardBuffers {
    Bf16ForwardBuffers(int64_t hd, int64_t key_groups)
        : f(hd, 0), value_pairs_stride(key_groups * kKeyStep / 2), q_words(hd / 2 * kLanes),
          key_words(key_groups * hd / 2 * kKeyStep), value_pairs(hd / kPanel * value_pairs_stride * kPanel) {}
    ForwardBuffers<float> f;  // acc_t, st, row_max, row_sum, ..., packed_head, packed_groups
    const int64_t value_pairs_stride;
    WordBuffer q_words;      // (hd / 2, kLanes): word p of each query row, a row per lane
    WordBuffer key_words;    // (key_groups, hd / 2, kKeyStep): word p of each key of a group of kKeyStep
    WordBuffer value_pairs;  // (hd / 16, key_groups * kKeyStep / 2, 16): values of keys 2c and 2c + 1 paired
    alignas(64) uint32_t p_words[kKeyTile / 2][kLanes];  // (keys of a tile / 2, kLanes): P of keys 2c, 2c + 1 in bf16
};

// The key groups of kv head g of batch b up to `group` that are not packed yet, as words, and
// their values in pairs (the f32 forward's packed_head and packed_groups say which are).
void pack_key_groups_bf16(const Dims& s, const Bf16ForwardOperands& o, int64_t b, int64_t g, int64_t group,
                          Bf16ForwardBuffers& w) {
    const int64_t hd = s.head_dim, ld = s.kv_heads * hd;
    for (; w.f.packed_groups <= group; ++w.f.packed_groups) {
        const int64_t p0 = w.f.packed_groups * kKeyStep;
        const int64_t keys = std::min(kKeyStep, s.kv_len - p0);
        pack_bf16_pairs(o.k + s.kv_row(b, p0, g), ld, true, hd, 0, static_cast<int>(keys), hd / 2,
                        w.key_words.data() + w.f.packed_groups * (hd / 2 * kKeyStep));
        for (int64_t d0 = 0; d0 < hd; d0 += kPanel)
            pack_bf16_pairs(o.v + s.kv_row(b, p0, g), ld, false, keys, d0, kPanel, kKeyStep / 2,
                            w.value_pairs.data() + (d0 / kPanel * w.value_pairs_stride + p0 / 2) * kPanel);
    }
}

// st[c][r] = sum over words p of (word p of key c) . (word p of query row r), for a group of kKeyStep
// keys (key_words (words, kKeyStep)): a lane per query row, as the f32 forward's keys_times_rows.
inline void keys_times_rows_bf16(const uint32_t* key_words, const uint32_t* q_words, int64_t words,
                                 float (*st)[kLanes]) {
    __m512 acc[kKeyStep];
    for (__m512& a : acc) a = _mm512_setzero_ps();
    for (int64_t p = 0; p < words; ++p) {
        const __m512bh qp = load_words_kept(q_words + p * kLanes);
        const uint32_t* kp = key_words + p * kKeyStep;
        for (int64_t c = 0; c < kKeyStep; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], broadcast_word(kp[c]), qp);
    }
    for (int64_t c = 0; c < kKeyStep; ++c) _mm512_storeu_ps(st[c], acc[c]);
}

// acc_t[d][r] = acc_t[d][r] * rescale[r] + sum_{c2 < pairs} value pair c2 of column d . p_words[c2][r]:
// the output, transposed (hd, kLanes), 16 columns (one panel of value pairs) at a time over the tile's
// key pairs in order.
inline void values_times_probabilities_bf16(const uint32_t (*p_words)[kLanes], int64_t pairs,
                                            const uint32_t* value_pairs, int64_t pairs_stride, int64_t hd,
                                            const float* rescale, float* acc_t) {
    const __m512 f = _mm512_loadu_ps(rescale);
    for (int64_t d0 = 0; d0 < hd; d0 += kPanel) {
        __m512 acc[kPanel];
        for (int64_t e = 0; e < kPanel; ++e) acc[e] = _mm512_mul_ps(_mm512_loadu_ps(acc_t + (d0 + e) * kLanes), f);
        const uint32_t* panel = value_pairs + d0 / kPanel * pairs_stride * kPanel;
        for (int64_t c2 = 0; c2 < pairs; ++c2) {
            const __m512bh pc = load_words_kept(p_words[c2]);
            const uint32_t* vc = panel + c2 * kPanel;
            for (int64_t e = 0; e < kPanel; ++e) acc[e] = _mm512_dpbf16_ps(acc[e], broadcast_word(vc[e]), pc);
        }
        for (int64_t e = 0; e < kPanel; ++e) _mm512_storeu_ps(acc_t + (d0 + e) * kLanes, acc[e]);
    }
}

// One task of forward_task's: kLanes query rows of one head over the keys they see.
void forward_task_bf16(const Dims& s, const Bf16ForwardOperands& o, int64_t task, int64_t tiles,
                       Bf16ForwardBuffers& w) {
    ForwardBuffers<float>& f = w.f;
    const int64_t hd = s.head_dim, words = hd / 2;
    const int64_t tile = task % tiles, h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
    const int64_t g = h / s.group();
    const int64_t i0 = tile * kLanes, rows = std::min(kLanes, s.q_len - i0);
    pack_bf16_pairs(o.q + s.q_row(b, i0, h), s.heads * hd, true, hd, 0, static_cast<int>(rows), words,
                    w.q_words.data());
    std::fill(f.acc_t.begin(), f.acc_t.end(), 0.0f);
    std::fill(f.row_max, f.row_max + kLanes, -std::numeric_limits<float>::infinity());
    std::fill(f.row_sum, f.row_sum + kLanes, 0.0f);
    for (int64_t r = 0; r < kLanes; ++r) f.visible[r] = static_cast<float>(r < rows ? s.visible(i0 + r) : s.kv_len);
    const int64_t keys = s.visible(i0 + rows - 1);
    if (f.packed_head != b * s.kv_heads + g) {
        f.packed_head = b * s.kv_heads + g;
        f.packed_groups = 0;
    }
    NextTaskRows next = next_task_rows(s, o.q, o.k, o.v, b, h, g, i0 + rows, keys);
    for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
        const int64_t count = std::min(kKeyTile, keys - j0);
        for (int64_t c0 = 0; c0 < count; c0 += kKeyStep) {
            const int64_t group = (j0 + c0) / kKeyStep;
            next.share();
            pack_key_groups_bf16(s, o, b, g, group, w);
            keys_times_rows_bf16(w.key_words.data() + group * (words * kKeyStep), w.q_words.data(), words, f.st + c0);
        }
        online_softmax_tile(f, j0, count, o.scale, o.softcap);
        // P in bf16, keys paired; the key after an odd count's last gets 0.
        const int64_t pairs = (count + 1) / 2;
        for (int64_t c2 = 0; c2 < pairs; ++c2) {
            const __m512i first = cpu_math::f32x16_to_bf16(_mm512_loadu_ps(f.st[2 * c2]));
            const __m512i second = 2 * c2 + 1 < count ? cpu_math::f32x16_to_bf16(_mm512_loadu_ps(f.st[2 * c2 + 1]))
                                                      : _mm512_setzero_si512();
            _mm512_store_si512(w.p_words[c2], _mm512_or_si512(first, _mm512_slli_epi32(second, 16)));
        }
        values_times_probabilities_bf16(w.p_words, pairs, w.value_pairs.data() + j0 / 2 * kPanel, w.value_pairs_stride,
                                        hd, f.rescale, f.acc_t.data());
    }
    // out = acc / row_sum, rounded: 16 columns of every lane's row at a time, transposed to rows.
    alignas(64) float inv[kLanes];
    for (int64_t r = 0; r < kLanes; ++r) inv[r] = 1.0f / f.row_sum[r];
    const __m512 inv16 = _mm512_load_ps(inv);
    for (int64_t d0 = 0; d0 < hd; d0 += kPanel) {
        __m512i columns[kPanel];  // columns[e]: lane r holds out[r][d0 + e]; then rows[r]: out[r][d0, d0 + 16)
        for (int64_t e = 0; e < kPanel; ++e)
            columns[e] = cpu_math::f32x16_to_bf16(_mm512_mul_ps(_mm512_loadu_ps(f.acc_t.data() + (d0 + e) * kLanes), inv16));
        cpu_math::transpose_16x16_words(columns);
        for (int64_t r = 0; r < rows; ++r)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.out + s.q_row(b, i0 + r, h) + d0),
                                _mm512_cvtepi32_epi16(columns[r]));
    }
    for (int64_t r = 0; r < rows; ++r) o.lse[s.stat(b, h, i0 + r)] = f.row_max[r] + std::log(f.row_sum[r]);
}

void forward_bf16_vdpbf16ps(const Dims& s, const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                            float* lse, float scale, float softcap) {
    const Bf16ForwardOperands o{q, k, v, out, lse, scale, softcap};
    const int64_t tiles = (s.q_len + kLanes - 1) / kLanes;
    const int64_t tasks = s.batch * s.heads * tiles;
    const int64_t key_groups = (s.kv_len + kKeyStep - 1) / kKeyStep;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        Bf16ForwardBuffers buffers(s.head_dim, key_groups);
        const int64_t chunk = s.batch * s.heads >= 4 * omp_get_num_threads() ? tiles : 1;  // as forward_impl's
#pragma omp for schedule(dynamic, chunk)
        for (int64_t task = 0; task < tasks; ++task) forward_task_bf16(s, o, task, tiles, buffers);
    }
}

// ---- backward on vdpbf16ps ----

struct Bf16BackwardOperands {
    const uint16_t *q, *k, *v, *out, *dout;
    const float* lse;
    float* delta;
    uint16_t *dq, *dk, *dv;
    float scale, softcap;
};

constexpr int64_t kChunkPairs = kRowChunk / 2;  // query-row pairs of a chunk
constexpr int64_t kTilePairs = kKeyTile / 2;    // key pairs of a tile

// One thread's buffers for its (batch, kv head) tasks.
struct Bf16BackwardBuffers {
    explicit Bf16BackwardBuffers(const Dims& s)
        : key_words(s.head_dim / 2 * kKeyTile), value_words(s.head_dim / 2 * kKeyTile),
          key_pairs(s.head_dim * kTilePairs), q_pairs(s.head_dim * kChunkPairs), dout_pairs(s.head_dim * kChunkPairs),
          p_pairs(kKeyTile * kChunkPairs), ds_pairs(kKeyTile * kChunkPairs),
          p(static_cast<size_t>(kRowChunk * kKeyTile)), ds(p.size()), ds_bf16(p.size()),
          dk_acc(static_cast<size_t>((s.kv_len + kKeyTile - 1) / kKeyTile * kKeyTile * s.head_dim)), dv_acc(dk_acc.size()),
          dq_acc(static_cast<size_t>(s.q_len * s.group() * s.head_dim)), zero_row(static_cast<size_t>(s.head_dim), 0),
          spare_row(static_cast<size_t>(s.head_dim)) {}
    WordBuffer key_words, value_words;  // (kKeyTile / 16, hd / 2, 16): word p of each key (value) of the tile
    WordBuffer key_pairs;               // (hd / 16, kTilePairs, 16): the tile's keys paired, for dS K
    WordBuffer q_pairs, dout_pairs;     // (hd / 16, kChunkPairs, 16): the chunk's rows paired, for dS^T Q, P^T dO
    WordBuffer p_pairs, ds_pairs;       // (kKeyTile / 16, kChunkPairs, 16): P and dS of row pairs, per key
    std::vector<float> p, ds;             // (kRowChunk, kKeyTile)
    std::vector<uint16_t> ds_bf16;        // (kRowChunk, kKeyTile): dS rounded, for dS K
    std::vector<float> dk_acc, dv_acc;    // (kv_len in whole key tiles, hd): dk and dv of the task's kv head
    std::vector<float> dq_acc;            // (q_len, group, hd): dq of its query heads (narrow_rows' slice)
    const std::vector<uint16_t> zero_row;  // (hd): stands in for a block's missing rows
    std::vector<float> spare_row;          // (hd): their dq goes here, unread
};

// out[r][c] = sum over words p of (word p of a[r]) . (word p of key c) for kRowBlock rows and the
// first Width keys of a tile packed as words (kKeyTile / 16 panels of (words, 16)): the scores (a =
// q rows, the keys' words) and dP (a = dout rows, the values' words). Not inlined: inside
// chunk_probabilities_bf16, next to the exp constants the compiler keeps in vector registers there,
// two of the 16 accumulators went to the stack and back on every step of the loop.
template <int64_t Width>
__attribute__((noinline)) void rows_times_words_fixed(const uint16_t* const a[kRowBlock], const uint32_t* key_words,
                                                      int64_t words, float (*out)[kKeyTile]) {
    constexpr int V = static_cast<int>(Width / 16);
    __m512 acc[kRowBlock][V];
    for (auto& row : acc)
        for (__m512& v : row) v = _mm512_setzero_ps();
    for (int64_t p = 0; p < words; ++p) {
        __m512bh wv[V];
        for (int v = 0; v < V; ++v) wv[v] = load_words_kept(key_words + (v * words + p) * kPanel);
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const __m512bh ar = broadcast_word(word_at(a[r], p));
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, wv[v]);
        }
    }
    for (int64_t r = 0; r < kRowBlock; ++r)
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(out[r] + 16 * v, acc[r][v]);
}

// P and dS of query rows [c0, c0 + chunk) of head h against the key tile (the f32 backward's
// chunk_probabilities with bf16 products), rounded to bf16 (dS by rows, both in pairs of rows), and
// dq += dS K for those rows.
void chunk_probabilities_bf16(const Dims& s, const Bf16BackwardOperands& o, const KeyTile& t, int64_t h, int64_t c0,
                              int64_t chunk, Bf16BackwardBuffers& w) {
    const int64_t hd = s.head_dim, words = hd / 2, hl = h - t.g * s.group();
    for (int64_t r0 = 0; r0 < chunk; r0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, chunk - r0);
        int64_t n[kRowBlock];
        const uint16_t* q_rows[kRowBlock];
        const uint16_t* dout_rows[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r) {
            n[r] = r < rows ? std::min(s.visible(c0 + r0 + r) - t.j0, t.count) : 0;
            q_rows[r] = r < rows ? o.q + s.q_row(t.b, c0 + r0 + r, h) : w.zero_row.data();
            dout_rows[r] = r < rows ? o.dout + s.q_row(t.b, c0 + r0 + r, h) : w.zero_row.data();
        }
        float(*p)[kKeyTile] = reinterpret_cast<float(*)[kKeyTile]>(w.p.data() + r0 * kKeyTile);
        float(*ds)[kKeyTile] = reinterpret_cast<float(*)[kKeyTile]>(w.ds.data() + r0 * kKeyTile);
        const int64_t width = tile_width(n[rows - 1]);
        with_tile_width(width, [&](auto wc) {
            rows_times_words_fixed<decltype(wc)::value>(q_rows, w.key_words.data(), words, p);
            rows_times_words_fixed<decltype(wc)::value>(dout_rows, w.value_words.data(), words, ds);
        });
        const uint16_t* ds_rows[kRowBlock];
        float* dq_rows[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const bool real = r < rows;
            const float l = real ? o.lse[s.stat(t.b, h, c0 + r0 + r)] : 0.0f;
            const float di = real ? o.delta[s.stat(t.b, h, c0 + r0 + r)] : 0.0f;
            gradient_tile_row(width, p[r], ds[r], n[r], o.scale, l, di, o.softcap);  // zeros past width
            uint16_t* ds_row = w.ds_bf16.data() + (r0 + r) * kKeyTile;
            for (int64_t c = 0; c < kKeyTile; c += kPanel)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_row + c),
                                    cpu_math::f32x16_to_bf16x16(_mm512_loadu_ps(ds[r] + c)));
            ds_rows[r] = ds_row;
            dq_rows[r] = real ? w.dq_acc.data() + ((c0 + r0 + r) * s.group() + hl) * hd : w.spare_row.data();
        }
        rows_accumulate_words(ds_rows, 1, w.key_pairs.data(), kTilePairs * kPanel, (n[rows - 1] + 1) / 2, dq_rows, hd);
        // P and dS of the block's two row pairs, rounded, for P^T dO and dS^T Q: a panel per 16 keys.
        // (A block's missing rows have P and dS zero: an odd chunk's last pair ends in a zero.)
        for (int64_t pr = 0; pr < kRowBlock / 2; ++pr)
            for (int64_t c = 0; c < kKeyTile; c += kPanel) {
                const int64_t at = (c / kPanel * kChunkPairs + r0 / 2 + pr) * kPanel;
                const auto paired = [&](const float (*x)[kKeyTile]) {
                    return _mm512_or_si512(cpu_math::f32x16_to_bf16(_mm512_loadu_ps(x[2 * pr] + c)),
                                           _mm512_slli_epi32(cpu_math::f32x16_to_bf16(_mm512_loadu_ps(x[2 * pr + 1] + c)), 16));
                };
                _mm512_store_si512(w.p_pairs.data() + at, paired(p));
                _mm512_store_si512(w.ds_pairs.data() + at, paired(ds));
            }
    }
}

// dV and dK of the tile's keys from query rows [c0, c0 + chunk) of head h, four keys per pass, over the
// rows from the first that sees the pass's first key (rounded down to a whole pair: the rows above it
// have P and dS zero there).
void chunk_key_gradients_bf16(const Dims& s, const Bf16BackwardOperands& o, const KeyTile& t, int64_t h, int64_t c0,
                              int64_t chunk, Bf16BackwardBuffers& w) {
    const int64_t hd = s.head_dim;
    pack_column_panels(o.q + s.q_row(t.b, c0, h), s.heads * hd, chunk, hd, kChunkPairs, w.q_pairs.data());
    pack_column_panels(o.dout + s.q_row(t.b, c0, h), s.heads * hd, chunk, hd, kChunkPairs, w.dout_pairs.data());
    for (int64_t c = 0; c < t.count4; c += kRowBlock) {
        const int64_t r_first = std::max<int64_t>(0, t.j0 + c - s.offset() - c0) / 2 * 2;
        if (r_first >= chunk) break;
        const int64_t pairs = (chunk - r_first + 1) / 2, p_first = r_first / 2;
        const uint16_t* p_rows[kRowBlock];
        const uint16_t* ds_rows[kRowBlock];
        float* dv_rows[kRowBlock];
        float* dk_rows[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const int64_t key = c + r, at = (key / kPanel * kChunkPairs + p_first) * kPanel + key % kPanel;
            // Word p of key `key`'s row pairs, from pair p_first: at + p * kPanel words, read as bf16 pairs.
            p_rows[r] = reinterpret_cast<const uint16_t*>(w.p_pairs.data() + at);
            ds_rows[r] = reinterpret_cast<const uint16_t*>(w.ds_pairs.data() + at);
            dv_rows[r] = w.dv_acc.data() + (t.j0 + key) * hd;
            dk_rows[r] = w.dk_acc.data() + (t.j0 + key) * hd;
        }
        const int64_t from = p_first * kPanel;
        rows_accumulate_words(p_rows, kPanel, w.dout_pairs.data() + from, kChunkPairs * kPanel, pairs, dv_rows, hd);
        rows_accumulate_words(ds_rows, kPanel, w.q_pairs.data() + from, kChunkPairs * kPanel, pairs, dk_rows, hd);
    }
}

// delta = dout . out of one bf16 row of hd values (a multiple of 16), in f32, pairs summed in order.
inline float row_delta_bf16(const uint16_t* dout, const uint16_t* out, int64_t hd) {
    __m512 acc = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 32 <= hd; d += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(dout + d), (__m512bh)_mm512_loadu_si512(out + d));
    if (d < hd) {  // 16 values: 8 words
        const __m512i a = _mm512_maskz_loadu_epi32(0xff, dout + d), b = _mm512_maskz_loadu_epi32(0xff, out + d);
        acc = _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
    }
    alignas(64) float lanes[16];  // summed in lane order (_mm512_reduce_add_ps trips GCC 12's warnings)
    _mm512_store_ps(lanes, acc);
    float sum = 0.0f;
    for (float lane : lanes) sum += lane;
    return sum;
}

// One task: kv head g of batch b, its key tiles in order (the f32 backward_task's loop nest).
void backward_task_bf16(const Dims& s, const Bf16BackwardOperands& o, int64_t task, Bf16BackwardBuffers& w) {
    const int64_t hd = s.head_dim, group = s.group(), words = hd / 2;
    const int64_t g = task % s.kv_heads, b = task / s.kv_heads, h_begin = g * group;
    // The rows come cold from memory, a stride apart that the hardware's prefetchers follow too
    // slowly for a loop this short: each row's lines are asked for kDeltaAhead rows ahead, a row a
    // step (cpu_prefetch::RowLines).
    constexpr int64_t kDeltaAhead = 8;
    const int64_t row_bytes = hd * 2, ld_bytes = s.heads * row_bytes, ahead_rows = std::max<int64_t>(0, s.q_len - kDeltaAhead);
    for (int64_t h = h_begin; h < h_begin + group; ++h) {
        cpu_prefetch::RowLines dout_ahead, out_ahead;
        if (ahead_rows > 0) {
            dout_ahead = cpu_prefetch::RowLines(o.dout + s.q_row(b, kDeltaAhead, h), ld_bytes, ahead_rows, row_bytes, ahead_rows);
            out_ahead = cpu_prefetch::RowLines(o.out + s.q_row(b, kDeltaAhead, h), ld_bytes, ahead_rows, row_bytes, ahead_rows);
        }
        for (int64_t i = 0; i < s.q_len; ++i) {
            dout_ahead.share();
            out_ahead.share();
            o.delta[s.stat(b, h, i)] = row_delta_bf16(o.dout + s.q_row(b, i, h), o.out + s.q_row(b, i, h), hd);
        }
    }
    std::fill(w.dq_acc.begin(), w.dq_acc.end(), 0.0f);
    std::fill(w.dk_acc.begin(), w.dk_acc.end(), 0.0f);
    std::fill(w.dv_acc.begin(), w.dv_acc.end(), 0.0f);
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile;
    const int64_t ld = s.kv_heads * hd;
    for (int64_t tile = 0; tile < key_tiles; ++tile) {
        const int64_t j0 = tile * kKeyTile, count = std::min(s.kv_len - j0, kKeyTile);
        const int64_t width = tile_width(count);
        const KeyTile t{b, g, j0, count, width, std::min(width, (count + kRowBlock - 1) / kRowBlock * kRowBlock)};
        const uint16_t* keys = o.k + s.kv_row(b, j0, g);
        const uint16_t* values = o.v + s.kv_row(b, j0, g);
        for (int64_t c0 = 0; c0 < width; c0 += kPanel) {  // panels of 16 keys as words (past count: zero)
            const int lines = static_cast<int>(std::min(kPanel, count - c0));
            pack_bf16_pairs(keys + c0 * ld, ld, true, hd, 0, lines, words, w.key_words.data() + c0 / kPanel * words * kPanel);
            pack_bf16_pairs(values + c0 * ld, ld, true, hd, 0, lines, words, w.value_words.data() + c0 / kPanel * words * kPanel);
        }
        pack_column_panels(keys, ld, count, hd, kTilePairs, w.key_pairs.data());
        const int64_t first_row = std::max<int64_t>(0, j0 - s.offset());
        for (int64_t h = h_begin; h < h_begin + group; ++h) {
            for (int64_t c0 = first_row; c0 < s.q_len; c0 += kRowChunk) {
                const int64_t chunk = std::min(kRowChunk, s.q_len - c0);
                chunk_probabilities_bf16(s, o, t, h, c0, chunk, w);
                chunk_key_gradients_bf16(s, o, t, h, c0, chunk, w);
            }
        }
    }
    narrow_rows(w.dq_acc.data(), b, s.q_len, s.heads, h_begin, group, hd, o.dq);
    narrow_rows(w.dk_acc.data(), b, s.kv_len, s.kv_heads, g, 1, hd, o.dk);
    narrow_rows(w.dv_acc.data(), b, s.kv_len, s.kv_heads, g, 1, hd, o.dv);
}

void backward_bf16_vdpbf16ps(const Dims& s, const Bf16BackwardOperands& o) {
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        Bf16BackwardBuffers buffers(s);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.batch * s.kv_heads; ++task) backward_task_bf16(s, o, task, buffers);
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // AVX512-BF16

// bf16 q, k, v and out with f32 lse (the f32 kernel on widened slices, above); the shared checks see
// the f32 problem it runs.
AttentionForwardArgs as_f32(AttentionForwardArgs a) {
    a.dtype = DType::F32;
    return a;
}
AttentionBackwardArgs as_f32(AttentionBackwardArgs a) {
    a.dtype = DType::F32;
    return a;
}

// The bf16 kernel asked for by set_attention_bf16_kernel ("auto" until then).
std::string& requested_bf16_kernel() {
    static std::string kernel = "auto";
    return kernel;
}

#ifdef NL_ATTENTION_VDPBF16PS
// Whether a bf16 problem of these sizes runs on vdpbf16ps (attention_bf16_kernel, and whole vectors of
// head columns).
bool runs_on_vdpbf16ps(const Dims& s) {
    return s.head_dim % 16 == 0 && std::strcmp(attention_bf16_kernel(), "vdpbf16ps") == 0;
}
#endif

}  // namespace

const char* attention_bf16_kernel() {
    const std::string& want = requested_bf16_kernel();
    if (want == "widened") return "widened";
#ifdef NL_ATTENTION_VDPBF16PS
    if (want == "vdpbf16ps" || bgemm_vdpbf16ps_beats_widened()) return "vdpbf16ps";
#endif
    return "widened";
}

void set_attention_bf16_kernel(const std::string& kernel) {
#ifdef NL_ATTENTION_VDPBF16PS
    const bool has_vdpbf16ps = true;
#else
    const bool has_vdpbf16ps = false;
#endif
    NL_REQUIRE(kernel == "auto" || kernel == "widened" || (kernel == "vdpbf16ps" && has_vdpbf16ps),
               "set_attention_bf16_kernel: expected auto, widened", has_vdpbf16ps ? " or vdpbf16ps" : "",
               ", found '", kernel, "'",
               kernel == "vdpbf16ps" ? " (this build does not target AVX512-BF16)" : "");
    requested_bf16_kernel() = kernel;
}

void CpuBackend::attention_forward(const AttentionForwardArgs& a) {
    const Dims s{a.dims};
    if (a.dtype == DType::BF16) {
        check_kernel_args(as_f32(a));
#ifdef NL_ATTENTION_VDPBF16PS
        if (runs_on_vdpbf16ps(s))
            return forward_bf16_vdpbf16ps(s, static_cast<const uint16_t*>(a.q), static_cast<const uint16_t*>(a.k),
                                          static_cast<const uint16_t*>(a.v), static_cast<uint16_t*>(a.out),
                                          static_cast<float*>(a.lse), static_cast<float>(a.scale),
                                          static_cast<float>(a.softcap));
#endif
        return forward_bf16(s, static_cast<const uint16_t*>(a.q), static_cast<const uint16_t*>(a.k),
                            static_cast<const uint16_t*>(a.v), static_cast<uint16_t*>(a.out), static_cast<float*>(a.lse),
                            static_cast<float>(a.scale), static_cast<float>(a.softcap));
    }
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        using T = double;
        forward_impl(s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                     static_cast<T*>(a.out), static_cast<T*>(a.lse), a.scale, a.softcap);
    } else {
        using T = float;
        forward_impl(s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                     static_cast<T*>(a.out), static_cast<T*>(a.lse), static_cast<T>(a.scale),
                     static_cast<T>(a.softcap));
    }
}

void CpuBackend::attention_backward(const AttentionBackwardArgs& a) {
    const Dims s{a.dims};
    if (a.dtype == DType::BF16) {
        check_kernel_args(as_f32(a));
        using H = uint16_t;
#ifdef NL_ATTENTION_VDPBF16PS
        if (runs_on_vdpbf16ps(s))
            return backward_bf16_vdpbf16ps(
                s, {static_cast<const H*>(a.q), static_cast<const H*>(a.k), static_cast<const H*>(a.v),
                    static_cast<const H*>(a.out), static_cast<const H*>(a.dout), static_cast<const float*>(a.lse),
                    static_cast<float*>(a.delta), static_cast<H*>(a.dq), static_cast<H*>(a.dk), static_cast<H*>(a.dv),
                    static_cast<float>(a.scale), static_cast<float>(a.softcap)});
#endif
        return backward_bf16(s, static_cast<const H*>(a.q), static_cast<const H*>(a.k), static_cast<const H*>(a.v),
                             static_cast<const H*>(a.out), static_cast<const H*>(a.dout), static_cast<const float*>(a.lse),
                             static_cast<float*>(a.delta), static_cast<H*>(a.dq), static_cast<H*>(a.dk),
                             static_cast<H*>(a.dv), static_cast<float>(a.scale), static_cast<float>(a.softcap));
    }
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        using T = double;
        backward_impl(s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                      static_cast<const T*>(a.out), static_cast<const T*>(a.dout), static_cast<const T*>(a.lse),
                      static_cast<T*>(a.delta), static_cast<T*>(a.dq), static_cast<T*>(a.dk), static_cast<T*>(a.dv),
                      a.scale, a.softcap);
    } else {
        using T = float;
        backward_impl(s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                      static_cast<const T*>(a.out), static_cast<const T*>(a.dout), static_cast<const T*>(a.lse),
                      static_cast<T*>(a.delta), static_cast<T*>(a.dq), static_cast<T*>(a.dk), static_cast<T*>(a.dv),
                      static_cast<T>(a.scale), static_cast<T>(a.softcap));
    }
}

}  // namespace nl
