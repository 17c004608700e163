// CPU kernels for soft-capping, y = cap * tanh(x / cap), and its backward from the saved output
// (formulas in core/backend.h): one vectorized pass each way over contiguous elements (cpu_math's
// tanh_f32 for f32 and bf16, std::tanh for f64), threads over chunks for large n. bf16 is read and
// written as it is, widened to f32 as each element is loaded and rounded once as each is stored.
#include <algorithm>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_fused_rows.h"
#include "core/cpu/cpu_math.h"
#include "core/error.h"

namespace nl {

namespace {

// S: the storage (float, double, or uint16_t: bf16 bits); T: the math (double for f64, else float).
// x / cap, then tanh, then times cap: the composed form's order (tanh(x / cap) * cap), so with the tanh
// op's own f32 tanh the two agree to the bit.
template <typename S, typename T>
void forward_block(const S* x, S* y, int64_t n, T cap) {
    for (int64_t i = 0; i < n; ++i)
        y[i] = cpu_rows::stored_value<S>(cpu_math::tanh_of(cpu_rows::math_value(x[i]) / cap) * cap);
}

// dx = dy * (1 - (y / cap)^2), written as dy * ((cap - y) * (cap + y)) * (1 / cap^2). Near saturation
// (|y| -> cap, |x| beyond a few caps) 1 - t^2 with t = y / cap is a difference of nearly equal numbers:
// the rounding of t (and of t^2), about 2^-24 absolute in f32, becomes the whole result once
// 1 - t^2 is that small, and the gradient turns to noise or 0 well before the true one does. cap - y
// is exact there (Sterbenz: y within a factor 2 of cap), and cap + y, the products and 1 / cap^2 each
// round once relative to their own size: the gradient is as accurate as the saved y allows, at every
// |x|. (PyTorch's tanh_backward computes 1 - t * t.)
template <typename S, typename T>
void backward_block(const S* y, const S* dy, S* dx, int64_t n, T cap, T inv_cap_sq) {
    for (int64_t i = 0; i < n; ++i) {
        const T v = cpu_rows::math_value(y[i]);
        dx[i] = cpu_rows::stored_value<S>(cpu_rows::math_value(dy[i]) * (((cap - v) * (cap + v)) * inv_cap_sq));
    }
}

template <typename S>
void forward_impl(const void* x, void* y, int64_t n, double cap) {
    using T = decltype(cpu_rows::math_value(S{}));
    const S* xs = static_cast<const S*>(x);
    S* ys = static_cast<S*>(y);
    const T c = static_cast<T>(cap);
    cpu_rows::for_element_blocks(n, [&](int64_t at, int64_t len) { forward_block(xs + at, ys + at, len, c); });
}

template <typename S>
void backward_impl(const void* y, const void* dy, void* dx, int64_t n, double cap) {
    using T = decltype(cpu_rows::math_value(S{}));
    const S *ys = static_cast<const S*>(y), *gs = static_cast<const S*>(dy);
    S* dxs = static_cast<S*>(dx);
    const T c = static_cast<T>(cap), inv_c2 = static_cast<T>(1.0 / (double(c) * double(c)));
    cpu_rows::for_element_blocks(n, [&](int64_t at, int64_t len) { backward_block(ys + at, gs + at, dxs + at, len, c, inv_c2); });
}

}  // namespace

void CpuBackend::softcap_forward(DType dtype, const void* x, void* y, int64_t n, double cap) {
    NL_CHECK(cap > 0.0, "softcap: cap ", cap);
    switch (dtype) {
        case DType::F64: return forward_impl<double>(x, y, n, cap);
        case DType::F32: return forward_impl<float>(x, y, n, cap);
        case DType::BF16: return forward_impl<uint16_t>(x, y, n, cap);
        default: NL_CHECK(false, "softcap: dtype ", dtype_name(dtype));
    }
}

void CpuBackend::softcap_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, double cap) {
    NL_CHECK(cap > 0.0, "softcap_backward: cap ", cap);
    switch (dtype) {
        case DType::F64: return backward_impl<double>(y, dy, dx, n, cap);
        case DType::F32: return backward_impl<float>(y, dy, dx, n, cap);
        case DType::BF16: return backward_impl<uint16_t>(y, dy, dx, n, cap);
        default: NL_CHECK(false, "softcap_backward: dtype ", dtype_name(dtype));
    }
}

}  // namespace nl
