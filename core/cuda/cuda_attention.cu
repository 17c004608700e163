// CUDA kernels for fused causal attention (the formulas are in core/backend.h next to the
// declarations; the CPU kernels are core/cpu/cpu_attention.cpp). The plain form of the algorithm:
// one thread per query row walks the keys with an online softmax, accumulating into its output row;
// the backward recomputes each probability from the saved logsumexp, in a query pass (delta, dq: one
// thread per query row) and a key pass (dk, dv: one thread per key row, summing over its group's
// query heads). Every sum has one owner and a fixed order: deterministic, no atomics. Not tuned for
// speed (no shared-memory tiles or tensor cores); it has run on the CPU emulator only (docs/cuda.md).
#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

__device__ __forceinline__ int64_t q_row(const AttentionDims& s, int64_t b, int64_t i, int64_t h) {
    return ((b * s.q_len + i) * s.heads + h) * s.head_dim;
}
__device__ __forceinline__ int64_t kv_row(const AttentionDims& s, int64_t b, int64_t j, int64_t g) {
    return ((b * s.kv_len + j) * s.kv_heads + g) * s.head_dim;
}
__device__ __forceinline__ int64_t stat(const AttentionDims& s, int64_t b, int64_t h, int64_t i) {
    return (b * s.heads + h) * s.q_len + i;
}

template <typename T>
__device__ __forceinline__ T dot_row(const T* a, const T* b, int64_t n) {
    T sum = T(0);
    for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
    return sum;
}

// The score of query row qi and key row kj: scale * qi . kj, soft-capped to cap * tanh(score / cap) when
// softcap = cap > 0 (Gemma 2), with tanh's derivative 1 - tanh^2 through `slope` (1 when off). The
// forward and both backward passes call this one function, so they see the same scores.
template <typename T>
__device__ __forceinline__ T attention_score(const T* qi, const T* kj, int64_t hd, T scale, T softcap, T& slope) {
    const T score = scale * dot_row(qi, kj, hd);
    slope = T(1);
    if (softcap <= T(0)) return score;
    const T t = cuda::m_tanh(score / softcap);
    slope = T(1) - t * t;
    return softcap * t;
}

// One thread per (b, i, h) query row.
template <typename T>
__global__ void attention_forward_kernel(AttentionDims s, const T* q, const T* k, const T* v, T* out, T* lse, T scale,
                                         T softcap) {
    const int64_t rows = s.batch * s.q_len * s.heads, hd = s.head_dim, group = s.heads / s.kv_heads;
    for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < rows;
         row += int64_t(gridDim.x) * blockDim.x) {
        const int64_t h = row % s.heads, i = (row / s.heads) % s.q_len, b = row / (s.heads * s.q_len);
        const int64_t g = h / group, keys = s.kv_len - s.q_len + i + 1;
        const T* qi = q + row * hd;
        T* o = out + row * hd;  // (hd): the unnormalized sum until the end
        for (int64_t d = 0; d < hd; ++d) o[d] = T(0);
        T m = T(0), sum = T(0);
        for (int64_t j = 0; j < keys; ++j) {
            T slope;
            const T score = attention_score(qi, k + kv_row(s, b, j, g), hd, scale, softcap, slope);
            const T m_new = j == 0 ? score : (score > m ? score : m);
            const T rescale = j == 0 ? T(0) : cuda::m_exp(m - m_new);  // online softmax
            const T p = cuda::m_exp(score - m_new);
            const T* vj = v + kv_row(s, b, j, g);
            for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * rescale + p * vj[d];
            sum = sum * rescale + p;
            m = m_new;
        }
        const T inv = T(1) / sum;
        for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
        lse[stat(s, b, h, i)] = m + cuda::m_log(sum);
    }
}

// Query pass: delta and dq, one thread per (b, i, h) query row.
template <typename T>
__global__ void attention_backward_query_kernel(AttentionDims s, const T* q, const T* k, const T* v, const T* out,
                                                const T* dout, const T* lse, T* delta, T* dq, T scale, T softcap) {
    const int64_t rows = s.batch * s.q_len * s.heads, hd = s.head_dim, group = s.heads / s.kv_heads;
    for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < rows;
         row += int64_t(gridDim.x) * blockDim.x) {
        const int64_t h = row % s.heads, i = (row / s.heads) % s.q_len, b = row / (s.heads * s.q_len);
        const int64_t g = h / group, keys = s.kv_len - s.q_len + i + 1;
        const T* qi = q + row * hd;
        const T* doi = dout + row * hd;
        const T di = dot_row(doi, out + row * hd, hd);
        const T l = lse[stat(s, b, h, i)];
        delta[stat(s, b, h, i)] = di;
        T* dqi = dq + row * hd;
        for (int64_t d = 0; d < hd; ++d) dqi[d] = T(0);
        for (int64_t j = 0; j < keys; ++j) {
            const T* kj = k + kv_row(s, b, j, g);
            T slope;
            const T p = cuda::m_exp(attention_score(qi, kj, hd, scale, softcap, slope) - l);
            const T ds = p * (dot_row(doi, v + kv_row(s, b, j, g), hd) - di) * slope;
            for (int64_t d = 0; d < hd; ++d) dqi[d] += scale * ds * kj[d];
        }
    }
}

// Key pass: dk and dv, one thread per (b, j, g) key row, over its group's heads and the query rows
// that see it. Reads the query pass's delta.
template <typename T>
__global__ void attention_backward_key_kernel(AttentionDims s, const T* q, const T* k, const T* v, const T* dout,
                                              const T* lse, const T* delta, T* dk, T* dv, T scale, T softcap) {
    const int64_t rows = s.batch * s.kv_len * s.kv_heads, hd = s.head_dim, group = s.heads / s.kv_heads;
    const int64_t offset = s.kv_len - s.q_len;  // query row i is at position offset + i
    for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < rows;
         row += int64_t(gridDim.x) * blockDim.x) {
        const int64_t g = row % s.kv_heads, j = (row / s.kv_heads) % s.kv_len, b = row / (s.kv_heads * s.kv_len);
        const T* kj = k + row * hd;
        const T* vj = v + row * hd;
        T* dkj = dk + row * hd;
        T* dvj = dv + row * hd;
        for (int64_t d = 0; d < hd; ++d) dkj[d] = dvj[d] = T(0);
        const int64_t first = j > offset ? j - offset : 0;  // the first query row that sees key j
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            for (int64_t i = first; i < s.q_len; ++i) {
                const T* qi = q + q_row(s, b, i, h);
                const T* doi = dout + q_row(s, b, i, h);
                T slope;
                const T p = cuda::m_exp(attention_score(qi, kj, hd, scale, softcap, slope) - lse[stat(s, b, h, i)]);
                const T ds = p * (dot_row(doi, vj, hd) - delta[stat(s, b, h, i)]) * slope;
                for (int64_t d = 0; d < hd; ++d) {
                    dvj[d] += p * doi[d];
                    dkj[d] += scale * ds * qi[d];
                }
            }
        }
    }
}

template <typename T>
void attention_forward_typed(const AttentionForwardArgs& a) {
    const AttentionDims& s = a.dims;
    const int64_t rows = s.batch * s.q_len * s.heads;
    if (rows == 0) return;
    NL_LAUNCH(attention_forward_kernel<T>, cuda::blocks_for(rows), cuda::kThreads)(
        s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.out),
        static_cast<T*>(a.lse), T(a.scale), T(a.softcap));
    NL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_backward_typed(const AttentionBackwardArgs& a) {
    const AttentionDims& s = a.dims;
    const int64_t query_rows = s.batch * s.q_len * s.heads, key_rows = s.batch * s.kv_len * s.kv_heads;
    if (query_rows == 0 || key_rows == 0) return;
    NL_LAUNCH(attention_backward_query_kernel<T>, cuda::blocks_for(query_rows), cuda::kThreads)(
        s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
        static_cast<const T*>(a.out), static_cast<const T*>(a.dout), static_cast<const T*>(a.lse),
        static_cast<T*>(a.delta), static_cast<T*>(a.dq), T(a.scale), T(a.softcap));
    NL_CUDA_CHECK_LAUNCH();
    NL_LAUNCH(attention_backward_key_kernel<T>, cuda::blocks_for(key_rows), cuda::kThreads)(
        s, static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
        static_cast<const T*>(a.dout), static_cast<const T*>(a.lse), static_cast<const T*>(a.delta),
        static_cast<T*>(a.dk), static_cast<T*>(a.dv), T(a.scale), T(a.softcap));
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::attention_forward(const AttentionForwardArgs& a) {
    check_kernel_args(a);
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64)
        attention_forward_typed<double>(a);
    else
        attention_forward_typed<float>(a);
}

void CudaBackend::attention_backward(const AttentionBackwardArgs& a) {
    check_kernel_args(a);
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64)
        attention_backward_typed<double>(a);
    else
        attention_backward_typed<float>(a);
}

}  // namespace nl
