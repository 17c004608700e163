// CPU kernels for SwiGLU's gate, out = silu(a) * b, and its backward (formulas in core/backend.h):
// one vectorizable pass each way over contiguous elements, threads over chunks for large n. bf16
// operands are read and written as they are, a block at a time widened to f32 in scratch (so a bf16
// gate moves only bf16 bytes and rounds each output once).
#include <algorithm>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;  // below this many elements one thread is faster
constexpr int64_t kBlock = 1024;              // elements per scratch block (4 KiB of f32 each)

template <typename T>
void forward_block(const T* a, const T* b, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * cpu_math::stable_sigmoid(a[i]) * b[i];
}

template <typename T>
void backward_block(const T* a, const T* b, const T* dout, T* da, T* db, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const T x = a[i], s = cpu_math::stable_sigmoid(x), g = dout[i];
        da[i] = g * b[i] * (s * (T(1) + x * (T(1) - s)));
        db[i] = g * (x * s);
    }
}

// body(block, scratch) over the kBlock-element blocks of n (the last one shorter), across threads
// for large n; `scratch` is the thread's (slots, kBlock) f32/f64 buffer.
template <typename T, int Slots, typename Body>
void for_blocks(int64_t n, Body body) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel if (n > kParallelElements)
    {
        alignas(64) T scratch[Slots][kBlock];
#pragma omp for schedule(static)
        for (int64_t q = 0; q < blocks; ++q) body(q, std::min(kBlock, n - q * kBlock), scratch);
    }
}

template <typename T>
void forward_impl(DType dtype, const void* a, const void* b, void* out, int64_t n) {
    for_blocks<T, 3>(n, [&](int64_t q, int64_t len, T (*scratch)[kBlock]) {
        // Each block is "row" q of width kBlock; the last one is shorter, so the offsets are by hand.
        const T* ar = cpu_rows::load<T>(dtype, cpu_rows::offset(dtype, a, q * kBlock), 0, len, scratch[0]);
        const T* br = cpu_rows::load<T>(dtype, cpu_rows::offset(dtype, b, q * kBlock), 0, len, scratch[1]);
        void* out_at = cpu_rows::offset(dtype, out, q * kBlock);
        T* o = cpu_rows::output<T>(dtype, out_at, 0, len, scratch[2]);
        forward_block(ar, br, o, len);
        cpu_rows::store<T>(dtype, out_at, 0, len, o);
    });
}

template <typename T>
void backward_impl(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db, int64_t n) {
    for_blocks<T, 5>(n, [&](int64_t q, int64_t len, T (*scratch)[kBlock]) {
        const int64_t at = q * kBlock;
        const T* ar = cpu_rows::load<T>(dtype, cpu_rows::offset(dtype, a, at), 0, len, scratch[0]);
        const T* br = cpu_rows::load<T>(dtype, cpu_rows::offset(dtype, b, at), 0, len, scratch[1]);
        const T* gr = cpu_rows::load<T>(dtype, cpu_rows::offset(dtype, dout, at), 0, len, scratch[2]);
        void* da_at = cpu_rows::offset(dtype, da, at);
        void* db_at = cpu_rows::offset(dtype, db, at);
        T* dar = cpu_rows::output<T>(dtype, da_at, 0, len, scratch[3]);
        T* dbr = cpu_rows::output<T>(dtype, db_at, 0, len, scratch[4]);
        backward_block(ar, br, gr, dar, dbr, len);
        cpu_rows::store<T>(dtype, da_at, 0, len, dar);
        cpu_rows::store<T>(dtype, db_at, 0, len, dbr);
    });
}

}  // namespace

void CpuBackend::swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) {
    if (dtype == DType::F64) {
        forward_impl<double>(dtype, a, b, out, n);
    } else {
        NL_CHECK(dtype == DType::F32 || dtype == DType::BF16, "swiglu: dtype ", dtype_name(dtype));
        forward_impl<float>(dtype, a, b, out, n);
    }
}

void CpuBackend::swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                                 int64_t n) {
    if (dtype == DType::F64) {
        backward_impl<double>(dtype, a, b, dout, da, db, n);
    } else {
        NL_CHECK(dtype == DType::F32 || dtype == DType::BF16, "swiglu: dtype ", dtype_name(dtype));
        backward_impl<float>(dtype, a, b, dout, da, db, n);
    }
}

}  // namespace nl
