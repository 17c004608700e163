// CUDA kernels for SwiGLU's gate, out = silu(a) * b, and its backward (formulas in core/backend.h;
// the CPU kernels are core/cpu/cpu_swiglu.cpp): one thread per element, grid-stride.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

template <typename T>
__global__ void swiglu_forward_kernel(const T* a, const T* b, T* out, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = a[i] * cuda::stable_sigmoid(a[i]) * b[i];
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* a, const T* b, const T* dout, T* da, T* db, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const T x = a[i], s = cuda::stable_sigmoid(x), g = dout[i];
        da[i] = g * b[i] * (s * (T(1) + x * (T(1) - s)));
        db[i] = g * (x * s);
    }
}

}  // namespace

void CudaBackend::swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "swiglu: dtype ", dtype_name(dtype));
    if (n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F64) {
        NL_LAUNCH(swiglu_forward_kernel<double>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(out), n);
    } else {
        NL_LAUNCH(swiglu_forward_kernel<float>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(out), n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                                  int64_t n) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "swiglu: dtype ", dtype_name(dtype));
    if (n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F64) {
        NL_LAUNCH(swiglu_backward_kernel<double>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const double*>(a), static_cast<const double*>(b), static_cast<const double*>(dout),
            static_cast<double*>(da), static_cast<double*>(db), n);
    } else {
        NL_LAUNCH(swiglu_backward_kernel<float>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const float*>(a), static_cast<const float*>(b), static_cast<const float*>(dout),
            static_cast<float*>(da), static_cast<float*>(db), n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
