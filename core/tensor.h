// Tensor: shared storage + shape + strides + offset + dtype (+ the storage's device). Views share
// storage; contiguous() copies only when needed. No tensor is ever half-initialized.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/shape.h"

namespace nl {

class Tensor {
public:
    Tensor() = default;  // an undefined tensor: defined() is false, every other call throws
    Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

    // Uninitialized contents (callers overwrite every element).
    static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());

    bool defined() const { return storage_ != nullptr; }
    const Shape& shape() const { return shape_; }
    const Shape& strides() const { return strides_; }
    int64_t offset() const { return offset_; }  // in elements
    DType dtype() const { return dtype_; }
    Device device() const;
    int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
    int64_t numel() const { return shape_numel(shape_); }
    int64_t size(int64_t dim) const;  // negative dims count from the end
    int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype_)); }
    bool is_contiguous() const;
    const std::shared_ptr<Storage>& storage() const { return storage_; }

    // Pointer to element [0, 0, ...] (storage base + offset). data<T>() checks T against dtype().
    void* data_ptr() const;
    template <typename T>
    T* data() const;

    // ---- views (share storage, never copy) ----
    Tensor view(const Shape& shape) const;     // needs compatible strides; one -1 allowed
    Tensor reshape(const Shape& shape) const;  // a view when possible, else a contiguous copy
    Tensor transpose(int64_t dim0, int64_t dim1) const;
    Tensor t() const;  // 2-D transpose
    Tensor permute(const std::vector<int64_t>& dims) const;
    Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
    Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // python-like clamp
    Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
    Tensor expand(const Shape& shape) const;          // size-1 dims broadcast with stride 0; -1 keeps
    Tensor squeeze() const;                           // drops every size-1 dim
    Tensor squeeze(int64_t dim) const;                // drops `dim` if it has size 1
    Tensor unsqueeze(int64_t dim) const;
    Tensor flatten() const;                           // reshape({numel})

    // ---- copies ----
    Tensor contiguous() const;        // *this when already contiguous, else a packed copy
    Tensor clone() const;             // always a packed copy
    Tensor to(DType dtype) const;     // *this when same dtype, else a converted copy
    Tensor to(Device device) const;   // *this when same device, else a copy on `device`
    void copy_(const Tensor& src);    // src broadcast to this shape, converted to this dtype
    void fill_(double value);
    void zero_() { fill_(0.0); }

    // ---- host access (for tests, printing, small reads; copies from a device when needed) ----
    double item() const;                                  // needs numel() == 1
    double at(const std::vector<int64_t>& index) const;   // one element as double
    std::vector<double> to_vector() const;                // row-major logical order
    template <typename T>
    std::vector<T> to_vector_as() const;                  // T in float, double, int64_t
    std::string str() const;                              // "Tensor(f32, [2, 3], cpu)\n[[...]]"

private:
    std::shared_ptr<Storage> storage_;
    Shape shape_;
    Shape strides_;
    int64_t offset_ = 0;
    DType dtype_ = DType::F32;
};

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };

template <typename T>
T* Tensor::data() const {
    NL_REQUIRE(defined(), "data: tensor is undefined");
    NL_REQUIRE(dtype_ == DTypeOf<T>::value, "data: expected dtype ", dtype_name(DTypeOf<T>::value),
               ", found ", dtype_name(dtype_));
    return static_cast<T*>(data_ptr());
}

// ---- creation ----
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor scalar_tensor(double value, DType dtype = DType::F32, Device device = Device::cpu());  // shape []
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::F32,
              Device device = Device::cpu());
// Values in row-major order; values.size() must equal the shape's numel (error names both).
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::F32,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64,
                   Device device = Device::cpu());
// Random: drawn in f64/f32 from `gen` in row-major order, so a seed gives the same values always.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::cpu());
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::cpu());
Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype = DType::F32,
               Device device = Device::cpu());
Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype = DType::F32,
              Device device = Device::cpu());

}  // namespace nl
