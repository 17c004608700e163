// CUDA kernels for soft-capping, y = cap * tanh(x / cap), and its backward from the saved output
// (formulas in core/backend.h; the CPU kernels, core/cpu/cpu_softcap.cpp, say why the backward is
// written (cap - y) * (cap + y) / cap^2): one thread per element, grid-stride.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

template <typename T>
__global__ void softcap_forward_kernel(const T* x, T* y, int64_t n, T cap) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = cuda::m_tanh(x[i] / cap) * cap;
}

template <typename T>
__global__ void softcap_backward_kernel(const T* y, const T* dy, T* dx, int64_t n, T cap, T inv_cap_sq) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const T v = y[i];
        dx[i] = dy[i] * (((cap - v) * (cap + v)) * inv_cap_sq);
    }
}

}  // namespace

void CudaBackend::softcap_forward(DType dtype, const void* x, void* y, int64_t n, double cap) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "softcap: dtype ", dtype_name(dtype));
    NL_CHECK(cap > 0.0, "softcap: cap ", cap);
    if (n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F64) {
        NL_LAUNCH(softcap_forward_kernel<double>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const double*>(x), static_cast<double*>(y), n, cap);
    } else {
        NL_LAUNCH(softcap_forward_kernel<float>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const float*>(x), static_cast<float*>(y), n, static_cast<float>(cap));
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::softcap_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, double cap) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "softcap_backward: dtype ", dtype_name(dtype));
    NL_CHECK(cap > 0.0, "softcap_backward: cap ", cap);
    if (n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F64) {
        NL_LAUNCH(softcap_backward_kernel<double>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const double*>(y), static_cast<const double*>(dy), static_cast<double*>(dx), n, cap,
            1.0 / (cap * cap));
    } else {
        // cap and 1 / cap^2 as the CPU kernel has them: cap rounded to f32 first.
        const float c = static_cast<float>(cap);
        NL_LAUNCH(softcap_backward_kernel<float>, cuda::blocks_for(n), cuda::kThreads)(
            static_cast<const float*>(y), static_cast<const float*>(dy), static_cast<float*>(dx), n, c,
            static_cast<float>(1.0 / (double(c) * double(c))));
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
