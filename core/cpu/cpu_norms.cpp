// CPU kernels for the fused norms: one forward/backward pair serves LayerNorm, RMSNorm, RMSNorm with
// bias and pRMSNorm (statistics over the first k elements of each row), and DyT's pair (no statistic,
// at the end of the file). The formulas are written out in core/backend.h next to the declarations.
//
// Precision: T is the row type (double for f64, float for f32/bf16/f16; halves go through an f32
// scratch row). Row sums run in T in several SIMD accumulators (no add waits on the previous one),
// each lane flushed into double every 16 terms (lane_sums); dweight/dbias rows are
// summed in T over kRowBlock rows, then in double; the elementwise loops run in T, so f32 rows cost
// f32 arithmetic (about 1e-7 relative per element; dweight/dbias over thousands of rows ~1e-5). Row
// statistics use two passes (mean, then sum of squared deviations), never E[x^2] - E[x]^2, and the
// mean is applied as a hi + lo pair of T so a large mean (|mean| >> std) keeps its digits in f32.
// mean/rstd are saved as f32 (f64 for f64).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

// Row g of a (G, d) scratch buffer, or null when the buffer is empty (rows stored in T need none):
// arithmetic on an empty vector's data() (a null pointer) is undefined behaviour even unused.
template <typename T>
T* scratch_row(std::vector<T>& scratch, int64_t g, int64_t d) {
    return scratch.empty() ? nullptr : scratch.data() + g * d;
}

// Below this many elements a norm runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelElements = 32768;
// dweight/dbias partials: rows are cut into fixed chunks of at least kMinChunkRows rows and at most
// kMaxChunks chunks (see norm_backward_impl), so few rows mean few partial rows to sum.
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMinChunkRows = 16;
// lane_sums: kAccumulators independent vector accumulators of T (no add waits on the previous one, and
// enough of them to hide the add latency), each flushed into double lanes after kLaneTerms terms, so
// the rounding of a float sum stays near one float ulp of a 16-term sum, at float speed.
constexpr int kAccumulators = 4;
constexpr int64_t kLaneTerms = 16;
// dweight/dbias rows are accumulated in T over kRowBlock rows, then flushed into the double partial.
constexpr int64_t kRowBlock = 16;
// The forward computes the statistics of up to kMaxGroupRows rows together when they fit in
// kGroupBytes (see row_statistics and forward_group_rows).
constexpr int64_t kMaxGroupRows = 4;
constexpr int64_t kGroupBytes = 8192;
// The backward sweeps kBackwardGroupRows rows together (see backward_elements).
constexpr int kBackwardGroupRows = 2;
// The backward's elementwise sweep runs in blocks of kPrefetchBlock elements and prefetches the same
// span of the next rows, one kLineElements cache line at a time (64 bytes of f32).
constexpr int64_t kPrefetchBlock = 128;
constexpr int64_t kLineElements = 16;
// Columns per block when the dweight/dbias partials are summed (a block's sums stay in L1).
constexpr int64_t kColumnBlock = 256;

// One SIMD register of T (GCC/Clang vector extension): 64 bytes with AVX-512, 32 with AVX, else 16.
// Arithmetic on it is elementwise and a scalar operand is broadcast, so one term expression serves a
// vector of consecutive elements and a single element alike. Double is the flush type of the sums.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif
template <typename T>
struct SimdOf;
template <>
struct SimdOf<float> {
    typedef float type __attribute__((vector_size(kVectorBytes)));
    typedef double wide __attribute__((vector_size(2 * kVectorBytes)));  // the same lanes in double
};
template <>
struct SimdOf<double> {
    typedef double type __attribute__((vector_size(kVectorBytes)));
    typedef double wide __attribute__((vector_size(kVectorBytes)));
};

// V consecutive values from p: a SIMD vector (unaligned load) or, when V is the scalar type, one value.
template <typename V, typename T>
V load_as(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
}

// Stores a SIMD vector (unaligned) or, when V is the scalar type, one value at p.
template <typename T, typename V>
void store_as(T* p, const V& v) {
    std::memcpy(p, &v, sizeof(V));
}

// Stores v at p with a non-temporal (streaming) store when V is a SIMD vector (p aligned to it: the
// line is written without being read first), or plainly when V is the scalar type.
template <typename T, typename V>
void stream_as(T* p, const V& v) {
    if constexpr (sizeof(V) == sizeof(T)) {
        *p = v;
    } else if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX512F__)
        _mm512_stream_ps(p, (__m512)v);
#elif defined(__AVX__)
        _mm256_stream_ps(p, (__m256)v);
#else
        _mm_stream_ps(p, (__m128)v);
#endif
    } else {
#if defined(__AVX512F__)
        _mm512_stream_pd(p, (__m512d)v);
#elif defined(__AVX__)
        _mm256_stream_pd(p, (__m256d)v);
#else
        _mm_stream_pd(p, (__m128d)v);
#endif
    }
}

// Calls body(lanes, j) for j in [begin, end): with a SIMD vector tag for each full vector of elements
// starting at j, then with a scalar T tag for each element left over.
template <typename T, typename Body>
void for_each_lanes(int64_t begin, int64_t end, Body body) {
    using V = typename SimdOf<T>::type;
    constexpr int64_t kWidth = sizeof(V) / sizeof(T);
    int64_t j = begin;
    for (; j + kWidth <= end; j += kWidth) body(V{}, j);
    for (; j < end; ++j) body(T{}, j);
}

// total[i] = sum_{j < n} term(lanes, j)[i] for i < N: N sums in one sweep. term is called with a SIMD
// vector tag (then it returns the terms of elements j .. j + lanes - 1, which it reads with load_as)
// or a scalar T tag for the last few elements. The order is fixed by n alone (deterministic).
template <typename T, int N, typename Term>
std::array<double, N> lane_sums(int64_t n, Term term) {
    using V = typename SimdOf<T>::type;
    using Wide = typename SimdOf<T>::wide;
    constexpr int64_t kWidth = sizeof(V) / sizeof(T);
    constexpr int64_t kStep = kAccumulators * kWidth;  // elements per sweep of the accumulators
    Wide wide_total[N] = {};
    std::array<double, N> total = {};
    int64_t j = 0;
    while (j + kStep <= n) {
        const int64_t end = j + std::min(kLaneTerms * kStep, (n - j) / kStep * kStep);
        V acc[N][kAccumulators] = {};
        for (; j < end; j += kStep) {
            for (int u = 0; u < kAccumulators; ++u) {
                const std::array<V, N> t = term(V{}, j + u * kWidth);
                for (int i = 0; i < N; ++i) acc[i][u] += t[i];
            }
        }
        for (int i = 0; i < N; ++i)
            for (int u = 0; u < kAccumulators; ++u) wide_total[i] += __builtin_convertvector(acc[i][u], Wide);
    }
    for (; j < n; ++j) {
        const std::array<T, N> t = term(T{}, j);
        for (int i = 0; i < N; ++i) total[i] += static_cast<double>(t[i]);
    }
    for (int i = 0; i < N; ++i)
        for (int64_t l = 0; l < kWidth; ++l) total[i] += wide_total[i][l];
    return total;
}

// A (d) parameter row as T: the stored row, a converted copy, or `fill` when the pointer is null
// (weight 1, bias 0), so the kernels have no null branches in their inner loops.
template <typename T>
const T* param_row(DType dtype, const void* param, int64_t d, double fill, std::vector<T>& buffer) {
    if (param == nullptr) {
        buffer.assign(static_cast<size_t>(d), static_cast<T>(fill));
        return buffer.data();
    }
    if (!cpu_rows::stored_as<T>(dtype)) buffer.resize(static_cast<size_t>(d));  // a stored row needs no copy
    return cpu_rows::load<T>(dtype, param, 0, d, buffer.data());
}

// hi = T(v) and lo = T(v - hi): v to about twice T's precision. The empty asm makes hi opaque to the
// optimizer: GCC 12.2's SLP vectorizer, splitting G rows' means at once, folded (double)(float)v back
// to v and so made every lo 0 (wrong code; the large-offset LayerNorm test catches it).
template <typename T>
void split_hi_lo(double v, T& hi, T& lo) {
    T rounded = static_cast<T>(v);
    asm("" : "+m"(rounded));
    hi = rounded;
    lo = static_cast<T>(v - static_cast<double>(rounded));
}

// Statistics of G rows, each statistic in one sweep over the G rows (lane_sums over G terms): the mean
// (LayerNorm only) as a hi + lo pair of T, and rstd. xs: (G) row pointers; mu_hi, mu_lo, rstd: (G).
// Interleaving rows gives the out-of-order core G independent chains (sum, mean, centered squares,
// rstd): with short rows those chains, not the arithmetic, bound the forward.
template <typename T, int G>
void row_statistics(const T* const* xs, int64_t k, double eps, bool subtract_mean, T* mu_hi, T* mu_lo,
                    T* rstd) {
    std::array<double, G> mu = {};
    if (subtract_mean) {
        // Summing x - x[0] keeps a large common offset out of the T accumulators.
        std::array<T, G> x0;
        for (int g = 0; g < G; ++g) x0[g] = xs[g][0];
        const std::array<double, G> sums = lane_sums<T, G>(k, [xs, &x0](auto lanes, int64_t j) {
            std::array<decltype(lanes), G> terms;
            for (int g = 0; g < G; ++g) terms[g] = load_as<decltype(lanes)>(xs[g] + j) - x0[g];
            return terms;
        });
        for (int g = 0; g < G; ++g) mu[g] = static_cast<double>(x0[g]) + sums[g] / static_cast<double>(k);
    }
    // mu = mu_hi + mu_lo to about twice T's precision. x - mu_hi is exact when x is near the mean
    // (Sterbenz), so centering in T loses nothing even when |mean| >> std.
    for (int g = 0; g < G; ++g) split_hi_lo(mu[g], mu_hi[g], mu_lo[g]);
    // Second pass over centered values: exact enough even when |mean| >> std.
    const std::array<double, G> sum_sq = lane_sums<T, G>(k, [xs, mu_hi, mu_lo](auto lanes, int64_t j) {
        std::array<decltype(lanes), G> terms;
        for (int g = 0; g < G; ++g) {
            const auto centered = (load_as<decltype(lanes)>(xs[g] + j) - mu_hi[g]) - mu_lo[g];
            terms[g] = centered * centered;
        }
        return terms;
    });
    for (int g = 0; g < G; ++g)
        rstd[g] = static_cast<T>(1.0 / std::sqrt(sum_sq[g] / static_cast<double>(k) + eps));
}

// Rows per forward group: as many (up to kMaxGroupRows) as fit in kGroupBytes, so the statistics
// sweeps and the output sweep of a group find its rows in L1.
int64_t forward_group_rows(int64_t row_bytes) {
    int64_t group = kMaxGroupRows;
    while (group > 1 && group * row_bytes > kGroupBytes) group /= 2;
    return group;
}

template <typename T>
void norm_forward_impl(const NormForwardArgs& a) {
    const DType dtype = a.dtype;
    const void *x = a.x, *weight = a.weight, *bias = a.bias;  // (rows, d), (d), (d)
    void* y = a.y;                                              // (rows, d)
    T* mean = static_cast<T*>(a.mean);                          // (rows)
    T* rstd = static_cast<T*>(a.rstd);                          // (rows)
    const int64_t rows = a.rows, d = a.d, k = a.stat_count;
    const double eps = a.eps;
    const bool subtract_mean = a.subtract_mean;
    std::vector<T> w_buffer, b_buffer;
    const T* w = param_row<T>(dtype, weight, d, 1.0, w_buffer);  // (d)
    const T* b = param_row<T>(dtype, bias, d, 0.0, b_buffer);    // (d)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
    const bool streaming = !convert && cpu_rows::stream_output(rows * d * static_cast<int64_t>(sizeof(T)));
    const int64_t group_rows = forward_group_rows(d * static_cast<int64_t>(sizeof(T)));
    const int64_t groups = (rows + group_rows - 1) / group_rows;
#pragma omp parallel if (rows * d > kParallelElements)
    {
        std::vector<T> x_scratch(convert ? group_rows * d : 0), y_scratch(convert ? d : 0);  // (G, d), (d)
#pragma omp for schedule(static)
        for (int64_t group = 0; group < groups; ++group) {
            const int64_t r0 = group * group_rows, count = std::min(group_rows, rows - r0);
            const T* xs[kMaxGroupRows];  // (count) rows of x
            T mu_hi[kMaxGroupRows], mu_lo[kMaxGroupRows], rs[kMaxGroupRows];  // (count) each
            for (int64_t g = 0; g < count; ++g)
                xs[g] = cpu_rows::load<T>(dtype, x, r0 + g, d, scratch_row(x_scratch, g, d));
            static_assert(kMaxGroupRows == 4, "the dispatch below covers groups of 4, 2 and 1 rows");
            if (count == 4) {
                row_statistics<T, 4>(xs, k, eps, subtract_mean, mu_hi, mu_lo, rs);
            } else if (count == 2) {
                row_statistics<T, 2>(xs, k, eps, subtract_mean, mu_hi, mu_lo, rs);
            } else {
                for (int64_t g = 0; g < count; ++g)
                    row_statistics<T, 1>(xs + g, k, eps, subtract_mean, mu_hi + g, mu_lo + g, rs + g);
            }
            for (int64_t g = 0; g < count; ++g) {
                const int64_t r = r0 + g;
                const T* xr = xs[g];
                const T row_mu_hi = mu_hi[g], row_mu_lo = mu_lo[g], row_rstd = rs[g];
                T* yr = cpu_rows::output<T>(dtype, y, r, d, y_scratch.data());
                // While this row is computed (from cache), pull the next group's rows in, one prefetch
                // per vector, so memory and compute overlap instead of every group waiting on its first
                // sweep. Streamed rows go out straight from the registers (non-temporal vector stores).
                const T* next = !convert && r + group_rows < rows ? xr + group_rows * d : nullptr;
                const bool stream_row = streaming && reinterpret_cast<uintptr_t>(yr) % kVectorBytes == 0;
                for_each_lanes<T>(0, d, [=](auto lanes, int64_t j) {
                    using V = decltype(lanes);
                    if (next != nullptr) __builtin_prefetch(next + j);
                    const V xhat = ((load_as<V>(xr + j) - row_mu_hi) - row_mu_lo) * row_rstd;
                    const V out = xhat * load_as<V>(w + j) + load_as<V>(b + j);
                    if (stream_row) {
                        stream_as(yr + j, out);
                    } else {
                        store_as(yr + j, out);
                    }
                });
                cpu_rows::store<T>(dtype, y, r, d, yr);
                if (subtract_mean && mean != nullptr) mean[r] = row_mu_hi;
                rstd[r] = row_rstd;
            }
        }
        if (streaming) cpu_rows::stream_fence();
    }
}

// G rows of the backward's elementwise sweep. x, dy: (d) rows; mean, rstd, a = sm * sum(g) / k and
// b = sum(g * xhat) / k: the rows' scalars (see the derivation below); out: where each row's dx for
// the current column block goes.
template <typename T, int G>
struct RowGroup {
    const T* x[G];
    const T* dy[G];
    T mean[G], rstd[G], a[G], b[G];
    T* out[G];
};

// dx for elements [j0, j1) of G rows into out[g][0 .. j1 - j0); elements from jk on are past the
// statistics' k and get only the direct path. The rows' dy * xhat are added (summed over the G rows
// first) into dw_sum, and with kBiasGrad their dy into db_sum: the rows of a group share one
// read-modify-write of those (d) rows and one read of w, and RMSNorm (no bias) skips db_sum.
template <typename T, int G, bool kBiasGrad>
void backward_elements(const RowGroup<T, G>& rows, const T* w, T* dw_sum, T* db_sum, int64_t j0, int64_t jk,
                       int64_t j1) {
    // in_stats: elements before jk, whose dx also carries the statistics' terms.
    auto sweep = [&rows, w, dw_sum, db_sum, j0](auto lanes, int64_t j, auto in_stats) {
        (void)db_sum;  // read only with kBiasGrad
        using V = decltype(lanes);
        const V wj = load_as<V>(w + j);
        V dw = {}, db = {};
        for (int g = 0; g < G; ++g) {
            const V dy = load_as<V>(rows.dy[g] + j);
            const V xhat = (load_as<V>(rows.x[g] + j) - rows.mean[g]) * rows.rstd[g];
            if constexpr (decltype(in_stats)::value) {
                store_as(rows.out[g] + (j - j0), rows.rstd[g] * (dy * wj - (rows.a[g] + xhat * rows.b[g])));
            } else {
                store_as(rows.out[g] + (j - j0), rows.rstd[g] * (dy * wj));
            }
            dw += dy * xhat;
            db += dy;
        }
        store_as(dw_sum + j, load_as<V>(dw_sum + j) + dw);
        if constexpr (kBiasGrad) store_as(db_sum + j, load_as<V>(db_sum + j) + db);
    };
    for_each_lanes<T>(j0, jk, [&sweep](auto lanes, int64_t j) { sweep(lanes, j, std::true_type{}); });
    for_each_lanes<T>(jk, j1, [&sweep](auto lanes, int64_t j) { sweep(lanes, j, std::false_type{}); });
}

// One backward call as its row sweeps see it: the operands, and what is decided once for all rows
// (rows converted through scratch rows, dx streamed out, a bias gradient wanted).
template <typename T>
struct BackwardContext {
    DType dtype;
    const void *dy, *x;  // (rows, d) each
    void* dx;            // (rows, d)
    const T* mean;       // (rows)
    const T* rstd;       // (rows)
    const T* w;          // (d)
    int64_t rows, d, k;
    double inv_k;        // 1 / k
    bool subtract_mean, convert, streaming, bias_grad;
};

// One thread's buffers for the backward's row sweeps.
template <typename T>
struct BackwardScratch {
    explicit BackwardScratch(const BackwardContext<T>& c)
        : x_rows(group_values(c)), dy_rows(group_values(c)), dx_rows(group_values(c)), dw_acc(c.d),
          db_acc(c.bias_grad ? c.d : 0) {}
    // Values of a group's converted rows: none when rows are stored as T.
    static int64_t group_values(const BackwardContext<T>& c) { return c.convert ? kBackwardGroupRows * c.d : 0; }
    std::vector<T> x_rows, dy_rows, dx_rows;  // (G, d) each
    std::vector<T> dw_acc, db_acc;  // (d) each: sums over the current kRowBlock rows
    T out_blocks[kBackwardGroupRows][kPrefetchBlock];  // (G, kPrefetchBlock) dx on its way to streaming stores
};

// Rows r .. r + G - 1 as a RowGroup: their x and dy rows (converted into the scratch rows where they
// are not stored as T), mean and rstd; dxr: (G) where each row's dx goes.
template <typename T, int G>
void load_row_group(const BackwardContext<T>& c, BackwardScratch<T>& scratch, int64_t r, RowGroup<T, G>& group,
                    T* (&dxr)[G]) {
    for (int g = 0; g < G; ++g) {
        group.x[g] = cpu_rows::load<T>(c.dtype, c.x, r + g, c.d, scratch_row(scratch.x_rows, g, c.d));
        group.dy[g] = cpu_rows::load<T>(c.dtype, c.dy, r + g, c.d, scratch_row(scratch.dy_rows, g, c.d));
        dxr[g] = cpu_rows::output<T>(c.dtype, c.dx, r + g, c.d, scratch_row(scratch.dx_rows, g, c.d));
        group.mean[g] = c.subtract_mean ? c.mean[r + g] : T(0);
        group.rstd[g] = c.rstd[r + g];
    }
}

// The group's scalars a = sm * sum(g) / k and b = sum(g * xhat) / k, all its rows' sums in one sweep.
// Derivation (S = first k elements, sm = 1 for LayerNorm, 0 for RMS; mean = 0 for RMS):
//   xhat_i = (x_i - mean) * rstd,  rstd = (var + eps)^-1/2,  var = sum_S (x - mean)^2 / k
//   d xhat_i / d x_j = rstd * (delta_ij - sm [j in S] / k) - [j in S] * xhat_i * xhat_j * rstd / k
// (the mean term of d var / d x_j vanishes because sum_S (x - mean) = 0). With g = dy * w:
//   dx_j = sum_i g_i d xhat_i / d x_j
//        = rstd * (g_j - [j in S] * (sm * sum_i g_i / k + xhat_j * sum_i g_i xhat_i / k))
// where the sums run over all d elements (every output depends on rstd), divided by k.
// For k = d and sm = 1 this is llm.c's layernorm_backward.
template <typename T, int G>
void row_group_scalars(const BackwardContext<T>& c, RowGroup<T, G>& group) {
    const T* w = c.w;  // (d)
    // sums[2g] = sum(dy * w), sums[2g + 1] = sum(dy * w * xhat) of row g.
    const std::array<double, 2 * G> sums = lane_sums<T, 2 * G>(c.d, [&group, w](auto lanes, int64_t j) {
        using V = decltype(lanes);
        std::array<V, 2 * G> terms;
        for (int g = 0; g < G; ++g) {
            const V dy_w = load_as<V>(group.dy[g] + j) * load_as<V>(w + j);
            terms[2 * g] = dy_w;
            terms[2 * g + 1] = dy_w * ((load_as<V>(group.x[g] + j) - group.mean[g]) * group.rstd[g]);
        }
        return terms;
    });
    for (int g = 0; g < G; ++g) {
        group.a[g] = c.subtract_mean ? static_cast<T>(sums[2 * g] * c.inv_k) : T(0);
        group.b[g] = static_cast<T>(sums[2 * g + 1] * c.inv_k);
    }
}

// The group's elementwise sweep (rows r .. r + G - 1), kPrefetchBlock columns at a time: dx into dxr
// (G) rows, streamed out through scratch.out_blocks where dx is streamed, and the rows' dweight/dbias
// terms into scratch.dw_acc, db_acc.
template <typename T, int G>
void row_group_columns(const BackwardContext<T>& c, BackwardScratch<T>& scratch, int64_t r, RowGroup<T, G>& group,
                       T* const (&dxr)[G]) {
    const int64_t d = c.d;
    // While these rows are computed (from cache), pull the next rows in.
    const int64_t next_rows = !c.convert ? std::min<int64_t>(G, c.rows - (r + G)) : 0;
    for (int64_t j0 = 0; j0 < d; j0 += kPrefetchBlock) {
        const int64_t j1 = std::min(d, j0 + kPrefetchBlock), jk = std::clamp(c.k, j0, j1);
        for (int64_t n = 0; n < next_rows; ++n) {
            for (int64_t p = j0; p < j1; p += kLineElements) {
                __builtin_prefetch(group.x[0] + (G + n) * d + p);
                __builtin_prefetch(group.dy[0] + (G + n) * d + p);
            }
        }
        for (int g = 0; g < G; ++g) group.out[g] = c.streaming ? scratch.out_blocks[g] : dxr[g] + j0;
        if (c.bias_grad) {
            backward_elements<T, G, true>(group, c.w, scratch.dw_acc.data(), scratch.db_acc.data(), j0, jk, j1);
        } else {
            backward_elements<T, G, false>(group, c.w, scratch.dw_acc.data(), scratch.db_acc.data(), j0, jk, j1);
        }
        for (int g = 0; c.streaming && g < G; ++g)
            cpu_rows::stream_block(dxr[g] + j0, scratch.out_blocks[g], j1 - j0);
    }
}

// Rows r .. r + G - 1: their sums in one sweep, then their elementwise sweep together.
template <typename T, int G>
void backward_rows(const BackwardContext<T>& c, BackwardScratch<T>& scratch, int64_t r) {
    RowGroup<T, G> group;
    T* dxr[G];
    load_row_group(c, scratch, r, group, dxr);
    row_group_scalars(c, group);
    row_group_columns(c, scratch, r, group, dxr);
    for (int g = 0; g < G; ++g) cpu_rows::store<T>(c.dtype, c.dx, r + g, c.d, dxr[g]);
}

// Rows [row_begin, row_end) of one chunk, kRowBlock rows at a time: each block's dweight/dbias sums
// in T (scratch.dw_acc, db_acc), then added into the chunk's partial rows dw_row, db_row ((d) each,
// null when not wanted) in double.
template <typename T>
void backward_chunk(const BackwardContext<T>& c, BackwardScratch<T>& scratch, int64_t row_begin, int64_t row_end,
                    double* dw_row, double* db_row) {
    for (int64_t block = row_begin; block < row_end; block += kRowBlock) {
        const int64_t block_end = std::min(row_end, block + kRowBlock);
        std::fill(scratch.dw_acc.begin(), scratch.dw_acc.end(), T(0));
        if (c.bias_grad) std::fill(scratch.db_acc.begin(), scratch.db_acc.end(), T(0));
        int64_t r = block;
        for (; r + kBackwardGroupRows <= block_end; r += kBackwardGroupRows)
            backward_rows<T, kBackwardGroupRows>(c, scratch, r);
        for (; r < block_end; ++r) backward_rows<T, 1>(c, scratch, r);
        for (int64_t j = 0; dw_row != nullptr && j < c.d; ++j) dw_row[j] += static_cast<double>(scratch.dw_acc[j]);
        for (int64_t j = 0; db_row != nullptr && j < c.d; ++j) db_row[j] += static_cast<double>(scratch.db_acc[j]);
    }
}

// Sums the (chunks, d) partials in chunk order (the same order for every column, so deterministic), a
// block of columns at a time across threads, and stores them in out, a (d) row in the parameters' dtype.
// dtype: the parameters' (T's own, or a half converted on the way out).
template <typename T>
void sum_partials(DType dtype, int64_t d, const std::vector<double>& partial, int64_t chunks, void* out) {
    std::vector<T> out_scratch(cpu_rows::stored_as<T>(dtype) ? 0 : d);  // (d)
    T* row = cpu_rows::output<T>(dtype, out, 0, d, out_scratch.data());
#pragma omp parallel for schedule(static) if (chunks * d > kParallelElements)
    for (int64_t j0 = 0; j0 < d; j0 += kColumnBlock) {
        const int64_t width = std::min(kColumnBlock, d - j0);
        double sum[kColumnBlock] = {};  // (width)
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            const double* part = partial.data() + chunk * d + j0;
            for (int64_t j = 0; j < width; ++j) sum[j] += part[j];
        }
        for (int64_t j = 0; j < width; ++j) row[j0 + j] = static_cast<T>(sum[j]);
    }
    cpu_rows::store<T>(dtype, out, 0, d, row);
}

// The norms' backward (core/backend.h): dx row group by row group, and dweight/dbias through
// per-chunk partial rows.
template <typename T>
void norm_backward_impl(const NormBackwardArgs& a) {
    const int64_t rows = a.rows, d = a.d;
    void *dweight = a.dweight, *dbias = a.dbias;  // (d), (d)
    std::vector<T> w_buffer;
    const bool convert = !cpu_rows::stored_as<T>(a.dtype);
    const BackwardContext<T> c{
        .dtype = a.dtype,
        .dy = a.dy,
        .x = a.x,
        .dx = a.dx,
        .mean = static_cast<const T*>(a.mean),
        .rstd = static_cast<const T*>(a.rstd),
        .w = param_row<T>(a.dtype, a.weight, d, 1.0, w_buffer),
        .rows = rows,
        .d = d,
        .k = a.stat_count,
        .inv_k = 1.0 / static_cast<double>(a.stat_count),
        .subtract_mean = a.subtract_mean,
        .convert = convert,
        .streaming = !convert && cpu_rows::stream_output(rows * d * static_cast<int64_t>(sizeof(T))),
        .bias_grad = dbias != nullptr,
    };
    // dweight/dbias: rows are cut into fixed chunks that depend on `rows` only, each chunk sums its
    // rows in order into its own partial row (vectorized row axpys in T over kRowBlock rows, flushed
    // into double), then the partials are summed in chunk order. No atomics, and the same bits for any thread count.
    const int64_t chunks = std::clamp((rows + kMinChunkRows - 1) / kMinChunkRows, int64_t{1}, kMaxChunks);
    std::vector<double> dw_partial(dweight ? chunks * d : 0);  // (chunks, d)
    std::vector<double> db_partial(dbias ? chunks * d : 0);    // (chunks, d)
#pragma omp parallel if (rows * d > kParallelElements)
    {
        BackwardScratch<T> scratch(c);
#pragma omp for schedule(static)
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            double* dw_row = dweight ? dw_partial.data() + chunk * d : nullptr;  // (d)
            double* db_row = dbias ? db_partial.data() + chunk * d : nullptr;    // (d)
            backward_chunk(c, scratch, chunk * rows / chunks, (chunk + 1) * rows / chunks, dw_row, db_row);
        }
        if (c.streaming) cpu_rows::stream_fence();
    }
    if (dweight != nullptr) sum_partials<T>(a.dtype, d, dw_partial, chunks, dweight);
    if (dbias != nullptr) sum_partials<T>(a.dtype, d, db_partial, chunks, dbias);
}

// ---- DyT: y = tanh(alpha * x) * w + b (core/backend.h) ----
// Elementwise, so the forward and dx go row by row across threads, each element on its own; tanh in T
// (tanh_of: the vectorizable f32 tanh for f32 and the halves, std::tanh for f64). dalpha, dweight and
// dbias are summed as the norms' dweight: fixed chunks of rows, each chunk's terms added per column in
// T over kRowBlock rows and flushed into the chunk's double partials, the partials summed in chunk
// order; dalpha's per-column terms are summed over the columns in double at each flush. No atomics:
// the same bits for any thread count.

// Where a row's y or dx is computed: the output row itself, or (halves, or a streamed output) `scratch`,
// which finish_row then converts or streams out.
template <typename T>
T* row_out(DType dtype, void* base, int64_t r, int64_t d, bool streaming, T* scratch) {
    return streaming ? scratch : cpu_rows::output<T>(dtype, base, r, d, scratch);
}
template <typename T>
void finish_row(DType dtype, void* base, int64_t r, int64_t d, bool streaming, const T* row) {
    if (streaming) {
        cpu_rows::stream_block(static_cast<T*>(base) + r * d, row, d);
    } else {
        cpu_rows::store<T>(dtype, base, r, d, row);
    }
}

// One row of the forward, y (d) from x, w, b (d each); __restrict as in dyt_backward_row.
template <typename T>
void dyt_forward_row(const T* __restrict x, const T* __restrict w, const T* __restrict b, T alpha, int64_t d,
                     T* __restrict y) {
    for (int64_t j = 0; j < d; ++j) y[j] = cpu_math::tanh_of(alpha * x[j]) * w[j] + b[j];
}

template <typename T>
void dyt_forward_impl(const DytForwardArgs& a) {
    const DType dtype = a.dtype;
    const int64_t rows = a.rows, d = a.d;
    std::vector<T> alpha_buffer, w_buffer, b_buffer;
    const T alpha = param_row<T>(dtype, a.alpha, 1, 0.0, alpha_buffer)[0];
    const T* w = param_row<T>(dtype, a.weight, d, 1.0, w_buffer);  // (d)
    const T* b = param_row<T>(dtype, a.bias, d, 0.0, b_buffer);    // (d)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
    const bool streaming = !convert && cpu_rows::stream_output(rows * d * static_cast<int64_t>(sizeof(T)));
#pragma omp parallel if (rows * d > kParallelElements)
    {
        std::vector<T> x_scratch(convert ? d : 0), y_scratch(convert || streaming ? d : 0);  // (d) each
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const T* xr = cpu_rows::load<T>(dtype, a.x, r, d, x_scratch.data());  // (d)
            T* yr = row_out<T>(dtype, a.y, r, d, streaming, y_scratch.data());     // (d)
            dyt_forward_row<T>(xr, w, b, alpha, d, yr);
            finish_row<T>(dtype, a.y, r, d, streaming, yr);
        }
        if (streaming) cpu_rows::stream_fence();
    }
}

// One row of the backward: dx (d), and the row's terms added to the column sums da, dw, db (d each).
// __restrict: the rows and the sums never overlap, and saying so lets the compiler vectorize the loop
// (with seven pointers it gives up on the run-time overlap checks, and the loop ran ~10x slower).
template <typename T>
void dyt_backward_row(const T* __restrict x, const T* __restrict dy, const T* __restrict w, T alpha, int64_t d,
                      T* __restrict dx, T* __restrict da, T* __restrict dw, T* __restrict db) {
    for (int64_t j = 0; j < d; ++j) {
        const T t = cpu_math::tanh_of(alpha * x[j]);
        const T dt = dy[j] * w[j] * (T(1) - t * t);  // d loss / d (alpha x_j)
        dx[j] = dt * alpha;
        da[j] += dt * x[j];
        dw[j] += dy[j] * t;
        db[j] += dy[j];
    }
}

template <typename T>
void dyt_backward_impl(const DytBackwardArgs& a) {
    const DType dtype = a.dtype;
    const int64_t rows = a.rows, d = a.d;
    std::vector<T> alpha_buffer, w_buffer;
    const T alpha = param_row<T>(dtype, a.alpha, 1, 0.0, alpha_buffer)[0];
    const T* w = param_row<T>(dtype, a.weight, d, 1.0, w_buffer);  // (d)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
    const bool streaming = !convert && cpu_rows::stream_output(rows * d * static_cast<int64_t>(sizeof(T)));
    const bool want_dalpha = a.dalpha != nullptr, want_dweight = a.dweight != nullptr, want_dbias = a.dbias != nullptr;
    // The chunks depend on `rows` only (see norm_backward_impl).
    const int64_t chunks = std::clamp((rows + kMinChunkRows - 1) / kMinChunkRows, int64_t{1}, kMaxChunks);
    std::vector<double> da_partial(chunks, 0.0);                   // (chunks)
    std::vector<double> dw_partial(want_dweight ? chunks * d : 0);  // (chunks, d)
    std::vector<double> db_partial(want_dbias ? chunks * d : 0);    // (chunks, d)
#pragma omp parallel if (rows * d > kParallelElements)
    {
        std::vector<T> x_scratch(convert ? d : 0), dy_scratch(convert ? d : 0);  // (d) each
        std::vector<T> dx_scratch(convert || streaming ? d : 0);                 // (d)
        std::vector<T> da_acc(d), dw_acc(d), db_acc(d);  // (d) each: a kRowBlock's terms per column
#pragma omp for schedule(static)
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            const int64_t row_begin = chunk * rows / chunks, row_end = (chunk + 1) * rows / chunks;
            double* dw_row = want_dweight ? dw_partial.data() + chunk * d : nullptr;  // (d)
            double* db_row = want_dbias ? db_partial.data() + chunk * d : nullptr;    // (d)
            for (int64_t block = row_begin; block < row_end; block += kRowBlock) {
                std::fill(da_acc.begin(), da_acc.end(), T(0));
                std::fill(dw_acc.begin(), dw_acc.end(), T(0));
                std::fill(db_acc.begin(), db_acc.end(), T(0));
                for (int64_t r = block; r < std::min(row_end, block + kRowBlock); ++r) {
                    const T* xr = cpu_rows::load<T>(dtype, a.x, r, d, x_scratch.data());     // (d)
                    const T* dyr = cpu_rows::load<T>(dtype, a.dy, r, d, dy_scratch.data());  // (d)
                    T* dxr = row_out<T>(dtype, a.dx, r, d, streaming, dx_scratch.data());    // (d)
                    dyt_backward_row<T>(xr, dyr, w, alpha, d, dxr, da_acc.data(), dw_acc.data(), db_acc.data());
                    finish_row<T>(dtype, a.dx, r, d, streaming, dxr);
                }
                double da = 0.0;
                for (int64_t j = 0; want_dalpha && j < d; ++j) da += static_cast<double>(da_acc[j]);
                da_partial[chunk] += da;
                for (int64_t j = 0; dw_row != nullptr && j < d; ++j) dw_row[j] += static_cast<double>(dw_acc[j]);
                for (int64_t j = 0; db_row != nullptr && j < d; ++j) db_row[j] += static_cast<double>(db_acc[j]);
            }
        }
        if (streaming) cpu_rows::stream_fence();
    }
    if (want_dalpha) {
        double da = 0.0;
        for (int64_t chunk = 0; chunk < chunks; ++chunk) da += da_partial[chunk];
        T value = static_cast<T>(da);
        T* out = cpu_rows::output<T>(dtype, a.dalpha, 0, 1, &value);
        *out = value;
        cpu_rows::store<T>(dtype, a.dalpha, 0, 1, out);
    }
    if (want_dweight) sum_partials<T>(dtype, d, dw_partial, chunks, a.dweight);
    if (want_dbias) sum_partials<T>(dtype, d, db_partial, chunks, a.dbias);
}

}  // namespace

void CpuBackend::norm_forward(const NormForwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        norm_forward_impl<double>(a);
    } else {
        norm_forward_impl<float>(a);
    }
}

void CpuBackend::norm_backward(const NormBackwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        norm_backward_impl<double>(a);
    } else {
        norm_backward_impl<float>(a);
    }
}

void CpuBackend::dyt_forward(const DytForwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        dyt_forward_impl<double>(a);
    } else {
        dyt_forward_impl<float>(a);
    }
}

void CpuBackend::dyt_backward(const DytBackwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        dyt_backward_impl<double>(a);
    } else {
        dyt_backward_impl<float>(a);
    }
}

}  // namespace nl
