// CPU kernels for fused causal attention (the formulas are in core/backend.h next to the declarations):
// FlashAttention's tiling on the CPU. A task is one (batch, head, tile of query rows) in the forward
// and the query pass of the backward, one (batch, kv head, tile of keys) in the key pass; tasks are
// independent, so OpenMP hands them out dynamically (causal tiles differ in cost, and a thread that
// loses its core to another process does not hold the others up) without changing a bit.
// References: Dao et al. 2022, "FlashAttention" (Algorithm 1: tiles and the online softmax); Dao 2023,
// "FlashAttention-2" (the backward from the saved logsumexp, delta = rowsum(dO * O)).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kQueryTile = 32;  // query rows per task: a (32 x 64) score tile lives in L1
constexpr int64_t kKeyTile = 64;    // keys per inner tile
constexpr double kParallelFlops = 1 << 20;  // below this much work one thread is faster

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

// One order of summation for every dot product, so the forward and both backward passes recompute
// exactly the same scores.
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
    return s;
}

template <typename T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {  // y += alpha * x
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// ---- forward ----

template <typename T>
void forward_impl(const Dims& s, const T* q, const T* k, const T* v, T* out, T* lse, T scale) {
    const int64_t hd = s.head_dim, tiles = (s.q_len + kQueryTile - 1) / kQueryTile;
    const int64_t tasks = s.batch * s.heads * tiles;
#pragma omp parallel if (s.work() > kParallelFlops)
    {
        std::vector<T> acc(static_cast<size_t>(kQueryTile * hd));  // (rows, hd): unnormalized output
        std::vector<T> score(static_cast<size_t>(kKeyTile));        // one row of the score tile
        T row_max[kQueryTile], row_sum[kQueryTile];
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t tile = task % tiles, h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
            const int64_t g = h / s.group();
            const int64_t i0 = tile * kQueryTile, rows = std::min(kQueryTile, s.q_len - i0);
            std::fill(acc.begin(), acc.end(), T(0));
            std::fill(row_max, row_max + rows, -std::numeric_limits<T>::infinity());
            std::fill(row_sum, row_sum + rows, T(0));
            const int64_t keys = s.visible(i0 + rows - 1);  // the tile's last row sees the most keys
            for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t jn = std::min(s.visible(i0 + r), j0 + kKeyTile);  // this row's keys in the tile
                    if (jn <= j0) continue;
                    const T* qi = q + s.q_row(b, i0 + r, h);
                    T m = row_max[r];
                    for (int64_t j = j0; j < jn; ++j) {
                        score[j - j0] = scale * dot(qi, k + s.kv_row(b, j, g), hd);
                        m = std::max(m, score[j - j0]);
                    }
                    // Online softmax: rescale what was summed under the old max to the new one.
                    const T rescale = std::exp(row_max[r] - m);
                    T* a = acc.data() + r * hd;
                    T sum = row_sum[r] * rescale;
                    for (int64_t d = 0; d < hd; ++d) a[d] *= rescale;
                    for (int64_t j = j0; j < jn; ++j) {
                        const T p = std::exp(score[j - j0] - m);
                        sum += p;
                        axpy(p, v + s.kv_row(b, j, g), a, hd);
                    }
                    row_max[r] = m;
                    row_sum[r] = sum;
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

// p_ij and ds_ij of query row (b, h, i) against keys [j0, jn), into p and ds.
template <typename T>
inline void probabilities(const Dims& s, const T* q, const T* k, const T* v, const T* dout, const T* lse,
                          const T* delta, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t jn, T scale, T* p,
                          T* ds) {
    const int64_t hd = s.head_dim, g = h / s.group();
    const T* qi = q + s.q_row(b, i, h);
    const T* doi = dout + s.q_row(b, i, h);
    const T l = lse[s.stat(b, h, i)], di = delta[s.stat(b, h, i)];
    for (int64_t j = j0; j < jn; ++j) {
        const T pj = std::exp(scale * dot(qi, k + s.kv_row(b, j, g), hd) - l);
        p[j - j0] = pj;
        ds[j - j0] = pj * (dot(doi, v + s.kv_row(b, j, g), hd) - di);
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

    // Key pass: dk and dv of a tile of keys of one kv head, summed over its query heads and every
    // query row that sees them (rows in order, heads in order).
    const int64_t key_tiles = (s.kv_len + kKeyTile - 1) / kKeyTile;
    const int64_t key_tasks = s.batch * s.kv_heads * key_tiles;
#pragma omp parallel if (parallel)
    {
        std::vector<T> dk_acc(static_cast<size_t>(kKeyTile * hd)), dv_acc(dk_acc.size());  // (keys, hd)
        std::vector<T> p(static_cast<size_t>(kKeyTile)), ds(p.size());
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < key_tasks; ++task) {
            const int64_t tile = task % key_tiles, g = (task / key_tiles) % s.kv_heads;
            const int64_t b = task / (key_tiles * s.kv_heads);
            const int64_t j0 = tile * kKeyTile, jn = std::min(s.kv_len, j0 + kKeyTile);
            std::fill(dk_acc.begin(), dk_acc.end(), T(0));
            std::fill(dv_acc.begin(), dv_acc.end(), T(0));
            // The first query row that sees key j0: position offset + i >= j0.
            const int64_t first_row = std::max<int64_t>(0, j0 - s.offset());
            for (int64_t h = g * s.group(); h < (g + 1) * s.group(); ++h) {
                for (int64_t i = first_row; i < s.q_len; ++i) {
                    const int64_t jr = std::min(jn, s.visible(i));  // keys [j0, jr) of the tile this row sees
                    probabilities(s, q, k, v, dout, lse, delta, b, h, i, j0, jr, scale, p.data(), ds.data());
                    const T* qi = q + s.q_row(b, i, h);
                    const T* doi = dout + s.q_row(b, i, h);
                    for (int64_t j = j0; j < jr; ++j) {
                        axpy(p[j - j0], doi, dv_acc.data() + (j - j0) * hd, hd);
                        axpy(scale * ds[j - j0], qi, dk_acc.data() + (j - j0) * hd, hd);
                    }
                }
            }
            for (int64_t j = j0; j < jn; ++j) {
                std::copy_n(dk_acc.data() + (j - j0) * hd, hd, dk + s.kv_row(b, j, g));
                std::copy_n(dv_acc.data() + (j - j0) * hd, hd, dv + s.kv_row(b, j, g));
            }
        }
    }

    // Query pass: dq of a tile of query rows of one head, summed over the keys in order.
    const int64_t query_tiles = (s.q_len + kQueryTile - 1) / kQueryTile;
    const int64_t query_tasks = s.batch * s.heads * query_tiles;
#pragma omp parallel if (parallel)
    {
        std::vector<T> p(static_cast<size_t>(kKeyTile)), ds(p.size());
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < query_tasks; ++task) {
            const int64_t tile = task % query_tiles, h = (task / query_tiles) % s.heads;
            const int64_t b = task / (query_tiles * s.heads), g = h / s.group();
            const int64_t i0 = tile * kQueryTile, i_end = std::min(s.q_len, i0 + kQueryTile);
            for (int64_t i = i0; i < i_end; ++i) {
                T* dqi = dq + s.q_row(b, i, h);
                std::fill(dqi, dqi + hd, T(0));
                const int64_t keys = s.visible(i);
                for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
                    const int64_t jn = std::min(keys, j0 + kKeyTile);
                    probabilities(s, q, k, v, dout, lse, delta, b, h, i, j0, jn, scale, p.data(), ds.data());
                    for (int64_t j = j0; j < jn; ++j) axpy(scale * ds[j - j0], k + s.kv_row(b, j, g), dqi, hd);
                }
            }
        }
    }
}

Dims check_dims(int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads, int64_t head_dim) {
    NL_CHECK(batch >= 0 && q_len >= 0 && kv_len >= q_len && head_dim > 0 && kv_heads > 0 && heads % kv_heads == 0,
             "attention sizes: batch ", batch, ", q_len ", q_len, ", kv_len ", kv_len, ", heads ", heads,
             ", kv_heads ", kv_heads, ", head_dim ", head_dim);
    NL_CHECK(kv_len > 0 || q_len == 0, "attention: no keys");
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
