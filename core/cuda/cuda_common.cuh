// Shared pieces of the CUDA kernels: the checked-call macro, launch sizing, half <-> f32 loads and
// stores, block reductions, the collapsed strided-iteration description and the device guard.
// Every kernel runs on the legacy default stream, so kernels, cuBLAS calls, cudaMemcpy and the
// caching allocator's block reuse are all ordered with each other without events.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "core/backend.h"
#include "core/error.h"

namespace nl {

// A failing CUDA runtime call throws nl::Error naming the call, file:line and CUDA's message.
// (nl::Error, not InternalError: the usual causes are the user's environment: no driver, out of memory,
// a bad device index.)
#define NL_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        const cudaError_t nl_cuda_status_ = (call);                                                \
        if (nl_cuda_status_ != cudaSuccess)                                                        \
            throw ::nl::Error(::nl::detail::concat("CUDA error at ", __FILE__, ":", __LINE__, ": ", \
                                                   #call, ": ", cudaGetErrorName(nl_cuda_status_), \
                                                   " (", cudaGetErrorString(nl_cuda_status_), ")")); \
    } while (0)

// After a kernel launch: reports bad launch configurations (and earlier asynchronous faults).
#define NL_CUDA_CHECK_LAUNCH() NL_CUDA_CHECK(cudaGetLastError())

// A kernel launch on the legacy default stream: NL_LAUNCH(kernel, blocks, threads)(arguments...). A macro
// because the CPU emulator (tests/cuda/emulator/, -DNORMLAB_CUDA_EMULATOR=ON) compiles these files as
// C++, which has no <<< >>>; under nvcc it is the plain launch.
#ifdef NORMLAB_CUDA_EMULATOR
#define NL_LAUNCH(kernel, blocks, threads) ::nl_emu::launcher((blocks), (threads), kernel)
#else
#define NL_LAUNCH(kernel, blocks, threads) kernel<<<(blocks), (threads)>>>
#endif

namespace cuda {

constexpr int kThreads = 256;       // threads per block for elementwise and row kernels
constexpr int64_t kMaxBlocks = 65535 * 8;  // grid-stride loops cover the rest; fits gridDim.x

// Blocks for a grid-stride loop over n items with kThreads threads each (at least 1).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > kMaxBlocks) blocks = kMaxBlocks;
    return static_cast<unsigned>(blocks);
}

// Blocks for one-block-per-row kernels that loop over rows with a grid stride.
inline unsigned row_blocks(int64_t rows) {
    int64_t blocks = rows < 1 ? 1 : rows;
    if (blocks > kMaxBlocks) blocks = kMaxBlocks;
    return static_cast<unsigned>(blocks);
}

// Makes `index` the current device for the guard's lifetime (the CUDA runtime's current device is
// per host thread, and a backend call may come after someone else selected another GPU).
class DeviceGuard {
public:
    explicit DeviceGuard(int index) {
        NL_CUDA_CHECK(cudaGetDevice(&previous_));
        if (previous_ != index) NL_CUDA_CHECK(cudaSetDevice(index));
        changed_ = previous_ != index;
    }
    ~DeviceGuard() {
        if (changed_) cudaSetDevice(previous_);  // no throw from a destructor; nothing to undo on failure
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int previous_ = 0;
    bool changed_ = false;
};

// ---- element loads and stores: every floating dtype as the compute type T (f32 or f64) ----
// bf16/f16 convert with CUDA's round-to-nearest-even intrinsics, the same rounding as dtype.cpp
// (only a NaN's payload bits may differ).

__device__ __forceinline__ float half_bits_to_f32(uint16_t bits, bool is_bf16) {
    return is_bf16 ? __bfloat162float(__ushort_as_bfloat16(bits)) : __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ uint16_t f32_to_half_bits(float v, bool is_bf16) {
    return is_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

// Element i of a floating array of `dtype` as T. For T = double only F64 reaches here.
template <typename T>
__device__ __forceinline__ T load_as(DType dtype, const void* p, int64_t i) {
    switch (dtype) {
        case DType::F32: return static_cast<T>(static_cast<const float*>(p)[i]);
        case DType::F64: return static_cast<T>(static_cast<const double*>(p)[i]);
        case DType::BF16: return static_cast<T>(half_bits_to_f32(static_cast<const uint16_t*>(p)[i], true));
        default: return static_cast<T>(half_bits_to_f32(static_cast<const uint16_t*>(p)[i], false));
    }
}

template <typename T>
__device__ __forceinline__ void store_as(DType dtype, void* p, int64_t i, T v) {
    switch (dtype) {
        case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
        case DType::F64: static_cast<double*>(p)[i] = static_cast<double>(v); return;
        case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_half_bits(static_cast<float>(v), true); return;
        default: static_cast<uint16_t*>(p)[i] = f32_to_half_bits(static_cast<float>(v), false); return;
    }
}

// ---- math overloads, so one kernel body serves float and double ----
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }

// Stable for large |x|: never evaluates exp of a large positive number (as the CPU kernel).
template <typename T>
__device__ __forceinline__ T stable_sigmoid(T x) {
    if (x >= T(0)) return T(1) / (T(1) + m_exp(-x));
    const T e = m_exp(x);
    return e / (T(1) + e);
}
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) ----

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum of v over the block, returned to every thread. The tree shape depends only on blockDim, so the
// result is the same bits on every run. `scratch` holds 32 T; the trailing barrier lets a caller
// reuse it right away.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T total = lane < warps ? scratch[lane] : T(0);
    total = warp_sum(total);
    __syncthreads();
    return total;
}

// Max over the block with NaN winning (torch.max semantics), returned to every thread.
template <typename T>
__device__ __forceinline__ T nan_max(T a, T b) {
    return (a != a || b != b) ? (a != a ? a : b) : (a > b ? a : b);
}
template <typename T>
__device__ T block_max(T v, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T total = lane < warps ? scratch[lane] : scratch[0];
    for (int offset = 16; offset > 0; offset >>= 1)
        total = nan_max(total, __shfl_xor_sync(0xffffffffu, total, offset));
    __syncthreads();
    return total;
}

// ---- strided iteration: the shape after collapsing, one stride row per operand ----

constexpr int kMaxDims = 16;
constexpr int kMaxArgs = 4;  // out + up to three inputs (where)

struct StridedLoop {
    int ndim = 1;
    int64_t numel = 0;
    int64_t sizes[kMaxDims] = {};
    int64_t strides[kMaxArgs][kMaxDims] = {};
};

// Drops size-1 dims and merges neighbours that every operand walks as one (as the CPU's collapse),
// so packed tensors become one flat dim. Throws nl::Error past kMaxDims collapsed dims.
StridedLoop collapse(const Shape& shape, std::initializer_list<const StridedArg*> args);

// Element offsets of linear index `linear` (row-major over loop.sizes) for the first `nargs` operands.
// One collapsed dim (every packed or evenly strided operand) needs no division: a 64-bit integer
// division is a long instruction sequence on a GPU, enough to make a copy compute-bound.
template <int NArgs>
__device__ __forceinline__ void offsets_of(const StridedLoop& loop, int64_t linear, int64_t* off) {
    if (loop.ndim == 1) {
        for (int k = 0; k < NArgs; ++k) off[k] = linear * loop.strides[k][0];
        return;
    }
    for (int k = 0; k < NArgs; ++k) off[k] = 0;
    for (int d = loop.ndim - 1; d >= 0; --d) {
        const int64_t size = loop.sizes[d];
        const int64_t idx = linear % size;
        linear /= size;
        for (int k = 0; k < NArgs; ++k) off[k] += idx * loop.strides[k][d];
    }
}

}  // namespace cuda
}  // namespace nl
