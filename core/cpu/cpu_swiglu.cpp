// CPU kernels for SwiGLU's gate, out = silu(a) * b, and its backward (formulas in core/backend.h):
// one vectorizable pass each way over contiguous elements, threads over chunks for large n.
#include <algorithm>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster

template <typename T>
void forward_impl(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * cpu_math::stable_sigmoid(a[i]) * b[i];
}

template <typename T>
void backward_impl(const T* a, const T* b, const T* dout, T* da, T* db, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
        const T x = a[i], s = cpu_math::stable_sigmoid(x), g = dout[i];
        da[i] = g * b[i] * (s * (T(1) + x * (T(1) - s)));
        db[i] = g * (x * s);
    }
}

}  // namespace

void CpuBackend::swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) {
    if (dtype == DType::F64) {
        forward_impl(static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(out), n);
    } else {
        NL_CHECK(dtype == DType::F32, "swiglu: dtype ", dtype_name(dtype));
        forward_impl(static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(out), n);
    }
}

void CpuBackend::swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                                 int64_t n) {
    if (dtype == DType::F64) {
        using T = double;
        backward_impl(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(dout),
                      static_cast<T*>(da), static_cast<T*>(db), n);
    } else {
        NL_CHECK(dtype == DType::F32, "swiglu: dtype ", dtype_name(dtype));
        using T = float;
        backward_impl(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(dout),
                      static_cast<T*>(da), static_cast<T*>(db), n);
    }
}

}  // namespace nl
