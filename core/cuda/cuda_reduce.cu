// CUDA reductions over a contiguous (outer, len, inner) block and the softmax row kernels.
// Sums accumulate in double (as the CPU's), so f32 results differ from the CPU's only by the final
// rounding. Long rows with inner == 1 get one block each (threads stride over the row, then a fixed
// tree combines them: deterministic); otherwise one thread walks each (outer, inner) column in order.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

constexpr int64_t kShortRow = 32;  // rows up to this long take one thread each, not a block

template <typename T>
__device__ __forceinline__ T qnan() {
    return T(__longlong_as_double(0x7ff8000000000000LL));
}

// (value, index) for argmax. Combining is symmetric: NaN beats numbers, the larger value wins, and
// ties (including NaN vs NaN) go to the smaller index, so the result is the first NaN, else the first
// maximum, whatever order the tree combines in (torch.argmax's rule, as the CPU kernel).
template <typename T>
struct ArgBest {
    T value;
    int64_t index;
};
template <typename T>
__device__ __forceinline__ ArgBest<T> arg_combine(ArgBest<T> a, ArgBest<T> b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.index <= b.index ? a : b;
}

// The ops that sum in double: Sum, Mean and Var add x, SumSquares x * x.
__device__ __forceinline__ bool sums(ReduceOp op) {
    return op == ReduceOp::Sum || op == ReduceOp::Mean || op == ReduceOp::Var || op == ReduceOp::SumSquares;
}
__device__ __forceinline__ double summand(ReduceOp op, double v) { return op == ReduceOp::SumSquares ? v * v : v; }

// Writes the result of a row or column given its double sums (Sum/Mean/SumSquares) or squared
// deviations (Var).
template <typename T>
__device__ __forceinline__ T finish_sum(ReduceOp op, double sum, int64_t len, int64_t correction) {
    if (op == ReduceOp::Sum || op == ReduceOp::SumSquares) return T(sum);
    if (op == ReduceOp::Mean) return T(sum / double(len));
    const int64_t denom = len - correction;  // Var: `sum` holds the squared deviations
    return denom > 0 ? T(sum / double(denom)) : qnan<T>();
}

// One thread per (outer, inner) column, walking len in order. Also serves short rows (inner == 1).
template <typename T>
__global__ void reduce_columns_kernel(ReduceOp op, const T* in, void* out, int64_t outer, int64_t len,
                                      int64_t inner, int64_t correction) {
    const int64_t columns = outer * inner;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < columns;
         c += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = c / inner, i = c % inner;
        const T* x = in + o * len * inner + i;  // x[l * inner], l < len
        if (sums(op)) {
            double sum = 0.0;
            for (int64_t l = 0; l < len; ++l) sum += summand(op, double(x[l * inner]));
            if (op == ReduceOp::Var) {
                const double mean = sum / double(len);
                sum = 0.0;
                for (int64_t l = 0; l < len; ++l) {
                    const double dev = double(x[l * inner]) - mean;
                    sum += dev * dev;
                }
            }
            static_cast<T*>(out)[c] = finish_sum<T>(op, sum, len, correction);
        } else if (op == ReduceOp::ArgMax) {
            ArgBest<T> best{x[0], 0};
            for (int64_t l = 1; l < len; ++l) best = arg_combine(best, ArgBest<T>{x[l * inner], l});
            static_cast<int64_t*>(out)[c] = best.index;
        } else {
            // Min as -max(-x): negation is exact and keeps NaN a NaN.
            const T sign = op == ReduceOp::Max ? T(1) : T(-1);
            T best = sign * x[0];
            for (int64_t l = 1; l < len; ++l) best = cuda::nan_max(best, sign * x[l * inner]);
            static_cast<T*>(out)[c] = sign * best;
        }
    }
}

// One block per row (inner == 1), rows taken with a grid stride.
template <typename T>
__global__ void reduce_rows_kernel(ReduceOp op, const T* in, void* out, int64_t rows, int64_t len,
                                   int64_t correction) {
    __shared__ double dscratch[32];
    __shared__ T tscratch[32];
    __shared__ T arg_value[1024];
    __shared__ int64_t arg_index[1024];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = in + r * len;  // (len)
        if (sums(op)) {
            double sum = 0.0;
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) sum += summand(op, double(x[j]));
            sum = cuda::block_sum(sum, dscratch);
            if (op == ReduceOp::Var) {
                const double mean = sum / double(len);
                double dev2 = 0.0;
                for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
                    const double dev = double(x[j]) - mean;
                    dev2 += dev * dev;
                }
                sum = cuda::block_sum(dev2, dscratch);
            }
            if (threadIdx.x == 0) static_cast<T*>(out)[r] = finish_sum<T>(op, sum, len, correction);
        } else if (op == ReduceOp::ArgMax) {
            // Each thread scans its indices in increasing order, then a fixed tree combines.
            ArgBest<T> best{x[0], 0};
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) best = arg_combine(best, ArgBest<T>{x[j], j});
            arg_value[threadIdx.x] = best.value;
            arg_index[threadIdx.x] = best.index;
            __syncthreads();
            for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
                if (threadIdx.x < half) {
                    const ArgBest<T> p = arg_combine(ArgBest<T>{arg_value[threadIdx.x], arg_index[threadIdx.x]},
                                                     ArgBest<T>{arg_value[threadIdx.x + half],
                                                                arg_index[threadIdx.x + half]});
                    arg_value[threadIdx.x] = p.value;
                    arg_index[threadIdx.x] = p.index;
                }
                __syncthreads();
            }
            if (threadIdx.x == 0) static_cast<int64_t*>(out)[r] = arg_index[0];
            __syncthreads();  // arg_* are reused by the next row
        } else {
            const T sign = op == ReduceOp::Max ? T(1) : T(-1);
            T best = sign * x[0];
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) best = cuda::nan_max(best, sign * x[j]);
            best = cuda::block_max(best, tscratch);
            if (threadIdx.x == 0) static_cast<T*>(out)[r] = sign * best;
        }
    }
}

template <typename T>
void reduce_typed(ReduceOp op, const T* in, void* out, int64_t outer, int64_t len, int64_t inner,
                  int64_t correction) {
    if (inner == 1 && len > kShortRow) {
        NL_LAUNCH(reduce_rows_kernel<T>, cuda::row_blocks(outer), cuda::kThreads)(op, in, out, outer, len, correction);
    } else {
        NL_LAUNCH(reduce_columns_kernel<T>, cuda::blocks_for(outer * inner), cuda::kThreads)(op, in, out, outer, len,
                                                                                      inner, correction);
    }
    NL_CUDA_CHECK_LAUNCH();
}

// Threads per row block: a multiple of 32, no more than the row needs, at most kThreads.
int row_threads(int64_t cols) {
    int64_t t = (cols + 31) / 32 * 32;
    if (t > cuda::kThreads) t = cuda::kThreads;
    if (t < 32) t = 32;
    return static_cast<int>(t);
}

// ---- softmax rows: one block per row ----

template <typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
    __shared__ T scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;  // (cols)
        T* yr = y + r * cols;        // (cols)
        // Subtracting the row max keeps exp() <= 1 (no overflow for inputs like 1000).
        T m = xr[0];
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = cuda::nan_max(m, xr[j]);
        m = cuda::block_max(m, scratch);
        T s = T(0);
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += cuda::m_exp(xr[j] - m);
        s = cuda::block_sum(s, scratch);
        if (log) {
            const T ls = cuda::m_log(s);  // log_softmax = x - max - log(sum exp(x - max))
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - m) - ls;
        } else {
            const T inv = T(1) / s;
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = cuda::m_exp(xr[j] - m) * inv;
        }
    }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
    __shared__ T scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* yr = y + r * cols;    // (cols)
        const T* dyr = dy + r * cols;  // (cols)
        T* dxr = dx + r * cols;        // (cols)
        T s = T(0);
        // log_softmax: dx = dy - exp(y) * sum(dy); softmax: dx = y * (dy - sum(dy * y))
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += log ? dyr[j] : dyr[j] * yr[j];
        s = cuda::block_sum(s, scratch);
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
            dxr[j] = log ? dyr[j] - cuda::m_exp(yr[j]) * s : yr[j] * (dyr[j] - s);
    }
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len,
                         int64_t inner, int64_t correction) {
    if (outer * inner == 0) return;
    NL_CHECK(len > 0 || (op != ReduceOp::Max && op != ReduceOp::Min && op != ReduceOp::ArgMax),
             "empty max/min/argmax reaches the kernel");
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F32) return reduce_typed(op, static_cast<const float*>(in), out, outer, len, inner, correction);
    NL_CHECK(dtype == DType::F64, "reduce kernels take f32 or f64, got ", dtype_name(dtype));
    reduce_typed(op, static_cast<const double*>(in), out, outer, len, inner, correction);
}

void CudaBackend::softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log) {
    if (rows * cols == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(rows);
    const int threads = row_threads(cols);
    if (dtype == DType::F32) {
        NL_LAUNCH(softmax_forward_kernel<float>, blocks, threads)(static_cast<const float*>(x), static_cast<float*>(y),
                                                           rows, cols, log);
    } else {
        NL_CHECK(dtype == DType::F64, "softmax kernels take f32 or f64, got ", dtype_name(dtype));
        NL_LAUNCH(softmax_forward_kernel<double>, blocks, threads)(static_cast<const double*>(x),
                                                            static_cast<double*>(y), rows, cols, log);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                                   int64_t cols, bool log) {
    if (rows * cols == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(rows);
    const int threads = row_threads(cols);
    if (dtype == DType::F32) {
        NL_LAUNCH(softmax_backward_kernel<float>, blocks, threads)(static_cast<const float*>(y),
                                                            static_cast<const float*>(dy),
                                                            static_cast<float*>(dx), rows, cols, log);
    } else {
        NL_CHECK(dtype == DType::F64, "softmax kernels take f32 or f64, got ", dtype_name(dtype));
        NL_LAUNCH(softmax_backward_kernel<double>, blocks, threads)(static_cast<const double*>(y),
                                                             static_cast<const double*>(dy),
                                                             static_cast<double*>(dx), rows, cols, log);
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
