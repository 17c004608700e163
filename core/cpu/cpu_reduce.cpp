// CPU reductions over a contiguous (outer, len, inner) block and the softmax row kernels.
// Sums accumulate in double (f32 and f64 alike); long rows are cut into fixed chunks whose partial
// results are combined in order, which both bounds the rounding error (blocked summation: error
// grows with chunk length + chunk count, not the row length) and lets threads share one row, with a
// result that does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {
namespace {

constexpr int64_t kParallelMin = 32768;  // below this many elements threads cost more than they save
constexpr int64_t kChunk = 32768;        // the unit of a long row: blocked summation and threading
constexpr int64_t kColBlock = 256;       // columns per task when inner > 1
constexpr int kLanes = 8;                // independent accumulators, so the adds pipeline/vectorize

// Returns partial(0, len) for a short row; else the in-order combination of fixed chunk partials.
template <typename P, typename Partial, typename Combine>
P reduce_chunked(int64_t len, bool parallel, Partial partial, Combine combine) {
    const int64_t chunks = std::max<int64_t>(1, (len + kChunk - 1) / kChunk);
    if (chunks == 1) return partial(0, len);
    std::vector<P> parts(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t c = 0; c < chunks; ++c) parts[c] = partial(c * kChunk, std::min(len, (c + 1) * kChunk));
    P result = parts[0];
    for (int64_t c = 1; c < chunks; ++c) result = combine(result, parts[c]);
    return result;
}

// sum of f(x[i]) over [0, n), in double, with kLanes accumulators.
template <typename T, typename F>
double sum_range(const T* x, int64_t n, F f) {
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int k = 0; k < kLanes; ++k) lanes[k] += f(static_cast<double>(x[i + k]));
    double total = 0.0;
    for (int k = 0; k < kLanes; ++k) total += lanes[k];
    for (; i < n; ++i) total += f(static_cast<double>(x[i]));
    return total;
}

// NaN wins in max/min, like torch.max/torch.min.
template <typename T>
inline T max_pick(T best, T x) {
    return (x > best || x != x) ? x : best;
}
template <typename T>
inline T min_pick(T best, T x) {
    return (x < best || x != x) ? x : best;
}

template <typename T>
struct ArgBest {
    T value;
    int64_t index;
};
// The later candidate wins only when strictly greater (first max wins); the first NaN counts as max.
template <typename T>
inline ArgBest<T> arg_pick(ArgBest<T> best, ArgBest<T> x) {
    const bool best_nan = best.value != best.value;
    return (!best_nan && (x.value > best.value || x.value != x.value)) ? x : best;
}

// A lambda, not a function: a function pointer would block inlining into sum_range's loop.
constexpr auto identity = [](double v) { return v; };

// max (or min) of x[0..n), n > 0, NaN winning. kLanes independent picks plus a separate NaN flag
// keep the loop in the plain `x > best ? x : best` form that compiles to vector max instructions.
template <typename T>
T pick_range(const T* x, int64_t n, bool is_max) {
    T lanes[kLanes];
    std::fill(lanes, lanes + kLanes, x[0]);
    int nan_seen = 0;
    int64_t i = 0;
    if (is_max) {
        for (; i + kLanes <= n; i += kLanes)
            for (int k = 0; k < kLanes; ++k) {
                const T v = x[i + k];
                lanes[k] = v > lanes[k] ? v : lanes[k];
                nan_seen |= v != v;
            }
    } else {
        for (; i + kLanes <= n; i += kLanes)
            for (int k = 0; k < kLanes; ++k) {
                const T v = x[i + k];
                lanes[k] = v < lanes[k] ? v : lanes[k];
                nan_seen |= v != v;
            }
    }
    T best = lanes[0];
    for (int k = 1; k < kLanes; ++k) best = is_max ? max_pick(best, lanes[k]) : min_pick(best, lanes[k]);
    for (; i < n; ++i) best = is_max ? max_pick(best, x[i]) : min_pick(best, x[i]);
    if (nan_seen) return std::numeric_limits<T>::quiet_NaN();
    return best;
}

// One contiguous row of length `len` (> 0 for max/min/argmax), reduced to out[0].
template <typename T>
void reduce_row(ReduceOp op, const T* x, int64_t len, void* out, int64_t correction, bool parallel) {
    auto plus = [](double p, double q) { return p + q; };
    auto sum_of = [&](auto f) {
        return reduce_chunked<double>(
            len, parallel, [&](int64_t b, int64_t e) { return sum_range(x + b, e - b, f); }, plus);
    };
    switch (op) {
        case ReduceOp::Sum: *static_cast<T*>(out) = T(sum_of(identity)); return;
        case ReduceOp::Mean: *static_cast<T*>(out) = T(sum_of(identity) / double(len)); return;
        case ReduceOp::SumSquares: *static_cast<T*>(out) = T(sum_of([](double v) { return v * v; })); return;
        case ReduceOp::Var: {
            // Two passes (mean, then squared deviations): no cancellation as in E[x^2] - E[x]^2.
            const double mean = sum_of(identity) / double(len);
            const double ss = sum_of([mean](double v) { return (v - mean) * (v - mean); });
            const int64_t denom = len - correction;
            *static_cast<T*>(out) = denom > 0 ? T(ss / double(denom)) : std::numeric_limits<T>::quiet_NaN();
            return;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
            const bool is_max = op == ReduceOp::Max;
            *static_cast<T*>(out) = reduce_chunked<T>(
                len, parallel,
                [&](int64_t b, int64_t e) { return pick_range(x + b, e - b, is_max); },
                [&](T p, T q) { return is_max ? max_pick(p, q) : min_pick(p, q); });
            return;
        }
        case ReduceOp::ArgMax: {
            const ArgBest<T> best = reduce_chunked<ArgBest<T>>(
                len, parallel,
                [&](int64_t b, int64_t e) {
                    ArgBest<T> r{x[b], b};
                    for (int64_t i = b + 1; i < e; ++i) r = arg_pick(r, ArgBest<T>{x[i], i});
                    return r;
                },
                arg_pick<T>);
            *static_cast<int64_t*>(out) = best.index;
            return;
        }
    }
    NL_CHECK(false, "unknown ReduceOp");
}

// Columns [c0, c0 + w) of one outer slab (len, inner), reduced down the len axis with per-column
// accumulators, so the loads stay contiguous along inner.
template <typename T>
void reduce_columns(ReduceOp op, const T* slab, int64_t len, int64_t inner, int64_t c0, int64_t w,
                    void* out, int64_t correction) {
    double acc[kColBlock];
    const double zeros[kColBlock] = {};
    // Sums of the columns, or with `center` of their squared deviations from it.
    auto sum_columns = [&](const double* center) {
        std::fill(acc, acc + w, 0.0);
        for (int64_t l = 0; l < len; ++l) {
            const T* r = slab + l * inner + c0;
            if (center == nullptr) {
                for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<double>(r[j]);
            } else {
                for (int64_t j = 0; j < w; ++j) {
                    const double d = static_cast<double>(r[j]) - center[j];
                    acc[j] += d * d;
                }
            }
        }
    };
    T* o = static_cast<T*>(out) + c0;
    switch (op) {
        case ReduceOp::Sum:
            sum_columns(nullptr);
            for (int64_t j = 0; j < w; ++j) o[j] = T(acc[j]);
            return;
        case ReduceOp::Mean:
            sum_columns(nullptr);
            for (int64_t j = 0; j < w; ++j) o[j] = T(acc[j] / double(len));
            return;
        case ReduceOp::SumSquares:
            sum_columns(zeros);
            for (int64_t j = 0; j < w; ++j) o[j] = T(acc[j]);
            return;
        case ReduceOp::Var: {
            double mean[kColBlock];
            sum_columns(nullptr);
            for (int64_t j = 0; j < w; ++j) mean[j] = acc[j] / double(len);
            sum_columns(mean);
            const int64_t denom = len - correction;
            for (int64_t j = 0; j < w; ++j)
                o[j] = denom > 0 ? T(acc[j] / double(denom)) : std::numeric_limits<T>::quiet_NaN();
            return;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
            const bool is_max = op == ReduceOp::Max;
            std::copy(slab + c0, slab + c0 + w, o);
            for (int64_t l = 1; l < len; ++l) {
                const T* r = slab + l * inner + c0;
                if (is_max) {
                    for (int64_t j = 0; j < w; ++j) o[j] = max_pick(o[j], r[j]);
                } else {
                    for (int64_t j = 0; j < w; ++j) o[j] = min_pick(o[j], r[j]);
                }
            }
            return;
        }
        case ReduceOp::ArgMax: {
            T best[kColBlock];
            int64_t* idx = static_cast<int64_t*>(out) + c0;
            std::copy(slab + c0, slab + c0 + w, best);
            std::fill(idx, idx + w, int64_t{0});
            for (int64_t l = 1; l < len; ++l) {
                const T* r = slab + l * inner + c0;
                for (int64_t j = 0; j < w; ++j) {
                    const ArgBest<T> p = arg_pick(ArgBest<T>{best[j], idx[j]}, ArgBest<T>{r[j], l});
                    best[j] = p.value;
                    idx[j] = p.index;
                }
            }
            return;
        }
    }
    NL_CHECK(false, "unknown ReduceOp");
}

template <typename T>
void reduce_typed(ReduceOp op, const T* in, void* out, int64_t outer, int64_t len, int64_t inner,
                  int64_t correction) {
    const size_t out_size = op == ReduceOp::ArgMax ? sizeof(int64_t) : sizeof(T);
    char* out_bytes = static_cast<char*>(out);
    const bool large = outer * len * inner >= kParallelMin;
    if (inner == 1) {
        // Many rows: one thread per row. Few long rows: the threads share each row's chunks.
        // Not one loop with `parallel for if (rows_parallel)`: the chunks' parallel region would then
        // be nested in an inactive one, and libgomp starts new threads for a nested team on every
        // call, which gradient clipping's many small sums would pay each step.
        if (large && outer >= omp_get_max_threads()) {
#pragma omp parallel for schedule(static)
            for (int64_t o = 0; o < outer; ++o)
                reduce_row(op, in + o * len, len, out_bytes + o * out_size, correction, false);
        } else {
            for (int64_t o = 0; o < outer; ++o)
                reduce_row(op, in + o * len, len, out_bytes + o * out_size, correction, large);
        }
        return;
    }
    const int64_t blocks = (inner + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (large)
    for (int64_t task = 0; task < outer * blocks; ++task) {
        const int64_t o = task / blocks;
        const int64_t c0 = (task % blocks) * kColBlock;
        reduce_columns(op, in + o * len * inner, len, inner, c0, std::min(kColBlock, inner - c0),
                       out_bytes + o * inner * out_size, correction);
    }
}

// ---- softmax rows ----

template <typename T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        // Subtracting the row max keeps exp() <= 1 (no overflow for inputs like 1000).
        const T m = pick_range(xr, cols, /*is_max=*/true);
        for (int64_t j = 0; j < cols; ++j) yr[j] = std::exp(xr[j] - m);
        const double s = sum_range(yr, cols, identity);  // separate pass: no serial add chain on exp
        if (log) {
            // log_softmax = x - max - log(sum exp(x - max))
            const T ls = T(std::log(s));
            for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) - ls;
        } else {
            const T inv = T(1.0 / s);
            for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
        }
    }
}

template <typename T>
void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
        const T* yr = y + r * cols;
        const T* dyr = dy + r * cols;
        T* dxr = dx + r * cols;
        if (log) {
            // y = log_softmax(x): dx = dy - softmax(x) * sum(dy), softmax(x) = exp(y)
            const T s = T(sum_range(dyr, cols, identity));
            for (int64_t j = 0; j < cols; ++j) dxr[j] = dyr[j] - std::exp(yr[j]) * s;
        } else {
            // y = softmax(x): dx = y * (dy - sum(dy * y))
            double dot = 0.0;
            for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(dyr[j]) * static_cast<double>(yr[j]);
            const T d = T(dot);
            for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - d);
        }
    }
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len,
                        int64_t inner, int64_t correction) {
    if (outer * inner == 0) return;
    NL_CHECK(len > 0 || (op != ReduceOp::Max && op != ReduceOp::Min && op != ReduceOp::ArgMax),
             "empty max/min/argmax reaches the kernel");
    if (dtype == DType::F32)
        return reduce_typed(op, static_cast<const float*>(in), out, outer, len, inner, correction);
    NL_CHECK(dtype == DType::F64, "reduce kernels take f32 or f64, got ", dtype_name(dtype));
    reduce_typed(op, static_cast<const double*>(in), out, outer, len, inner, correction);
}

void CpuBackend::softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                                 bool log) {
    if (rows * cols == 0) return;
    if (dtype == DType::F32)
        return softmax_rows(static_cast<const float*>(x), static_cast<float*>(y), rows, cols, log);
    NL_CHECK(dtype == DType::F64, "softmax kernels take f32 or f64, got ", dtype_name(dtype));
    softmax_rows(static_cast<const double*>(x), static_cast<double*>(y), rows, cols, log);
}

void CpuBackend::softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                                  int64_t cols, bool log) {
    if (rows * cols == 0) return;
    if (dtype == DType::F32)
        return softmax_backward_rows(static_cast<const float*>(y), static_cast<const float*>(dy),
                                     static_cast<float*>(dx), rows, cols, log);
    NL_CHECK(dtype == DType::F64, "softmax kernels take f32 or f64, got ", dtype_name(dtype));
    softmax_backward_rows(static_cast<const double*>(y), static_cast<const double*>(dy),
                          static_cast<double*>(dx), rows, cols, log);
}

}  // namespace nl
