// CUDA copy/fill (every dtype, strided, broadcast by stride 0), binary/unary math (f32/f64) and where
// (every dtype), each one grid-stride kernel over the collapsed iteration shape. The op is a runtime
// switch inside the kernel (uniform across a warp, so it costs a branch, not divergence), which keeps
// the number of template instances, and so nvcc's compile time, small.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

using cuda::StridedLoop;

using cuda::stable_sigmoid;

// ---- copy ----

// An element as the value it represents: integers stay exact (i64 -> i64 through a double would
// round above 2^53), floats widen to double (exact for every floating dtype).
struct Value {
    double f;
    int64_t i;
    bool is_int;
};

__device__ __forceinline__ Value load_value(DType dtype, const void* p, int64_t off) {
    if (dtype == DType::I64) return Value{0.0, static_cast<const int64_t*>(p)[off], true};
    return Value{cuda::load_as<double>(dtype, p, off), 0, false};
}

// Float -> i64 as the CPU copy: truncate toward zero, NaN -> 0, out of range saturates.
__device__ __forceinline__ int64_t float_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return static_cast<int64_t>(v);
}

// Stores as the CPU's store<D>(v): half types round from f32 (an f64 source rounds to f32 first, as
// static_cast<float> does on the CPU), integer sources convert directly.
__device__ __forceinline__ void store_value(DType dtype, void* p, int64_t off, Value v) {
    switch (dtype) {
        case DType::I64:
            static_cast<int64_t*>(p)[off] = v.is_int ? v.i : float_to_i64(v.f);
            return;
        case DType::F32:
            static_cast<float*>(p)[off] = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
            return;
        case DType::F64:
            static_cast<double*>(p)[off] = v.is_int ? static_cast<double>(v.i) : v.f;
            return;
        default: {
            const float f = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
            static_cast<uint16_t*>(p)[off] = cuda::f32_to_half_bits(f, dtype == DType::BF16);
            return;
        }
    }
}

__global__ void convert_kernel(StridedLoop loop, void* dst, DType dst_dtype, const void* src, DType src_dtype) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[2];
        cuda::offsets_of<2>(loop, i, off);
        store_value(dst_dtype, dst, off[0], load_value(src_dtype, src, off[1]));
    }
}

// Same dtype: moves the element's bits (U is an unsigned integer of the element's size), so NaN
// payloads and every i64 survive unchanged.
template <typename U>
__global__ void raw_copy_kernel(StridedLoop loop, U* dst, const U* src) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[2];
        cuda::offsets_of<2>(loop, i, off);
        dst[off[0]] = src[off[1]];
    }
}

template <typename U>
__global__ void fill_kernel(StridedLoop loop, U* dst, U bits) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[1];
        cuda::offsets_of<1>(loop, i, off);
        dst[off[0]] = bits;
    }
}

// True when the collapsed loop is one packed run for every operand (a plain memcpy / memset).
bool packed(const StridedLoop& loop, int nargs) {
    if (loop.ndim != 1) return false;
    for (int k = 0; k < nargs; ++k)
        if (loop.strides[k][0] != 1 && loop.numel > 1) return false;
    return true;
}

// The GPU whose memory `ptr` is, or -1 for memory the GPU's kernels cannot address as device memory
// (plain host memory).
int pointer_device(const void* ptr) {
    cudaPointerAttributes attr{};
    NL_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
    const bool host = attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
    return host ? -1 : attr.device;
}

// ---- binary / unary ----

template <typename T>
__global__ void binary_kernel(BinaryOp op, StridedLoop loop, T* out, const T* a, const T* b) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[3];
        cuda::offsets_of<3>(loop, i, off);
        const T x = a[off[1]], y = b[off[2]];
        T r;
        switch (op) {
            case BinaryOp::Add: r = x + y; break;
            case BinaryOp::Sub: r = x - y; break;
            case BinaryOp::Mul: r = x * y; break;
            case BinaryOp::Div: r = x / y; break;
            case BinaryOp::Pow: r = cuda::m_pow(x, y); break;
            // NaN in either operand gives NaN, like torch.maximum / torch.minimum.
            case BinaryOp::Maximum: r = (x > y || x != x) ? x : y; break;
            case BinaryOp::Minimum: r = (x < y || x != x) ? x : y; break;
            case BinaryOp::Eq: r = T(x == y); break;
            case BinaryOp::Ne: r = T(x != y); break;
            case BinaryOp::Lt: r = T(x < y); break;
            case BinaryOp::Le: r = T(x <= y); break;
            case BinaryOp::Gt: r = T(x > y); break;
            case BinaryOp::SiluBackward: {  // x = grad, y = the SiLU input
                const T s = stable_sigmoid(y);
                r = x * (s * (T(1) + y * (T(1) - s)));
                break;
            }
            default: r = T(x >= y); break;  // Ge
        }
        out[off[0]] = r;
    }
}

// out = a + b for f32 out and a and a half b (bf16 when is_bf16, else f16), widened as it is read.
__global__ void add_half_b_kernel(StridedLoop loop, float* out, const float* a, const uint16_t* b, bool is_bf16) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[3];
        cuda::offsets_of<3>(loop, i, off);
        out[off[0]] = a[off[1]] + cuda::half_bits_to_f32(b[off[2]], is_bf16);
    }
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, StridedLoop loop, T* out, const T* in) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[2];
        cuda::offsets_of<2>(loop, i, off);
        const T x = in[off[1]];
        T r;
        switch (op) {
            case UnaryOp::Neg: r = -x; break;
            case UnaryOp::Exp: r = cuda::m_exp(x); break;
            case UnaryOp::Log: r = cuda::m_log(x); break;
            case UnaryOp::Sqrt: r = cuda::m_sqrt(x); break;
            case UnaryOp::Rsqrt: r = T(1) / cuda::m_sqrt(x); break;
            case UnaryOp::Abs: r = cuda::m_abs(x); break;
            case UnaryOp::Relu: r = x < T(0) ? T(0) : x; break;  // keeps NaN, like torch.relu
            case UnaryOp::Silu: r = x * stable_sigmoid(x); break;
            case UnaryOp::Sigmoid: r = stable_sigmoid(x); break;
            case UnaryOp::Tanh: r = cuda::m_tanh(x); break;
            // Exact GELU (Hendrycks & Gimpel 2016): 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default.
            case UnaryOp::Gelu: r = T(0.5) * x * (T(1) + cuda::m_erf(x * T(0.70710678118654752440))); break;
            case UnaryOp::Sign: r = x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); break;  // NaN stays NaN
            default: r = x * x; break;  // Square
        }
        out[off[0]] = r;
    }
}

// ---- where: pure selection of the element's bits ----

__device__ __forceinline__ bool nonzero(DType dtype, const void* p, int64_t off) {
    switch (dtype) {
        case DType::F32: return static_cast<const float*>(p)[off] != 0.0f;
        case DType::F64: return static_cast<const double*>(p)[off] != 0.0;
        case DType::I64: return static_cast<const int64_t*>(p)[off] != 0;
        default: return (static_cast<const uint16_t*>(p)[off] & 0x7fffu) != 0;  // +-0 is false
    }
}

template <typename U>
__global__ void where_kernel(StridedLoop loop, U* out, const void* cond, DType cond_dtype, const U* a,
                             const U* b) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < loop.numel;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t off[4];
        cuda::offsets_of<4>(loop, i, off);
        out[off[0]] = nonzero(cond_dtype, cond, off[1]) ? a[off[2]] : b[off[3]];
    }
}

// Calls f(U{}) with U the unsigned integer of the dtype's element size.
template <typename F>
void with_bits_type(DType dtype, F&& f) {
    switch (dtype_size(dtype)) {
        case 2: f(uint16_t{}); return;
        case 4: f(uint32_t{}); return;
        case 8: f(uint64_t{}); return;
    }
    NL_CHECK(false, "unexpected element size ", dtype_size(dtype));
}

// The host-side bits of `value` stored as `dtype`, converted like the CPU fill (via core/dtype.h).
uint64_t fill_bits(DType dtype, double value) {
    switch (dtype) {
        case DType::F32: {
            const float f = static_cast<float>(value);
            uint32_t bits;
            std::memcpy(&bits, &f, 4);
            return bits;
        }
        case DType::F64: {
            uint64_t bits;
            std::memcpy(&bits, &value, 8);
            return bits;
        }
        case DType::BF16: return f32_to_bf16(static_cast<float>(value));
        case DType::F16: return f32_to_f16(static_cast<float>(value));
        case DType::I64: {
            int64_t i;
            if (std::isnan(value)) i = 0;
            else if (value >= 9.2233720368547758e18) i = std::numeric_limits<int64_t>::max();
            else if (value <= -9.2233720368547758e18) i = std::numeric_limits<int64_t>::min();
            else i = static_cast<int64_t>(value);
            uint64_t bits;
            std::memcpy(&bits, &i, 8);
            return bits;
        }
    }
    NL_CHECK(false, "unknown dtype");
    return 0;
}

}  // namespace

void CudaBackend::copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) {
    const StridedLoop loop = cuda::collapse(shape, {&dst, &src});
    if (loop.numel == 0) return;
    cuda::DeviceGuard guard(index_);
    const int dst_device = pointer_device(dst.data), src_device = pointer_device(src.data);
    if (dst_device < 0 || src_device < 0) {
        // Between the host and this GPU: Tensor::to(Device) passes packed operands of one dtype.
        // cudaMemcpy on the legacy stream waits for queued kernels, so a host read sees their results.
        NL_CHECK(dst.dtype == src.dtype && packed(loop, 2),
                 "cuda copy: a host operand needs packed operands of one dtype (",
                 dtype_name(dst.dtype), " <- ", dtype_name(src.dtype), ", shape ", shape_str(shape), ")");
        NL_CUDA_CHECK(cudaMemcpy(dst.data, src.data, static_cast<size_t>(loop.numel) * dtype_size(dst.dtype),
                                 cudaMemcpyDefault));
        return;
    }
    if (dst_device != src_device) {
        // Between two GPUs (Tensor::to): each GPU has its own legacy stream, so an async copy queued
        // here would not wait for the source GPU's pending kernels (and a kernel here cannot read the
        // other GPU's memory without peer access). cudaMemcpyPeer is ordered after the queued work of
        // both devices.
        NL_CHECK(dst.dtype == src.dtype && packed(loop, 2),
                 "cuda copy: operands on two GPUs need packed operands of one dtype (",
                 dtype_name(dst.dtype), " <- ", dtype_name(src.dtype), ", shape ", shape_str(shape), ")");
        NL_CUDA_CHECK(cudaMemcpyPeer(dst.data, dst_device, src.data, src_device,
                                     static_cast<size_t>(loop.numel) * dtype_size(dst.dtype)));
        return;
    }
    if (dst.dtype == src.dtype && packed(loop, 2)) {
        NL_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(loop.numel) * dtype_size(dst.dtype),
                                      cudaMemcpyDeviceToDevice, 0));
        return;
    }
    const unsigned blocks = cuda::blocks_for(loop.numel);
    if (dst.dtype == src.dtype) {
        with_bits_type(dst.dtype, [&](auto u) {
            using U = decltype(u);
            NL_LAUNCH(raw_copy_kernel<U>, blocks, cuda::kThreads)(loop, static_cast<U*>(dst.data),
                                                          static_cast<const U*>(src.data));
        });
    } else {
        NL_LAUNCH(convert_kernel, blocks, cuda::kThreads)(loop, dst.data, dst.dtype, src.data, src.dtype);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::fill(const Shape& shape, const StridedArg& dst, double value) {
    const StridedLoop loop = cuda::collapse(shape, {&dst});
    if (loop.numel == 0) return;
    cuda::DeviceGuard guard(index_);
    const uint64_t bits = fill_bits(dst.dtype, value);
    if (bits == 0 && packed(loop, 1)) {
        NL_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, static_cast<size_t>(loop.numel) * dtype_size(dst.dtype), 0));
        return;
    }
    with_bits_type(dst.dtype, [&](auto u) {
        using U = decltype(u);
        NL_LAUNCH(fill_kernel<U>, cuda::blocks_for(loop.numel), cuda::kThreads)(loop, static_cast<U*>(dst.data),
                                                                        static_cast<U>(bits));
    });
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                         const StridedArg& b) {
    const bool half_b = op == BinaryOp::Add && out.dtype == DType::F32 && a.dtype == DType::F32 && is_half(b.dtype);
    NL_CHECK(out.dtype == a.dtype && (out.dtype == b.dtype || half_b), dtype_name(out.dtype), dtype_name(a.dtype),
             dtype_name(b.dtype));
    const StridedLoop loop = cuda::collapse(shape, {&out, &a, &b});
    if (loop.numel == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(loop.numel);
    if (half_b) {
        NL_LAUNCH(add_half_b_kernel, blocks, cuda::kThreads)(loop, static_cast<float*>(out.data),
                                                              static_cast<const float*>(a.data),
                                                              static_cast<const uint16_t*>(b.data),
                                                              b.dtype == DType::BF16);
    } else if (out.dtype == DType::F32) {
        NL_LAUNCH(binary_kernel<float>, blocks, cuda::kThreads)(op, loop, static_cast<float*>(out.data),
                                                         static_cast<const float*>(a.data),
                                                         static_cast<const float*>(b.data));
    } else {
        NL_CHECK(out.dtype == DType::F64, "binary kernels take f32 or f64, got ", dtype_name(out.dtype));
        NL_LAUNCH(binary_kernel<double>, blocks, cuda::kThreads)(op, loop, static_cast<double*>(out.data),
                                                          static_cast<const double*>(a.data),
                                                          static_cast<const double*>(b.data));
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) {
    NL_CHECK(out.dtype == in.dtype, dtype_name(out.dtype), dtype_name(in.dtype));
    const StridedLoop loop = cuda::collapse(shape, {&out, &in});
    if (loop.numel == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::blocks_for(loop.numel);
    if (out.dtype == DType::F32) {
        NL_LAUNCH(unary_kernel<float>, blocks, cuda::kThreads)(op, loop, static_cast<float*>(out.data),
                                                        static_cast<const float*>(in.data));
    } else {
        NL_CHECK(out.dtype == DType::F64, "unary kernels take f32 or f64, got ", dtype_name(out.dtype));
        NL_LAUNCH(unary_kernel<double>, blocks, cuda::kThreads)(op, loop, static_cast<double*>(out.data),
                                                         static_cast<const double*>(in.data));
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::where(const Shape& shape, const StridedArg& out, const StridedArg& cond,
                        const StridedArg& a, const StridedArg& b) {
    NL_CHECK(out.dtype == a.dtype && out.dtype == b.dtype, dtype_name(out.dtype), dtype_name(a.dtype),
             dtype_name(b.dtype));
    const StridedLoop loop = cuda::collapse(shape, {&out, &cond, &a, &b});
    if (loop.numel == 0) return;
    cuda::DeviceGuard guard(index_);
    with_bits_type(out.dtype, [&](auto u) {
        using U = decltype(u);
        NL_LAUNCH(where_kernel<U>, cuda::blocks_for(loop.numel), cuda::kThreads)(
            loop, static_cast<U*>(out.data), cond.data, cond.dtype, static_cast<const U*>(a.data),
            static_cast<const U*>(b.data));
    });
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace nl
