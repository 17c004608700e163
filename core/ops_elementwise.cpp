// Elementwise ops: operand checks, NumPy broadcasting, output allocation and one backend kernel
// (binary, unary or where); plus the test helpers allclose and max_abs_diff. bf16/f16 compute in f32
// and are cast back; comparisons on i64 compute in f64 (exact below 2^53) and return i64.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/backend.h"
#include "core/ops.h"

namespace nl {
namespace {

// `t` as a kernel sees it over the broadcast iteration shape `shape`: dims are right-aligned and
// missing or size-1 dims get stride 0.
StridedArg strided_arg(const Tensor& t, const Shape& shape) {
    StridedArg arg;
    arg.data = t.data_ptr();
    arg.dtype = t.dtype();
    arg.strides.assign(shape.size(), 0);
    const int64_t lead = static_cast<int64_t>(shape.size()) - t.dim();
    for (int64_t d = 0; d < t.dim(); ++d)
        if (t.shape()[d] != 1) arg.strides[lead + d] = t.strides()[d];
    return arg;
}

void require_defined(const Tensor& t, const char* op) {
    NL_REQUIRE(t.defined(), op, ": operand is an undefined tensor");
}

void require_same(const Tensor& a, const Tensor& b, const char* op) {
    require_defined(a, op);
    require_defined(b, op);
    NL_REQUIRE(a.device() == b.device(), op, ": device mismatch: ", a.device().str(), " vs ",
               b.device().str());
    NL_REQUIRE(a.dtype() == b.dtype(), op, ": dtype mismatch: ", dtype_name(a.dtype()), " vs ",
               dtype_name(b.dtype()));
}

bool is_comparison(BinaryOp op) {
    switch (op) {
        case BinaryOp::Eq:
        case BinaryOp::Ne:
        case BinaryOp::Lt:
        case BinaryOp::Le:
        case BinaryOp::Gt:
        case BinaryOp::Ge: return true;
        default: return false;
    }
}

// The dtype a binary op computes in for operands of `dtype`; throws for i64 math.
DType binary_compute_dtype(BinaryOp op, DType dtype, const char* name) {
    if (dtype == DType::I64 && is_comparison(op)) return DType::F64;
    NL_REQUIRE(is_floating(dtype), name, ": expected a floating dtype, found ", dtype_name(dtype));
    return compute_dtype(dtype);
}

// a and b are already in `ct`; the result is cast to `result_dtype`.
Tensor binary_kernel(BinaryOp op, const char* name, const Tensor& a, const Tensor& b, DType result_dtype) {
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    backend_for(a.device())
        .binary(op, shape, strided_arg(out, shape), strided_arg(a, shape), strided_arg(b, shape));
    return out.to(result_dtype);
}

Tensor binary(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
    require_same(a, b, name);
    const DType ct = binary_compute_dtype(op, a.dtype(), name);
    return binary_kernel(op, name, a.to(ct), b.to(ct), a.dtype());
}

// The scalar is made in the compute dtype (not rounded to bf16/f16 first), like PyTorch's
// wrapped-number scalars.
Tensor binary_scalar(BinaryOp op, const char* name, const Tensor& a, double b, bool scalar_first) {
    require_defined(a, name);
    const DType ct = binary_compute_dtype(op, a.dtype(), name);
    const Tensor s = scalar_tensor(b, ct, a.device());
    const Tensor x = a.to(ct);
    return scalar_first ? binary_kernel(op, name, s, x, a.dtype()) : binary_kernel(op, name, x, s, a.dtype());
}

Tensor unary(UnaryOp op, const char* name, const Tensor& a) {
    require_defined(a, name);
    NL_REQUIRE(is_floating(a.dtype()), name, ": expected a floating dtype, found ", dtype_name(a.dtype()));
    const Tensor x = a.to(compute_dtype(a.dtype()));
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).unary(op, x.shape(), strided_arg(out, x.shape()), strided_arg(x, x.shape()));
    return out.to(a.dtype());
}

// The shape of `a op= b`: b broadcast to a's shape, which is kept; a must not be a broadcast view.
Shape in_place_shape(const Tensor& a, const Tensor& b, const char* op) {
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
    NL_REQUIRE(shape == a.shape(), op, ": cannot add ", shape_str(b.shape()), " into ", shape_str(a.shape()),
               " in place (the sum would have shape ", shape_str(shape), ")");
    for (int64_t d = 0; d < a.dim(); ++d)
        NL_REQUIRE(a.size(d) <= 1 || a.strides()[static_cast<size_t>(d)] != 0, op,
                   ": the tensor written is a broadcast view (stride 0 in dim ", d, " of ", shape_str(a.shape()),
                   "): its elements share memory, so they cannot be summed in place");
    return shape;
}

// add_widened's operands: defined, on one device, a f32 and b bf16 or f16.
void require_widened_pair(const Tensor& a, const Tensor& b, const char* op) {
    require_defined(a, op);
    require_defined(b, op);
    NL_REQUIRE(a.device() == b.device(), op, ": device mismatch: ", a.device().str(), " vs ", b.device().str());
    NL_REQUIRE(a.dtype() == DType::F32 && is_half(b.dtype()), op, ": expected an f32 a and a bf16 or f16 b, found ",
               dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
}

}  // namespace

// ---- binary ----
Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, "add", a, b); }
void add_(Tensor& a, const Tensor& b) {
    require_same(a, b, "add_");
    const Shape shape = in_place_shape(a, b, "add_");
    const DType ct = binary_compute_dtype(BinaryOp::Add, a.dtype(), "add_");
    if (ct != a.dtype()) {  // bf16/f16: summed in f32, rounded once into a
        a.copy_(add(a, b));
        return;
    }
    // Each element is read before it is written, at the same offset: out may be a itself.
    backend_for(a.device()).binary(BinaryOp::Add, shape, strided_arg(a, shape), strided_arg(a, shape),
                                   strided_arg(b, shape));
}
Tensor add_widened(const Tensor& a, const Tensor& b) {
    require_widened_pair(a, b, "add_widened");
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), "add_widened");
    Tensor out = Tensor::empty(shape, DType::F32, a.device());
    backend_for(a.device())
        .binary(BinaryOp::Add, shape, strided_arg(out, shape), strided_arg(a, shape), strided_arg(b, shape));
    return out;
}
void add_widened_(Tensor& a, const Tensor& b) {
    require_widened_pair(a, b, "add_widened_");
    const Shape shape = in_place_shape(a, b, "add_widened_");
    backend_for(a.device())
        .binary(BinaryOp::Add, shape, strided_arg(a, shape), strided_arg(a, shape), strided_arg(b, shape));
}
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, "div", a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Pow, "pow", a, b); }
Tensor silu_backward(const Tensor& grad, const Tensor& x) {
    return binary(BinaryOp::SiluBackward, "silu_backward", grad, x);
}
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Maximum, "maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Minimum, "minimum", a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Eq, "eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ne, "ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Lt, "lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Le, "le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Gt, "gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ge, "ge", a, b); }

Tensor add(const Tensor& a, double b) { return binary_scalar(BinaryOp::Add, "add", a, b, false); }
Tensor sub(const Tensor& a, double b) { return binary_scalar(BinaryOp::Sub, "sub", a, b, false); }
Tensor rsub(double a, const Tensor& b) { return binary_scalar(BinaryOp::Sub, "rsub", b, a, true); }
Tensor mul(const Tensor& a, double b) { return binary_scalar(BinaryOp::Mul, "mul", a, b, false); }
Tensor div(const Tensor& a, double b) { return binary_scalar(BinaryOp::Div, "div", a, b, false); }
Tensor rdiv(double a, const Tensor& b) { return binary_scalar(BinaryOp::Div, "rdiv", b, a, true); }
Tensor pow(const Tensor& a, double exponent) {
    return binary_scalar(BinaryOp::Pow, "pow", a, exponent, false);
}
Tensor maximum(const Tensor& a, double b) { return binary_scalar(BinaryOp::Maximum, "maximum", a, b, false); }
Tensor minimum(const Tensor& a, double b) { return binary_scalar(BinaryOp::Minimum, "minimum", a, b, false); }
Tensor eq(const Tensor& a, double b) { return binary_scalar(BinaryOp::Eq, "eq", a, b, false); }
Tensor gt(const Tensor& a, double b) { return binary_scalar(BinaryOp::Gt, "gt", a, b, false); }
Tensor lt(const Tensor& a, double b) { return binary_scalar(BinaryOp::Lt, "lt", a, b, false); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

// ---- unary ----
Tensor neg(const Tensor& a) { return unary(UnaryOp::Neg, "neg", a); }
Tensor exp(const Tensor& a) { return unary(UnaryOp::Exp, "exp", a); }
Tensor log(const Tensor& a) { return unary(UnaryOp::Log, "log", a); }
Tensor sqrt(const Tensor& a) { return unary(UnaryOp::Sqrt, "sqrt", a); }
Tensor rsqrt(const Tensor& a) { return unary(UnaryOp::Rsqrt, "rsqrt", a); }
Tensor abs(const Tensor& a) { return unary(UnaryOp::Abs, "abs", a); }
Tensor relu(const Tensor& a) { return unary(UnaryOp::Relu, "relu", a); }
Tensor silu(const Tensor& a) { return unary(UnaryOp::Silu, "silu", a); }
Tensor sigmoid(const Tensor& a) { return unary(UnaryOp::Sigmoid, "sigmoid", a); }
Tensor tanh(const Tensor& a) { return unary(UnaryOp::Tanh, "tanh", a); }
Tensor gelu(const Tensor& a) { return unary(UnaryOp::Gelu, "gelu", a); }
Tensor sign(const Tensor& a) { return unary(UnaryOp::Sign, "sign", a); }
Tensor square(const Tensor& a) { return unary(UnaryOp::Square, "square", a); }

// ---- selection ----

// The kernel selects raw elements, so a/b may have any dtype (halves and i64 included) and cond
// any dtype (nonzero = true).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
    require_same(a, b, "where");
    require_defined(cond, "where");
    NL_REQUIRE(cond.device() == a.device(), "where: device mismatch: cond on ", cond.device().str(),
               ", values on ", a.device().str());
    const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    backend_for(a.device())
        .where(shape, strided_arg(out, shape), strided_arg(cond, shape), strided_arg(a, shape),
               strided_arg(b, shape));
    return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
    require_defined(a, "masked_fill");
    require_defined(mask, "masked_fill");
    const Shape shape = broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
    NL_REQUIRE(shape == a.shape(), "masked_fill: mask ", shape_str(mask.shape()), " does not broadcast to ",
               shape_str(a.shape()));
    return where(mask, scalar_tensor(value, a.dtype(), a.device()), a);
}

// The keep-mask (rows, cols) is built on the host and selected through `where`, so tril runs on
// any device and dtype.
Tensor tril(const Tensor& a, int64_t diagonal) {
    require_defined(a, "tril");
    NL_REQUIRE(a.dim() >= 2, "tril: expected a tensor with at least 2 dims, found ", shape_str(a.shape()));
    const int64_t rows = a.size(-2), cols = a.size(-1);
    std::vector<double> keep(static_cast<size_t>(rows * cols));  // (rows, cols)
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) keep[i * cols + j] = j - i <= diagonal ? 1.0 : 0.0;
    const Tensor mask = from_vector(keep, {rows, cols}, DType::F32).to(a.device());
    return where(mask, a, scalar_tensor(0.0, a.dtype(), a.device()));
}

// ---- comparisons for tests ----
// Both compare on the host in f64. Shapes must match exactly (no broadcasting), so a test comparing
// a [3] result with a [3, 1] reference fails loudly instead of broadcasting to [3, 3].

namespace {
void require_same_shape(const Tensor& a, const Tensor& b, const char* op) {
    require_defined(a, op);
    require_defined(b, op);
    NL_REQUIRE(a.shape() == b.shape(), op, ": shape mismatch: ", shape_str(a.shape()), " vs ",
               shape_str(b.shape()));
}
}  // namespace

// |a - b| <= atol + rtol * |b| elementwise (torch.allclose); equal infinities are close, NaN never is.
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
    require_same_shape(a, b, "allclose");
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    for (size_t i = 0; i < x.size(); ++i) {
        if (x[i] == y[i]) continue;
        if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
    }
    return true;
}

// The largest |a - b|: NaN if either holds a NaN (so a test on it fails), 0 when empty.
double max_abs_diff(const Tensor& a, const Tensor& b) {
    require_same_shape(a, b, "max_abs_diff");
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (x[i] == y[i]) continue;  // equal infinities
        const double d = std::abs(x[i] - y[i]);
        if (d != d) return std::numeric_limits<double>::quiet_NaN();
        worst = std::max(worst, d);
    }
    return worst;
}

}  // namespace nl
