// Tensor: construction, views (PyTorch semantics), copies through the device's backend, host
// access and printing, and the creation functions (random ones draw on the host in row-major order).
#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/backend.h"

namespace nl {

namespace {

StridedArg strided_arg(const Tensor& t) { return StridedArg{t.data_ptr(), t.dtype(), t.strides()}; }

// Replaces one -1 in `shape` by the size that makes the element count `numel`.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
    Shape out = shape;
    int64_t known = 1;
    int64_t infer_at = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            NL_REQUIRE(infer_at < 0, op, ": only one dim can be -1, found ", shape_str(shape));
            infer_at = static_cast<int64_t>(i);
        } else {
            NL_REQUIRE(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape_str(shape));
            known *= shape[i];
        }
    }
    if (infer_at >= 0) {
        NL_REQUIRE(known != 0 && numel % known == 0, op, ": cannot infer the -1 in ", shape_str(shape),
                   " for a tensor of shape ", shape_str(from), " (", numel, " elements)");
        out[infer_at] = numel / known;
        known *= out[infer_at];
    }
    NL_REQUIRE(known == numel, op, ": cannot view a tensor of shape ", shape_str(from), " (", numel,
               " elements) as ", shape_str(shape), " (", known, " elements)");
    return out;
}

// Strides that let `new_shape` view the same elements as (old_shape, old_strides) in row-major
// order, or nothing when a copy is needed. PyTorch's at::detail::computeStride: walk the old dims
// from the back, split them into chunks that are contiguous in memory, and lay the new dims over
// each chunk.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
    if (old_shape.empty()) return Shape(new_shape.size(), 1);
    if (shape_numel(old_shape) == 0) {
        if (old_shape == new_shape) return old_strides;
        return contiguous_strides(new_shape);
    }
    Shape new_strides(new_shape.size(), 0);
    int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
    int64_t chunk_base_stride = old_strides.back();
    int64_t tensor_numel = 1;
    int64_t view_numel = 1;
    for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
        tensor_numel *= old_shape[tensor_d];
        bool chunk_ends = tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                                            old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if (!chunk_ends) continue;
        while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
            new_strides[view_d] = view_numel * chunk_base_stride;
            view_numel *= new_shape[view_d];
            --view_d;
        }
        if (view_numel != tensor_numel) return std::nullopt;
        if (tensor_d > 0) {
            chunk_base_stride = old_strides[tensor_d - 1];
            tensor_numel = 1;
            view_numel = 1;
        }
    }
    if (view_d != -1) return std::nullopt;
    return new_strides;
}

// Reads element `ptr` (of `dtype`, on the host) as a double.
double read_host(const void* ptr, DType dtype) {
    double value = 0.0;
    backend_for(Device::cpu()).copy({}, StridedArg{&value, DType::F64, {}}, StridedArg{const_cast<void*>(ptr), dtype, {}});
    return value;
}

// A tensor on `device` holding `n` row-major host values of `src_dtype`, converted to `dtype`.
Tensor from_host(const void* values, DType src_dtype, size_t n, const Shape& shape, DType dtype, Device device) {
    Tensor host = Tensor::empty(shape, dtype, Device::cpu());
    NL_REQUIRE(static_cast<int64_t>(n) == host.numel(), "from_vector: got ", n, " values for shape ",
               shape_str(shape), " (", host.numel(), " elements)");
    backend_for(Device::cpu())
        .copy(shape, strided_arg(host), StridedArg{const_cast<void*>(values), src_dtype, contiguous_strides(shape)});
    return host.to(device);
}

void require_floating(DType dtype, const char* op) {
    NL_REQUIRE(is_floating(dtype), op, ": expected a floating dtype, found ", dtype_name(dtype));
}

// low + (high - low) * U[0, 1) or mean + std * N(0, 1), drawn in f64 for f64 tensors and in f32
// otherwise, row-major from `gen`, then converted to `dtype` and moved to `device`.
template <typename T>
Tensor draw(const Shape& shape, bool gaussian, double a, double b, Generator& gen, DType dtype, Device device) {
    std::vector<T> values(static_cast<size_t>(std::max<int64_t>(shape_numel(shape), 0)));
    const int64_t n = static_cast<int64_t>(values.size());
    if (gaussian) {
        gen.fill_normal(values.data(), n);
        if (a != 0.0 || b != 1.0)
            for (T& v : values) v = static_cast<T>(a + b * v);
    } else {
        gen.fill_uniform(values.data(), n);
        if (a != 0.0 || b != 1.0)
            for (T& v : values) v = static_cast<T>(a + (b - a) * v);
    }
    return from_host(values.data(), DTypeOf<T>::value, values.size(), shape, dtype, device);
}

Tensor random_tensor(const char* op, const Shape& shape, bool gaussian, double a, double b, Generator& gen,
                     DType dtype, Device device) {
    require_floating(dtype, op);
    for (int64_t s : shape) NL_REQUIRE(s >= 0, op, ": invalid size ", s, " in shape ", shape_str(shape));
    if (dtype == DType::F64) return draw<double>(shape, gaussian, a, b, gen, dtype, device);
    return draw<float>(shape, gaussian, a, b, gen, dtype, device);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// construction and metadata

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)), shape_(std::move(shape)), strides_(std::move(strides)), offset_(offset),
      dtype_(dtype) {
    NL_CHECK(storage_ != nullptr, "Tensor: null storage");
    NL_CHECK(shape_.size() == strides_.size(), "Tensor: shape ", shape_str(shape_), " vs strides ",
             shape_str(strides_));
    NL_CHECK(offset_ >= 0, "Tensor: negative offset");
    // Every reachable element must lie inside the storage.
    int64_t last = offset_;
    for (size_t i = 0; i < shape_.size(); ++i) {
        NL_CHECK(shape_[i] >= 0 && strides_[i] >= 0, "Tensor: bad shape/strides");
        if (shape_[i] == 0) last = -1;
        if (last >= 0) last += (shape_[i] - 1) * strides_[i];
    }
    NL_CHECK(last < 0 || (last + 1) * static_cast<int64_t>(dtype_size(dtype_)) <=
                             static_cast<int64_t>(storage_->nbytes()),
             "Tensor: view ", shape_str(shape_), " at offset ", offset_, " exceeds its storage");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
    for (int64_t s : shape) NL_REQUIRE(s >= 0, "empty: invalid size ", s, " in shape ", shape_str(shape));
    // Every size check before the allocation: the element count, the byte count and the strides.
    const int64_t numel = shape_numel(shape);
    NL_REQUIRE(uint64_t(numel) <= uint64_t(INT64_MAX) / dtype_size(dtype), "empty: shape ", shape_str(shape), " of ",
               dtype_name(dtype), " needs more bytes than an int64 can count (", numel, " elements)");
    Shape strides = contiguous_strides(shape);
    const size_t nbytes = static_cast<size_t>(numel) * dtype_size(dtype);
    return Tensor(std::make_shared<Storage>(nbytes, device), shape, std::move(strides), 0, dtype);
}

Device Tensor::device() const {
    NL_REQUIRE(defined(), "device: tensor is undefined");
    return storage_->device();
}

int64_t Tensor::size(int64_t dim) const { return shape_[wrap_dim(dim, this->dim(), "size")]; }

bool Tensor::is_contiguous() const {
    // Size-1 dims may have any stride; an empty tensor is trivially contiguous (PyTorch's rule).
    if (numel() == 0) return true;
    int64_t expected = 1;
    for (int64_t d = dim() - 1; d >= 0; --d) {
        if (shape_[d] == 1) continue;
        if (strides_[d] != expected) return false;
        expected *= shape_[d];
    }
    return true;
}

void* Tensor::data_ptr() const {
    NL_REQUIRE(defined(), "data_ptr: tensor is undefined");
    return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

// ---------------------------------------------------------------------------------------------
// views

Tensor Tensor::view(const Shape& shape) const {
    NL_REQUIRE(defined(), "view: tensor is undefined");
    Shape target = infer_shape(shape, numel(), "view", shape_);
    std::optional<Shape> strides = view_strides(shape_, strides_, target);
    NL_REQUIRE(strides.has_value(), "view: shape ", shape_str(target), " is not compatible with a tensor of shape ",
               shape_str(shape_), " and strides ", shape_str(strides_), " (call contiguous() or use reshape)");
    return Tensor(storage_, target, *strides, offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
    NL_REQUIRE(defined(), "reshape: tensor is undefined");
    Shape target = infer_shape(shape, numel(), "reshape", shape_);
    std::optional<Shape> strides = view_strides(shape_, strides_, target);
    if (strides) return Tensor(storage_, target, *strides, offset_, dtype_);
    return clone().view(target);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
    NL_REQUIRE(defined(), "transpose: tensor is undefined");
    const int64_t d0 = wrap_dim(dim0, dim(), "transpose");
    const int64_t d1 = wrap_dim(dim1, dim(), "transpose");
    Shape shape = shape_, strides = strides_;
    std::swap(shape[d0], shape[d1]);
    std::swap(strides[d0], strides[d1]);
    return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::t() const {
    NL_REQUIRE(defined(), "t: tensor is undefined");
    NL_REQUIRE(dim() <= 2, "t: expected a tensor with at most 2 dims, found shape ", shape_str(shape_));
    return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
    NL_REQUIRE(defined(), "permute: tensor is undefined");
    const bool right_count = static_cast<int64_t>(dims.size()) == dim();
    std::vector<bool> seen(shape_.size(), false);
    bool valid = right_count;
    Shape shape, strides;
    for (size_t i = 0; valid && i < dims.size(); ++i) {
        int64_t d = dims[i] < 0 ? dims[i] + dim() : dims[i];
        valid = d >= 0 && d < dim() && !seen[d];
        if (!valid) break;
        seen[d] = true;
        shape.push_back(shape_[d]);
        strides.push_back(strides_[d]);
    }
    NL_REQUIRE(valid, "permute: expected a permutation of the ", dim(), " dims of a tensor of shape ",
               shape_str(shape_), ", found dims ", shape_str(dims));
    return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
    NL_REQUIRE(defined(), "narrow: tensor is undefined");
    const int64_t d = wrap_dim(dim, this->dim(), "narrow");
    const int64_t size = shape_[d];
    const int64_t begin = start < 0 ? start + size : start;
    NL_REQUIRE(begin >= 0 && begin <= size && length >= 0 && begin + length <= size, "narrow: start ", start,
               " and length ", length, " do not fit dim ", d, " of size ", size, " (shape ", shape_str(shape_), ")");
    Shape shape = shape_;
    shape[d] = length;
    return Tensor(storage_, shape, strides_, offset_ + begin * strides_[d], dtype_);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
    NL_REQUIRE(defined(), "slice: tensor is undefined");
    const int64_t d = wrap_dim(dim, this->dim(), "slice");
    NL_REQUIRE(step > 0, "slice: expected step > 0, found ", step, " (shape ", shape_str(shape_), ")");
    const int64_t size = shape_[d];
    // Python's clamping: negative bounds count from the end, then both are clipped into [0, size].
    auto clamp = [size](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + size : i, 0, size); };
    const int64_t begin = clamp(start);
    const int64_t stop = std::max(clamp(end), begin);
    Shape shape = shape_, strides = strides_;
    shape[d] = (stop - begin + step - 1) / step;
    strides[d] = strides_[d] * step;
    return Tensor(storage_, shape, strides, offset_ + begin * strides_[d], dtype_);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
    NL_REQUIRE(defined(), "select: tensor is undefined");
    const int64_t d = wrap_dim(dim, this->dim(), "select");
    const int64_t size = shape_[d];
    NL_REQUIRE(index >= -size && index < size, "select: index ", index, " is out of range for dim ", d,
               " of size ", size, " (shape ", shape_str(shape_), ")");
    const int64_t i = index < 0 ? index + size : index;
    Shape shape = shape_, strides = strides_;
    shape.erase(shape.begin() + d);
    strides.erase(strides.begin() + d);
    return Tensor(storage_, shape, strides, offset_ + i * strides_[d], dtype_);
}

Tensor Tensor::expand(const Shape& shape) const {
    NL_REQUIRE(defined(), "expand: tensor is undefined");
    const int64_t nd = static_cast<int64_t>(shape.size());
    NL_REQUIRE(nd >= dim(), "expand: cannot expand ", shape_str(shape_), " to ", shape_str(shape),
               " (the target has fewer dims)");
    Shape out_shape(shape.size()), out_strides(shape.size());
    for (int64_t i = nd - 1; i >= 0; --i) {
        const int64_t j = i - (nd - dim());  // matching dim of *this, negative for new leading dims
        if (j < 0) {
            NL_REQUIRE(shape[i] >= 0, "expand: cannot expand ", shape_str(shape_), " to ", shape_str(shape),
                       " (new leading dim ", i, " needs a size >= 0, found ", shape[i], ")");
            out_shape[i] = shape[i];
            out_strides[i] = 0;
            continue;
        }
        const int64_t want = shape[i] == -1 ? shape_[j] : shape[i];
        NL_REQUIRE(want == shape_[j] || (shape_[j] == 1 && want >= 0), "expand: cannot expand ",
                   shape_str(shape_), " to ", shape_str(shape), " (dim ", i, ": size ", shape_[j],
                   " is not 1 and differs from ", shape[i], ")");
        out_shape[i] = want;
        out_strides[i] = want == shape_[j] ? strides_[j] : 0;
    }
    return Tensor(storage_, out_shape, out_strides, offset_, dtype_);
}

Tensor Tensor::squeeze() const {
    NL_REQUIRE(defined(), "squeeze: tensor is undefined");
    Shape shape, strides;
    for (size_t i = 0; i < shape_.size(); ++i) {
        if (shape_[i] == 1) continue;
        shape.push_back(shape_[i]);
        strides.push_back(strides_[i]);
    }
    return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::squeeze(int64_t dim) const {
    NL_REQUIRE(defined(), "squeeze: tensor is undefined");
    const int64_t d = wrap_dim(dim, this->dim(), "squeeze");
    if (shape_[d] != 1) return *this;
    Shape shape = shape_, strides = strides_;
    shape.erase(shape.begin() + d);
    strides.erase(strides.begin() + d);
    return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
    NL_REQUIRE(defined(), "unsqueeze: tensor is undefined");
    const int64_t d = wrap_dim(dim, this->dim() + 1, "unsqueeze");
    // The new size-1 dim gets the stride it would have in a packed tensor (PyTorch's choice).
    const int64_t stride = d < this->dim() ? shape_[d] * strides_[d] : 1;
    Shape shape = shape_, strides = strides_;
    shape.insert(shape.begin() + d, 1);
    strides.insert(strides.begin() + d, stride);
    return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::flatten() const {
    NL_REQUIRE(defined(), "flatten: tensor is undefined");
    return reshape({numel()});
}

// ---------------------------------------------------------------------------------------------
// copies

Tensor Tensor::contiguous() const {
    NL_REQUIRE(defined(), "contiguous: tensor is undefined");
    return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
    NL_REQUIRE(defined(), "clone: tensor is undefined");
    Tensor out = empty(shape_, dtype_, device());
    out.copy_(*this);
    return out;
}

Tensor Tensor::to(DType dtype) const {
    NL_REQUIRE(defined(), "to: tensor is undefined");
    if (dtype == dtype_) return *this;
    Tensor out = empty(shape_, dtype, device());
    out.copy_(*this);
    return out;
}

Tensor Tensor::to(Device device) const {
    NL_REQUIRE(defined(), "to: tensor is undefined");
    if (device == this->device()) return *this;
    Tensor out = empty(shape_, dtype_, device);  // throws the allocator's error for a missing device
    Tensor src = contiguous();
    // A cross-device copy runs on the CUDA side's backend (the only one that can reach both
    // memories), with packed operands of one dtype.
    Backend& backend = device.is_cuda() ? backend_for(device) : backend_for(src.device());
    backend.copy(shape_, strided_arg(out), strided_arg(src));
    return out;
}

void Tensor::copy_(const Tensor& src) {
    NL_REQUIRE(defined() && src.defined(), "copy_: tensor is undefined");
    NL_REQUIRE(src.dim() <= dim(), "copy_: cannot broadcast source ", shape_str(src.shape()),
               " to destination ", shape_str(shape_));
    for (int64_t i = 0; i < src.dim(); ++i) {
        const int64_t s = src.shape()[i], d = shape_[dim() - src.dim() + i];
        NL_REQUIRE(s == d || s == 1, "copy_: cannot broadcast source ", shape_str(src.shape()),
                   " to destination ", shape_str(shape_), " (dim ", i, ": ", s, " vs ", d, ")");
    }
    Tensor source = src.device() == device() ? src : src.to(device());
    // Overlapping views of one storage would read elements already overwritten: copy via a temporary.
    const bool same_view = source.storage() == storage_ && source.offset() == offset_ &&
                           source.shape() == shape_ && source.strides() == strides_ && source.dtype() == dtype_;
    if (same_view) return;
    if (source.storage() == storage_) source = source.clone();
    source = source.expand(shape_);
    backend_for(device()).copy(shape_, strided_arg(*this), strided_arg(source));
}

void Tensor::fill_(double value) {
    NL_REQUIRE(defined(), "fill_: tensor is undefined");
    backend_for(device()).fill(shape_, strided_arg(*this), value);
}

// ---------------------------------------------------------------------------------------------
// host access

double Tensor::item() const {
    NL_REQUIRE(defined(), "item: tensor is undefined");
    NL_REQUIRE(numel() == 1, "item: expected a tensor with 1 element, found shape ", shape_str(shape_), " (",
               numel(), " elements)");
    return at(Shape(shape_.size(), 0));
}

double Tensor::at(const std::vector<int64_t>& index) const {
    NL_REQUIRE(defined(), "at: tensor is undefined");
    bool valid = static_cast<int64_t>(index.size()) == dim();
    int64_t element = offset_;
    for (size_t i = 0; valid && i < index.size(); ++i) {
        const int64_t k = index[i] < 0 ? index[i] + shape_[i] : index[i];
        valid = k >= 0 && k < shape_[i];
        element += k * strides_[i];
    }
    NL_REQUIRE(valid, "at: index ", shape_str(index), " is out of range for shape ", shape_str(shape_));
    Tensor one(storage_, {}, {}, element, dtype_);
    Tensor host = one.to(Device::cpu());
    return read_host(host.data_ptr(), dtype_);
}

std::vector<double> Tensor::to_vector() const { return to_vector_as<double>(); }

template <typename T>
std::vector<T> Tensor::to_vector_as() const {
    NL_REQUIRE(defined(), "to_vector: tensor is undefined");
    Tensor host = to(Device::cpu());
    std::vector<T> out(static_cast<size_t>(numel()));
    backend_for(Device::cpu())
        .copy(shape_, StridedArg{out.data(), DTypeOf<T>::value, contiguous_strides(shape_)}, strided_arg(host));
    return out;
}

template std::vector<float> Tensor::to_vector_as<float>() const;
template std::vector<double> Tensor::to_vector_as<double>() const;
template std::vector<int64_t> Tensor::to_vector_as<int64_t>() const;

namespace {

void print_value(std::ostringstream& out, double value, bool integer) {
    if (integer)
        out << static_cast<int64_t>(value);
    else
        out << value;
}

// Nested brackets like PyTorch; dims longer than 2 * edge + 1 show `edge` items each side of "..."
// when the tensor is large.
void print_dim(std::ostringstream& out, const std::vector<double>& values, const Shape& shape,
               const Shape& strides, size_t d, int64_t base, bool integer, int64_t edge, int indent) {
    if (shape.empty()) {
        print_value(out, values[0], integer);
        return;
    }
    out << '[';
    const int64_t n = shape[d];
    for (int64_t i = 0; i < n; ++i) {
        if (edge > 0 && n > 2 * edge + 1 && i == edge) {
            out << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
            i = n - edge - 1;
            continue;
        }
        const int64_t at = base + i * strides[d];
        if (d + 1 == shape.size()) {
            print_value(out, values[at], integer);
        } else {
            print_dim(out, values, shape, strides, d + 1, at, integer, edge, indent + 1);
        }
        if (i + 1 < n) out << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
    }
    out << ']';
}

}  // namespace

std::string Tensor::str() const {
    if (!defined()) return "Tensor(undefined)";
    std::ostringstream out;
    out << "Tensor(" << dtype_name(dtype_) << ", " << shape_str(shape_) << ", " << device().str() << ")\n";
    const std::vector<double> values = to_vector();
    const int64_t edge = numel() > 1000 ? 3 : 0;
    print_dim(out, values, shape_, contiguous_strides(shape_), 0, 0, dtype_ == DType::I64, edge, 0);
    return out.str();
}

// ---------------------------------------------------------------------------------------------
// creation

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
    Tensor out = Tensor::empty(shape, dtype, device);
    out.fill_(value);
    return out;
}

Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }

Tensor full_like(const Tensor& t, double value) {
    NL_REQUIRE(t.defined(), "full_like: tensor is undefined");
    return full(t.shape(), value, t.dtype(), t.device());
}

Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
    NL_REQUIRE(step != 0.0 && std::isfinite(step) && std::isfinite(start) && std::isfinite(end),
               "arange: expected finite start, end and a nonzero step, found start ", start, ", end ", end,
               ", step ", step);
    NL_REQUIRE((end - start) / step >= 0.0 || end == start, "arange: step ", step, " moves away from end ", end,
               " (start ", start, ")");
    const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
    std::vector<double> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[i] = start + static_cast<double>(i) * step;
    return from_vector(values, {n}, dtype, device);
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
    return from_host(values.data(), DType::F64, values.size(), shape, dtype, device);
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, Device device) {
    return from_host(values.data(), DType::F32, values.size(), shape, dtype, device);
}

Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype, Device device) {
    return from_host(values.data(), DType::I64, values.size(), shape, dtype, device);
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
    return random_tensor("rand", shape, false, 0.0, 1.0, gen, dtype, device);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
    return random_tensor("randn", shape, true, 0.0, 1.0, gen, dtype, device);
}

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype, Device device) {
    NL_REQUIRE(low <= high, "uniform: expected low <= high, found low ", low, ", high ", high);
    return random_tensor("uniform", shape, false, low, high, gen, dtype, device);
}

Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype, Device device) {
    NL_REQUIRE(std >= 0.0, "normal: expected std >= 0, found ", std);
    return random_tensor("normal", shape, true, mean, std, gen, dtype, device);
}

}  // namespace nl
