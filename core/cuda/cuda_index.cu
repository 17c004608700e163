// CUDA indexing kernels on contiguous operands viewed as (outer, size, inner) along the indexed dim.
// Selections run one thread per output element. The accumulating kernels (index_add, scatter_add)
// give each thread one whole (outer, inner) column of the destination and walk j in order: no
// atomics, no races, and the same bits on every run (torch's CUDA index_add_ uses atomics and is not
// deterministic). Indices were range-checked by the ops; an out-of-range one is skipped here rather
// than read or written out of bounds.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

template <typename T>
__global__ void index_select_kernel(const T* src, const int64_t* index, T* out, int64_t outer, int64_t src_size,
                                    int64_t inner, int64_t n) {
    // src (outer, src_size, inner) -> out (outer, n, inner)
    const int64_t total = outer * n * inner;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = e % inner, j = (e / inner) % n, o = e / (inner * n);
        const int64_t s = index[j];
        if (s < 0 || s >= src_size) continue;
        out[e] = src[(o * src_size + s) * inner + i];
    }
}

template <typename T>
__global__ void index_add_kernel(T* dst, const int64_t* index, const T* src, int64_t outer, int64_t dst_size,
                                 int64_t inner, int64_t n) {
    // dst (outer, dst_size, inner) += src (outer, n, inner) scattered along the middle dim
    const int64_t columns = outer * inner;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < columns;
         c += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t t = index[j];
            if (t < 0 || t >= dst_size) continue;
            dst[(o * dst_size + t) * inner + i] += src[(o * n + j) * inner + i];
        }
    }
}

template <typename T>
__global__ void gather_kernel(const T* src, const int64_t* index, T* out, int64_t outer, int64_t src_size,
                              int64_t inner, int64_t n) {
    // out (outer, n, inner) = src (outer, src_size, inner) at index (outer, n, inner)
    const int64_t total = outer * n * inner;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = e % inner, o = e / (inner * n);
        const int64_t s = index[e];
        if (s < 0 || s >= src_size) continue;
        out[e] = src[(o * src_size + s) * inner + i];
    }
}

template <typename T>
__global__ void scatter_add_kernel(T* dst, const int64_t* index, const T* src, int64_t outer, int64_t dst_size,
                                   int64_t inner, int64_t n) {
    // dst (outer, dst_size, inner) += src (outer, n, inner) at index (outer, n, inner); the thread of
    // column (o, i) is the only writer of dst(o, :, i).
    const int64_t columns = outer * inner;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < columns;
         c += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t at = (o * n + j) * inner + i;
            const int64_t t = index[at];
            if (t < 0 || t >= dst_size) continue;
            dst[(o * dst_size + t) * inner + i] += src[at];
        }
    }
}

}  // namespace

void CudaBackend::index_select(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                               int64_t src_size, int64_t inner, int64_t n) {
    const int64_t total = outer * n * inner;
    if (total == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(total);
    if (dtype == DType::F32) {
        index_select_kernel<float><<<blocks, cuda::kThreads>>>(static_cast<const float*>(src), index,
                                                               static_cast<float*>(out), outer, src_size, inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, "index_select: kernels see f32/f64 only, found ", dtype_name(dtype));
        index_select_kernel<double><<<blocks, cuda::kThreads>>>(static_cast<const double*>(src), index,
                                                                static_cast<double*>(out), outer, src_size, inner,
                                                                n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                            int64_t dst_size, int64_t inner, int64_t n) {
    const int64_t columns = outer * inner;
    if (columns == 0 || n == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(columns);
    if (dtype == DType::F32) {
        index_add_kernel<float><<<blocks, cuda::kThreads>>>(static_cast<float*>(dst), index,
                                                            static_cast<const float*>(src), outer, dst_size, inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, "index_add: kernels see f32/f64 only, found ", dtype_name(dtype));
        index_add_kernel<double><<<blocks, cuda::kThreads>>>(static_cast<double*>(dst), index,
                                                             static_cast<const double*>(src), outer, dst_size,
                                                             inner, n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                         int64_t src_size, int64_t inner, int64_t n) {
    const int64_t total = outer * n * inner;
    if (total == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(total);
    if (dtype == DType::F32) {
        gather_kernel<float><<<blocks, cuda::kThreads>>>(static_cast<const float*>(src), index,
                                                         static_cast<float*>(out), outer, src_size, inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, "gather: kernels see f32/f64 only, found ", dtype_name(dtype));
        gather_kernel<double><<<blocks, cuda::kThreads>>>(static_cast<const double*>(src), index,
                                                          static_cast<double*>(out), outer, src_size, inner, n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::scatter_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                              int64_t dst_size, int64_t inner, int64_t n) {
    const int64_t columns = outer * inner;
    if (columns == 0 || n == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(columns);
    if (dtype == DType::F32) {
        scatter_add_kernel<float><<<blocks, cuda::kThreads>>>(static_cast<float*>(dst), index,
                                                              static_cast<const float*>(src), outer, dst_size,
                                                              inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, "scatter_add: kernels see f32/f64 only, found ", dtype_name(dtype));
        scatter_add_kernel<double><<<blocks, cuda::kThreads>>>(static_cast<double*>(dst), index,
                                                               static_cast<const double*>(src), outer, dst_size,
                                                               inner, n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
