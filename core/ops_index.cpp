// Indexing ops: index_select / index_add and gather / scatter_add (each pair is the other's backward),
// embedding, and cat. Indices are checked on the host before any kernel runs, so a bad token id is an
// error naming it, never an out-of-bounds read.
#include <string>

#include "core/backend.h"
#include "core/ops.h"

namespace nl {

namespace {

// A contiguous tensor as (outer, size, inner) around `dim`.
struct Split3 {
    int64_t outer = 1, size = 1, inner = 1;
};

Split3 split_at(const Shape& shape, int64_t dim) {
    Split3 s;
    for (int64_t d = 0; d < dim; ++d) s.outer *= shape[d];
    s.size = shape[dim];
    for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) s.inner *= shape[d];
    return s;
}

void require_floating(const Tensor& t, const char* op) {
    NL_REQUIRE(t.defined(), op, ": tensor is undefined");
    NL_REQUIRE(is_floating(t.dtype()), op, ": expected a floating dtype, found ", dtype_name(t.dtype()));
}

void require_index(const Tensor& index, const char* op, bool one_dim) {
    NL_REQUIRE(index.defined(), op, ": index is undefined");
    NL_REQUIRE(index.dtype() == DType::I64, op, ": expected an index of dtype i64, found ",
               dtype_name(index.dtype()));
    if (one_dim) {
        NL_REQUIRE(index.dim() == 1, op, ": expected a 1-D index, found shape ", shape_str(index.shape()));
    }
}

void require_same(const Tensor& a, const Tensor& other, const char* op, const char* what) {
    NL_REQUIRE(other.defined(), op, ": ", what, " is undefined");
    NL_REQUIRE(other.device() == a.device(), op, ": ", what, " is on ", other.device().str(),
               " but the input is on ", a.device().str());
}

// Every index must lie in [0, size): checked on the host so the message can name the culprit.
void check_range(const Tensor& index, int64_t dim, int64_t size, const char* op) {
    for (const int64_t v : index.to_vector_as<int64_t>()) {
        NL_REQUIRE(v >= 0 && v < size, op, ": index ", v, " is out of range for dim ", dim, " of size ", size);
    }
}

// Narrow every dim of `t` except `skip` (-1 for none) to `sizes` (a view; no copy).
Tensor narrow_to(const Tensor& t, const Shape& sizes, int64_t skip) {
    Tensor v = t;
    for (int64_t d = 0; d < t.dim(); ++d) {
        if (d != skip && v.size(d) != sizes[d]) v = v.narrow(d, 0, sizes[d]);
    }
    return v;
}

// gather / scatter_add: index has a's rank and fits inside `a` on every dim but `dim` (torch's rule).
void check_gather_index(const Tensor& a, int64_t dim, const Tensor& index, const char* op) {
    NL_REQUIRE(index.dim() == a.dim(), op, ": index must have the input's rank ", a.dim(), ", found shape ",
               shape_str(index.shape()), " for input ", shape_str(a.shape()));
    for (int64_t d = 0; d < a.dim(); ++d) {
        NL_REQUIRE(d == dim || index.size(d) <= a.size(d), op, ": index shape ", shape_str(index.shape()),
                   " exceeds input shape ", shape_str(a.shape()), " in dim ", d);
    }
}

// A fresh contiguous copy of `a` in its compute dtype (f32 for bf16/f16), for the accumulating ops.
Tensor accumulator_copy(const Tensor& a) {
    const DType cd = compute_dtype(a.dtype());
    return cd == a.dtype() ? a.clone() : a.to(cd).contiguous();
}

}  // namespace

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
    require_floating(a, "index_select");
    require_index(index, "index_select", true);
    require_same(a, index, "index_select", "index");
    dim = wrap_dim(dim, a.dim(), "index_select");
    check_range(index, dim, a.size(dim), "index_select");

    const DType cd = compute_dtype(a.dtype());
    const Tensor src = a.to(cd).contiguous();
    const Tensor idx = index.contiguous();
    const Split3 s = split_at(src.shape(), dim);
    Shape out_shape = a.shape();
    out_shape[dim] = index.numel();
    Tensor out = Tensor::empty(out_shape, cd, a.device());  // (outer, n, inner)
    if (out.numel() > 0) {
        backend_for(a.device())
            .index_select(cd, src.data_ptr(), idx.data<int64_t>(), out.data_ptr(), s.outer, s.size, s.inner,
                          index.numel());
    }
    return out.to(a.dtype());
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
    require_floating(a, "index_add");
    require_index(index, "index_add", true);
    require_same(a, index, "index_add", "index");
    require_same(a, src, "index_add", "src");
    NL_REQUIRE(src.dtype() == a.dtype(), "index_add: src has dtype ", dtype_name(src.dtype()),
               " but the input has ", dtype_name(a.dtype()));
    dim = wrap_dim(dim, a.dim(), "index_add");
    Shape expected = a.shape();
    expected[dim] = index.numel();
    NL_REQUIRE(src.shape() == expected, "index_add: expected src of shape ", shape_str(expected),
               " (input ", shape_str(a.shape()), " with dim ", dim, " sized by the index's ", index.numel(),
               " entries), found ", shape_str(src.shape()));
    check_range(index, dim, a.size(dim), "index_add");

    Tensor out = accumulator_copy(a);  // (outer, size, inner)
    const Tensor from = src.to(out.dtype()).contiguous();
    const Tensor idx = index.contiguous();
    const Split3 s = split_at(out.shape(), dim);
    if (from.numel() > 0) {
        backend_for(a.device())
            .index_add(out.dtype(), out.data_ptr(), idx.data<int64_t>(), from.data_ptr(), s.outer, s.size,
                       s.inner, index.numel());
    }
    return out.to(a.dtype());
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
    require_floating(a, "gather");
    require_index(index, "gather", false);
    require_same(a, index, "gather", "index");
    dim = wrap_dim(dim, a.dim(), "gather");
    check_gather_index(a, dim, index, "gather");
    check_range(index, dim, a.size(dim), "gather");

    // Only the part of `a` the index covers takes part, so both share (outer, -, inner).
    const DType cd = compute_dtype(a.dtype());
    const Tensor src = narrow_to(a, index.shape(), dim).to(cd).contiguous();  // (outer, size, inner)
    const Tensor idx = index.contiguous();                                      // (outer, n, inner)
    const Split3 s = split_at(src.shape(), dim);
    Tensor out = Tensor::empty(index.shape(), cd, a.device());  // (outer, n, inner)
    if (out.numel() > 0) {
        backend_for(a.device())
            .gather(cd, src.data_ptr(), idx.data<int64_t>(), out.data_ptr(), s.outer, s.size, s.inner,
                    index.size(dim));
    }
    return out.to(a.dtype());
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
    require_floating(a, "scatter_add");
    require_index(index, "scatter_add", false);
    require_same(a, index, "scatter_add", "index");
    require_same(a, src, "scatter_add", "src");
    NL_REQUIRE(src.dtype() == a.dtype(), "scatter_add: src has dtype ", dtype_name(src.dtype()),
               " but the input has ", dtype_name(a.dtype()));
    dim = wrap_dim(dim, a.dim(), "scatter_add");
    check_gather_index(a, dim, index, "scatter_add");
    NL_REQUIRE(src.dim() == index.dim(), "scatter_add: src must have the index's rank, found src ",
               shape_str(src.shape()), " and index ", shape_str(index.shape()));
    for (int64_t d = 0; d < src.dim(); ++d) {
        NL_REQUIRE(index.size(d) <= src.size(d), "scatter_add: index shape ", shape_str(index.shape()),
                   " exceeds src shape ", shape_str(src.shape()), " in dim ", d);
    }
    check_range(index, dim, a.size(dim), "scatter_add");

    Tensor out = accumulator_copy(a);
    if (index.numel() == 0) return out.to(a.dtype());
    // The kernel needs dst, index and src to share (outer, -, inner): work on the region of `out` the
    // index covers, packed, and copy it back when that region is not all of `out`.
    const Tensor region = narrow_to(out, index.shape(), dim);
    Tensor dst = region.is_contiguous() ? region : region.contiguous();  // (outer, size, inner)
    const Tensor from = narrow_to(src, index.shape(), -1).to(out.dtype()).contiguous();  // (outer, n, inner)
    const Tensor idx = index.contiguous();                                                 // (outer, n, inner)
    const Split3 s = split_at(dst.shape(), dim);
    backend_for(a.device())
        .scatter_add(out.dtype(), dst.data_ptr(), idx.data<int64_t>(), from.data_ptr(), s.outer, s.size,
                     s.inner, index.size(dim));
    if (dst.storage() != out.storage()) {
        Tensor back = region;
        back.copy_(dst);
    }
    return out.to(a.dtype());
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
    NL_REQUIRE(weight.defined() && ids.defined(), "embedding: tensor is undefined");
    NL_REQUIRE(weight.dim() == 2, "embedding: expected a 2-D weight (num, dim), found ",
               shape_str(weight.shape()));
    NL_REQUIRE(ids.dtype() == DType::I64, "embedding: expected ids of dtype i64, found ",
               dtype_name(ids.dtype()));
    const int64_t num = weight.size(0);
    for (const int64_t v : ids.to_vector_as<int64_t>()) {
        NL_REQUIRE(v >= 0 && v < num, "embedding: id ", v, " is out of range for ", num,
                   " embeddings (weight ", shape_str(weight.shape()), ")");
    }
    Shape out_shape = ids.shape();  // ids.shape + [dim]
    out_shape.push_back(weight.size(1));
    return index_select(weight, 0, ids.reshape({ids.numel()})).view(out_shape);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
    NL_REQUIRE(!tensors.empty(), "cat: expected at least one tensor");
    const Tensor& first = tensors[0];
    NL_REQUIRE(first.defined(), "cat: tensor 0 is undefined");
    NL_REQUIRE(first.dim() >= 1, "cat: cannot concatenate 0-dim tensors (tensor 0 has shape [])");
    dim = wrap_dim(dim, first.dim(), "cat");
    Shape out_shape = first.shape();
    out_shape[dim] = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        NL_REQUIRE(t.defined(), "cat: tensor ", i, " is undefined");
        NL_REQUIRE(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ", dtype_name(t.dtype()),
                   " but tensor 0 has ", dtype_name(first.dtype()));
        NL_REQUIRE(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device().str(),
                   " but tensor 0 is on ", first.device().str());
        bool match = t.dim() == first.dim();
        for (int64_t d = 0; match && d < t.dim(); ++d) match = d == dim || t.size(d) == first.size(d);
        NL_REQUIRE(match, "cat: tensor ", i, " has shape ", shape_str(t.shape()), " but tensor 0 has shape ",
                   shape_str(first.shape()), " (sizes must match except in dim ", dim, ")");
        out_shape[dim] += t.size(dim);
    }
    Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
        const int64_t len = t.size(dim);
        if (len == 0) continue;
        out.narrow(dim, offset, len).copy_(t);
        offset += len;
    }
    return out;
}

}  // namespace nl
