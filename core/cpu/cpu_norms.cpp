// CPU kernels for the fused norms: one forward/backward pair serves LayerNorm, RMSNorm, RMSNorm with
// bias and pRMSNorm (statistics over the first k elements of each row). The formulas are written out
// in core/backend.h next to the declarations.
//
// Precision: per-row math (sums, centering, scaling) runs in double for every dtype; f32/bf16/f16
// rows are read as f32 and the result is rounded once on store. Row sums use two passes (mean, then
// sum of squared deviations), never E[x^2] - E[x]^2. mean/rstd are saved as f32 (f64 for f64).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/error.h"

namespace nl {

namespace {

// Below this many elements a norm runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelElements = 32768;
// dweight/dbias partials: rows are cut into at most this many fixed chunks (see norm_backward_impl).
constexpr int64_t kMaxChunks = 64;

// A (d) parameter row as T: the stored row, a converted copy, or `fill` when the pointer is null
// (weight 1, bias 0), so the kernels have no null branches in their inner loops.
template <typename T>
const T* param_row(DType dtype, const void* param, int64_t d, double fill, std::vector<T>& buffer) {
    buffer.resize(static_cast<size_t>(d));
    if (param == nullptr) {
        std::fill(buffer.begin(), buffer.end(), static_cast<T>(fill));
        return buffer.data();
    }
    return cpu_rows::load<T>(dtype, param, 0, d, buffer.data());
}

// T is the row type: double for f64, float for f32/bf16/f16. mean, rstd: (rows).
template <typename T>
void norm_forward_impl(DType dtype, const void* x, const void* weight, const void* bias, void* y,
                       T* mean, T* rstd, int64_t rows, int64_t d, double eps, bool subtract_mean,
                       int64_t k) {
    std::vector<T> w_buffer, b_buffer;
    const T* w = param_row<T>(dtype, weight, d, 1.0, w_buffer);  // (d)
    const T* b = param_row<T>(dtype, bias, d, 0.0, b_buffer);    // (d)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
#pragma omp parallel if (rows * d > kParallelElements)
    {
        std::vector<T> x_scratch(convert ? d : 0), y_scratch(convert ? d : 0);  // (d) each
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const T* xr = cpu_rows::load<T>(dtype, x, r, d, x_scratch.data());
            T* yr = cpu_rows::output<T>(dtype, y, r, d, y_scratch.data());
            double mu = 0.0;
            if (subtract_mean) {
                double sum = 0.0;
#pragma omp simd reduction(+ : sum)
                for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(xr[j]);
                mu = sum / static_cast<double>(k);
            }
            // Second pass over centered values: exact enough even when |mean| >> std.
            double sum_sq = 0.0;
#pragma omp simd reduction(+ : sum_sq)
            for (int64_t j = 0; j < k; ++j) {
                const double c = static_cast<double>(xr[j]) - mu;
                sum_sq += c * c;
            }
            const double rs = 1.0 / std::sqrt(sum_sq / static_cast<double>(k) + eps);
            for (int64_t j = 0; j < d; ++j) {
                const double xhat = (static_cast<double>(xr[j]) - mu) * rs;
                yr[j] = static_cast<T>(xhat * static_cast<double>(w[j]) + static_cast<double>(b[j]));
            }
            cpu_rows::store<T>(dtype, y, r, d, yr);
            if (subtract_mean && mean != nullptr) mean[r] = static_cast<T>(mu);
            rstd[r] = static_cast<T>(rs);
        }
    }
}

// Derivation (S = first k elements, sm = 1 for LayerNorm, 0 for RMS; mean = 0 for RMS):
//   xhat_i = (x_i - mean) * rstd,  rstd = (var + eps)^-1/2,  var = sum_S (x - mean)^2 / k
//   d xhat_i / d x_j = rstd * (delta_ij - sm [j in S] / k) - [j in S] * xhat_i * xhat_j * rstd / k
// (the mean term of d var / d x_j vanishes because sum_S (x - mean) = 0). With g = dy * w:
//   dx_j = sum_i g_i d xhat_i / d x_j
//        = rstd * (g_j - [j in S] * (sm * sum_i g_i / k + xhat_j * sum_i g_i xhat_i / k))
// where the sums run over all d elements (every output depends on rstd), divided by k.
// For k = d and sm = 1 this is llm.c's layernorm_backward.
template <typename T>
void norm_backward_impl(DType dtype, const void* dy, const void* x, const void* weight,
                        const T* mean, const T* rstd, void* dx, void* dweight, void* dbias,
                        int64_t rows, int64_t d, bool subtract_mean, int64_t k) {
    std::vector<T> w_buffer;
    const T* w = param_row<T>(dtype, weight, d, 1.0, w_buffer);  // (d)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
    // dweight/dbias: rows are cut into fixed chunks that depend on `rows` only, each chunk sums its
    // rows in order into its own partial row, then the partials are summed in chunk order. No
    // atomics, and the same bits for any thread count.
    const int64_t chunks = std::max<int64_t>(1, std::min(rows, kMaxChunks));
    std::vector<double> dw_partial(dweight ? chunks * d : 0);  // (chunks, d)
    std::vector<double> db_partial(dbias ? chunks * d : 0);    // (chunks, d)
    const double inv_k = 1.0 / static_cast<double>(k);
#pragma omp parallel if (rows * d > kParallelElements)
    {
        std::vector<T> x_scratch(convert ? d : 0), dy_scratch(convert ? d : 0),
            dx_scratch(convert ? d : 0);  // (d) each
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; ++c) {
            double* dw_row = dweight ? dw_partial.data() + c * d : nullptr;  // (d)
            double* db_row = dbias ? db_partial.data() + c * d : nullptr;    // (d)
            const int64_t row_end = (c + 1) * rows / chunks;
            for (int64_t r = c * rows / chunks; r < row_end; ++r) {
                const T* xr = cpu_rows::load<T>(dtype, x, r, d, x_scratch.data());
                const T* dyr = cpu_rows::load<T>(dtype, dy, r, d, dy_scratch.data());
                T* dxr = cpu_rows::output<T>(dtype, dx, r, d, dx_scratch.data());
                const double mu = subtract_mean ? static_cast<double>(mean[r]) : 0.0;
                const double rs = static_cast<double>(rstd[r]);
                double sum_g = 0.0, sum_g_xhat = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
                for (int64_t j = 0; j < d; ++j) {
                    const double xhat = (static_cast<double>(xr[j]) - mu) * rs;
                    const double g = static_cast<double>(dyr[j]) * static_cast<double>(w[j]);
                    sum_g += g;
                    sum_g_xhat += g * xhat;
                }
                const double a = subtract_mean ? sum_g * inv_k : 0.0;
                const double b = sum_g_xhat * inv_k;
                for (int64_t j = 0; j < d; ++j) {
                    const double xhat = (static_cast<double>(xr[j]) - mu) * rs;
                    const double g = static_cast<double>(dyr[j]) * static_cast<double>(w[j]);
                    // Elements past k do not feed the statistics: only the direct path remains.
                    const double through_stats = j < k ? a + xhat * b : 0.0;
                    dxr[j] = static_cast<T>(rs * (g - through_stats));
                }
                cpu_rows::store<T>(dtype, dx, r, d, dxr);
                if (dw_row != nullptr) {
                    for (int64_t j = 0; j < d; ++j)
                        dw_row[j] += static_cast<double>(dyr[j]) * ((static_cast<double>(xr[j]) - mu) * rs);
                }
                if (db_row != nullptr) {
                    for (int64_t j = 0; j < d; ++j) db_row[j] += static_cast<double>(dyr[j]);
                }
            }
        }
    }
    // Sum the partials in chunk order and store them in the parameters' dtype.
    auto finish = [&](const std::vector<double>& partial, void* out) {
        std::vector<T> out_scratch(convert ? d : 0);
        T* row = cpu_rows::output<T>(dtype, out, 0, d, out_scratch.data());
        for (int64_t j = 0; j < d; ++j) {
            double sum = 0.0;
            for (int64_t c = 0; c < chunks; ++c) sum += partial[c * d + j];
            row[j] = static_cast<T>(sum);
        }
        cpu_rows::store<T>(dtype, out, 0, d, row);
    };
    if (dweight != nullptr) finish(dw_partial, dweight);
    if (dbias != nullptr) finish(db_partial, dbias);
}

void check_norm_sizes(const char* op, DType dtype, int64_t rows, int64_t d, int64_t k) {
    NL_CHECK(is_floating(dtype), op, ": dtype ", dtype_name(dtype));
    NL_CHECK(rows >= 0 && d >= 1 && k >= 1 && k <= d, op, ": rows ", rows, " d ", d, " k ", k);
}

}  // namespace

void CpuBackend::norm_forward(DType dtype, const void* x, const void* weight, const void* bias, void* y,
                              void* mean, void* rstd, int64_t rows, int64_t d, double eps,
                              bool subtract_mean, int64_t stat_count) {
    check_norm_sizes("norm_forward", dtype, rows, d, stat_count);
    if (dtype == DType::F64) {
        norm_forward_impl<double>(dtype, x, weight, bias, y, static_cast<double*>(mean),
                                  static_cast<double*>(rstd), rows, d, eps, subtract_mean, stat_count);
    } else {
        norm_forward_impl<float>(dtype, x, weight, bias, y, static_cast<float*>(mean),
                                 static_cast<float*>(rstd), rows, d, eps, subtract_mean, stat_count);
    }
}

void CpuBackend::norm_backward(DType dtype, const void* dy, const void* x, const void* weight,
                               const void* mean, const void* rstd, void* dx, void* dweight, void* dbias,
                               int64_t rows, int64_t d, bool subtract_mean, int64_t stat_count) {
    check_norm_sizes("norm_backward", dtype, rows, d, stat_count);
    NL_CHECK(!subtract_mean || mean != nullptr || rows == 0, "norm_backward: LayerNorm needs mean");
    if (dtype == DType::F64) {
        norm_backward_impl<double>(dtype, dy, x, weight, static_cast<const double*>(mean),
                                   static_cast<const double*>(rstd), dx, dweight, dbias, rows, d,
                                   subtract_mean, stat_count);
    } else {
        norm_backward_impl<float>(dtype, dy, x, weight, static_cast<const float*>(mean),
                                  static_cast<const float*>(rstd), dx, dweight, dbias, rows, d,
                                  subtract_mean, stat_count);
    }
}

}  // namespace nl
