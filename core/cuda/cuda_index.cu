// CUDA indexing kernels on contiguous operands viewed as (outer, size, inner) along the indexed dim.
// Selections run one thread per output element. The accumulating kernels (index_add, scatter_add)
// give each thread one whole (outer, inner) column of the destination and walk j in order: no
// atomics, no races, and the same bits on every run (torch's CUDA index_add_ uses atomics and is not
// deterministic). Indices were range-checked by the ops; an out-of-range one is skipped here rather
// than read or written out of bounds.
//
// One read kernel serves index_select and gather, one accumulate kernel serves index_add and
// scatter_add: they differ only in where the index of element (o, j, i) is, index[j] (a row per j)
// or index[(o * n + j) * inner + i] (one per element), chosen by `per_element`.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

// The src/dst row that element (o, j, i) (flat position `at` in the (outer, n, inner) operand) uses.
__device__ __forceinline__ int64_t row_of(const int64_t* index, bool per_element, int64_t j, int64_t at) {
    return per_element ? index[at] : index[j];
}

template <typename T>
__global__ void read_rows_kernel(const T* src, const int64_t* index, bool per_element, T* out, int64_t outer,
                                 int64_t src_size, int64_t inner, int64_t n) {
    // out (outer, n, inner) = src (outer, src_size, inner) at the indexed rows
    const int64_t total = outer * n * inner;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = e % inner, j = (e / inner) % n, o = e / (inner * n);
        const int64_t s = row_of(index, per_element, j, e);
        if (s < 0 || s >= src_size) continue;
        out[e] = src[(o * src_size + s) * inner + i];
    }
}

template <typename T>
__global__ void add_rows_kernel(T* dst, const int64_t* index, bool per_element, const T* src, int64_t outer,
                                int64_t dst_size, int64_t inner, int64_t n) {
    // dst (outer, dst_size, inner) += src (outer, n, inner) at the indexed rows; the thread of column
    // (o, i) is the only writer of dst(o, :, i).
    const int64_t columns = outer * inner;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < columns;
         c += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t at = (o * n + j) * inner + i;
            const int64_t t = row_of(index, per_element, j, at);
            if (t < 0 || t >= dst_size) continue;
            dst[(o * dst_size + t) * inner + i] += src[at];
        }
    }
}

void read_rows(const char* op, int device, DType dtype, const void* src, const int64_t* index, bool per_element,
               void* out, int64_t outer, int64_t src_size, int64_t inner, int64_t n) {
    const int64_t total = outer * n * inner;
    if (total == 0) return;
    cuda::DeviceGuard guard(device);
    const unsigned blocks = cuda::blocks_for(total);
    if (dtype == DType::F32) {
        NL_LAUNCH(read_rows_kernel<float>, blocks, cuda::kThreads)(static_cast<const float*>(src), index, per_element,
                                                            static_cast<float*>(out), outer, src_size, inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, op, ": kernels see f32/f64 only, found ", dtype_name(dtype));
        NL_LAUNCH(read_rows_kernel<double>, blocks, cuda::kThreads)(static_cast<const double*>(src), index, per_element,
                                                             static_cast<double*>(out), outer, src_size, inner, n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void add_rows(const char* op, int device, DType dtype, void* dst, const int64_t* index, bool per_element,
              const void* src, int64_t outer, int64_t dst_size, int64_t inner, int64_t n) {
    const int64_t columns = outer * inner;
    if (columns == 0 || n == 0) return;
    cuda::DeviceGuard guard(device);
    const unsigned blocks = cuda::blocks_for(columns);
    if (dtype == DType::F32) {
        NL_LAUNCH(add_rows_kernel<float>, blocks, cuda::kThreads)(static_cast<float*>(dst), index, per_element,
                                                           static_cast<const float*>(src), outer, dst_size, inner, n);
    } else {
        NL_CHECK(dtype == DType::F64, op, ": kernels see f32/f64 only, found ", dtype_name(dtype));
        NL_LAUNCH(add_rows_kernel<double>, blocks, cuda::kThreads)(static_cast<double*>(dst), index, per_element,
                                                            static_cast<const double*>(src), outer, dst_size, inner,
                                                            n);
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::index_select(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                               int64_t src_size, int64_t inner, int64_t n) {
    read_rows("index_select", index_, dtype, src, index, false, out, outer, src_size, inner, n);
}

void CudaBackend::index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                            int64_t dst_size, int64_t inner, int64_t n) {
    add_rows("index_add", index_, dtype, dst, index, false, src, outer, dst_size, inner, n);
}

void CudaBackend::gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                         int64_t src_size, int64_t inner, int64_t n) {
    read_rows("gather", index_, dtype, src, index, true, out, outer, src_size, inner, n);
}

void CudaBackend::scatter_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                              int64_t dst_size, int64_t inner, int64_t n) {
    add_rows("scatter_add", index_, dtype, dst, index, true, src, outer, dst_size, inner, n);
}

}  // namespace nl
