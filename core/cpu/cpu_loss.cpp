// CPU kernels for the fused cross-entropy loss over logits rows: forward (per-row loss and
// logsumexp) and backward (softmax - onehot, scaled). Softmax is never stored: the backward
// recomputes it from the logits and the saved logsumexp, as a fused log-softmax + NLL does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;

// T is the row type: double for f64, float for f32/bf16/f16.
template <typename T>
void cross_entropy_forward_impl(const CrossEntropyForwardArgs& a) {
    const DType dtype = a.dtype;
    const int64_t rows = a.rows, classes = a.classes, ignore_index = a.ignore_index;
    const int64_t* targets = a.targets;  // (rows)
    T* loss = static_cast<T*>(a.loss);   // (rows)
    T* lse = static_cast<T*>(a.lse);     // (rows)
    const bool convert = !cpu_rows::stored_as<T>(dtype);
#pragma omp parallel if (rows * classes > kParallelElements)
    {
        std::vector<T> scratch(convert ? classes : 0);  // (classes)
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const T* z = cpu_rows::load<T>(dtype, a.logits, r, classes, scratch.data());
            // logsumexp with the max subtracted, so exp never overflows.
            T max = z[0];
            for (int64_t j = 1; j < classes; ++j) max = std::max(max, z[j]);
            double sum = 0.0;
            for (int64_t j = 0; j < classes; ++j) sum += static_cast<double>(std::exp(z[j] - max));
            const double row_lse = static_cast<double>(max) + std::log(sum);
            lse[r] = static_cast<T>(row_lse);
            const int64_t t = targets[r];
            loss[r] = t == ignore_index ? T(0) : static_cast<T>(row_lse - static_cast<double>(z[t]));
        }
    }
}

// dlogits (rows, classes) = (exp(z - lse) - onehot(target)) * dloss[r] * scale; ignored rows are 0.
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
                for (int64_t j = 0; j < classes; ++j) dz[j] = std::exp(z[j] - row_lse) * g;
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
