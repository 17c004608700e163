// Differentiable ops on Var, with the names and argument conventions of core/ops.h. Each runs the
// core op on .data() and, when grad mode is on and an input requires grad, records one node whose
// backward is written with these same ops (so backward(create_graph=true) is differentiable again).
// Broadcast gradients are summed back to each input's shape with sum_to. Ops that have no gradient
// (comparisons, argmax, sign) are used on .data() with the Tensor ops.
#pragma once

#include <vector>

#include "autograd/var.h"
#include "core/ops.h"

namespace nl {

// ---- elementwise binary (NumPy broadcasting) ----
Var add(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var div(const Var& a, const Var& b);
Var pow(const Var& a, const Var& b);      // d/db = a^b log a (a > 0 where b's grad is wanted)
Var maximum(const Var& a, const Var& b);  // ties split the gradient half/half (as PyTorch)
Var minimum(const Var& a, const Var& b);
Var add(const Var& a, double b);
Var sub(const Var& a, double b);
Var rsub(double a, const Var& b);         // a - b
Var mul(const Var& a, double b);
Var div(const Var& a, double b);
Var rdiv(double a, const Var& b);         // a / b
Var pow(const Var& a, double exponent);
Var maximum(const Var& a, double b);
Var minimum(const Var& a, double b);

Var operator+(const Var& a, const Var& b);
Var operator-(const Var& a, const Var& b);
Var operator*(const Var& a, const Var& b);
Var operator/(const Var& a, const Var& b);
Var operator+(const Var& a, double b);
Var operator-(const Var& a, double b);
Var operator*(const Var& a, double b);
Var operator/(const Var& a, double b);
Var operator+(double a, const Var& b);
Var operator-(double a, const Var& b);
Var operator*(double a, const Var& b);
Var operator/(double a, const Var& b);
Var operator-(const Var& a);

// ---- elementwise unary ----
Var neg(const Var& a);
Var exp(const Var& a);
Var log(const Var& a);
Var sqrt(const Var& a);
Var rsqrt(const Var& a);
Var abs(const Var& a);      // gradient sign(a); 0 at 0
Var relu(const Var& a);     // gradient 0 at 0
Var silu(const Var& a);
Var sigmoid(const Var& a);
Var tanh(const Var& a);
Var gelu(const Var& a);     // exact (erf) GELU
Var square(const Var& a);

// ---- reductions (empty dims = all dims), keepdim like PyTorch ----
Var sum(const Var& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Var mean(const Var& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Var max(const Var& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // ties share
Var min(const Var& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // the grad
Var var(const Var& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
        bool keepdim = false);
Var sum_to(const Var& a, const Shape& shape);  // inverse of broadcasting (expand's backward)

// ---- softmax family ----
Var softmax(const Var& a, int64_t dim);
Var log_softmax(const Var& a, int64_t dim);

// ---- linear algebra (1-D, 2-D, batched with broadcast batch dims) ----
Var matmul(const Var& a, const Var& b);
// y = x W^T, torch.nn.functional.linear without a bias: x (..., in), weight (out, in), y (..., out).
Var linear(const Var& x, const Var& weight);

// ---- views and copies ----
Var reshape(const Var& a, const Shape& shape);
Var view(const Var& a, const Shape& shape);
Var transpose(const Var& a, int64_t dim0, int64_t dim1);
Var t(const Var& a);
Var permute(const Var& a, const std::vector<int64_t>& dims);
Var narrow(const Var& a, int64_t dim, int64_t start, int64_t length);
Var slice(const Var& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Var select(const Var& a, int64_t dim, int64_t index);
Var expand(const Var& a, const Shape& shape);
Var squeeze(const Var& a);
Var squeeze(const Var& a, int64_t dim);
Var unsqueeze(const Var& a, int64_t dim);
Var flatten(const Var& a);
Var contiguous(const Var& a);
Var clone(const Var& a);
// a again as a node of its own (the same data, the gradient passed through; torch's a.view_as(a)):
// a separate variable for partial_gradients even where two inputs are one Var.
Var alias(const Var& a);
Var to(const Var& a, DType dtype);  // cast; the gradient is cast back to a's dtype

// ---- indexing ----
Var index_select(const Var& a, int64_t dim, const Tensor& index);
Var index_add(const Var& a, int64_t dim, const Tensor& index, const Var& src);
Var gather(const Var& a, int64_t dim, const Tensor& index);
Var scatter_add(const Var& a, int64_t dim, const Tensor& index, const Var& src);
Var embedding(const Var& weight, const Tensor& ids);  // (num, dim) by ids -> ids.shape + [dim]
Var where(const Tensor& cond, const Var& a, const Var& b);
Var masked_fill(const Var& a, const Tensor& mask, double value);
Var cat(const std::vector<Var>& vars, int64_t dim);
Var tril(const Var& a, int64_t diagonal = 0);

}  // namespace nl
