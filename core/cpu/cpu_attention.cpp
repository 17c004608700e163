// CPU kernels for fused causal attention (the formulas are in core/backend.h next to the declarations):
// FlashAttention's tiling on the CPU. A forward task is one (batch, head, tile of query rows), a
// backward task one (batch, kv head) with its group of query heads; tasks are independent, so OpenMP
// hands them out dynamically (causal tiles differ in cost, and a thread that loses its core to
// another process does not hold the others up) without changing a bit.
// References: Dao et al. 2022, "FlashAttention" (Algorithm 1: tiles and the online softmax); Dao 2023,
// "FlashAttention-2" (the backward from the saved logsumexp, delta = rowsum(dO * O)).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_math.h"
#include "core/cpu/cpu_sgemm.h"
#include "core/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace nl {

namespace {

constexpr int64_t kQueryTile = 32;  // query rows per task: a (32 x 64) score tile lives in L1
constexpr int64_t kKeyTile = 64;    // keys per inner tile, at most
constexpr int64_t kKeyStep = 16;    // a tile's width is a multiple of this (one AVX-512 vector of f32)
constexpr int64_t kRowBlock = 4;    // query rows computed together: one packed column load serves four
constexpr int64_t kRowChunk = 64;   // backward: query rows whose P and dS are kept (a multiple of kRowBlock)

// The width of a tile holding `count` keys: rounded up to whole vectors, so a short tile (a small T,
// the causal diagonal) does not compute the full kKeyTile columns.
inline int64_t tile_width(int64_t count) { return std::min(kKeyTile, (count + kKeyStep - 1) / kKeyStep * kKeyStep); }
constexpr double kParallelFlops = 1 << 18;  // below this much work one thread is faster

// The sizes of one call, and where row i of a head starts in each operand.
struct Dims {
    int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
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

using cpu_math::exp_of;  // the vectorizable exp for f32; std::exp for f64 (gradient checks)

// Keys [j0, j0 + count) of kv head g, transposed into packed (head_dim, width) with zero columns
// past count (width = tile_width(count)), so a row of scores is one loop over contiguous keys that
// vectorizes without horizontal sums. Packed once per tile, read by every query row of the task.
template <typename T>
void pack_transposed(const Dims& s, const T* src, int64_t b, int64_t j0, int64_t count, int64_t g, T* packed) {
    const int64_t hd = s.head_dim, width = tile_width(count);
    std::fill(packed, packed + hd * width, T(0));
    for (int64_t c = 0; c < count; ++c) {
        const T* row = src + s.kv_row(b, j0 + c, g);
        for (int64_t d = 0; d < hd; ++d) packed[d * width + c] = row[d];
    }
}

// f32: the gemm engine's block transpose (16 x 16 AVX-512 shuffles instead of the scalar moves above,
// which measured a tenth of the forward's time at T 256).
void pack_transposed(const Dims& s, const float* src, int64_t b, int64_t j0, int64_t count, int64_t g, float* packed) {
    const int64_t width = tile_width(count);
    transpose_pad_f32(src + s.kv_row(b, j0, g), s.kv_heads * s.head_dim, count, s.head_dim, packed, width, width);
}

// out[r][c] = sum_d a[r][d] * packed[d][c] for kRowBlock rows and the first `width` columns of a
// packed tile whose rows are `stride` apart, summed over d in order: every pass computes a score (or
// dp) the same way, whatever block a row is in and however many columns it takes, so the backward's
// probabilities are the forward's. The width is a compile-time constant inside (16, 32, 48 or 64),
// so the block's accumulators stay in vector registers and each packed column loaded serves four
// rows. A block of fewer rows passes a row of zeros for the rest.
template <int64_t Width, typename T>
inline void rows_times_packed_fixed(const T* const a[kRowBlock], const T* packed, int64_t stride, int64_t hd,
                                    T (*out)[kKeyTile]) {
    T acc[kRowBlock][Width] = {};
    for (int64_t d = 0; d < hd; ++d) {
        const T* col = packed + d * stride;
        for (int64_t r = 0; r < kRowBlock; ++r) {
            const T ad = a[r][d];
#pragma omp simd
            for (int64_t c = 0; c < Width; ++c) acc[r][c] = cpu_math::mul_add(ad, col[c], acc[r][c]);
        }
    }
    for (int64_t r = 0; r < kRowBlock; ++r) std::copy_n(acc[r], Width, out[r]);
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

// The max and the sum of a row of Width scores (Width a multiple of kKeyStep, known at compile time).
// For f32 on AVX-512 each is one vector reduction: GCC's `omp simd reduction` ends every row with a
// scalar loop over the lanes, and at T 64 and head size 32 the softmax is most of the forward's time.
// GCC 12's own headers trip -Wmaybe-uninitialized in the reduce intrinsics (their _mm512_undefined
// operands; GCC bug 105593): the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <int64_t Width, typename T>
inline T max_of(const T* x) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
        __m512 m = _mm512_loadu_ps(x);
        for (int64_t c = kKeyStep; c < Width; c += kKeyStep) m = _mm512_max_ps(m, _mm512_loadu_ps(x + c));
        return _mm512_reduce_max_ps(m);
    }
#endif
    T m = x[0];
    for (int64_t c = 1; c < Width; ++c) m = x[c] > m ? x[c] : m;
    return m;
}

template <int64_t Width, typename T>
inline T sum_of(const T* x) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
        __m512 sum = _mm512_loadu_ps(x);
        for (int64_t c = kKeyStep; c < Width; c += kKeyStep) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x + c));
        return _mm512_reduce_add_ps(sum);
    }
#endif
    T sum = T(0);
    for (int64_t c = 0; c < Width; ++c) sum += x[c];
    return sum;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

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

// One step of the online softmax for a block of kRowBlock rows over a tile of Width scores, row r
// having n[r] keys in the tile (0: it sees none, or pads the block): row r's scores become
// exp(scale * s - m) (0 past n[r]) under its new running max m, and rescale[r] is what the row's
// earlier sums are multiplied by to move to m (1 for a row with no keys here, whose scores become 0).
// Each stage runs for all rows before the next, so the rows' dependent chains (a reduction, the
// scalar exp of the rescale, a second reduction) can overlap. The operations on each row are the
// same as one row at a time.
template <int64_t Width, typename T>
inline void softmax_tile_block_fixed(T (*scores)[kKeyTile], const int64_t* n, T scale, T* row_max, T* row_sum,
                                     T* rescale) {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    T m[kRowBlock];
    for (int64_t r = 0; r < kRowBlock; ++r) {
        T* score = scores[r];
        const int64_t nr = n[r];
#pragma omp simd
        for (int64_t c = 0; c < Width; ++c) score[c] = c < nr ? score[c] * scale : kNegInf;
        const T tile_max = max_of<Width>(score);
        m[r] = tile_max > row_max[r] ? tile_max : row_max[r];
    }
    for (int64_t r = 0; r < kRowBlock; ++r)
        rescale[r] = n[r] > 0 ? exp_of(row_max[r] - m[r]) : T(1);  // 0 on the row's first tile (row_max -inf)
    for (int64_t r = 0; r < kRowBlock; ++r) {
        T* score = scores[r];
        if (n[r] <= 0) {  // the row adds nothing here
            std::fill_n(score, Width, T(0));
            continue;
        }
        // The masked keys hold -inf, so their exp is 0.
        const T mr = m[r];
        exp_shifted<Width>(score, mr);
        row_sum[r] = row_sum[r] * rescale[r] + sum_of<Width>(score);
        row_max[r] = mr;
    }
}

template <typename T>
inline void softmax_tile_block(int64_t width, T (*scores)[kKeyTile], const int64_t* n, T scale, T* row_max,
                               T* row_sum, T* rescale) {
    with_tile_width(width, [&](auto w) {
        softmax_tile_block_fixed<decltype(w)::value>(scores, n, scale, row_max, row_sum, rescale);
    });
}

// The backward's p = exp(scale * s - lse) (0 past n) and ds = p * (dp - delta) * scale of one row of
// a tile: `p` holds the scores s and `ds` the products dp = dout . v on entry. (ds carries the scale
// that dq and dk take.)
template <int64_t Width, typename T>
inline void gradient_tile_row_fixed(T* p, T* ds, int64_t n, T scale, T lse, T delta) {
#pragma omp simd
    for (int64_t c = 0; c < Width; ++c) p[c] = c < n ? p[c] * scale : -std::numeric_limits<T>::infinity();
    exp_shifted<Width>(p, lse);  // exp(scale * s - lse); the masked keys' -inf gives 0
#pragma omp simd
    for (int64_t c = 0; c < Width; ++c) ds[c] = p[c] * (ds[c] - delta) * scale;
}

template <typename T>
inline void gradient_tile_row(int64_t width, T* p, T* ds, int64_t n, T scale, T lse, T delta) {
    with_tile_width(width, [&](auto w) { gradient_tile_row_fixed<decltype(w)::value>(p, ds, n, scale, lse, delta); });
}

// y[r] = y[r] * y_scale[r] (when given) + sum_{c < count} w[r][c] * x[c] for kRowBlock rows, where x[c]
// is the row at x + c * x_stride and w[r][c] is at w + r * w_rs + c * w_cs (so P^T is P read the
// other way, not a copy): the products P V, dS K, P^T dO and dS^T Q, each a small gemm over the tile. The y rows are summed in registers over the whole count,
// a chunk of columns at a time (Chunk a compile-time width: 4, 2 or 1 vectors), and in order of c.
template <int64_t Chunk, typename T>
inline void rows_accumulate_fixed(const T* w, int64_t w_rs, int64_t w_cs, int64_t count, const T* x,
                                  int64_t x_stride, T* const y[kRowBlock], const T* y_scale, int64_t d0) {
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
    constexpr int64_t kVec = 64 / sizeof(T);  // one AVX-512 vector
    int64_t d0 = 0;
    for (; d0 + 4 * kVec <= hd; d0 += 4 * kVec) rows_accumulate_fixed<4 * kVec>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
    if (d0 + 2 * kVec <= hd) {
        rows_accumulate_fixed<2 * kVec>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
        d0 += 2 * kVec;
    }
    if (d0 + kVec <= hd) {
        rows_accumulate_fixed<kVec>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
        d0 += kVec;
    }
    for (; d0 < hd; ++d0) rows_accumulate_fixed<1>(w, w_rs, w_cs, count, x, x_stride, y, y_scale, d0);
}

// ---- forward ----

template <typename T>
void forward_impl(const Dims& s, const T* q, const T* k, const T* v, T* out, T* lse, T scale) {
    const int64_t hd = s.head_dim, tiles = (s.q_len + kQueryTile - 1) / kQueryTile;
    const int64_t tasks = s.batch * s.heads * tiles;
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile, tile_floats = hd * kKeyTile;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        std::vector<T> acc(static_cast<size_t>(kQueryTile * hd));  // (rows, hd): unnormalized output
        // The key tiles of one (batch, kv head), transposed: (key_tiles, hd, kKeyTile), each tile
        // packed to its own width, whole (with the keys later query tiles see too). A thread's tasks
        // come mostly in order, the query tiles of one head after another, so it packs a head's
        // tiles once as they are first needed instead of once per query tile (at T 256, 20 packs
        // per head where 4 do, a tenth of the forward's time). The contents are a copy of K, the
        // same whichever thread packs them, so the bits do not depend on the schedule.
        std::vector<T> head_keys_t(static_cast<size_t>(key_tiles * tile_floats));
        int64_t packed_head = -1, packed_tiles = 0;  // head_keys_t holds tiles [0, packed_tiles) of packed_head
        const std::vector<T> zero_row(static_cast<size_t>(hd), T(0));  // stands in for a block's missing rows
        std::vector<T> spare_row(static_cast<size_t>(hd));            // their output goes here, unread
        T scores[kRowBlock][kKeyTile], row_max[kQueryTile], row_sum[kQueryTile];
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t tile = task % tiles, h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
            const int64_t g = h / s.group();
            const int64_t i0 = tile * kQueryTile, rows = std::min(kQueryTile, s.q_len - i0);
            std::fill(acc.begin(), acc.end(), T(0));
            // All kQueryTile entries, the padding rows' too: the block softmax reads them (and
            // leaves them as they are).
            std::fill(row_max, row_max + kQueryTile, -std::numeric_limits<T>::infinity());
            std::fill(row_sum, row_sum + kQueryTile, T(0));
            const int64_t keys = s.visible(i0 + rows - 1);  // the tile's last row sees the most keys
            if (packed_head != b * s.kv_heads + g) {
                packed_head = b * s.kv_heads + g;
                packed_tiles = 0;
            }
            for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
                const int64_t count = std::min(kKeyTile, keys - j0), width = tile_width(count);
                const int64_t tile = j0 / kKeyTile;
                const int64_t packed_width = tile_width(std::min(kKeyTile, s.kv_len - j0));  // the whole tile's
                T* const keys_t = head_keys_t.data() + tile * tile_floats;
                for (; packed_tiles <= tile; ++packed_tiles) {
                    const int64_t p0 = packed_tiles * kKeyTile;
                    pack_transposed(s, k, b, p0, std::min(kKeyTile, s.kv_len - p0), g,
                                    head_keys_t.data() + packed_tiles * tile_floats);
                }
                for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
                    const int64_t block = std::min(kRowBlock, rows - r0);
                    if (s.visible(i0 + r0 + block - 1) <= j0) continue;  // no row of the block sees the tile
                    const T* q_rows[kRowBlock];
                    for (int64_t r = 0; r < kRowBlock; ++r)
                        q_rows[r] = r < block ? q + s.q_row(b, i0 + r0 + r, h) : zero_row.data();
                    // The first `width` columns of the packed tile: the keys this query tile sees
                    // (a row masks those past its own).
                    rows_times_packed(q_rows, keys_t, packed_width, hd, width, scores);
                    T rescale[kRowBlock];
                    T* acc_rows[kRowBlock];
                    int64_t n[kRowBlock];  // each row's keys in the tile (0 for a padding row)
                    for (int64_t r = 0; r < kRowBlock; ++r) {
                        const int64_t row = r0 + r;
                        n[r] = r < block ? std::max<int64_t>(0, std::min(s.visible(i0 + row) - j0, count)) : 0;
                        acc_rows[r] = r < block ? acc.data() + row * hd : spare_row.data();
                    }
                    softmax_tile_block(width, scores, n, scale, row_max + r0, row_sum + r0, rescale);
                    // acc = acc * rescale + P V over the keys the block's last row sees (the others' P is 0 there).
                    const int64_t n_max = std::min(s.visible(i0 + r0 + block - 1) - j0, count);
                    rows_accumulate(&scores[0][0], kKeyTile, 1, n_max, v + s.kv_row(b, j0, g), s.kv_heads * hd, acc_rows,
                                    rescale, hd);
                }
            }
            for (int64_t r = 0; r < rows; ++r) {
                const T inv = T(1) / row_sum[r];
                T* o = out + s.q_row(b, i0 + r, h);
                const T* a = acc.data() + r * hd;
                for (int64_t d = 0; d < hd; ++d) o[d] = a[d] * inv;
                lse[s.stat(b, h, i0 + r)] = row_max[r] + std::log(row_sum[r]);
            }
        }
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
                          int64_t rows, const int64_t* n, T scale, const T* zero_row, T (*p)[kKeyTile],
                          T (*ds)[kKeyTile]) {
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
        gradient_tile_row(width, p[r], ds[r], nr, scale, l, di);
        std::fill(p[r] + width, p[r] + stride, T(0));  // keys no row of the block sees
        std::fill(ds[r] + width, ds[r] + stride, T(0));
    }
}

template <typename T>
void backward_impl(const Dims& s, const T* q, const T* k, const T* v, const T* out, const T* dout, const T* lse,
                   T* delta, T* dq, T* dk, T* dv, T scale) {
    const int64_t hd = s.head_dim;
    const bool parallel = s.work() > kParallelFlops;
    // delta_i = dout_i . out_i, one per query row and head.
    const int64_t rows = s.batch * s.q_len * s.heads;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t h = row % s.heads, i = (row / s.heads) % s.q_len, b = row / (s.heads * s.q_len);
        delta[s.stat(b, h, i)] = dot(dout + row * hd, out + row * hd, hd);
    }

    // One task per (batch, kv head): it owns dk and dv of its keys and dq of its group's query heads,
    // so each probability tile is computed once and every sum has one owner and a fixed order (key
    // tiles in order, then heads, then rows; no atomics, the same bits for any thread count). The
    // query rows go in chunks of kRowChunk: P and dS of a chunk are kept so that dV
    // += P^T dO and dK += dS^T Q are register-blocked sums over the chunk's rows, four keys at a time.
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile;
    const int64_t tasks = s.batch * s.kv_heads;
#pragma omp parallel if (parallel)
    {
        std::vector<T> keys_t(static_cast<size_t>(hd * kKeyTile)), values_t(keys_t.size());  // (hd, kKeyTile)
        std::vector<T> dk_acc(static_cast<size_t>(kKeyTile * hd)), dv_acc(dk_acc.size());     // (kKeyTile, hd)
        std::vector<T> p(static_cast<size_t>(kRowChunk * kKeyTile)), ds(p.size());   // (kRowChunk, kKeyTile)
        const std::vector<T> zero_row(static_cast<size_t>(hd), T(0));  // stands in for a block's missing rows
        std::vector<T> spare_row(static_cast<size_t>(hd));            // their dq goes here, unread
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t g = task % s.kv_heads, b = task / s.kv_heads;
            const int64_t h_begin = g * s.group(), h_end = h_begin + s.group();
            for (int64_t h = h_begin; h < h_end; ++h)
                for (int64_t i = 0; i < s.q_len; ++i) std::fill_n(dq + s.q_row(b, i, h), hd, T(0));
            for (int64_t tile = 0; tile < key_tiles; ++tile) {
                const int64_t j0 = tile * kKeyTile, count = std::min(s.kv_len - j0, kKeyTile);
                const int64_t width = tile_width(count);
                const int64_t count4 = std::min(width, (count + kRowBlock - 1) / kRowBlock * kRowBlock);
                pack_transposed(s, k, b, j0, count, g, keys_t.data());
                pack_transposed(s, v, b, j0, count, g, values_t.data());
                std::fill(dk_acc.begin(), dk_acc.end(), T(0));
                std::fill(dv_acc.begin(), dv_acc.end(), T(0));
                const int64_t first_row = std::max<int64_t>(0, j0 - s.offset());  // the first row that sees key j0
                const T* key_rows = k + s.kv_row(b, j0, g);
                for (int64_t h = h_begin; h < h_end; ++h) {
                    for (int64_t c0 = first_row; c0 < s.q_len; c0 += kRowChunk) {
                        const int64_t chunk = std::min(kRowChunk, s.q_len - c0);
                        // P and dS of the chunk, four rows at a time (rows past the chunk get zeros), and
                        // dq += dS K for those rows.
                        for (int64_t r0 = 0; r0 < chunk; r0 += kRowBlock) {
                            const int64_t rows = std::min(kRowBlock, chunk - r0);
                            int64_t n[kRowBlock];
                            for (int64_t r = 0; r < rows; ++r)
                                n[r] = std::min(s.visible(c0 + r0 + r) - j0, count);  // keys of the tile row r sees
                            T(*p_block)[kKeyTile] = reinterpret_cast<T(*)[kKeyTile]>(p.data() + r0 * kKeyTile);
                            T(*ds_block)[kKeyTile] = reinterpret_cast<T(*)[kKeyTile]>(ds.data() + r0 * kKeyTile);
                            probabilities(s, q, dout, lse, delta, keys_t.data(), values_t.data(), width,
                                          tile_width(n[rows - 1]), b, h, c0 + r0, rows, n, scale, zero_row.data(),
                                          p_block, ds_block);
                            T* dq_rows[kRowBlock];
                            for (int64_t r = 0; r < kRowBlock; ++r)
                                dq_rows[r] = r < rows ? dq + s.q_row(b, c0 + r0 + r, h) : spare_row.data();
                            rows_accumulate(&ds_block[0][0], kKeyTile, 1, n[rows - 1], key_rows, s.kv_heads * hd, dq_rows,
                                            static_cast<const T*>(nullptr), hd);
                        }
                        // Transposed, four keys per pass: dV[c] += sum_r P[r][c] dO[r], dK[c] += sum_r dS[r][c] Q[r]
                        // over the chunk's rows from the first that sees key c (P and dS are zero above it,
                        // where a row does not see key c, and past count).
                        for (int64_t c = 0; c < count4; c += kRowBlock) {
                            const int64_t r_first = std::max<int64_t>(0, j0 + c - s.offset() - c0);
                            if (r_first >= chunk) break;  // nor the keys after c
                            const T* dout_rows = dout + s.q_row(b, c0 + r_first, h);
                            const T* q_rows = q + s.q_row(b, c0 + r_first, h);
                            T* dv_rows[kRowBlock];
                            T* dk_rows[kRowBlock];
                            for (int64_t r = 0; r < kRowBlock; ++r) {
                                dv_rows[r] = dv_acc.data() + (c + r) * hd;
                                dk_rows[r] = dk_acc.data() + (c + r) * hd;
                            }
                            rows_accumulate(p.data() + r_first * kKeyTile + c, 1, kKeyTile, chunk - r_first, dout_rows,
                                            s.heads * hd, dv_rows, static_cast<const T*>(nullptr), hd);
                            rows_accumulate(ds.data() + r_first * kKeyTile + c, 1, kKeyTile, chunk - r_first, q_rows,
                                            s.heads * hd, dk_rows, static_cast<const T*>(nullptr), hd);
                        }
                    }
                }
                for (int64_t c = 0; c < count; ++c) {
                    std::copy_n(dk_acc.data() + c * hd, hd, dk + s.kv_row(b, j0 + c, g));
                    std::copy_n(dv_acc.data() + c * hd, hd, dv + s.kv_row(b, j0 + c, g));
                }
            }
        }
    }
}

Dims check_dims(int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                        int64_t head_dim) {
    check_attention_sizes(batch, q_len, kv_len, heads, kv_heads, head_dim);
    return {batch, q_len, kv_len, heads, kv_heads, head_dim};
}

}  // namespace

void CpuBackend::attention_forward(DType dtype, const void* q, const void* k, const void* v, void* out, void* lse,
                                   int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, double scale) {
    const Dims s = check_dims(batch, q_len, kv_len, heads, kv_heads, head_dim);
    if (dtype == DType::F64) {
        forward_impl(s, static_cast<const double*>(q), static_cast<const double*>(k), static_cast<const double*>(v),
                     static_cast<double*>(out), static_cast<double*>(lse), scale);
    } else {
        NL_CHECK(dtype == DType::F32, "attention: dtype ", dtype_name(dtype));
        forward_impl(s, static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                     static_cast<float*>(out), static_cast<float*>(lse), static_cast<float>(scale));
    }
}

void CpuBackend::attention_backward(DType dtype, const void* q, const void* k, const void* v, const void* out,
                                    const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                                    int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, double scale) {
    const Dims s = check_dims(batch, q_len, kv_len, heads, kv_heads, head_dim);
    if (dtype == DType::F64) {
        using T = double;
        backward_impl(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                      static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const T*>(lse),
                      static_cast<T*>(delta), static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), scale);
    } else {
        NL_CHECK(dtype == DType::F32, "attention: dtype ", dtype_name(dtype));
        using T = float;
        backward_impl(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                      static_cast<const T*>(out), static_cast<const T*>(dout), static_cast<const T*>(lse),
                      static_cast<T*>(delta), static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv),
                      static_cast<T>(scale));
    }
}

}  // namespace nl
