// CUDA gemm through cuBLAS (cublasSgemmStridedBatched / cublasDgemmStridedBatched). cuBLAS is
// column-major; a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// operands are swapped and each buffer is read as its own transpose (the usual trick, no copies).
// f32 runs in exact f32 unless set_cuda_tf32(true) allows TF32 tensor cores.
#include <algorithm>

#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"
#include "core/cuda/nl_cuda_api.h"

namespace nl {

namespace {

const char* cublas_status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "CUBLAS_STATUS_(unknown)";
    }
}

#define NL_CUBLAS_CHECK(call)                                                                         \
    do {                                                                                              \
        const cublasStatus_t nl_cublas_status_ = (call);                                              \
        if (nl_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
            throw ::nl::Error(::nl::detail::concat("cuBLAS error at ", __FILE__, ":", __LINE__, ": ", \
                                                   #call, ": ", cublas_status_name(nl_cublas_status_))); \
    } while (0)

// cuBLAS's batch count per call; larger batches are split (the grid's z dimension caps it).
constexpr int64_t kMaxBatch = 65535;

cublasStatus_t strided_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                               int k, const float* alpha, const float* a, int lda, long long sa,
                               const float* b, int ldb, long long sb, const float* beta, float* c, int ldc,
                               long long sc, int batch) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}
cublasStatus_t strided_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                               int k, const double* alpha, const double* a, int lda, long long sa,
                               const double* b, int ldb, long long sb, const double* beta, double* c, int ldc,
                               long long sc, int batch) {
    return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}

// C = beta * C for every batch matrix: gemm with k == 0 (an empty sum). beta == 0 writes zeros
// without reading C, which may be uninitialized memory holding NaN (as the CPU kernel).
template <typename T>
__global__ void scale_c_kernel(int64_t m, int64_t n, T beta, T* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    const int64_t total = batch * m * n;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t p = e / (m * n), i = (e / n) % m, j = e % n;
        T* x = c + p * stride_c + i * ldc + j;
        *x = beta == T(0) ? T(0) : beta * *x;
    }
}

template <typename T>
void gemm_typed(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b,
                double beta, T* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) {
        NL_LAUNCH(scale_c_kernel<T>, cuda::blocks_for(batch * m * n), cuda::kThreads)(m, n, T(beta), c, ldc, stride_c,
                                                                             batch);
        NL_CUDA_CHECK_LAUNCH();
        return;
    }
    const int64_t int_max = INT32_MAX;
    NL_CHECK(m <= int_max && n <= int_max && k <= int_max && lda <= int_max && ldb <= int_max &&
             ldc <= int_max, "gemm sizes exceed int range");
    const T alpha_t = static_cast<T>(alpha), beta_t = static_cast<T>(beta);
    // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    for (int64_t p0 = 0; p0 < batch; p0 += kMaxBatch) {
        const int64_t count = std::min(kMaxBatch, batch - p0);
        NL_CUBLAS_CHECK(strided_batched(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                        static_cast<int>(k), &alpha_t, b + p0 * stride_b, static_cast<int>(ldb),
                                        stride_b, a + p0 * stride_a, static_cast<int>(lda), stride_a, &beta_t,
                                        c + p0 * stride_c, static_cast<int>(ldc), stride_c,
                                        static_cast<int>(count)));
    }
}

}  // namespace

CudaBackend::~CudaBackend() {
    // Backends live until exit (see cuda_backend()); destroying the handle after the CUDA runtime has
    // shut down would fail, so it is left to the driver's process teardown.
}

cublasHandle_t CudaBackend::cublas() {
    std::lock_guard<std::mutex> lock(cublas_mutex_);
    if (cublas_ == nullptr) {
        NL_CUBLAS_CHECK(cublasCreate(&cublas_));
        NL_CUBLAS_CHECK(cublasSetStream(cublas_, 0));  // the legacy default stream, as every kernel
    }
    return cublas_;
}

void CudaBackend::gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
                       int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    NL_CHECK(c_dtype == dtype, "gemm: C in ", dtype_name(c_dtype), " for ", dtype_name(dtype),
             " operands: CUDA's gemm writes C in its operands' dtype (ops multiply bf16 in f32 here)");
    cuda::DeviceGuard guard(index_);
    cublasHandle_t handle = cublas();
    switch (dtype) {
        case DType::F32:
            // Read per call so set_cuda_tf32 takes effect at once. DEFAULT_MATH is exact f32.
            NL_CUBLAS_CHECK(cublasSetMathMode(handle, cuda_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
            gemm_typed(handle, trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda, stride_a,
                       static_cast<const float*>(b), ldb, stride_b, beta, static_cast<float*>(c), ldc, stride_c,
                       batch);
            return;
        case DType::F64:
            gemm_typed(handle, trans_a, trans_b, m, n, k, alpha, static_cast<const double*>(a), lda, stride_a,
                       static_cast<const double*>(b), ldb, stride_b, beta, static_cast<double*>(c), ldc,
                       stride_c, batch);
            return;
        default:
            NL_CHECK(false, "gemm: kernels see f32/f64 only, found ", dtype_name(dtype));
    }
}

}  // namespace nl
