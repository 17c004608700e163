// CPU elementwise kernels: binary, unary and where over strided operands. The iteration shape is
// collapsed first (size-1 dims dropped, neighbouring dims merged when every operand steps through
// them as one), so contiguous tensors and scalar broadcasts become one flat, vectorizable loop and
// only genuinely strided views pay for the n-d index counter.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {
namespace {

constexpr int64_t kParallelMin = 32768;  // below this many elements threads cost more than they save
constexpr int64_t kChunk = 16384;        // elements per OpenMP task on large tensors
constexpr int kMaxArgs = 4;              // out + up to three inputs (where)

// The iteration space after collapsing; innermost dim last, at least one dim.
struct Loop {
    Shape shape;
    int nargs = 0;
    Shape strides[kMaxArgs];  // per operand, one stride per collapsed dim (elements)
};

Loop collapse(const Shape& shape, std::initializer_list<const StridedArg*> args) {
    Loop loop;
    loop.nargs = static_cast<int>(args.size());
    NL_CHECK(loop.nargs <= kMaxArgs);
    for (const StridedArg* arg : args) NL_CHECK(arg->strides.size() == shape.size(), shape_str(shape));
    // Outermost to innermost, skipping size-1 dims (their strides never matter).
    for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 1) continue;
        const bool can_merge = !loop.shape.empty() && [&] {
            int k = 0;
            for (const StridedArg* arg : args) {
                // the previous (outer) dim must step exactly over this whole dim
                if (loop.strides[k].back() != arg->strides[d] * shape[d]) return false;
                ++k;
            }
            return true;
        }();
        int k = 0;
        if (can_merge) {
            loop.shape.back() *= shape[d];
            for (const StridedArg* arg : args) loop.strides[k++].back() = arg->strides[d];
        } else {
            loop.shape.push_back(shape[d]);
            for (const StridedArg* arg : args) loop.strides[k++].push_back(arg->strides[d]);
        }
    }
    if (loop.shape.empty()) {  // a scalar, or all dims of size 1
        loop.shape.push_back(1);
        for (int k = 0; k < loop.nargs; ++k) loop.strides[k].push_back(0);
    }
    return loop;
}

// Calls row(len, offsets) for runs along the innermost dim that cover the row-major elements
// [begin, end); offsets are each operand's element offset at the run's start.
template <typename Row>
void for_rows(const Loop& loop, int64_t begin, int64_t end, Row& row) {
    const int64_t nd = static_cast<int64_t>(loop.shape.size());
    const int64_t inner = loop.shape[nd - 1];
    int64_t index[64];
    NL_CHECK(nd <= 64);
    int64_t offsets[kMaxArgs] = {};
    int64_t rest = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
        index[d] = rest % loop.shape[d];
        rest /= loop.shape[d];
        for (int k = 0; k < loop.nargs; ++k) offsets[k] += index[d] * loop.strides[k][d];
    }
    while (begin < end) {
        const int64_t len = std::min(inner - index[nd - 1], end - begin);
        row(len, offsets);
        begin += len;
        index[nd - 1] += len;
        for (int k = 0; k < loop.nargs; ++k) offsets[k] += len * loop.strides[k][nd - 1];
        if (index[nd - 1] < inner) continue;
        // carry into the outer dims
        index[nd - 1] = 0;
        for (int k = 0; k < loop.nargs; ++k) offsets[k] -= inner * loop.strides[k][nd - 1];
        for (int64_t d = nd - 2; d >= 0; --d) {
            ++index[d];
            for (int k = 0; k < loop.nargs; ++k) offsets[k] += loop.strides[k][d];
            if (index[d] < loop.shape[d]) break;
            index[d] = 0;
            for (int k = 0; k < loop.nargs; ++k) offsets[k] -= loop.shape[d] * loop.strides[k][d];
        }
    }
}

// Runs `row` over the whole loop, split into fixed chunks across OpenMP threads when large.
// Elementwise results do not depend on the split.
template <typename Row>
void run_rows(const Loop& loop, Row row) {
    const int64_t n = shape_numel(loop.shape);
    if (n < kParallelMin) {
        for_rows(loop, 0, n, row);
        return;
    }
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        Row local = row;
        for_rows(loop, c * kChunk, std::min(n, (c + 1) * kChunk), local);
    }
}

// ---- binary ----

template <typename T, typename F>
void binary_loop(const Loop& loop, const StridedArg& out, const StridedArg& a, const StridedArg& b,
                 F f) {
    T* po = static_cast<T*>(out.data);
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    const int64_t so = loop.strides[0].back(), sa = loop.strides[1].back(), sb = loop.strides[2].back();
    run_rows(loop, [=](int64_t len, const int64_t* off) {
        T* o = po + off[0];
        const T* x = pa + off[1];
        const T* y = pb + off[2];
        // The common layouts get their own loops so the compiler can vectorize them.
        if (so == 1 && sa == 1 && sb == 1) {
            for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], y[i]);
        } else if (so == 1 && sa == 1 && sb == 0) {
            const T s = *y;
            for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], s);
        } else if (so == 1 && sa == 0 && sb == 1) {
            const T s = *x;
            for (int64_t i = 0; i < len; ++i) o[i] = f(s, y[i]);
        } else {
            for (int64_t i = 0; i < len; ++i) o[i * so] = f(x[i * sa], y[i * sb]);
        }
    });
}

// out = a + b for f32 out and a and a half b (bf16, or f16 when !bf16), widened as it is read.
void add_half_b(const Loop& loop, const StridedArg& out, const StridedArg& a, const StridedArg& b, bool bf16) {
    float* po = static_cast<float*>(out.data);
    const float* pa = static_cast<const float*>(a.data);
    const uint16_t* pb = static_cast<const uint16_t*>(b.data);
    const int64_t so = loop.strides[0].back(), sa = loop.strides[1].back(), sb = loop.strides[2].back();
    run_rows(loop, [=](int64_t len, const int64_t* off) {
        float* o = po + off[0];
        const float* x = pa + off[1];
        const uint16_t* y = pb + off[2];
        if (bf16 && so == 1 && sa == 1 && sb == 1) {  // autocast's case: its own loop, so it vectorizes
            for (int64_t i = 0; i < len; ++i) o[i] = x[i] + bf16_to_f32(y[i]);
        } else {
            for (int64_t i = 0; i < len; ++i)
                o[i * so] = x[i * sa] + (bf16 ? bf16_to_f32(y[i * sb]) : f16_to_f32(y[i * sb]));
        }
    });
}

using cpu_math::exp_of;
using cpu_math::stable_sigmoid;

template <typename T>
void binary_typed(BinaryOp op, const Loop& loop, const StridedArg& out, const StridedArg& a,
                  const StridedArg& b) {
    switch (op) {
        case BinaryOp::Add: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return x + y; });
        case BinaryOp::Sub: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return x - y; });
        case BinaryOp::Mul: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return x * y; });
        case BinaryOp::Div: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return x / y; });
        case BinaryOp::Pow:
            return binary_loop<T>(loop, out, a, b, [](T x, T y) { return std::pow(x, y); });
        // NaN in either operand gives NaN, like torch.maximum / torch.minimum.
        case BinaryOp::Maximum:
            return binary_loop<T>(loop, out, a, b, [](T x, T y) { return (x > y || x != x) ? x : y; });
        case BinaryOp::Minimum:
            return binary_loop<T>(loop, out, a, b, [](T x, T y) { return (x < y || x != x) ? x : y; });
        case BinaryOp::Eq: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x == y); });
        case BinaryOp::Ne: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x != y); });
        case BinaryOp::Lt: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x < y); });
        case BinaryOp::Le: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x <= y); });
        case BinaryOp::Gt: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x > y); });
        case BinaryOp::Ge: return binary_loop<T>(loop, out, a, b, [](T x, T y) { return T(x >= y); });
        case BinaryOp::SiluBackward:
            return binary_loop<T>(loop, out, a, b, [](T g, T x) {
                const T s = stable_sigmoid(x);
                return g * (s * (T(1) + x * (T(1) - s)));
            });
    }
    NL_CHECK(false, "unknown BinaryOp");
}

// ---- unary ----

template <typename T, typename F>
void unary_loop(const Loop& loop, const StridedArg& out, const StridedArg& in, F f) {
    T* po = static_cast<T*>(out.data);
    const T* pi = static_cast<const T*>(in.data);
    const int64_t so = loop.strides[0].back(), si = loop.strides[1].back();
    run_rows(loop, [=](int64_t len, const int64_t* off) {
        T* o = po + off[0];
        const T* x = pi + off[1];
        if (so == 1 && si == 1) {
            for (int64_t i = 0; i < len; ++i) o[i] = f(x[i]);
        } else {
            for (int64_t i = 0; i < len; ++i) o[i * so] = f(x[i * si]);
        }
    });
}

template <typename T>
void unary_typed(UnaryOp op, const Loop& loop, const StridedArg& out, const StridedArg& in) {
    switch (op) {
        case UnaryOp::Neg: return unary_loop<T>(loop, out, in, [](T x) { return -x; });
        case UnaryOp::Exp: return unary_loop<T>(loop, out, in, [](T x) { return std::exp(x); });
        case UnaryOp::Log: return unary_loop<T>(loop, out, in, [](T x) { return std::log(x); });
        case UnaryOp::Sqrt: return unary_loop<T>(loop, out, in, [](T x) { return std::sqrt(x); });
        case UnaryOp::Rsqrt:
            return unary_loop<T>(loop, out, in, [](T x) { return T(1) / std::sqrt(x); });
        case UnaryOp::Abs: return unary_loop<T>(loop, out, in, [](T x) { return std::abs(x); });
        // `x < 0 ? 0 : x` keeps NaN as NaN, like torch.relu.
        case UnaryOp::Relu: return unary_loop<T>(loop, out, in, [](T x) { return x < T(0) ? T(0) : x; });
        case UnaryOp::Silu:
            return unary_loop<T>(loop, out, in, [](T x) { return x * stable_sigmoid(x); });
        case UnaryOp::Sigmoid: return unary_loop<T>(loop, out, in, [](T x) { return stable_sigmoid(x); });
        // The vectorizable f32 tanh (within 2 ulp of glibc's tanhf over every f32 input, and 1.33 ulp of
        // the exact tanh: tests/test_ops_elementwise.cpp); std::tanh for f64.
        case UnaryOp::Tanh: return unary_loop<T>(loop, out, in, [](T x) { return cpu_math::tanh_of(x); });
        // Exact GELU (Hendrycks & Gimpel 2016): 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default.
        case UnaryOp::Gelu:
            return unary_loop<T>(loop, out, in, [](T x) {
                return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
            });
        // -1 / 0 / 1; NaN stays NaN (torch.sign).
        case UnaryOp::Sign:
            return unary_loop<T>(loop, out, in, [](T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); });
        case UnaryOp::Square: return unary_loop<T>(loop, out, in, [](T x) { return x * x; });
    }
    NL_CHECK(false, "unknown UnaryOp");
}

// ---- where: pure selection, so it moves raw bits and works for every dtype of out/a/b ----

// Lambdas (not function pointers) so the test inlines into the loop. bf16/f16 condition values are
// nonzero unless +0 or -0 (sign bit ignored).
constexpr auto nonzero = [](auto c) { return c != decltype(c)(0); };
constexpr auto nonzero_half = [](uint16_t bits) { return (bits & 0x7fffu) != 0; };

template <typename T, typename C, typename Test>
void where_loop(const Loop& loop, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
                const StridedArg& b, Test test) {
    T* po = static_cast<T*>(out.data);
    const C* pc = static_cast<const C*>(cond.data);
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    const int64_t so = loop.strides[0].back(), sc = loop.strides[1].back();
    const int64_t sa = loop.strides[2].back(), sb = loop.strides[3].back();
    run_rows(loop, [=](int64_t len, const int64_t* off) {
        T* o = po + off[0];
        const C* c = pc + off[1];
        const T* x = pa + off[2];
        const T* y = pb + off[3];
        for (int64_t i = 0; i < len; ++i) o[i * so] = test(c[i * sc]) ? x[i * sa] : y[i * sb];
    });
}

template <typename T>
void where_typed(const Loop& loop, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
                 const StridedArg& b) {
    switch (cond.dtype) {
        case DType::F32: return where_loop<T, float>(loop, out, cond, a, b, nonzero);
        case DType::F64: return where_loop<T, double>(loop, out, cond, a, b, nonzero);
        case DType::I64: return where_loop<T, int64_t>(loop, out, cond, a, b, nonzero);
        case DType::BF16:
        case DType::F16: return where_loop<T, uint16_t>(loop, out, cond, a, b, nonzero_half);
    }
    NL_CHECK(false, "unknown DType");
}

}  // namespace

void CpuBackend::binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                        const StridedArg& b) {
    const bool half_b = op == BinaryOp::Add && out.dtype == DType::F32 && a.dtype == DType::F32 && is_half(b.dtype);
    NL_CHECK(out.dtype == a.dtype && (out.dtype == b.dtype || half_b), dtype_name(out.dtype), dtype_name(a.dtype),
             dtype_name(b.dtype));
    if (shape_numel(shape) == 0) return;
    const Loop loop = collapse(shape, {&out, &a, &b});
    if (half_b) return add_half_b(loop, out, a, b, b.dtype == DType::BF16);
    if (out.dtype == DType::F32) return binary_typed<float>(op, loop, out, a, b);
    NL_CHECK(out.dtype == DType::F64, "binary kernels take f32 or f64, got ", dtype_name(out.dtype));
    binary_typed<double>(op, loop, out, a, b);
}

void CpuBackend::unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) {
    NL_CHECK(out.dtype == in.dtype, dtype_name(out.dtype), dtype_name(in.dtype));
    if (shape_numel(shape) == 0) return;
    const Loop loop = collapse(shape, {&out, &in});
    if (out.dtype == DType::F32) return unary_typed<float>(op, loop, out, in);
    NL_CHECK(out.dtype == DType::F64, "unary kernels take f32 or f64, got ", dtype_name(out.dtype));
    unary_typed<double>(op, loop, out, in);
}

void CpuBackend::where(const Shape& shape, const StridedArg& out, const StridedArg& cond,
                       const StridedArg& a, const StridedArg& b) {
    NL_CHECK(out.dtype == a.dtype && out.dtype == b.dtype, dtype_name(out.dtype), dtype_name(a.dtype),
             dtype_name(b.dtype));
    if (shape_numel(shape) == 0) return;
    const Loop loop = collapse(shape, {&out, &cond, &a, &b});
    switch (dtype_size(out.dtype)) {
        case 2: return where_typed<uint16_t>(loop, out, cond, a, b);
        case 4: return where_typed<uint32_t>(loop, out, cond, a, b);
        case 8: return where_typed<uint64_t>(loop, out, cond, a, b);
    }
    NL_CHECK(false, "where: unexpected element size ", dtype_size(out.dtype));
}

}  // namespace nl
