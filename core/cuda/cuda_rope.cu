// CUDA kernel for rotary position embedding: one thread per (even, odd) pair. The formula is in
// core/backend.h next to the declaration; the CPU kernel is core/cpu/cpu_rope.cpp.
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

template <typename T>
__global__ void rope_kernel(const T* x, const T* cos, const T* sin, T* out, int64_t pairs, int64_t seq,
                            int64_t heads, int64_t half, bool inverse) {
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = p % half;                   // pair within the head
        const int64_t t = (p / (half * heads)) % seq;  // position
        const T c = cos[t * half + i];
        const T s = inverse ? -sin[t * half + i] : sin[t * half + i];
        const T re = x[2 * p], im = x[2 * p + 1];
        out[2 * p] = re * c - im * s;
        out[2 * p + 1] = re * s + im * c;
    }
}

template <typename T>
void rope_typed(const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq,
                int64_t heads, int64_t head_dim, bool inverse) {
    const int64_t pairs = batch * seq * heads * (head_dim / 2);
    if (pairs == 0) return;
    NL_LAUNCH(rope_kernel<T>, cuda::blocks_for(pairs), cuda::kThreads)(
        static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(out), pairs,
        seq, heads, head_dim / 2, inverse);
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                       int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
    NL_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim);
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "rope: dtype ", dtype_name(dtype));
    cuda::DeviceGuard guard(index_);
    if (dtype == DType::F64)
        rope_typed<double>(x, cos, sin, out, batch, seq, heads, head_dim, inverse);
    else
        rope_typed<float>(x, cos, sin, out, batch, seq, heads, head_dim, inverse);
}

}  // namespace nl
