// Tensor operations (no autograd): shape and dtype checks, broadcasting, output allocation, then one
// backend kernel. bf16/f16 inputs are computed in f32 and the result cast back (docs/architecture.md).
// Every user mistake throws nl::Error naming the op and what was found, e.g.
// "matmul: cannot multiply [2, 3] by [4, 5] (3 != 4)".
#pragma once

#include <vector>

#include "core/tensor.h"

namespace nl {

// ---- elementwise binary, NumPy broadcasting; both operands must share dtype and device ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Comparisons return 1.0 / 0.0 in the operands' dtype (normlab has no bool dtype).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// Tensor-scalar forms (the scalar takes the tensor's dtype).
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(double a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(double a, const Tensor& b);  // a / b
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, double b);
Tensor minimum(const Tensor& a, double b);
Tensor eq(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);

// In place, PyTorch's a.add_(b): a += b with b broadcast to a's shape (a's shape is kept), same dtype
// and device. a's own elements are written, so views of a see the sum.
void add_(Tensor& a, const Tensor& b);

// Autocast's mixed sums: f32 a plus a bf16 or f16 b, in f32, b widened (exactly) as it is read. The
// bits of add(a, b.to(f32)) (torch's type promotion for f32 + bf16) in one pass instead of two.
// Broadcasting as add's; add_widened_ writes into a as add_ does.
Tensor add_widened(const Tensor& a, const Tensor& b);
void add_widened_(Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- elementwise unary ----
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor silu(const Tensor& a);     // x * sigmoid(x)
Tensor sigmoid(const Tensor& a);
// grad * d silu(x) / dx in one pass (SiLU's backward), broadcasting like mul.
Tensor silu_backward(const Tensor& grad, const Tensor& x);
Tensor tanh(const Tensor& a);
Tensor gelu(const Tensor& a);     // exact: 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default
Tensor sign(const Tensor& a);     // -1, 0, 1 (used by abs' gradient)
Tensor square(const Tensor& a);

// ---- reductions over a set of dims (empty `dims` = all dims), keepdim like PyTorch ----
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// sum(a * a) over dims, summed in double, without the squared tensor (no autograd node).
Tensor sum_of_squares(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor min(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance, two-pass; correction 1 = unbiased (PyTorch's default), 0 = biased.
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);  // i64; first max wins
// Sum `a` down to `shape` (the inverse of broadcasting): how broadcast gradients return home.
Tensor sum_to(const Tensor& a, const Shape& shape);

// ---- softmax family, along one dim, numerically stable (max subtracted) ----
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// Closed-form backward given the forward output y and upstream grad dy (kernel pair partners).
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim);

// ---- linear algebra ----
// PyTorch semantics: 1-D and 2-D operands, and batched (>= 3-D) with broadcast batch dims.
// Transposed views go to BLAS as transpose flags, not copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// matmul with the result in out_dtype: a's dtype (plain matmul), or f32 for bf16/f16 operands, whose
// f32 sums are then returned as they are instead of rounded to the operands' dtype (autocast's
// gradients: layers/autocast.h). Other pairs are an nl::Error naming both dtypes.
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype);

// ---- indexing ----
// index: 1-D i64. Out-of-range indices are errors naming the index and the size.
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// Returns a copy of `a` with src's slices added at `index` along dim (index_select's backward).
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// out[i][j] = a[i][index[i][j]] along dim (torch.gather); index i64 with a's rank.
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// Returns a copy of `a` with src added at `index` along dim (gather's backward, torch.scatter_add).
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// weight (num, dim) looked up by i64 ids of any shape -> ids.shape + [dim].
Tensor embedding(const Tensor& weight, const Tensor& ids);
// cond nonzero picks a, else b; all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);  // mask broadcast to a
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor tril(const Tensor& a, int64_t diagonal = 0);  // zero above the diagonal (last two dims)

// ---- comparisons for tests and checks ----
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace nl
