// CUDA kernels for the fused cross-entropy over logits rows: forward (per-row loss and logsumexp) and
// backward ((softmax - onehot) * dloss * scale, recomputing softmax from the saved logsumexp, so the
// probabilities are never stored). One block per row; bf16/f16 logits are read as f32.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

int row_threads(int64_t cols) {
    int64_t t = (cols + 31) / 32 * 32;
    if (t > cuda::kThreads) t = cuda::kThreads;
    return static_cast<int>(t < 32 ? 32 : t);
}

// T is the math type: float for f32/bf16/f16, double for f64. loss, lse: (rows).
template <typename T>
__global__ void cross_entropy_forward_kernel(DType dtype, const void* logits, const int64_t* targets, T* loss,
                                             T* lse, T* lse_sq, int64_t rows, int64_t classes, int64_t ignore_index) {
    __shared__ T scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r * classes;  // row r of logits: (classes)
        // logsumexp with the max subtracted, so exp never overflows.
        T m = cuda::load_as<T>(dtype, logits, base);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
            m = cuda::nan_max(m, cuda::load_as<T>(dtype, logits, base + j));
        m = cuda::block_max(m, scratch);
        T sum = T(0);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
            sum += cuda::m_exp(cuda::load_as<T>(dtype, logits, base + j) - m);
        sum = cuda::block_sum(sum, scratch);
        if (threadIdx.x == 0) {
            const T row_lse = m + cuda::m_log(sum);
            lse[r] = row_lse;
            const int64_t t = targets[r];
            const bool valid = t != ignore_index && t >= 0 && t < classes;  // the caller checked the range
            loss[r] = valid ? row_lse - cuda::load_as<T>(dtype, logits, base + t) : T(0);
            if (lse_sq != nullptr) lse_sq[r] = valid ? row_lse * row_lse : T(0);  // the z-loss's statistic
        }
    }
}

// dlogits (rows, classes) = (exp(z - lse) * (1 + 2 c lse) - onehot(target)) * dloss[r] * scale, c the
// z_loss (0: the plain cross-entropy's gradient); ignored rows are 0.
template <typename T>
__global__ void cross_entropy_backward_kernel(DType dtype, const void* logits, const int64_t* targets,
                                              const T* lse, const T* dloss, T scale, void* dlogits, int64_t rows,
                                              int64_t classes, int64_t ignore_index, T z_loss) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r * classes;
        const int64_t t = targets[r];
        if (t == ignore_index) {
            // Exact zeros, even when the scale is inf or NaN (mean over zero rows).
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) cuda::store_as<T>(dtype, dlogits, base + j, T(0));
            continue;
        }
        const T g = (dloss != nullptr ? dloss[r] : T(1)) * scale;
        const T row_lse = lse[r];
        const T gp = z_loss != T(0) ? g * (T(1) + T(2) * z_loss * row_lse) : g;  // d(c lse^2) = 2 c lse softmax
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            const T p = cuda::m_exp(cuda::load_as<T>(dtype, logits, base + j) - row_lse);
            cuda::store_as<T>(dtype, dlogits, base + j, j == t ? p * gp - g : p * gp);
        }
    }
}

}  // namespace

void CudaBackend::cross_entropy_forward(const CrossEntropyForwardArgs& a) {
    check_kernel_args(a);
    if (a.rows == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(a.rows);
    const int threads = row_threads(a.classes);
    if (a.dtype == DType::F64) {
        NL_LAUNCH(cross_entropy_forward_kernel<double>, blocks, threads)(
            a.dtype, a.logits, a.targets, static_cast<double*>(a.loss), static_cast<double*>(a.lse),
            static_cast<double*>(a.lse_sq), a.rows, a.classes, a.ignore_index);
    } else {
        NL_LAUNCH(cross_entropy_forward_kernel<float>, blocks, threads)(
            a.dtype, a.logits, a.targets, static_cast<float*>(a.loss), static_cast<float*>(a.lse),
            static_cast<float*>(a.lse_sq), a.rows, a.classes, a.ignore_index);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::cross_entropy_backward(const CrossEntropyBackwardArgs& a) {
    check_kernel_args(a);
    if (a.rows == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(a.rows);
    const int threads = row_threads(a.classes);
    if (a.dtype == DType::F64) {
        NL_LAUNCH(cross_entropy_backward_kernel<double>, blocks, threads)(
            a.dtype, a.logits, a.targets, static_cast<const double*>(a.lse), static_cast<const double*>(a.dloss),
            a.scale, a.dlogits, a.rows, a.classes, a.ignore_index, a.z_loss);
    } else {
        NL_LAUNCH(cross_entropy_backward_kernel<float>, blocks, threads)(
            a.dtype, a.logits, a.targets, static_cast<const float*>(a.lse), static_cast<const float*>(a.dloss),
            static_cast<float>(a.scale), a.dlogits, a.rows, a.classes, a.ignore_index, static_cast<float>(a.z_loss));
    }
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
