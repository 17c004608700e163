// Tensors from Python: the dtypes, normlab.Tensor (an autograd Var: data, .grad, requires_grad),
// creation, and the two ways memory crosses to other libraries without a copy: NumPy's array
// interface (t.numpy(), np.asarray(t), normlab.from_numpy) and DLPack (t.__dlpack__(),
// normlab.from_dlpack: PyTorch, NumPy, JAX, ...). Memory that came from another library is borrowed
// storage (core/allocator.h): the other side's object stays alive until the last normlab tensor on
// it is gone, and memory given out keeps normlab's storage alive until the other side lets go.
#include <Python.h>

#include <cstring>
#include <memory>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace nl::py {

// ---- shared conversions ----

Shape shape_from(nb::handle sequence, const char* what) {
    if (nb::isinstance<nb::int_>(sequence)) return {nb::cast<int64_t>(sequence)};
    NL_REQUIRE(PySequence_Check(sequence.ptr()), what, ": expected a sequence of ints, found ",
               nb::str(nb::type_name(sequence.type())).c_str());
    Shape shape;
    for (nb::handle item : sequence) {
        NL_REQUIRE(nb::isinstance<nb::int_>(item) || PyIndex_Check(item.ptr()), what, ": expected ints, found ",
                   nb::str(nb::repr(sequence)).c_str());
        shape.push_back(nb::cast<int64_t>(nb::int_(item)));
    }
    return shape;
}

nb::tuple shape_tuple(const Shape& shape) {
    nb::list items;
    for (int64_t size : shape) items.append(size);
    return nb::tuple(items);
}

DType dtype_from(nb::handle value, DType fallback) {
    if (value.is_none()) return fallback;
    if (nb::isinstance<DType>(value)) return nb::cast<DType>(value);
    if (nb::isinstance<nb::str>(value)) {
        const std::string name = nb::cast<std::string>(value);
        static const std::pair<const char*, DType> names[] = {
            {"float32", DType::F32}, {"float", DType::F32},    {"float64", DType::F64}, {"double", DType::F64},
            {"bfloat16", DType::BF16}, {"float16", DType::F16}, {"half", DType::F16},   {"int64", DType::I64},
            {"long", DType::I64}};
        for (const auto& [alias, dtype] : names)
            if (name == alias) return dtype;
        return dtype_from_name(name);  // "f32", "bf16", ...: an nl::Error naming the choices otherwise
    }
    throw Error(detail::concat("dtype: expected a normlab dtype (normlab.float32, ...) or its name, found ",
                               nb::str(nb::repr(value)).c_str()));
}

Var var_from(nb::handle value, DType like) {
    if (nb::isinstance<Var>(value)) return nb::cast<Var>(value);
    if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()))
        return Var(scalar_tensor(nb::cast<double>(value), like));
    throw Error(detail::concat("expected a normlab.Tensor or a number, found ",
                               nb::str(nb::type_name(value.type())).c_str()));
}

namespace {

// ---- NumPy's array interface ----

// What an object's __array_interface__ (version 3) says about its memory.
struct ArrayMemory {
    void* data = nullptr;
    Shape shape;
    Shape strides;        // in elements; valid only when `strided_ok`
    DType dtype = DType::F32;
    bool readonly = false;
    bool strided_ok = true;  // every byte stride a non-negative multiple of the element size
    size_t span_bytes = 0;   // from data to one past the last element
};

DType dtype_of_typestr(const std::string& typestr) {
    const bool little = !typestr.empty() && (typestr[0] == '<' || typestr[0] == '|' || typestr[0] == '=');
    const std::string kind = typestr.size() > 1 ? typestr.substr(1) : "";
    if (little && kind == "f4") return DType::F32;
    if (little && kind == "f8") return DType::F64;
    if (little && kind == "f2") return DType::F16;
    if (little && kind == "i8") return DType::I64;
    throw Error("from_numpy: normlab holds float32, float64, float16 and int64; found an array of typestr '" + typestr +
                "' (convert it first, e.g. array.astype(numpy.float32))");
}

const char* typestr_of(DType dtype) {
    switch (dtype) {
        case DType::F32: return "<f4";
        case DType::F64: return "<f8";
        case DType::F16: return "<f2";
        case DType::I64: return "<i8";
        case DType::BF16: break;
    }
    throw Error("numpy(): NumPy has no bfloat16 dtype; convert explicitly first (t.float().numpy()), or hand "
                "the bfloat16 tensor over by DLPack (torch.from_dlpack(t))");
}

ArrayMemory array_memory(nb::handle array) {
    NL_REQUIRE(nb::hasattr(array, "__array_interface__"), "from_numpy: expected a NumPy array (an object with "
               "__array_interface__), found ", nb::str(nb::type_name(array.type())).c_str());
    nb::dict info = nb::borrow<nb::dict>(array.attr("__array_interface__"));
    ArrayMemory m;
    m.dtype = dtype_of_typestr(nb::cast<std::string>(info["typestr"]));
    nb::tuple data = nb::borrow<nb::tuple>(info["data"]);
    m.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
    m.readonly = nb::cast<bool>(data[1]);
    m.shape = shape_from(info["shape"]);
    const int64_t item = static_cast<int64_t>(dtype_size(m.dtype));
    const nb::handle strides = info.contains("strides") ? nb::handle(info["strides"]) : nb::none();
    int64_t span = 1, contiguous = 1;
    for (int64_t d = static_cast<int64_t>(m.shape.size()) - 1; d >= 0; --d) {
        int64_t stride = contiguous;
        if (!strides.is_none()) {
            const int64_t bytes = nb::cast<int64_t>(nb::borrow<nb::tuple>(strides)[static_cast<size_t>(d)]);
            m.strided_ok = m.strided_ok && bytes >= 0 && bytes % item == 0;
            stride = bytes / item;
        }
        m.strides.insert(m.strides.begin(), stride);
        if (m.shape[d] == 0) span = 0;
        if (span > 0) span += (m.shape[d] - 1) * stride;
        contiguous *= m.shape[d];
    }
    m.span_bytes = static_cast<size_t>(span * item);
    return m;
}

// Releases a borrowed reference to a Python object from whichever thread drops the last tensor.
std::function<void()> releaser(nb::object owner) {
    auto* held = new nb::object(std::move(owner));
    return [held] {
        if (!Py_IsInitialized()) return;  // at interpreter exit the object is gone with it
        nb::gil_scoped_acquire gil;
        delete held;
    };
}

// The array's memory as a tensor, no copy; an array whose strides a tensor cannot express (negative,
// or not a whole number of elements) is copied into a new tensor.
Tensor tensor_on_array(nb::handle array) {
    const ArrayMemory m = array_memory(array);
    if (!m.strided_ok) return tensor_on_array(nb::module_::import_("numpy").attr("ascontiguousarray")(array));
    auto storage = std::make_shared<Storage>(m.data, m.span_bytes, Device::cpu(), releaser(nb::borrow(array)));
    return Tensor(std::move(storage), m.shape, m.strides, 0, m.dtype);
}

// The object NumPy wraps for t.numpy() and np.asarray(t): it holds the tensor (so its storage) and
// describes its memory. The array's base is this object, not the Python Tensor, so replacing the
// Tensor's data later (t.data = ...) never frees memory an array still points to.
struct ArrayView {
    Tensor tensor;
    nb::dict interface() const {
        NL_REQUIRE(tensor.device().is_cpu(), "numpy(): the tensor is on ", tensor.device().str(),
                   "; copy it to the CPU first (t.cpu())");
        nb::dict d;
        d["version"] = 3;
        d["typestr"] = typestr_of(tensor.dtype());
        d["shape"] = shape_tuple(tensor.shape());
        nb::list strides;
        for (int64_t s : tensor.strides()) strides.append(s * static_cast<int64_t>(dtype_size(tensor.dtype())));
        d["strides"] = nb::tuple(strides);
        d["data"] = nb::make_tuple(reinterpret_cast<uintptr_t>(tensor.data_ptr()), false);
        return d;
    }
};

nb::object as_numpy(const Tensor& t) {
    return nb::module_::import_("numpy").attr("asarray")(nb::cast(ArrayView{t}));
}

// ---- DLPack (the stable C ABI of dlpack.h: versioned 1.x capsules, and legacy ones for old consumers) ----

struct DLDevice {
    int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3
    int32_t device_id;
};
struct DLDataType {
    uint8_t code;  // kDLInt = 0, kDLFloat = 2, kDLBfloat = 4
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;  // in elements; null means compact row-major
    uint64_t byte_offset;
};
struct DLManagedTensor {  // legacy capsule "dltensor"
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
    uint32_t major;
    uint32_t minor;
};
struct DLManagedTensorVersioned {  // DLPack 1.x capsule "dltensor_versioned"
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned* self);
    uint64_t flags;  // bit 0: read-only, bit 1: a copy
    DLTensor dl_tensor;
};

DLDataType dl_dtype(DType dtype) {
    switch (dtype) {
        case DType::F32: return {2, 32, 1};
        case DType::F64: return {2, 64, 1};
        case DType::F16: return {2, 16, 1};
        case DType::BF16: return {4, 16, 1};
        case DType::I64: return {0, 64, 1};
    }
    throw InternalError("dl_dtype: unknown dtype");
}

DType dtype_of_dl(DLDataType t) {
    NL_REQUIRE(t.lanes == 1, "from_dlpack: vector dtypes (lanes ", t.lanes, ") are not supported");
    if (t.code == 2 && t.bits == 32) return DType::F32;
    if (t.code == 2 && t.bits == 64) return DType::F64;
    if (t.code == 2 && t.bits == 16) return DType::F16;
    if (t.code == 4 && t.bits == 16) return DType::BF16;
    if (t.code == 0 && t.bits == 64) return DType::I64;
    throw Error(detail::concat("from_dlpack: normlab holds float32, float64, float16, bfloat16 and int64; found DLPack "
                               "type code ", int(t.code), " with ", int(t.bits), " bits (convert it first)"));
}

// What a capsule given out keeps alive: the tensor (its storage) and the arrays its DLTensor points to.
struct ExportContext {
    Tensor tensor;
    std::vector<int64_t> shape, strides;
};

template <typename Managed>
void delete_export(Managed* managed) {
    delete static_cast<ExportContext*>(managed->manager_ctx);
    delete managed;
}

// A consumer renames the capsule "used_..." and calls the deleter itself; one that never consumed it
// leaves the name, and the capsule frees the tensor.
void legacy_capsule_destructor(PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        managed->deleter(managed);
    }
}

void versioned_capsule_destructor(PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
        managed->deleter(managed);
    }
}

// Fills `dl` to describe t, with shape and strides held by `context`.
void describe(const Tensor& t, ExportContext* context, DLTensor& dl) {
    dl.data = t.data_ptr();
    dl.device = t.device().is_cpu() ? DLDevice{1, 0} : DLDevice{2, static_cast<int32_t>(t.device().index)};
    dl.ndim = static_cast<int32_t>(t.dim());
    dl.dtype = dl_dtype(t.dtype());
    dl.shape = context->shape.data();
    dl.strides = context->strides.data();
    dl.byte_offset = 0;
}

template <typename Managed>
nb::object capsule_of(Managed* managed, const char* name, PyCapsule_Destructor destructor) {
    PyObject* capsule = PyCapsule_New(managed, name, destructor);
    if (capsule == nullptr) {
        delete_export(managed);
        throw nb::python_error();
    }
    return nb::steal(capsule);
}

// A capsule on t's memory: versioned (writable, not a copy) when the consumer accepts DLPack 1.x,
// as the array API standard asks, else legacy.
nb::object to_dlpack(const Tensor& t, bool versioned) {
    auto* context = new ExportContext{t, t.shape(), t.strides()};
    if (versioned) {
        auto* managed = new DLManagedTensorVersioned{};
        managed->version = {1, 0};
        managed->manager_ctx = context;
        managed->deleter = delete_export<DLManagedTensorVersioned>;
        managed->flags = 0;
        describe(t, context, managed->dl_tensor);
        return capsule_of(managed, "dltensor_versioned", versioned_capsule_destructor);
    }
    auto* managed = new DLManagedTensor{};
    managed->manager_ctx = context;
    managed->deleter = delete_export<DLManagedTensor>;
    describe(t, context, managed->dl_tensor);
    return capsule_of(managed, "dltensor", legacy_capsule_destructor);
}

// Whether a __dlpack__ max_version argument, (major, minor) or None, accepts versioned capsules.
bool accepts_versioned(nb::handle max_version) {
    if (max_version.is_none()) return false;
    NL_REQUIRE(PySequence_Check(max_version.ptr()) && nb::len(max_version) == 2,
               "__dlpack__: max_version must be a (major, minor) tuple, found ", nb::str(nb::repr(max_version)).c_str());
    return nb::cast<int64_t>(max_version[0]) >= 1;
}

// A capsule from an object with __dlpack__: versioned where the producer knows DLPack 1.x.
nb::object capsule_from(nb::handle source) {
    if (PyCapsule_CheckExact(source.ptr())) return nb::borrow(source);
    NL_REQUIRE(nb::hasattr(source, "__dlpack__"), "from_dlpack: expected an object with __dlpack__ (a NumPy "
               "array, a PyTorch tensor, ...) or a DLPack capsule, found ", nb::str(nb::type_name(source.type())).c_str());
    nb::object method = source.attr("__dlpack__");
    try {
        nb::dict kwargs;
        kwargs["max_version"] = nb::make_tuple(1, 0);
        return method(**kwargs);
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_TypeError)) throw;  // a producer from before DLPack 1.0 has no max_version
        return method();
    }
}

// The tensor on a DLTensor's memory; `release` (run when the last view goes) hands it back to the producer.
Tensor tensor_on_dl(const DLTensor& dl, std::function<void()> release) {
    Device device = Device::cpu();
    if (dl.device.device_type == 2) device = Device::cuda(dl.device.device_id);
    else NL_REQUIRE(dl.device.device_type == 1 || dl.device.device_type == 3, "from_dlpack: DLPack device type ",
                    dl.device.device_type, " is neither the CPU nor a CUDA GPU");
    const DType dtype = dtype_of_dl(dl.dtype);
    Shape shape(dl.shape, dl.shape + dl.ndim), strides(static_cast<size_t>(dl.ndim));
    int64_t contiguous = 1, span = 1;
    for (int64_t d = dl.ndim - 1; d >= 0; --d) {
        strides[d] = dl.strides != nullptr ? dl.strides[d] : contiguous;
        NL_REQUIRE(strides[d] >= 0, "from_dlpack: negative strides are not supported (found ", strides[d], ")");
        if (shape[d] == 0) span = 0;
        if (span > 0) span += (shape[d] - 1) * strides[d];
        contiguous *= shape[d];
    }
    void* data = static_cast<char*>(dl.data) + dl.byte_offset;
    auto storage = std::make_shared<Storage>(data, static_cast<size_t>(span) * dtype_size(dtype), device, std::move(release));
    return Tensor(std::move(storage), shape, strides, 0, dtype);
}

// Calls a producer's deleter from whichever thread drops the last tensor.
template <typename Managed>
std::function<void()> dl_release(Managed* managed) {
    return [managed] {
        if (managed->deleter == nullptr) return;
        if (!Py_IsInitialized()) return;
        nb::gil_scoped_acquire gil;  // a producer's deleter may drop Python objects
        managed->deleter(managed);
    };
}

// The tensor a DLPack capsule (or an object with __dlpack__) describes, on its memory. The checks
// run before the capsule is marked used, so a refused capsule still frees itself.
Tensor from_dlpack(nb::handle source) {
    nb::object capsule = capsule_from(source);
    if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
        auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
        NL_REQUIRE(managed->version.major == 1, "from_dlpack: DLPack version ", managed->version.major, ".",
                   managed->version.minor, " is newer than normlab reads (1.x)");
        Tensor t = tensor_on_dl(managed->dl_tensor, dl_release(managed));
        PyCapsule_SetName(capsule.ptr(), "used_dltensor_versioned");  // consumed: the capsule no longer frees it
        return t;
    }
    NL_REQUIRE(PyCapsule_IsValid(capsule.ptr(), "dltensor"),
               "from_dlpack: expected an unused \"dltensor\" or \"dltensor_versioned\" capsule (a capsule can be "
               "consumed once)");
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    Tensor t = tensor_on_dl(managed->dl_tensor, dl_release(managed));
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    return t;
}

// ---- creation ----

Generator& generator_from(nb::handle generator) {
    return generator.is_none() ? default_generator() : nb::cast<Generator&>(generator);
}

void bind_dtypes(nb::module_& m) {
    nb::enum_<DType>(m, "dtype", "A tensor's element type: float32 (the default), float64, bfloat16, float16, int64.")
        .value("float32", DType::F32, "32-bit float, the default")
        .value("float64", DType::F64, "64-bit float (gradient checks)")
        .value("bfloat16", DType::BF16, "bfloat16: stored in 16 bits, computed in float32")
        .value("float16", DType::F16, "IEEE half: stored in 16 bits, computed in float32")
        .value("int64", DType::I64, "64-bit integers (token ids, indices)")
        .def_prop_ro("itemsize", [](DType d) { return dtype_size(d); }, "Bytes per element.")
        .def_prop_ro("is_floating_point", [](DType d) { return is_floating(d); });
    m.def("_parse_dtype", [](nb::handle value) {
              NL_REQUIRE(!value.is_none(), "dtype: expected a normlab dtype or its name, found None");
              return dtype_from(value, DType::F32);
          },
          nb::arg("value"),
          "A dtype from a normlab dtype, its name (\"float64\", \"double\") or a config's short name (\"f64\"); "
          "normlab.Error naming the choices otherwise.");
    m.attr("float32") = DType::F32;
    m.attr("float64") = DType::F64;
    m.attr("bfloat16") = DType::BF16;
    m.attr("float16") = DType::F16;
    m.attr("int64") = DType::I64;
}

void bind_generator(nb::module_& m) {
    nb::class_<Generator>(m, "Generator",
                          "A counter-based Philox random generator: a seed gives the same numbers on every run "
                          "and thread count (torch.Generator's analogue).")
        .def(nb::init<uint64_t>(), nb::arg("seed") = 0)
        .def("manual_seed", [](Generator& g, uint64_t seed) -> Generator& { return g = Generator(seed); },
             nb::arg("seed"), nb::rv_policy::reference, "Restarts the generator from `seed`.");
    m.def("manual_seed", &manual_seed, nb::arg("seed"),
          "Seeds the default generator, which layers' initial weights and randn/rand without a generator draw from.");
}

void bind_creation(nb::module_& m) {
    m.def("_empty", [](nb::handle shape, nb::handle dtype) { return Var(Tensor::empty(shape_from(shape), dtype_from(dtype, DType::F32))); },
          nb::arg("shape"), nb::arg("dtype").none() = nb::none());
    m.def("_full", [](nb::handle shape, double value, nb::handle dtype) {
              return Var(full(shape_from(shape), value, dtype_from(dtype, DType::F32)));
          },
          nb::arg("shape"), nb::arg("value"), nb::arg("dtype").none() = nb::none());
    m.def("_arange", [](double start, double end, double step, nb::handle dtype) {
              return Var(arange(start, end, step, dtype_from(dtype, DType::F32)));
          },
          nb::arg("start"), nb::arg("end"), nb::arg("step"), nb::arg("dtype").none() = nb::none());
    m.def("_randn", [](nb::handle shape, nb::handle generator, nb::handle dtype) {
              return Var(randn(shape_from(shape), generator_from(generator), dtype_from(dtype, DType::F32)));
          },
          nb::arg("shape"), nb::arg("generator").none() = nb::none(), nb::arg("dtype").none() = nb::none());
    m.def("_rand", [](nb::handle shape, nb::handle generator, nb::handle dtype) {
              return Var(rand(shape_from(shape), generator_from(generator), dtype_from(dtype, DType::F32)));
          },
          nb::arg("shape"), nb::arg("generator").none() = nb::none(), nb::arg("dtype").none() = nb::none());
    m.def("from_numpy", [](nb::handle array) { return Var(tensor_on_array(array)); }, nb::arg("array"),
          "A tensor on a NumPy array's memory, without a copy (writes through either side show on the other); "
          "float32, float64, float16 and int64 arrays. The array stays alive while the tensor does. An array "
          "whose strides a tensor cannot express (negative ones) is copied.");
    m.def("_copy_array", [](nb::handle array) { return Var(tensor_on_array(array).clone()); }, nb::arg("array"),
          "A copy of a NumPy array in normlab's own memory.");
    m.def("from_dlpack", [](nb::handle source) { return Var(from_dlpack(source)); }, nb::arg("source"),
          "A tensor on the memory of anything that speaks DLPack (a PyTorch tensor, a NumPy array, JAX, ...) or "
          "of a DLPack capsule, without a copy; the source stays alive while the tensor does.");
}

// ---- the Tensor class: everything but the math (ops.cpp) and autograd's calls (autograd.cpp) ----

// The constructor and what a tensor is: sizes, strides, dtype, device, its element.
void bind_tensor_class(nb::module_& m, TensorClass& tensor) {
    nb::class_<ArrayView>(m, "_ArrayView").def_prop_ro("__array_interface__", &ArrayView::interface);
    // Tensor(t) is t again as a new Python object on the same VarImpl (data, .grad, requires_grad and
    // graph shared): what lets a Python subclass (normlab.nn.Parameter) be made from an existing
    // tensor, including a C++ module's parameter Var, without a copy.
    tensor.def(nb::init<const Var&>(), nb::arg("tensor"),
               "The same tensor as a new Python object (shares data, .grad and autograd state; not a copy).");
    tensor.def_prop_ro("shape", [](const Var& v) { return shape_tuple(v.shape()); }, "The sizes, a tuple.")
        .def("size", [](const Var& v, nb::handle dim) -> nb::object {
                 if (dim.is_none()) return shape_tuple(v.shape());
                 return nb::int_(v.size(nb::cast<int64_t>(dim)));
             },
             nb::arg("dim").none() = nb::none(), "The sizes, or one dim's size.")
        .def("dim", &Var::dim, "The number of dims.")
        .def_prop_ro("ndim", &Var::dim)
        .def("numel", &Var::numel, "The number of elements.")
        .def_prop_ro("dtype", &Var::dtype)
        .def_prop_ro("device", [](const Var& v) { return v.device().str(); }, "\"cpu\" or \"cuda:N\".")
        .def("stride", [](const Var& v) { return shape_tuple(v.data().strides()); }, "Strides in elements.")
        .def("storage_offset", [](const Var& v) { return v.data().offset(); })
        .def("is_contiguous", [](const Var& v) { return v.data().is_contiguous(); })
        .def("data_ptr", [](const Var& v) { return reinterpret_cast<uintptr_t>(v.data().data_ptr()); },
             "The address of the first element (pointer identity: which tensors share memory).")
        .def("element_size", [](const Var& v) { return dtype_size(v.dtype()); })
        .def_prop_ro("nbytes", [](const Var& v) { return v.data().nbytes(); })
        .def_prop_ro("is_cuda", [](const Var& v) { return v.device().is_cuda(); })
        .def("__len__", [](const Var& v) {
            NL_REQUIRE(v.dim() > 0, "len() of a 0-d tensor");
            return v.size(0);
        })
        .def("item", &Var::item, "The one element as a Python float.")
        .def("_str", [](const Var& v) { return v.str(); });
}

// The ways a tensor's memory reaches NumPy and DLPack consumers, without a copy.
void bind_tensor_exports(TensorClass& tensor) {
    tensor.def("__array__", [](const Var& v, nb::handle dtype, nb::handle copy) {
                 nb::object array = as_numpy(v.data());
                 if (!dtype.is_none()) array = array.attr("astype")(dtype);
                 return array;
             },
             nb::arg("dtype").none() = nb::none(), nb::arg("copy").none() = nb::none())
        .def("numpy", [](const Var& v) {
                 NL_REQUIRE(!v.requires_grad(), "numpy(): the tensor requires grad; use t.detach().numpy()");
                 return as_numpy(v.data());
             },
             "A NumPy array on the tensor's memory, no copy. bfloat16 has no NumPy dtype: convert first.")
        .def("__dlpack__", [](const Var& v, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                              nb::handle copy) {
                 NL_REQUIRE(!v.requires_grad(), "__dlpack__: the tensor requires grad; use t.detach()");
                 return to_dlpack(v.data(), accepts_versioned(max_version));
             },
             nb::kw_only(), nb::arg("stream").none() = nb::none(), nb::arg("max_version").none() = nb::none(),
             nb::arg("dl_device").none() = nb::none(), nb::arg("copy").none() = nb::none(),
             "A DLPack capsule on the tensor's memory (torch.from_dlpack(t), numpy.from_dlpack(t)).")
        .def("__dlpack_device__", [](const Var& v) {
            return v.device().is_cpu() ? nb::make_tuple(1, 0) : nb::make_tuple(2, v.device().index);
        });
}

// Copies, casts and in-place writes.
void bind_tensor_conversions(TensorClass& tensor) {
    tensor.def("contiguous", &Var::contiguous, "Itself when contiguous, else a packed copy (autograd follows).")
        .def("clone", [](const Var& v) { return clone(v); }, "A packed copy (autograd follows).")
        .def("to", [](const Var& v, nb::handle dtype) { return v.to(dtype_from(dtype, v.dtype())); }, nb::arg("dtype"),
             "Cast to a dtype (autograd follows).")
        .def("float", [](const Var& v) { return v.to(DType::F32); })
        .def("double", [](const Var& v) { return v.to(DType::F64); })
        .def("half", [](const Var& v) { return v.to(DType::F16); })
        .def("bfloat16", [](const Var& v) { return v.to(DType::BF16); })
        .def("long", [](const Var& v) { return v.to(DType::I64); })
        .def("cpu", [](const Var& v) { return v.device().is_cpu() ? v : Var(v.data().to(Device::cpu())); })
        .def("copy_", [](nb::handle self, const Var& src) {
                 Var& v = nb::cast<Var&>(self);
                 NL_REQUIRE(!(v.requires_grad() && v.is_leaf() && is_grad_enabled()),
                            "copy_: a leaf tensor that requires grad is written in place; do it under normlab.no_grad()");
                 v.data().copy_(src.data());
                 return nb::borrow(self);
             },
             nb::arg("src"), "Copies src (broadcast, converted) into this tensor in place; returns it.")
        .def("fill_", [](nb::handle self, double value) {
                 nb::cast<Var&>(self).data().fill_(value);
                 return nb::borrow(self);
             },
             nb::arg("value"), "Sets every element to `value` in place; returns the tensor.")
        .def("zero_", [](nb::handle self) {
                 nb::cast<Var&>(self).data().zero_();
                 return nb::borrow(self);
             },
             "Sets every element to 0 in place; returns the tensor.");
}

}  // namespace

void bind_tensor(nb::module_& m, TensorClass& t) {
    bind_dtypes(m);
    bind_generator(m);
    bind_tensor_class(m, t);
    bind_tensor_exports(t);
    bind_tensor_conversions(t);
    bind_creation(m);
}

}  // namespace nl::py
