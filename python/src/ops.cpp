// The math of normlab.Tensor, with PyTorch's names: arithmetic operators with broadcasting and
// Python numbers, elementwise math, reductions, softmax, matmul, shape views, indexing primitives
// (the Python package composes t[...] from them), cat, where. Every op records autograd's graph
// when grad mode is on and an input requires grad (autograd/functions.h). Each releases the GIL
// while it computes.
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "core/ops.h"

namespace nl::py {

namespace {

using Guard = nb::call_guard<nb::gil_scoped_release>;

// The reduction dims argument: None (every dim), an int, or a sequence of ints.
std::vector<int64_t> dims_from(nb::handle dim) {
    if (dim.is_none()) return {};
    if (nb::isinstance<nb::int_>(dim)) return {nb::cast<int64_t>(dim)};
    return shape_from(dim, "dim");
}

// A comparison's result: 1 where true, 0 elsewhere, in the inputs' dtype; never part of a graph.
Var compare(Tensor (*op)(const Tensor&, const Tensor&), const Var& a, const Var& b) {
    return Var(op(a.data(), b.data()));
}

// An in-place update (t += x): only where autograd need not see it, as in PyTorch.
void require_in_place(const Var& v, const char* op) {
    NL_REQUIRE(!(v.requires_grad() && is_grad_enabled()), op, ": an in-place update of a tensor that requires grad; "
               "do it under normlab.no_grad(), or write t = t ", op[2], " x");
}

void bind_arithmetic(TensorClass& t) {
    // Tensor with Tensor (broadcasting), Tensor with a Python number, and the reflected forms.
    t.def("__add__", [](const Var& a, const Var& b) { return a + b; }, Guard())
        .def("__add__", [](const Var& a, double b) { return a + b; }, Guard())
        .def("__radd__", [](const Var& a, double b) { return b + a; }, Guard())
        .def("__sub__", [](const Var& a, const Var& b) { return a - b; }, Guard())
        .def("__sub__", [](const Var& a, double b) { return a - b; }, Guard())
        .def("__rsub__", [](const Var& a, double b) { return b - a; }, Guard())
        .def("__mul__", [](const Var& a, const Var& b) { return a * b; }, Guard())
        .def("__mul__", [](const Var& a, double b) { return a * b; }, Guard())
        .def("__rmul__", [](const Var& a, double b) { return b * a; }, Guard())
        .def("__truediv__", [](const Var& a, const Var& b) { return a / b; }, Guard())
        .def("__truediv__", [](const Var& a, double b) { return a / b; }, Guard())
        .def("__rtruediv__", [](const Var& a, double b) { return b / a; }, Guard())
        .def("__pow__", [](const Var& a, const Var& b) { return pow(a, b); }, Guard())
        .def("__pow__", [](const Var& a, double b) { return pow(a, b); }, Guard())
        .def("__rpow__", [](const Var& a, double b) { return pow(Var(full_like(a.data(), b)), a); }, Guard())
        .def("__neg__", [](const Var& a) { return -a; }, Guard())
        .def("__matmul__", [](const Var& a, const Var& b) { return matmul(a, b); }, Guard())
        .def("__eq__", [](const Var& a, const Var& b) { return compare(eq, a, b); }, Guard())
        .def("__eq__", [](const Var& a, double b) { return Var(eq(a.data(), b)); }, Guard())
        .def("__ne__", [](const Var& a, const Var& b) { return compare(ne, a, b); }, Guard())
        .def("__lt__", [](const Var& a, const Var& b) { return compare(lt, a, b); }, Guard())
        .def("__lt__", [](const Var& a, double b) { return Var(lt(a.data(), b)); }, Guard())
        .def("__le__", [](const Var& a, const Var& b) { return compare(le, a, b); }, Guard())
        .def("__gt__", [](const Var& a, const Var& b) { return compare(gt, a, b); }, Guard())
        .def("__gt__", [](const Var& a, double b) { return Var(gt(a.data(), b)); }, Guard())
        .def("__ge__", [](const Var& a, const Var& b) { return compare(ge, a, b); }, Guard());
    // Identity, not elementwise equality, for hashing and `in` (as torch.Tensor).
    t.def("__hash__", [](const Var& a) { return reinterpret_cast<uintptr_t>(a.impl().get()); });
    auto in_place = [](const char* name, Var (*op)(const Var&, const Var&)) {
        return [name, op](nb::handle self, nb::handle other) {
            Var& v = nb::cast<Var&>(self);
            require_in_place(v, name);
            const Var rhs = var_from(other, v.dtype());
            {
                nb::gil_scoped_release release;
                NoGradGuard no_grad;
                v.data().copy_(op(v, rhs).data());
            }
            return nb::borrow(self);
        };
    };
    t.def("__iadd__", in_place("+=", [](const Var& a, const Var& b) { return a + b; }))
        .def("__isub__", in_place("-=", [](const Var& a, const Var& b) { return a - b; }))
        .def("__imul__", in_place("*=", [](const Var& a, const Var& b) { return a * b; }))
        .def("__itruediv__", in_place("/=", [](const Var& a, const Var& b) { return a / b; }));
}

void bind_math(nb::module_& m, TensorClass& t) {
    // Elementwise, each both a function (normlab.exp(x)) and a method (x.exp()).
    struct Unary {
        const char* name;
        Var (*fn)(const Var&);
    };
    static const Unary unary[] = {{"neg", neg},         {"exp", exp},     {"log", log},   {"sqrt", sqrt},
                                  {"rsqrt", rsqrt},     {"abs", abs},     {"relu", relu}, {"silu", silu},
                                  {"sigmoid", sigmoid}, {"tanh", tanh},   {"gelu", gelu}, {"square", square}};
    for (const Unary& u : unary) {
        m.def(u.name, u.fn, nb::arg("input"), Guard());
        t.def(u.name, u.fn, Guard());
    }
    m.def("pow", [](const Var& a, const Var& b) { return pow(a, b); }, Guard());
    m.def("pow", [](const Var& a, double b) { return pow(a, b); }, Guard());
    t.def("pow", [](const Var& a, double b) { return pow(a, b); }, Guard());
    m.def("maximum", [](const Var& a, const Var& b) { return maximum(a, b); }, Guard());
    m.def("minimum", [](const Var& a, const Var& b) { return minimum(a, b); }, Guard());
    m.def("matmul", [](const Var& a, const Var& b) { return matmul(a, b); }, nb::arg("input"), nb::arg("other"), Guard(),
          "Matrix product with NumPy's rules: 1-D, 2-D and batched operands, batch dims broadcast.");
    t.def("matmul", [](const Var& a, const Var& b) { return matmul(a, b); }, Guard());
    m.def("softmax", [](const Var& a, int64_t dim) { return softmax(a, dim); }, nb::arg("input"), nb::arg("dim"), Guard());
    m.def("log_softmax", [](const Var& a, int64_t dim) { return log_softmax(a, dim); }, nb::arg("input"), nb::arg("dim"),
          Guard());
    t.def("softmax", [](const Var& a, int64_t dim) { return softmax(a, dim); }, nb::arg("dim"), Guard());
    t.def("log_softmax", [](const Var& a, int64_t dim) { return log_softmax(a, dim); }, nb::arg("dim"), Guard());
    m.def("where", [](const Var& cond, const Var& a, const Var& b) { return where(cond.data(), a, b); },
          nb::arg("condition"), nb::arg("input"), nb::arg("other"), Guard(),
          "input where condition is non-zero, else other (broadcast).");
    m.def("cat", [](const std::vector<Var>& tensors, int64_t dim) { return cat(tensors, dim); }, nb::arg("tensors"),
          nb::arg("dim") = 0, Guard());
    m.def("tril", [](const Var& a, int64_t diagonal) { return tril(a, diagonal); }, nb::arg("input"),
          nb::arg("diagonal") = 0, Guard());
    t.def("masked_fill", [](const Var& a, const Var& mask, double value) { return masked_fill(a, mask.data(), value); },
          nb::arg("mask"), nb::arg("value"), Guard());
}

// sum / mean / var over dims; max / min with PyTorch's two forms: over everything a value, over a
// dim (values, indices).
void bind_reductions(nb::module_& m, TensorClass& t) {
    auto reduce = [](Var (*fn)(const Var&, const std::vector<int64_t>&, bool)) {
        return [fn](const Var& a, nb::handle dim, bool keepdim) {
            const std::vector<int64_t> dims = dims_from(dim);
            nb::gil_scoped_release release;
            return fn(a, dims, keepdim);
        };
    };
    struct Reduction {
        const char* name;
        Var (*fn)(const Var&, const std::vector<int64_t>&, bool);
    };
    static const Reduction reductions[] = {{"sum", sum}, {"mean", mean}};
    for (const Reduction& r : reductions) {
        m.def(r.name, reduce(r.fn), nb::arg("input"), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
        t.def(r.name, reduce(r.fn), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
    }
    auto extreme = [](bool is_max) {
        return [is_max](const Var& a, nb::handle dim, bool keepdim) -> nb::object {
            if (dim.is_none()) return nb::cast(is_max ? max(a, {}, false) : min(a, {}, false));
            const int64_t d = nb::cast<int64_t>(dim);
            Var values = is_max ? max(a, {d}, keepdim) : min(a, {d}, keepdim);
            Tensor indices = argmax(is_max ? a.data() : nl::neg(a.data()), d, keepdim);
            return nb::make_tuple(values, Var(indices));
        };
    };
    for (bool is_max : {true, false}) {
        const char* name = is_max ? "max" : "min";
        m.def(name, extreme(is_max), nb::arg("input"), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
        t.def(name, extreme(is_max), nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false);
    }
    auto variance = [](bool take_sqrt) {
        return [take_sqrt](const Var& a, nb::handle dim, int64_t correction, bool keepdim) {
            const std::vector<int64_t> dims = dims_from(dim);
            nb::gil_scoped_release release;
            Var v = var(a, dims, correction, keepdim);
            return take_sqrt ? sqrt(v) : v;
        };
    };
    for (bool take_sqrt : {false, true}) {
        const char* name = take_sqrt ? "std" : "var";
        m.def(name, variance(take_sqrt), nb::arg("input"), nb::arg("dim").none() = nb::none(), nb::kw_only(),
              nb::arg("correction") = 1, nb::arg("keepdim") = false);
        t.def(name, variance(take_sqrt), nb::arg("dim").none() = nb::none(), nb::kw_only(), nb::arg("correction") = 1,
              nb::arg("keepdim") = false);
    }
    t.def("argmax", [](const Var& a, int64_t dim, bool keepdim) { return Var(argmax(a.data(), dim, keepdim)); },
          nb::arg("dim"), nb::arg("keepdim") = false, Guard());
}

// Views share the tensor's memory; autograd follows them.
void bind_shapes(TensorClass& t) {
    auto sizes = [](nb::args args) {
        return args.size() == 1 && !nb::isinstance<nb::int_>(args[0]) ? shape_from(args[0]) : shape_from(args);
    };
    t.def("reshape", [sizes](const Var& a, nb::args shape) { return a.reshape(sizes(shape)); })
        .def("view", [sizes](const Var& a, nb::args shape) { return a.view(sizes(shape)); })
        .def("expand", [sizes](const Var& a, nb::args shape) { return a.expand(sizes(shape)); })
        .def("permute", [sizes](const Var& a, nb::args dims) { return a.permute(sizes(dims)); })
        .def("transpose", &Var::transpose, nb::arg("dim0"), nb::arg("dim1"))
        .def("t", &Var::t)
        .def_prop_ro("T", [](const Var& a) {
            std::vector<int64_t> dims;
            for (int64_t d = a.dim() - 1; d >= 0; --d) dims.push_back(d);
            return a.permute(dims);
        })
        .def("narrow", &Var::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"))
        .def("unsqueeze", &Var::unsqueeze, nb::arg("dim"))
        .def("squeeze", [](const Var& a, nb::handle dim) { return dim.is_none() ? squeeze(a) : a.squeeze(nb::cast<int64_t>(dim)); },
             nb::arg("dim").none() = nb::none())
        .def("_select", &Var::select, nb::arg("dim"), nb::arg("index"))
        .def("_slice", &Var::slice, nb::arg("dim"), nb::arg("start"), nb::arg("end"), nb::arg("step") = 1)
        .def("index_select", [](const Var& a, int64_t dim, const Var& index) { return index_select(a, dim, index.data()); },
             nb::arg("dim"), nb::arg("index"), Guard())
        .def("gather", [](const Var& a, int64_t dim, const Var& index) { return gather(a, dim, index.data()); },
             nb::arg("dim"), nb::arg("index"), Guard());
}

}  // namespace

void bind_ops(nb::module_& m, TensorClass& t) {
    bind_arithmetic(t);
    bind_math(m, t);
    bind_reductions(m, t);
    bind_shapes(t);
}

}  // namespace nl::py
