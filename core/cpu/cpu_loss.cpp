// CPU kernels for the fused cross-entropy loss over logits rows: forward (per-row loss and
// logsumexp) and backward (softmax - onehot, scaled). Softmax is never stored: the backward
// recomputes it from the logits and the saved logsumexp, as a fused log-softmax + NLL does. Both
// passes vectorize (the f32 exp of cpu_math.h): at a GPT-2-sized vocabulary they read every logit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;
// A row's max and its sum of exps run in this many independent lanes (element j in lane j % kLanes),
// so the loops vectorize and the adds do not wait on each other; the lanes are combined in one fixed
// order, so a row's bits depend on its values only, never on the threads.
constexpr int64_t kLanes = 16;

// max over z[0, n), NaN skipped (a NaN row still gives a NaN loss: its exp sum is NaN).
template <typename T>
T row_max(const T* z, int64_t n) {
    T lanes[kLanes];
    for (T& lane : lanes) lane = -std::numeric_limits<T>::infinity();
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] = z[j + l] > lanes[l] ? z[j + l] : lanes[l];
    for (int64_t l = 0; j + l < n; ++l) lanes[l] = z[j + l] > lanes[l] ? z[j + l] : lanes[l];
    T max = lanes[0];
    for (int64_t l = 1; l < kLanes; ++l) max = lanes[l] > max ? lanes[l] : max;
    return max;
}

// sum over j of e^(z[j] - shift), each term in T (the vectorizable exp for f32), summed in double.
template <typename T>
double row_exp_sum(const T* z, int64_t n, T shift) {
    double lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(cpu_math::exp_of(z[j + l] - shift));
    for (int64_t l = 0; j + l < n; ++l) lanes[l] += static_cast<double>(cpu_math::exp_of(z[j + l] - shift));
    // Pairwise: lanes l and l + half, halving until one is left.
    for (int64_t half = kLanes / 2; half >= 1; half /= 2)
        for (int64_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
    return lanes[0];
}

// T is the row type: double for f64, float for f32/bf16/f16.
template <typename T>
void cross_entropy_forward_impl(const CrossEntropyForwardArgs& a) {
    const DType dtype = a.dtype;
    const int64_t rows = a.rows, classes = a.classes, ignore_index = a.ignore_index;
    const int64_t* targets = a.targets;  // (rows)
    T* loss = static_cast<T*>(a.loss);   // (rows)
    T* lse = static_cast<T*>(a.lse);     // (rows)
    T* lse_sq = static_cast<T*>(a.lse_sq);  // (rows) or null
    const bool convert = !cpu_rows::stored_as<T>(dtype);
#pragma omp parallel if (rows * classes > kParallelElements)
    {
        std::vector<T> scratch(convert ? classes : 0);  // (classes)
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const T* z = cpu_rows::load<T>(dtype, a.logits, r, classes, scratch.data());
            // logsumexp with the max subtracted, so exp never overflows.
            const T max = row_max(z, classes);
            const double row_lse = static_cast<double>(max) + std::log(row_exp_sum(z, classes, max));
            lse[r] = static_cast<T>(row_lse);
            const int64_t t = targets[r];
            loss[r] = t == ignore_index ? T(0) : static_cast<T>(row_lse - static_cast<double>(z[t]));
            if (lse_sq != nullptr) lse_sq[r] = t == ignore_index ? T(0) : static_cast<T>(row_lse * row_lse);
        }
    }
}

// dlogits (rows, classes) = (exp(z - lse) * (1 + 2 c lse) - onehot(target)) * dloss[r] * scale, c the
// z_loss (0: the plain cross-entropy's gradient, the same bits); ignored rows are 0.
template <typename T>
void cross_entropy_backward_impl(const CrossEntropyBackwardArgs& a) {
    const DType dtype = a.dtype;
    const int64_t rows = a.rows, classes = a.classes, ignore_index = a.ignore_index;
    const int64_t* targets = a.targets;                // (rows)
    const T* lse = static_cast<const T*>(a.lse);      // (rows)
    const T* dloss = static_cast<const T*>(a.dloss);  // (rows) or null
    const double scale = a.scale;
    void* dlogits = a.dlogits;  // (rows, classes)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
#pragma omp parallel if (rows * classes > kParallelElements)
    {
        std::vector<T> z_scratch(convert ? classes : 0), dz_scratch(convert ? classes : 0);  // (classes)
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            T* dz = cpu_rows::output<T>(dtype, dlogits, r, classes, dz_scratch.data());
            const int64_t t = targets[r];
            if (t == ignore_index) {
                // Exact zeros, even when the scale is inf or NaN (mean over zero rows).
                for (int64_t j = 0; j < classes; ++j) dz[j] = T(0);
            } else {
                const T* z = cpu_rows::load<T>(dtype, a.logits, r, classes, z_scratch.data());
                const T g = static_cast<T>((dloss != nullptr ? static_cast<double>(dloss[r]) : 1.0) * scale);
                const T row_lse = lse[r];
                // The softmax's factor: g, and with a z-loss g (1 + 2 c lse) (d(c lse^2) = 2 c lse softmax).
                const T gp = a.z_loss != 0.0
                                 ? static_cast<T>(static_cast<double>(g) * (1.0 + 2.0 * a.z_loss * static_cast<double>(row_lse)))
                                 : g;
                for (int64_t j = 0; j < classes; ++j) dz[j] = cpu_math::exp_of(z[j] - row_lse) * gp;
                dz[t] -= g;
            }
            cpu_rows::store<T>(dtype, dlogits, r, classes, dz);
        }
    }
}

}  // namespace

void CpuBackend::cross_entropy_forward(const CrossEntropyForwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        cross_entropy_forward_impl<double>(a);
    } else {
        cross_entropy_forward_impl<float>(a);
    }
}

void CpuBackend::cross_entropy_backward(const CrossEntropyBackwardArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        cross_entropy_backward_impl<double>(a);
    } else {
        cross_entropy_backward_impl<float>(a);
    }
}

}  // namespace nl
