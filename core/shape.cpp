// Shape helpers: printing, element counts, row-major strides, dim wrapping and broadcasting.
#include "core/shape.h"

#include <algorithm>

#include "core/error.h"

namespace nl {

std::string shape_str(const Shape& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(shape[i]);
    }
    return out + "]";
}

bool checked_shape_numel(const Shape& shape, int64_t& out) {
    int64_t n = 1;
    for (int64_t s : shape)
        if (__builtin_mul_overflow(n, s, &n)) return false;
    out = n;
    return true;
}

int64_t shape_numel(const Shape& shape) {
    // Sizes come from configs and files: a wrapped product would allocate a tiny buffer for a huge tensor.
    int64_t n = 0;
    NL_REQUIRE(checked_shape_numel(shape, n), "shape ", shape_str(shape),
               " has more elements than an int64 can count (the product of its sizes overflows)");
    return n;
}

Shape contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = stride;
        // The stride of the dim before this one; only needed (and only checked) when there is one.
        if (i > 0)
            NL_REQUIRE(!__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride), "shape ",
                       shape_str(shape), ": its row-major strides overflow int64");
    }
    return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
    NL_REQUIRE(dim >= -ndim && dim < ndim, op, ": dim ", dim, " is out of range for a tensor with ",
               ndim, " dims (expected ", -ndim, " <= dim < ", ndim, ")");
    return dim < 0 ? dim + ndim : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
    size_t n = std::max(a.size(), b.size());
    Shape out(n);
    for (size_t i = 0; i < n; ++i) {
        // i counts from the right: dim -(i+1).
        int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
        int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
        NL_REQUIRE(sa == sb || sa == 1 || sb == 1, op, ": cannot broadcast ", shape_str(a), " with ",
                   shape_str(b), " (dim -", i + 1, ": ", sa, " vs ", sb, ")");
        out[n - 1 - i] = sa == 1 ? sb : sa;
    }
    return out;
}

}  // namespace nl
