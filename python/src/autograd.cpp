// Autograd from Python: grad mode, requires_grad and .grad, backward, autograd.grad, gradcheck,
// gradgradcheck and hvp on Python functions, and graph inspection (each node with the tensors it saved and
// their bytes, the graph's total, a text summary, Graphviz DOT).
#include <memory>
#include <vector>

#include <nanobind/stl/function.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "autograd/functional.h"
#include "autograd/graph.h"
#include "bindings.h"

namespace nl::py {

namespace {

void bind_grad_mode(nb::module_& m) {
    m.def("is_grad_enabled", &is_grad_enabled, "Whether ops record the graph (off under normlab.no_grad()).");
    m.def("_set_grad_enabled", [](bool enabled) {
              const bool before = is_grad_enabled();
              set_grad_enabled(enabled);
              return before;
          },
          nb::arg("enabled"), "Sets grad mode; returns the mode it replaced (normlab.no_grad() is built on it).");
}

void bind_tensor_autograd(TensorClass& t) {
    t.def_prop_rw("requires_grad", &Var::requires_grad, &Var::set_requires_grad,
                  "Whether backward computes this tensor's gradient (settable on leaves of a floating dtype).")
        .def("requires_grad_", [](nb::handle self, bool requires_grad) {
                 nb::cast<Var&>(self).set_requires_grad(requires_grad);
                 return nb::borrow(self);
             },
             nb::arg("requires_grad") = true, "Sets requires_grad in place; returns the tensor.")
        .def_prop_ro("is_leaf", &Var::is_leaf, "True for tensors not made by a recorded op.")
        .def_prop_rw("grad",
                     [](const Var& v) -> nb::object { return v.grad().defined() ? nb::cast(v.grad()) : nb::none(); },
                     [](Var& v, nb::handle grad) { v.set_grad(grad.is_none() ? Var() : nb::cast<Var>(grad)); },
                     nb::arg("grad").none(), "The accumulated gradient, or None.")
        .def_prop_ro("grad_fn",
                     [](const Var& v) -> nb::object { return v.grad_fn() ? nb::cast(v.grad_fn()) : nb::none(); },
                     "The node that made this tensor (None for leaves).")
        .def_prop_rw("data", [](const Var& v) { return Var(v.data()); },
                     [](Var& v, const Var& data) { v.set_data(data.data()); },
                     "The values without the graph (shares memory); assigning replaces them.")
        .def("detach", &Var::detach, "The same memory without the graph, requires_grad False.")
        .def("retain_grad", &Var::retain_grad, "Keeps .grad on a non-leaf after backward.")
        .def("backward", [](const Var& v, nb::handle gradient, nb::handle retain_graph, bool create_graph) {
                 const Var grad = gradient.is_none() ? Var() : var_from(gradient, v.dtype());
                 const bool retain = retain_graph.is_none() ? create_graph : nb::cast<bool>(retain_graph);
                 nb::gil_scoped_release release;
                 v.backward(grad, retain, create_graph);
             },
             nb::arg("gradient").none() = nb::none(), nb::arg("retain_graph").none() = nb::none(),
             nb::arg("create_graph") = false,
             "Accumulates d(this)/d(leaf) into every leaf's .grad. `gradient` is needed unless this has one "
             "element; create_graph records the backward so the gradients can be differentiated again.");
}

// torch.autograd.grad for one or more outputs: the gradients are summed over the outputs.
std::vector<nb::object> grad(nb::handle outputs, nb::handle inputs, nb::handle grad_outputs, nb::handle retain_graph,
                             bool create_graph, bool allow_unused) {
    auto as_list = [](nb::handle value) {
        std::vector<Var> out;
        if (nb::isinstance<Var>(value)) out.push_back(nb::cast<Var>(value));
        else for (nb::handle item : value) out.push_back(nb::cast<Var>(item));
        return out;
    };
    const std::vector<Var> outs = as_list(outputs), wrt = as_list(inputs);
    std::vector<Var> seeds(outs.size());
    if (!grad_outputs.is_none()) {
        std::vector<Var> given = as_list(grad_outputs);
        NL_REQUIRE(given.size() == outs.size(), "grad: ", outs.size(), " outputs but ", given.size(), " grad_outputs");
        seeds = given;
    }
    const bool retain = retain_graph.is_none() ? create_graph : nb::cast<bool>(retain_graph);
    std::vector<Var> total(wrt.size());
    {
        nb::gil_scoped_release release;
        for (size_t i = 0; i < outs.size(); ++i) {
            const bool last = i + 1 == outs.size();
            std::vector<Var> g = gradients(outs[i], wrt, seeds[i], retain || !last, create_graph);
            for (size_t j = 0; j < wrt.size(); ++j)
                if (g[j].defined()) total[j] = total[j].defined() ? total[j] + g[j] : g[j];
        }
    }
    std::vector<nb::object> result;
    for (size_t j = 0; j < wrt.size(); ++j) {
        NL_REQUIRE(total[j].defined() || allow_unused, "grad: input ", j, " was not used to compute the outputs "
                   "(pass allow_unused=True to get None for it)");
        result.push_back(total[j].defined() ? nb::cast(total[j]) : nb::none());
    }
    return result;
}

// A Python function of tensors as the VarFn gradcheck differentiates (called with the GIL held).
VarFn python_fn(nb::callable fn) {
    return [fn](const std::vector<Var>& inputs) {
        nb::list args;
        for (const Var& v : inputs) args.append(nb::cast(v));
        return nb::cast<Var>(fn(*args));
    };
}

void bind_checks(nb::module_& m) {
    nb::class_<GradcheckResult>(m, "GradcheckResult", "What gradcheck found: ok, the worst element and its errors.")
        .def_ro("ok", &GradcheckResult::ok)
        .def_ro("input", &GradcheckResult::input, "The worst input's index (-1 when nothing was compared).")
        .def_ro("element", &GradcheckResult::element, "The worst element's flat index in that input.")
        .def_ro("analytic", &GradcheckResult::analytic)
        .def_ro("numeric", &GradcheckResult::numeric)
        .def_ro("abs_error", &GradcheckResult::abs_error)
        .def_ro("rel_error", &GradcheckResult::rel_error)
        .def_ro("message", &GradcheckResult::message)
        .def("__bool__", [](const GradcheckResult& r) { return r.ok; })
        .def("__repr__", [](const GradcheckResult& r) { return r.message; });
    const char* doc = "Compares the analytic gradient of fn(*inputs) (f64 tensors that require grad) with central "
                      "differences: an element passes when |analytic - numeric| <= atol + rtol |numeric|.";
    m.def("_gradcheck", [](nb::callable fn, const std::vector<Var>& inputs, double eps, double atol, double rtol) {
              return gradcheck(python_fn(fn), inputs, eps, atol, rtol);
          },
          nb::arg("fn"), nb::arg("inputs"), nb::arg("eps") = 1e-6, nb::arg("atol") = 1e-5, nb::arg("rtol") = 1e-3, doc);
    m.def("_gradgradcheck", [](nb::callable fn, const std::vector<Var>& inputs, double eps, double atol, double rtol) {
              return gradgradcheck(python_fn(fn), inputs, eps, atol, rtol);
          },
          nb::arg("fn"), nb::arg("inputs"), nb::arg("eps") = 1e-6, nb::arg("atol") = 1e-5, nb::arg("rtol") = 1e-3,
          "gradcheck of the gradient: the second derivatives, through backward(create_graph=True).");
    m.def("_hvp", [](nb::callable fn, const std::vector<Var>& inputs, const std::vector<Var>& v, bool create_graph,
                     bool strict) {
              HvpResult r = hvp(python_fn(fn), inputs, v, create_graph, strict);
              return nb::make_tuple(r.output, r.hvp);
          },
          nb::arg("fn"), nb::arg("inputs"), nb::arg("v"), nb::arg("create_graph") = false, nb::arg("strict") = false,
          "(fn(*inputs), H v) for the Hessian H of fn's single-element output (normlab.autograd.functional.hvp).");
    m.def("_grad", &grad, nb::arg("outputs"), nb::arg("inputs"), nb::arg("grad_outputs").none() = nb::none(),
          nb::arg("retain_graph").none() = nb::none(), nb::arg("create_graph") = false, nb::arg("allow_unused") = false);
}

void bind_graph(nb::module_& m) {
    nb::class_<Node>(m, "Node", "One recorded op: its name, its inputs' nodes and what it saved for backward.")
        .def_prop_ro("name", &Node::name)
        .def_prop_ro("id", &Node::id, "Creation order, unique per process.")
        .def_prop_ro("saved_bytes", &Node::saved_bytes, "Bytes of the storages its saved tensors keep alive.")
        .def_prop_ro("saved", [](const Node& n) {
            nb::list out;
            for (const SavedInfo& s : saved_info(n)) {
                nb::dict d;
                d["name"] = s.name;
                d["shape"] = shape_tuple(s.shape);
                d["dtype"] = s.dtype;
                d["bytes"] = s.bytes;
                out.append(d);
            }
            return out;
        }, "Each saved tensor: name, shape, dtype, bytes.")
        .def_prop_ro("next_nodes", [](const Node& n) {
            nb::list out;
            for (const Edge& e : n.inputs()) out.append(e.node ? nb::cast(e.node) : nb::none());
            return out;
        }, "The node behind each input (None for leaves and constants).")
        .def("__repr__", [](const Node& n) { return "<" + n.name() + " node #" + std::to_string(n.id()) + ">"; });
    m.def("graph_nodes", &graph_nodes, nb::arg("root"),
          "Every node reachable from root, root first, in the order backward visits them.");
    m.def("graph_saved_bytes", &graph_saved_bytes, nb::arg("root"),
          "Bytes saved for backward over the graph, each distinct storage once.");
    m.def("graph_summary", &graph_summary, nb::arg("root"), "One line per node with what it saved, and the total.");
    m.def("graph_to_dot", &graph_to_dot, nb::arg("root"), "The graph as Graphviz DOT text.");
}

}  // namespace

void bind_autograd(nb::module_& m, TensorClass& t) {
    bind_grad_mode(m);
    bind_tensor_autograd(t);
    bind_checks(m);
    bind_graph(m);
}

}  // namespace nl::py
