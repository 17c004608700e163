// normlab._normlab: the extension module. Registers normlab's errors as Python exceptions (the
// message unchanged), the Tensor class, then each area's bindings (bindings.h).
#include <filesystem>

#include "bindings.h"
#include "core/dist.h"

namespace nl::py {

namespace {

void bind_errors(nb::module_& m) {
    // A user mistake (bad shape, dtype, config key, file) is a ValueError, as Python's own checks;
    // a broken invariant inside normlab a RuntimeError.
    static nb::object error = nb::exception<Error>(m, "Error", PyExc_ValueError);
    static nb::object internal = nb::exception<InternalError>(m, "InternalError", PyExc_RuntimeError);
    error.attr("__doc__") = "A user mistake normlab refused: the message names what was expected and what was found.";
    internal.attr("__doc__") = "A bug inside normlab: an internal invariant did not hold (please report it).";
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const std::filesystem::filesystem_error& e) {
            PyErr_SetString(PyExc_OSError, e.what());  // a path that cannot be used, named in the message
        }
    });
}

}  // namespace

}  // namespace nl::py

NB_MODULE(_normlab, m) {
    using namespace nl::py;
    m.doc() = "normlab's C++ core: tensors with autograd, layers, optimizers and jobs (the `normlab` package wraps it)";
    bind_errors(m);
    TensorClass tensor(m, "Tensor",
                       "An n-dimensional array in a dtype on a device, with reverse-mode autograd: requires_grad, "
                       "backward(), .grad (torch.Tensor's analogue).");
    bind_tensor(m, tensor);
    bind_ops(m, tensor);
    bind_autograd(m, tensor);
    nb::module_ nn = m.def_submodule("nn", "normlab's layers");
    bind_nn(nn);
    nb::module_ optim = m.def_submodule("optim", "normlab's optimizers and schedules");
    bind_optim(optim);
    nb::module_ jobs = m.def_submodule("jobs", "the jobs: train, sample, stability, checkpoints");
    bind_jobs(jobs);
    nb::module_ kernels = m.def_submodule("kernels", "the fused CPU kernels on plain tensors");
    bind_kernels(kernels);
    m.attr("__version__") = NORMLAB_VERSION;
}
