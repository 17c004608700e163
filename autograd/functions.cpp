// Differentiable ops: each runs the core op on .data() and records one node (make_result) whose
// backward closure is written with these same Var ops, so a backward under create_graph is itself
// recorded. A closure computes only the gradients whose inputs required grad at forward time, and
// an op saves only the tensors those gradients need (PyTorch's rule), so saved-bytes reports are
// honest. Formulas: the standard derivatives, as in PyTorch's tools/autograd/derivatives.yaml.
#include "autograd/functions.h"

#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"

namespace nl {

namespace {

using Saved = std::vector<Var>;
using Grads = std::vector<Var>;

// Whether a gradient for `v` will be needed: decides what a forward saves.
bool wants(const Var& v) { return v.defined() && v.requires_grad() && is_grad_enabled(); }

// A constant scalar with g's dtype and device (the "other branch" of where's gradient).
Var zero_like_scalar(const Var& g) { return Var(scalar_tensor(0.0, g.dtype(), g.device())); }

// Shape after reducing `dims` with keepdim (reduced dims become 1), and how many elements each
// output element reduced over. Empty dims means every dim.
struct Reduction {
    Shape keep_shape;
    int64_t count = 1;
};

Reduction reduction(const Shape& shape, const std::vector<int64_t>& dims, const char* op) {
    Reduction r;
    r.keep_shape = shape;
    const int64_t ndim = static_cast<int64_t>(shape.size());
    std::vector<int64_t> all(ndim);
    std::iota(all.begin(), all.end(), 0);
    std::vector<bool> reduced(ndim, false);
    for (int64_t d : dims.empty() ? all : dims) {
        int64_t w = wrap_dim(d, ndim, op);
        if (reduced[w]) continue;  // the core op rejects or ignores repeats; count each dim once
        reduced[w] = true;
        r.count *= shape[w];
        r.keep_shape[w] = 1;
    }
    return r;
}

// The gradient of a reduction: g (out shape) broadcast back over the reduced dims.
Var expand_back(const Var& g, const Reduction& r, const Shape& in_shape) {
    return expand(reshape(g, r.keep_shape), in_shape);
}

// A view given as a function of the base tensor (slice, narrow, select). Its backward writes the
// gradient into zeros of the base shape through the same view (scatter_view), and scatter_view's
// backward is the view again, so both are differentiable to any order.
using ViewFn = std::function<Tensor(const Tensor&)>;
Var apply_view(const Var& a, const char* name, const ViewFn& fn);

Var scatter_view(const Var& g, const Shape& base_shape, const char* name, const ViewFn& fn) {
    Tensor out = zeros(base_shape, g.dtype(), g.device());  // base_shape
    Tensor window = fn(out);
    window.copy_(g.data());
    return make_result(out, std::string(name) + "_backward", {g}, {},
                       [name, fn](const Var& gg, const Saved&) -> Grads { return {apply_view(gg, name, fn)}; });
}

Var apply_view(const Var& a, const char* name, const ViewFn& fn) {
    return make_result(fn(a.data()), name, {a}, {},
                       [name, fn, shape = a.shape()](const Var& g, const Saved&) -> Grads {
                           return {scatter_view(g, shape, name, fn)};
                       });
}

// A reshape-like view (reshape, view, squeeze, unsqueeze, flatten): the gradient is reshaped back.
Var reshaped(const Var& a, Tensor out, const char* name) {
    if (out.shape() == a.shape()) return a;
    return make_result(std::move(out), name, {a}, {},
                       [shape = a.shape()](const Var& g, const Saved&) -> Grads { return {reshape(g, shape)}; });
}

// gelu'(x) = Phi(x) + x phi(x) with Phi(x) = gelu(x) / x (0.5 at 0) and phi the normal density.
Tensor gelu_derivative(const Tensor& x) {
    const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * M_PI);
    Tensor cdf = where(eq(x, 0.0), full_like(x, 0.5), div(gelu(x), x));
    Tensor pdf = mul(exp(mul(square(x), -0.5)), inv_sqrt_2pi);
    return add(cdf, mul(x, pdf));
}

// g * gelu'(x) as a node of its own, so gelu is differentiable twice (and more):
// d/dg = gelu'(x), d/dx = g * gelu''(x) with gelu''(x) = phi(x) (2 - x^2).
Var gelu_backward(const Var& g, const Var& x) {
    Tensor out = mul(g.data(), gelu_derivative(x.data()));
    bool gg_needed = wants(g), gx_needed = wants(x);
    return make_result(out, "gelu_backward", {g, x}, {{"g", g}, {"x", x}},
                       [gg_needed, gx_needed](const Var& gg, const Saved& s) -> Grads {
                           const Var& g = s[0];
                           const Var& x = s[1];
                           Var dg, dx;
                           if (gg_needed) dg = gelu_backward(gg, x);
                           if (gx_needed) {
                               const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * M_PI);
                               Var pdf = exp(square(x) * -0.5) * inv_sqrt_2pi;
                               dx = gg * g * (pdf * rsub(2.0, square(x)));
                           }
                           return {dg, dx};
                       });
}

// maximum/minimum: the gradient follows the winner; a tie sends half to each side (as PyTorch).
Var max_min(const Var& a, const Var& b, bool is_max) {
    Tensor out = is_max ? maximum(a.data(), b.data()) : minimum(a.data(), b.data());
    std::vector<SavedTensor> saved;
    if (wants(a) || wants(b)) {
        // Share of the gradient that goes to a: 1 where a wins, 1/2 on ties (out shape).
        Tensor wins = is_max ? gt(a.data(), b.data()) : lt(a.data(), b.data());
        saved.emplace_back("mask", add(wins, mul(eq(a.data(), b.data()), 0.5)));
    }
    return make_result(out, is_max ? "maximum" : "minimum", {a, b}, std::move(saved),
                       [ga = wants(a), gb = wants(b), sa = a.shape(), sb = b.shape()](const Var& g,
                                                                                     const Saved& s) -> Grads {
                           Var da, db;
                           if (ga) da = sum_to(g * s[0], sa);
                           if (gb) db = sum_to(g * rsub(1.0, s[0]), sb);
                           return {da, db};
                       });
}

Var max_min_scalar(const Var& a, double b, bool is_max) {
    Tensor out = is_max ? maximum(a.data(), b) : minimum(a.data(), b);
    std::vector<SavedTensor> saved;
    if (wants(a)) {
        Tensor wins = is_max ? gt(a.data(), b) : lt(a.data(), b);
        saved.emplace_back("mask", add(wins, mul(eq(a.data(), b), 0.5)));
    }
    return make_result(out, is_max ? "maximum" : "minimum", {a}, std::move(saved),
                       [](const Var& g, const Saved& s) -> Grads { return {g * s[0]}; });
}

Var reduce_max_min(const Var& a, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
    const char* name = is_max ? "max" : "min";
    Tensor out = is_max ? max(a.data(), dims, keepdim) : min(a.data(), dims, keepdim);
    Reduction r = reduction(a.shape(), dims, name);
    std::vector<SavedTensor> saved;
    if (wants(a)) {
        // Ties share the gradient evenly (torch.amax): weight = [a == max] / count of maxima.
        Tensor hit = eq(a.data(), out.reshape(r.keep_shape).expand(a.shape()));
        Tensor count = sum(hit, dims, true);
        saved.emplace_back("weight", div(hit, count));
    }
    return make_result(out, name, {a}, std::move(saved),
                       [r, shape = a.shape()](const Var& g, const Saved& s) -> Grads {
                           return {expand_back(g, r, shape) * s[0]};
                       });
}

}  // namespace

// ---- elementwise binary ----

Var add(const Var& a, const Var& b) {
    return make_result(add(a.data(), b.data()), "add", {a, b}, {},
                       [ga = wants(a), gb = wants(b), sa = a.shape(), sb = b.shape()](const Var& g,
                                                                                     const Saved&) -> Grads {
                           return {ga ? sum_to(g, sa) : Var(), gb ? sum_to(g, sb) : Var()};
                       });
}

Var sub(const Var& a, const Var& b) {
    return make_result(sub(a.data(), b.data()), "sub", {a, b}, {},
                       [ga = wants(a), gb = wants(b), sa = a.shape(), sb = b.shape()](const Var& g,
                                                                                     const Saved&) -> Grads {
                           return {ga ? sum_to(g, sa) : Var(), gb ? sum_to(-g, sb) : Var()};
                       });
}

Var mul(const Var& a, const Var& b) {
    const bool ga = wants(a), gb = wants(b);
    std::vector<SavedTensor> saved;  // d/da needs b, d/db needs a
    if (ga) saved.emplace_back("b", b);
    if (gb) saved.emplace_back("a", a);
    return make_result(mul(a.data(), b.data()), "mul", {a, b}, std::move(saved),
                       [ga, gb, sa = a.shape(), sb = b.shape()](const Var& g, const Saved& s) -> Grads {
                           Var da, db;
                           if (ga) da = sum_to(g * s[0], sa);
                           if (gb) db = sum_to(g * s[ga ? 1 : 0], sb);
                           return {da, db};
                       });
}

Var div(const Var& a, const Var& b) {
    const bool ga = wants(a), gb = wants(b);
    std::vector<SavedTensor> saved;  // d/da = 1/b; d/db = -a/b^2
    if (ga || gb) saved.emplace_back("b", b);
    if (gb) saved.emplace_back("a", a);
    return make_result(div(a.data(), b.data()), "div", {a, b}, std::move(saved),
                       [ga, gb, sa = a.shape(), sb = b.shape()](const Var& g, const Saved& s) -> Grads {
                           const Var& b = s[0];
                           Var da, db;
                           if (ga) da = sum_to(g / b, sa);
                           if (gb) db = sum_to(-(g * s[1]) / (b * b), sb);
                           return {da, db};
                       });
}

Var pow(const Var& a, const Var& b) {
    const bool ga = wants(a), gb = wants(b);
    std::vector<SavedTensor> saved;  // d/da = b a^(b-1); d/db = a^b log a
    if (ga || gb) {
        saved.emplace_back("a", a);
        saved.emplace_back("b", b);
    }
    return make_result(pow(a.data(), b.data()), "pow", {a, b}, std::move(saved),
                       [ga, gb, sa = a.shape(), sb = b.shape()](const Var& g, const Saved& s) -> Grads {
                           const Var& a = s[0];
                           const Var& b = s[1];
                           Var da, db;
                           if (ga) da = sum_to(g * b * pow(a, sub(b, 1.0)), sa);
                           if (gb) db = sum_to(g * pow(a, b) * log(a), sb);
                           return {da, db};
                       });
}

Var maximum(const Var& a, const Var& b) { return max_min(a, b, true); }
Var minimum(const Var& a, const Var& b) { return max_min(a, b, false); }

Var add(const Var& a, double b) {
    return make_result(add(a.data(), b), "add", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {g}; });
}

Var sub(const Var& a, double b) {
    return make_result(sub(a.data(), b), "sub", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {g}; });
}

Var rsub(double a, const Var& b) {
    return make_result(rsub(a, b.data()), "rsub", {b}, {}, [](const Var& g, const Saved&) -> Grads { return {-g}; });
}

Var mul(const Var& a, double b) {
    return make_result(mul(a.data(), b), "mul", {a}, {},
                       [b](const Var& g, const Saved&) -> Grads { return {g * b}; });
}

Var div(const Var& a, double b) {
    return make_result(div(a.data(), b), "div", {a}, {},
                       [b](const Var& g, const Saved&) -> Grads { return {g / b}; });
}

Var rdiv(double a, const Var& b) {
    std::vector<SavedTensor> saved;
    if (wants(b)) saved.emplace_back("b", b);
    return make_result(rdiv(a, b.data()), "rdiv", {b}, std::move(saved),
                       [a](const Var& g, const Saved& s) -> Grads { return {-(g * a) / (s[0] * s[0])}; });
}

Var pow(const Var& a, double exponent) {
    std::vector<SavedTensor> saved;
    if (wants(a) && exponent != 0.0) saved.emplace_back("a", a);
    return make_result(pow(a.data(), exponent), "pow", {a}, std::move(saved),
                       [exponent](const Var& g, const Saved& s) -> Grads {
                           if (exponent == 0.0) return {Var()};  // constant 1: no gradient
                           return {g * (pow(s[0], exponent - 1.0) * exponent)};
                       });
}

Var maximum(const Var& a, double b) { return max_min_scalar(a, b, true); }
Var minimum(const Var& a, double b) { return max_min_scalar(a, b, false); }

Var operator+(const Var& a, const Var& b) { return add(a, b); }
Var operator-(const Var& a, const Var& b) { return sub(a, b); }
Var operator*(const Var& a, const Var& b) { return mul(a, b); }
Var operator/(const Var& a, const Var& b) { return div(a, b); }
Var operator+(const Var& a, double b) { return add(a, b); }
Var operator-(const Var& a, double b) { return sub(a, b); }
Var operator*(const Var& a, double b) { return mul(a, b); }
Var operator/(const Var& a, double b) { return div(a, b); }
Var operator+(double a, const Var& b) { return add(b, a); }
Var operator-(double a, const Var& b) { return rsub(a, b); }
Var operator*(double a, const Var& b) { return mul(b, a); }
Var operator/(double a, const Var& b) { return rdiv(a, b); }
Var operator-(const Var& a) { return neg(a); }

// ---- elementwise unary ----

Var neg(const Var& a) {
    return make_result(neg(a.data()), "neg", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {-g}; });
}

Var exp(const Var& a) {
    return make_result(exp(a.data()), "exp", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {g * s[0]}; });
}

Var log(const Var& a) {
    return make_result(log(a.data()), "log", {a}, {{"x", a}},
                       [](const Var& g, const Saved& s) -> Grads { return {g / s[0]}; });
}

Var sqrt(const Var& a) {  // d sqrt(x) = 1 / (2 sqrt(x))
    return make_result(sqrt(a.data()), "sqrt", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {(g * 0.5) / s[0]}; });
}

Var rsqrt(const Var& a) {  // d x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3
    return make_result(rsqrt(a.data()), "rsqrt", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {g * (pow(s[0], 3.0) * -0.5)}; });
}

Var abs(const Var& a) {
    return make_result(abs(a.data()), "abs", {a}, {{"x", a}},
                       [](const Var& g, const Saved& s) -> Grads { return {g * Var(sign(s[0].data()))}; });
}

Var relu(const Var& a) {
    return make_result(relu(a.data()), "relu", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {g * Var(gt(s[0].data(), 0.0))}; });
}

Var silu(const Var& a) {  // d x s(x) = s (1 + x (1 - s))
    return make_result(silu(a.data()), "silu", {a}, {{"x", a}}, [](const Var& g, const Saved& s) -> Grads {
        const Var& x = s[0];
        // First order (the usual backward): one fused pass. Under create_graph the composed ops
        // record a graph that can be differentiated again.
        if (!is_grad_enabled()) return {Var(silu_backward(g.data(), x.data()))};
        Var sig = sigmoid(x);
        return {g * (sig * (x * rsub(1.0, sig) + 1.0))};
    });
}

Var sigmoid(const Var& a) {  // d s = s (1 - s)
    return make_result(sigmoid(a.data()), "sigmoid", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {g * (s[0] * rsub(1.0, s[0]))}; });
}

Var tanh(const Var& a) {  // d tanh = 1 - tanh^2
    return make_result(tanh(a.data()), "tanh", {a}, {SavedTensor::output("y")},
                       [](const Var& g, const Saved& s) -> Grads { return {g * rsub(1.0, square(s[0]))}; });
}

Var gelu(const Var& a) {
    return make_result(gelu(a.data()), "gelu", {a}, {{"x", a}},
                       [](const Var& g, const Saved& s) -> Grads { return {gelu_backward(g, s[0])}; });
}

Var square(const Var& a) {
    return make_result(square(a.data()), "square", {a}, {{"x", a}},
                       [](const Var& g, const Saved& s) -> Grads { return {g * (s[0] * 2.0)}; });
}

// ---- reductions ----

Var sum(const Var& a, const std::vector<int64_t>& dims, bool keepdim) {
    Tensor out = sum(a.data(), dims, keepdim);
    return make_result(out, "sum", {a}, {},
                       [r = reduction(a.shape(), dims, "sum"), shape = a.shape()](const Var& g, const Saved&) -> Grads {
                           return {expand_back(g, r, shape)};
                       });
}

Var mean(const Var& a, const std::vector<int64_t>& dims, bool keepdim) {
    Tensor out = mean(a.data(), dims, keepdim);
    return make_result(out, "mean", {a}, {},
                       [r = reduction(a.shape(), dims, "mean"), shape = a.shape()](const Var& g, const Saved&) -> Grads {
                           return {expand_back(g / static_cast<double>(r.count), r, shape)};
                       });
}

Var max(const Var& a, const std::vector<int64_t>& dims, bool keepdim) { return reduce_max_min(a, dims, keepdim, true); }
Var min(const Var& a, const std::vector<int64_t>& dims, bool keepdim) { return reduce_max_min(a, dims, keepdim, false); }

Var var(const Var& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
    // d/dx_i sum_j (x_j - mean)^2 / (N - c) = 2 (x_i - mean) / (N - c)
    Tensor out = var(a.data(), dims, correction, keepdim);
    return make_result(out, "var", {a}, {{"x", a}},
                       [r = reduction(a.shape(), dims, "var"), shape = a.shape(), dims, correction](
                           const Var& g, const Saved& s) -> Grads {
                           const Var& x = s[0];
                           Var centered = x - mean(x, dims, true);
                           double scale = 2.0 / static_cast<double>(r.count - correction);
                           return {expand_back(g, r, shape) * (centered * scale)};
                       });
}

Var sum_to(const Var& a, const Shape& shape) {
    if (a.shape() == shape) return a;
    return make_result(sum_to(a.data(), shape), "sum_to", {a}, {},
                       [in = a.shape()](const Var& g, const Saved&) -> Grads { return {expand(g, in)}; });
}

// ---- softmax family ----

Var softmax(const Var& a, int64_t dim) {
    const int64_t d = wrap_dim(dim, a.dim(), "softmax");
    return make_result(softmax(a.data(), d), "softmax", {a}, {SavedTensor::output("y")},
                       [d](const Var& g, const Saved& s) -> Grads {
                           const Var& y = s[0];
                           // The fused kernel when nothing is recorded; Var ops under create_graph.
                           if (!is_grad_enabled()) return {Var(softmax_backward(y.data(), g.data(), d))};
                           return {y * (g - sum(g * y, {d}, true))};
                       });
}

Var log_softmax(const Var& a, int64_t dim) {
    const int64_t d = wrap_dim(dim, a.dim(), "log_softmax");
    return make_result(log_softmax(a.data(), d), "log_softmax", {a}, {SavedTensor::output("y")},
                       [d](const Var& g, const Saved& s) -> Grads {
                           const Var& y = s[0];
                           if (!is_grad_enabled()) return {Var(log_softmax_backward(y.data(), g.data(), d))};
                           return {g - exp(y) * sum(g, {d}, true)};
                       });
}

// ---- linear algebra ----

Var matmul(const Var& a, const Var& b) {
    const bool ga = wants(a), gb = wants(b);
    std::vector<SavedTensor> saved;  // d/da = g b^T needs b; d/db = a^T g needs a
    if (ga) saved.emplace_back("b", b);
    if (gb) saved.emplace_back("a", a);
    return make_result(matmul(a.data(), b.data()), "matmul", {a, b}, std::move(saved),
                       [ga, gb, sa = a.shape(), sb = b.shape()](const Var& g, const Saved& s) -> Grads {
                           // Promote 1-D operands to matrices as matmul did ((k) -> (1, k) for a,
                           // (k, 1) for b), restore g's dropped dims, then sum broadcast batch dims.
                           const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
                           Var g2 = g;
                           if (a_vec) g2 = unsqueeze(g2, b_vec ? 0 : g2.dim() - 1);
                           if (b_vec) g2 = unsqueeze(g2, g2.dim());
                           Var da, db;
                           if (ga) {
                               Var b2 = b_vec ? unsqueeze(s[0], 1) : s[0];
                               Var d = matmul(g2, transpose(b2, -1, -2));  // (..., n, k)
                               if (a_vec) d = squeeze(d, -2);
                               da = sum_to(d, sa);
                           }
                           if (gb && sb.size() == 2 && sa.size() > 2 && sa.back() > 0) {
                               // A shared matrix (Linear's weight) against batched rows: one
                               // (k, B*T) @ (B*T, m) gemm instead of B small gemms then a sum over B.
                               const Var& a = s[ga ? 1 : 0];
                               const int64_t k = sa.back(), m = sb.back();
                               const Var a_rows = reshape(a, {a.numel() / k, k});
                               const Var g_rows = reshape(g2, {a_rows.size(0), m});
                               db = matmul(transpose(a_rows, 0, 1), g_rows);  // (k, m)
                           } else if (gb) {
                               const Var& a = s[ga ? 1 : 0];
                               Var a2 = a_vec ? unsqueeze(a, 0) : a;
                               Var d = matmul(transpose(a2, -1, -2), g2);  // (..., k, m)
                               if (b_vec) d = squeeze(d, -1);
                               db = sum_to(d, sb);
                           }
                           return {da, db};
                       });
}

// Its own node rather than matmul(x, t(W)): the weight's gradient dW = dY^T X comes out (out, in) and
// contiguous, as the weight is. Through matmul it would be X^T dY, (in, out), and t's backward would
// then copy it transposed into .grad, one strided pass per weight per step.
Var linear(const Var& x, const Var& weight) {
    NL_REQUIRE(x.defined() && weight.defined(), "linear: expected defined input and weight");
    NL_REQUIRE(weight.dim() == 2, "linear: expected weight (out_features, in_features), found ",
               shape_str(weight.shape()));
    NL_REQUIRE(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: expected input (..., ", weight.size(1),
               ") for weight ", shape_str(weight.shape()), ", found ", shape_str(x.shape()));
    const bool gx = wants(x), gw = wants(weight);
    std::vector<SavedTensor> saved;  // dx = dY W needs W; dW = dY^T X needs x
    if (gx) saved.emplace_back("weight", weight);
    if (gw) saved.emplace_back("x", x);
    return make_result(matmul(x.data(), weight.data().t()), "linear", {x, weight}, std::move(saved),
                       [gx, gw, sx = x.shape()](const Var& g, const Saved& s) -> Grads {
                           Var dx, dw;
                           if (gx) dx = matmul(g, s[0]);  // (..., out) @ (out, in) = (..., in)
                           if (gw) {
                               const Var& x = s[gx ? 1 : 0];
                               const int64_t in = sx.back(), out = g.size(-1);
                               int64_t rows = 1;  // every dim of x but the last, as one
                               for (size_t d = 0; d + 1 < sx.size(); ++d) rows *= sx[d];
                               const Var g_rows = reshape(g, {rows, out}), x_rows = reshape(x, {rows, in});
                               dw = matmul(transpose(g_rows, 0, 1), x_rows);  // (out, rows) @ (rows, in)
                           }
                           return {dx, dw};
                       });
}

// ---- views and copies ----

Var reshape(const Var& a, const Shape& shape) { return reshaped(a, a.data().reshape(shape), "reshape"); }
Var view(const Var& a, const Shape& shape) { return reshaped(a, a.data().view(shape), "view"); }
Var squeeze(const Var& a) { return reshaped(a, a.data().squeeze(), "squeeze"); }
Var squeeze(const Var& a, int64_t dim) { return reshaped(a, a.data().squeeze(dim), "squeeze"); }
Var unsqueeze(const Var& a, int64_t dim) { return reshaped(a, a.data().unsqueeze(dim), "unsqueeze"); }
Var flatten(const Var& a) { return reshaped(a, a.data().flatten(), "flatten"); }

Var transpose(const Var& a, int64_t dim0, int64_t dim1) {
    return make_result(a.data().transpose(dim0, dim1), "transpose", {a}, {},
                       [dim0, dim1](const Var& g, const Saved&) -> Grads { return {transpose(g, dim0, dim1)}; });
}

Var t(const Var& a) {
    return make_result(a.data().t(), "t", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {t(g)}; });
}

Var permute(const Var& a, const std::vector<int64_t>& dims) {
    Tensor out = a.data().permute(dims);  // validates dims
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], a.dim(), "permute")] = static_cast<int64_t>(i);
    return make_result(out, "permute", {a}, {},
                       [inverse](const Var& g, const Saved&) -> Grads { return {permute(g, inverse)}; });
}

Var narrow(const Var& a, int64_t dim, int64_t start, int64_t length) {
    return apply_view(a, "narrow", [dim, start, length](const Tensor& t) { return t.narrow(dim, start, length); });
}

Var slice(const Var& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
    return apply_view(a, "slice", [dim, start, end, step](const Tensor& t) { return t.slice(dim, start, end, step); });
}

Var select(const Var& a, int64_t dim, int64_t index) {
    return apply_view(a, "select", [dim, index](const Tensor& t) { return t.select(dim, index); });
}

Var expand(const Var& a, const Shape& shape) {
    Tensor out = a.data().expand(shape);
    if (out.shape() == a.shape()) return a;
    return make_result(out, "expand", {a}, {},
                       [in = a.shape()](const Var& g, const Saved&) -> Grads { return {sum_to(g, in)}; });
}

Var contiguous(const Var& a) {
    if (a.data().is_contiguous()) return a;
    return make_result(a.data().contiguous(), "contiguous", {a}, {},
                       [](const Var& g, const Saved&) -> Grads { return {g}; });
}

Var clone(const Var& a) {
    return make_result(a.data().clone(), "clone", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {g}; });
}

Var alias(const Var& a) {
    return make_result(a.data(), "alias", {a}, {}, [](const Var& g, const Saved&) -> Grads { return {g}; });
}

Var to(const Var& a, DType dtype) {
    if (a.dtype() == dtype) return a;
    Tensor out = a.data().to(dtype);
    if (!is_floating(dtype)) return Var(out);  // integers carry no gradient
    return make_result(out, "to", {a}, {},
                       [in = a.dtype()](const Var& g, const Saved&) -> Grads { return {to(g, in)}; });
}

// ---- indexing ----

Var index_select(const Var& a, int64_t dim, const Tensor& index) {
    return make_result(index_select(a.data(), dim, index), "index_select", {a}, {{"index", index}},
                       [dim, shape = a.shape()](const Var& g, const Saved& s) -> Grads {
                           Var base(zeros(shape, g.dtype(), g.device()));
                           return {index_add(base, dim, s[0].data(), g)};
                       });
}

Var index_add(const Var& a, int64_t dim, const Tensor& index, const Var& src) {
    return make_result(index_add(a.data(), dim, index, src.data()), "index_add", {a, src}, {{"index", index}},
                       [dim](const Var& g, const Saved& s) -> Grads { return {g, index_select(g, dim, s[0].data())}; });
}

Var gather(const Var& a, int64_t dim, const Tensor& index) {
    return make_result(gather(a.data(), dim, index), "gather", {a}, {{"index", index}},
                       [dim, shape = a.shape()](const Var& g, const Saved& s) -> Grads {
                           Var base(zeros(shape, g.dtype(), g.device()));
                           return {scatter_add(base, dim, s[0].data(), g)};
                       });
}

Var scatter_add(const Var& a, int64_t dim, const Tensor& index, const Var& src) {
    return make_result(scatter_add(a.data(), dim, index, src.data()), "scatter_add", {a, src}, {{"index", index}},
                       [dim](const Var& g, const Saved& s) -> Grads { return {g, gather(g, dim, s[0].data())}; });
}

Var embedding(const Var& weight, const Tensor& ids) {
    return make_result(embedding(weight.data(), ids), "embedding", {weight}, {{"ids", ids}},
                       [shape = weight.shape()](const Var& g, const Saved& s) -> Grads {
                           // Rows of g (one per id) added back into the looked-up weight rows.
                           Var base(zeros(shape, g.dtype(), g.device()));
                           return {index_add(base, 0, s[0].data().flatten(), reshape(g, {-1, shape[1]}))};
                       });
}

Var where(const Tensor& cond, const Var& a, const Var& b) {
    return make_result(where(cond, a.data(), b.data()), "where", {a, b}, {{"cond", cond}},
                       [ga = wants(a), gb = wants(b), sa = a.shape(), sb = b.shape()](const Var& g,
                                                                                     const Saved& s) -> Grads {
                           const Tensor& cond = s[0].data();
                           Var zero = zero_like_scalar(g);
                           return {ga ? sum_to(where(cond, g, zero), sa) : Var(),
                                   gb ? sum_to(where(cond, zero, g), sb) : Var()};
                       });
}

Var masked_fill(const Var& a, const Tensor& mask, double value) {
    return make_result(masked_fill(a.data(), mask, value), "masked_fill", {a}, {{"mask", mask}},
                       [](const Var& g, const Saved& s) -> Grads { return {masked_fill(g, s[0].data(), 0.0)}; });
}

Var cat(const std::vector<Var>& vars, int64_t dim) {
    std::vector<Tensor> tensors;
    tensors.reserve(vars.size());
    for (const Var& v : vars) tensors.push_back(v.data());
    Tensor out = cat(tensors, dim);  // validates (and rejects an empty list)
    const int64_t d = wrap_dim(dim, out.dim(), "cat");
    std::vector<int64_t> sizes;
    for (const Var& v : vars) sizes.push_back(v.size(d));
    return make_result(out, "cat", vars, {}, [d, sizes](const Var& g, const Saved&) -> Grads {
        Grads grads;
        int64_t start = 0;
        for (int64_t size : sizes) {
            grads.push_back(narrow(g, d, start, size));
            start += size;
        }
        return grads;
    });
}

Var tril(const Var& a, int64_t diagonal) {
    return make_result(tril(a.data(), diagonal), "tril", {a}, {},
                       [diagonal](const Var& g, const Saved&) -> Grads { return {tril(g, diagonal)}; });
}

}  // namespace nl
