// Reductions (sum, mean, max, min, var, argmax, sum_to) and the softmax family: dim checks, laying
// the input out as a contiguous (outer, len, inner) block for the backend kernel, output shapes with
// keepdim. bf16/f16 compute in f32 and are cast back.
#include <algorithm>

#include "core/backend.h"
#include "core/ops.h"

namespace nl {
namespace {

void require_floating(const Tensor& a, const char* op) {
    NL_REQUIRE(a.defined(), op, ": operand is an undefined tensor");
    NL_REQUIRE(is_floating(a.dtype()), op, ": expected a floating dtype, found ", dtype_name(a.dtype()));
}

// One flag per dim of `a`: reduced or not. Empty `dims` reduces every dim.
std::vector<bool> reduced_flags(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
    const int64_t nd = a.dim();
    std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
    for (int64_t dim : dims) {
        if (nd == 0) {  // a scalar accepts dim 0 / -1, like PyTorch; nothing to reduce
            wrap_dim(dim, 1, op);
            continue;
        }
        const int64_t d = wrap_dim(dim, nd, op);
        NL_REQUIRE(!reduced[d], op, ": dim ", dim, " appears more than once in the dims to reduce");
        reduced[d] = true;
    }
    return reduced;
}

Tensor reduce(ReduceOp op, const char* name, const Tensor& a, const std::vector<bool>& reduced,
              bool keepdim, int64_t correction) {
    require_floating(a, name);
    const DType ct = compute_dtype(a.dtype());
    const Tensor x = a.to(ct);
    const int64_t nd = x.dim();

    Shape out_shape;
    std::vector<int64_t> kept_dims, reduced_dims;
    int64_t len = 1;
    for (int64_t d = 0; d < nd; ++d) {
        if (reduced[d]) {
            reduced_dims.push_back(d);
            len *= x.shape()[d];
            if (keepdim) out_shape.push_back(1);
        } else {
            kept_dims.push_back(d);
            out_shape.push_back(x.shape()[d]);
        }
    }
    NL_REQUIRE(len > 0 || (op != ReduceOp::Max && op != ReduceOp::Min && op != ReduceOp::ArgMax), name,
               ": cannot reduce over an empty dim (input ", shape_str(a.shape()), ")");

    // Lay the input out as (outer, len, inner): directly when the reduced dims form one consecutive
    // block, else with the reduced dims permuted to the end (inner = 1).
    Tensor in;
    int64_t outer = 1, inner = 1;
    const bool block = reduced_dims.empty() ||
                       reduced_dims.back() - reduced_dims.front() + 1 == static_cast<int64_t>(reduced_dims.size());
    if (block) {
        in = x.contiguous();
        if (reduced_dims.empty()) {
            outer = x.numel();
        } else {
            for (int64_t d = 0; d < reduced_dims.front(); ++d) outer *= x.shape()[d];
            for (int64_t d = reduced_dims.back() + 1; d < nd; ++d) inner *= x.shape()[d];
        }
    } else {
        std::vector<int64_t> perm = kept_dims;
        perm.insert(perm.end(), reduced_dims.begin(), reduced_dims.end());
        in = x.permute(perm).contiguous();
        for (int64_t d : kept_dims) outer *= x.shape()[d];
    }

    // The kernel writes (outer, inner) row-major, which is the kept dims in order: out_shape.
    Tensor out = Tensor::empty(out_shape, op == ReduceOp::ArgMax ? DType::I64 : ct, x.device());
    if (outer * inner > 0)
        backend_for(x.device()).reduce(op, ct, in.data_ptr(), out.data_ptr(), outer, len, inner, correction);
    return op == ReduceOp::ArgMax ? out : out.to(a.dtype());
}

// Moves `dim` last and makes the result contiguous: the (rows, cols) layout of the softmax kernels.
Tensor rows_along(const Tensor& t, int64_t dim) { return t.transpose(dim, t.dim() - 1).contiguous(); }

Tensor softmax_impl(const char* name, const Tensor& a, int64_t dim, bool log) {
    require_floating(a, name);
    if (a.dim() == 0) {  // a scalar is one row of one element, like PyTorch
        wrap_dim(dim, 1, name);
        return softmax_impl(name, a.reshape({1}), 0, log).reshape({});
    }
    const int64_t d = wrap_dim(dim, a.dim(), name);
    const DType ct = compute_dtype(a.dtype());
    const Tensor x = rows_along(a.to(ct), d);  // (rows, cols)
    Tensor y = Tensor::empty(x.shape(), ct, x.device());
    const int64_t cols = x.shape().back();
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    backend_for(x.device()).softmax_forward(ct, x.data_ptr(), y.data_ptr(), rows, cols, log);
    return rows_along(y, d).to(a.dtype());
}

Tensor softmax_backward_impl(const char* name, const Tensor& y, const Tensor& dy, int64_t dim, bool log) {
    require_floating(y, name);
    require_floating(dy, name);
    NL_REQUIRE(y.device() == dy.device(), name, ": device mismatch: ", y.device().str(), " vs ",
               dy.device().str());
    NL_REQUIRE(y.dtype() == dy.dtype(), name, ": dtype mismatch: ", dtype_name(y.dtype()), " vs ",
               dtype_name(dy.dtype()));
    NL_REQUIRE(y.shape() == dy.shape(), name, ": shape mismatch: y ", shape_str(y.shape()), " vs dy ",
               shape_str(dy.shape()));
    if (y.dim() == 0) {
        wrap_dim(dim, 1, name);
        return softmax_backward_impl(name, y.reshape({1}), dy.reshape({1}), 0, log).reshape({});
    }
    const int64_t d = wrap_dim(dim, y.dim(), name);
    const DType ct = compute_dtype(y.dtype());
    const Tensor yr = rows_along(y.to(ct), d);  // (rows, cols)
    const Tensor dyr = rows_along(dy.to(ct), d);
    Tensor dx = Tensor::empty(yr.shape(), ct, yr.device());
    const int64_t cols = yr.shape().back();
    const int64_t rows = cols == 0 ? 0 : yr.numel() / cols;
    backend_for(yr.device())
        .softmax_backward(ct, yr.data_ptr(), dyr.data_ptr(), dx.data_ptr(), rows, cols, log);
    return rows_along(dx, d).to(y.dtype());
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    return reduce(ReduceOp::Sum, "sum", a, reduced_flags(a, dims, "sum"), keepdim, 0);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    return reduce(ReduceOp::Mean, "mean", a, reduced_flags(a, dims, "mean"), keepdim, 0);
}

Tensor max(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    return reduce(ReduceOp::Max, "max", a, reduced_flags(a, dims, "max"), keepdim, 0);
}

Tensor min(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    return reduce(ReduceOp::Min, "min", a, reduced_flags(a, dims, "min"), keepdim, 0);
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
    NL_REQUIRE(correction >= 0, "var: expected correction >= 0, found ", correction);
    return reduce(ReduceOp::Var, "var", a, reduced_flags(a, dims, "var"), keepdim, correction);
}

Tensor sum_of_squares(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    return reduce(ReduceOp::SumSquares, "sum_of_squares", a, reduced_flags(a, dims, "sum_of_squares"), keepdim, 0);
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
    NL_REQUIRE(a.defined(), "argmax: operand is an undefined tensor");
    return reduce(ReduceOp::ArgMax, "argmax", a, reduced_flags(a, {dim}, "argmax"), keepdim, 0);
}

// Sums the leading dims `a` has beyond `shape`, and the dims where `shape` has 1 but `a` does not.
Tensor sum_to(const Tensor& a, const Shape& shape) {
    NL_REQUIRE(a.defined(), "sum_to: operand is an undefined tensor");
    const int64_t nd = a.dim();
    const int64_t lead = nd - static_cast<int64_t>(shape.size());
    NL_REQUIRE(lead >= 0, "sum_to: cannot sum ", shape_str(a.shape()), " to ", shape_str(shape),
               " (target has more dims)");
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < nd; ++d) {
        if (d < lead) {
            dims.push_back(d);
            continue;
        }
        const int64_t want = shape[d - lead], have = a.shape()[d];
        NL_REQUIRE(want == have || want == 1, "sum_to: cannot sum ", shape_str(a.shape()), " to ",
                   shape_str(shape), " (dim ", d - lead, ": ", have, " vs ", want, ")");
        if (want != have) dims.push_back(d);
    }
    if (dims.empty()) return a;  // already `shape` (sum's empty dims would mean all dims)
    return sum(a, dims, /*keepdim=*/true).reshape(shape);
}

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl("softmax", a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl("log_softmax", a, dim, true); }

Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim) {
    return softmax_backward_impl("softmax_backward", y, dy, dim, false);
}
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim) {
    return softmax_backward_impl("log_softmax_backward", y, dy, dim, true);
}

}  // namespace nl
