// Bindings of the optimizers (optim/): SGD, Adam and AdamW over named parameters with torch.optim's
// update rules, step and zero_grad, the learning rate, and their state for exact resumes; global
// gradient-norm clipping (optim/clip.h) and the learning-rate schedules (optim/schedule.h).
// python/normlab/optim/ gives them torch.optim's signatures, param_groups and lr_scheduler's shape.
//
// An optimizer holds the parameters' Vars (handles on the same VarImpl as the Python tensors), so
// step() updates the memory the model reads, whatever Python object the user holds. step()
// releases the GIL while it computes.
#include <map>
#include <string>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/sgd.h"

namespace nl::py {

namespace {

// The parameters as normlab.optim passes them: (name, Tensor) pairs (names made up for bare tensors).
NamedVars named_vars_from(nb::handle params) {
    NamedVars out;
    for (nb::handle item : params) {
        NL_REQUIRE(PySequence_Check(item.ptr()) && nb::len(item) == 2,
                   "optimizer: expected (name, Tensor) pairs, found ", nb::str(nb::repr(item)).c_str());
        out.emplace_back(nb::cast<std::string>(item[0]), nb::cast<Var>(item[1]));
    }
    return out;
}

// OptimizerState <-> a dict: type, step, hyper (name -> float), tensors (a list of (name, Tensor)).
nb::dict state_dict_of(const Optimizer& o) {
    const OptimizerState s = o.state_dict();
    nb::dict d;
    d["type"] = s.type;
    d["step"] = s.step;
    nb::dict hyper;
    for (const auto& [key, value] : s.hyper) hyper[key.c_str()] = value;
    d["hyper"] = hyper;
    nb::list tensors;
    for (const auto& [name, tensor] : s.tensors) tensors.append(nb::make_tuple(name, Var(tensor)));
    d["tensors"] = tensors;
    return d;
}

OptimizerState state_from(nb::handle d) {
    NL_REQUIRE(nb::isinstance<nb::dict>(d), "load_state_dict: expected a dict (from state_dict()), found ",
               nb::str(nb::type_name(d.type())).c_str());
    nb::dict state = nb::borrow<nb::dict>(d);
    for (const char* key : {"type", "step", "hyper", "tensors"})
        NL_REQUIRE(state.contains(key), "load_state_dict: the state has no '", key, "' entry");
    OptimizerState s;
    s.type = nb::cast<std::string>(state["type"]);
    s.step = nb::cast<int64_t>(state["step"]);
    for (auto [key, value] : nb::borrow<nb::dict>(state["hyper"]))
        s.hyper[nb::cast<std::string>(key)] = nb::cast<double>(value);
    for (nb::handle item : state["tensors"])
        s.tensors.emplace_back(nb::cast<std::string>(item[0]), nb::cast<Var>(item[1]).data());
    return s;
}

void bind_optimizers(nb::module_& m) {
    nb::class_<Optimizer>(m, "Optimizer",
                          "An optimizer over named parameters (optim/optimizer.h); normlab.optim's classes wrap one.")
        .def_prop_ro("type_name", &Optimizer::type_name, "\"SGD\", \"Adam\" or \"AdamW\".")
        .def("step", &Optimizer::step, nb::call_guard<nb::gil_scoped_release>(),
             "One update of every parameter whose .grad is set (others are skipped, their state untouched).")
        .def("zero_grad", &Optimizer::zero_grad, "Sets every parameter's .grad to None.")
        .def_prop_rw("lr", &Optimizer::lr, &Optimizer::set_lr, "The learning rate the next step uses (>= 0).")
        .def_prop_ro("step_count", &Optimizer::step_count, "step() calls so far.")
        .def("named_parameters", [](const Optimizer& o) {
                 nb::list out;
                 for (const auto& [name, var] : o.params()) out.append(nb::make_tuple(name, var));
                 return out;
             },
             "The (name, Tensor) pairs it updates (a tensor given twice kept once, under its first name).")
        .def("state_dict", &state_dict_of,
             "Its state as a dict: type, step, hyper (lr and the rest), tensors ((\"<param>.<buffer>\", Tensor) "
             "copies).")
        .def("load_state_dict", [](Optimizer& o, nb::handle state) { o.load_state_dict(state_from(state)); },
             nb::arg("state"),
             "Restores a state_dict(): the type must match; an unknown parameter or buffer, or a shape or dtype "
             "mismatch, is an error naming the key, and leaves the optimizer as it was.");
    // The options' defaults, which normlab.optim's signatures read (torch.optim's, declared in optim/).
    nb::class_<SGDOptions>(m, "SGDOptions", "optim/sgd.h SGDOptions: SGD's hyperparameters and their defaults.")
        .def(nb::init<>())
        .def_ro("lr", &SGDOptions::lr)
        .def_ro("momentum", &SGDOptions::momentum)
        .def_ro("dampening", &SGDOptions::dampening)
        .def_ro("weight_decay", &SGDOptions::weight_decay)
        .def_ro("nesterov", &SGDOptions::nesterov);
    nb::class_<AdamOptions>(m, "AdamOptions", "optim/adam.h AdamOptions: Adam's hyperparameters and their defaults.")
        .def(nb::init<>())
        .def_ro("lr", &AdamOptions::lr)
        .def_ro("beta1", &AdamOptions::beta1)
        .def_ro("beta2", &AdamOptions::beta2)
        .def_ro("eps", &AdamOptions::eps)
        .def_ro("weight_decay", &AdamOptions::weight_decay)
        .def_ro("amsgrad", &AdamOptions::amsgrad);
    m.def("adamw_defaults", &adamw_defaults, "AdamOptions with torch.optim.AdamW's defaults (weight_decay 1e-2).");
    nb::class_<SGD, Optimizer>(m, "SGD", "torch.optim.SGD: momentum, dampening, weight decay, Nesterov.")
        .def("__init__", [](SGD* self, nb::handle params, double lr, double momentum, double dampening,
                            double weight_decay, bool nesterov) {
                 SGDOptions o;
                 o.lr = lr;
                 o.momentum = momentum;
                 o.dampening = dampening;
                 o.weight_decay = weight_decay;
                 o.nesterov = nesterov;
                 new (self) SGD(named_vars_from(params), o);
             },
             nb::arg("params"), nb::arg("lr"), nb::arg("momentum"), nb::arg("dampening"), nb::arg("weight_decay"),
             nb::arg("nesterov"));
    auto adam_init = [](auto* self, nb::handle params, double lr, double beta1, double beta2, double eps,
                        double weight_decay, bool amsgrad) {
        AdamOptions o;
        o.lr = lr;
        o.beta1 = beta1;
        o.beta2 = beta2;
        o.eps = eps;
        o.weight_decay = weight_decay;
        o.amsgrad = amsgrad;
        using Class = std::remove_pointer_t<decltype(self)>;
        new (self) Class(named_vars_from(params), o);
    };
    nb::class_<Adam, Optimizer>(m, "Adam", "torch.optim.Adam: L2 weight decay added to the gradient; amsgrad.")
        .def("__init__", [adam_init](Adam* self, nb::handle params, double lr, double beta1, double beta2, double eps,
                                     double weight_decay, bool amsgrad) {
                 adam_init(self, params, lr, beta1, beta2, eps, weight_decay, amsgrad);
             },
             nb::arg("params"), nb::arg("lr"), nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"),
             nb::arg("weight_decay"), nb::arg("amsgrad"));
    nb::class_<AdamW, Adam>(m, "AdamW", "torch.optim.AdamW: decoupled weight decay.")
        .def("__init__", [adam_init](AdamW* self, nb::handle params, double lr, double beta1, double beta2, double eps,
                                     double weight_decay, bool amsgrad) {
                 adam_init(self, params, lr, beta1, beta2, eps, weight_decay, amsgrad);
             },
             nb::arg("params"), nb::arg("lr"), nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"),
             nb::arg("weight_decay"), nb::arg("amsgrad"));
}

void bind_clipping(nb::module_& m) {
    m.def("clip_grad_norm_",
          [](const std::vector<Var>& params, double max_norm) { return clip_grad_norm_(params, max_norm); },
          nb::arg("parameters"), nb::arg("max_norm"), nb::call_guard<nb::gil_scoped_release>(),
          "Scales every grad by min(1, max_norm / (total + 1e-6)), total the global L2 norm of the grads (summed "
          "in f64; parameters without a grad skipped); returns total, before clipping.");
    m.def("grad_norm", &grad_norm, nb::arg("parameters"), nb::call_guard<nb::gil_scoped_release>(),
          "The global L2 norm of the grads, without clipping.");
}

void bind_schedules(nb::module_& m) {
    nb::class_<LrSchedule>(m, "LrSchedule",
                           "A learning-rate schedule (optim/schedule.h): constant, or linear warmup then cosine decay "
                           "to min_lr. `step` is the index of the update about to be applied (0 first).")
        .def_static("constant", &LrSchedule::constant, nb::arg("lr"), nb::arg("warmup_steps") = 0,
                    "lr, after lr * (step + 1) / warmup_steps for the first warmup_steps steps.")
        .def_static("warmup_cosine", &LrSchedule::warmup_cosine, nb::arg("base_lr"), nb::arg("warmup_steps"),
                    nb::arg("total_steps"), nb::arg("min_lr"),
                    "Warmup as constant's, then min_lr + 0.5 (1 + cos(pi r)) (base_lr - min_lr), r = (step - "
                    "warmup) / (total - warmup); min_lr from total_steps on.")
        .def("lr_at", &LrSchedule::lr_at, nb::arg("step"), "The learning rate of update `step` (>= 0).")
        .def_prop_ro("kind",
                     [](const LrSchedule& s) { return s.kind == LrSchedule::Kind::Constant ? "constant" : "cosine"; })
        .def_ro("base_lr", &LrSchedule::base_lr)
        .def_ro("warmup_steps", &LrSchedule::warmup_steps)
        .def_ro("total_steps", &LrSchedule::total_steps)
        .def_ro("min_lr", &LrSchedule::min_lr)
        .def("__repr__", &LrSchedule::str);
}

}  // namespace

void bind_optim(nb::module_& m) {
    bind_optimizers(m);
    bind_clipping(m);
    bind_schedules(m);
}

}  // namespace nl::py
