// Shapes and strides (in elements, not bytes) and the helpers every op uses to check them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nl {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);          // "[2, 3]"; "[]" for a scalar
// Product of the sizes (1 for a scalar); throws nl::Error naming the shape when it overflows int64.
int64_t shape_numel(const Shape& shape);
// The same product without throwing: false when it overflows int64 (`out` is then unchanged).
bool checked_shape_numel(const Shape& shape, int64_t& out);
// Row-major strides; throws nl::Error naming the shape when a stride overflows int64 (possible even
// for an empty tensor: [0, 2^32, 2^32] has numel 0 but a first stride of 2^64).
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws nl::Error naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws nl::Error like
// "add: cannot broadcast [2, 3] with [4] (dim -1: 3 vs 4)".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace nl
