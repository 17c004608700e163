// NormMonitor: a running RMS of a norm's input, kept as buffers outside the autograd graph.
#include "layers/monitor.h"

#include <cmath>
#include <limits>

namespace nl {

namespace {

const NormOptions& options_of(const std::shared_ptr<Norm>& norm) {
    NL_REQUIRE(norm != nullptr, "NormMonitor: the wrapped norm is null");
    return norm->options();
}

}  // namespace

NormMonitor::NormMonitor(std::shared_ptr<Norm> norm, double momentum)
    : Norm(options_of(norm)), momentum_(momentum) {
    NL_REQUIRE(std::dynamic_pointer_cast<NormMonitor>(norm) == nullptr, "NormMonitor: the norm is already monitored");
    NL_REQUIRE(momentum > 0.0 && momentum <= 1.0, "NormMonitor: expected momentum in (0, 1], found ", momentum);
    register_module("", std::move(norm));  // transparent: the wrapped norm keeps its names
    register_buffer("running_rms", full({}, std::numeric_limits<double>::quiet_NaN(), DType::F32));
    register_buffer("num_batches_tracked", zeros({}, DType::I64));
}

std::shared_ptr<Norm> NormMonitor::inner() const {
    auto norm = std::dynamic_pointer_cast<Norm>(child(""));
    NL_REQUIRE(norm != nullptr, "NormMonitor: the wrapped module is a ", child("")->type_name(), ", not a Norm");
    return norm;
}

std::string NormMonitor::extra_repr() const { return detail::concat("momentum=", momentum_); }

bool NormMonitor::fused() const { return inner()->fused(); }
void NormMonitor::set_fused(bool fused) { inner()->set_fused(fused); }

double NormMonitor::running_rms() const { return buffer("running_rms").item(); }
int64_t NormMonitor::num_batches_tracked() const { return static_cast<int64_t>(buffer("num_batches_tracked").item()); }

Var NormMonitor::forward(const Var& x) {
    if (is_training() && x.defined() && x.numel() > 0) {
        NoGradGuard no_grad;
        // rms(x) = sqrt(mean(x^2)) over the whole batch, in f64 so large activations cannot overflow
        const double rms = std::sqrt(mean(square(x.data().to(DType::F64))).item());
        const int64_t n = num_batches_tracked();
        const double old = running_rms();
        const double updated = n == 0 ? rms : (1.0 - momentum_) * old + momentum_ * rms;
        Tensor running = buffer("running_rms");  // shares the buffer's storage: updated in place
        running.fill_(updated);
        Tensor count = buffer("num_batches_tracked");
        count.fill_(static_cast<double>(n + 1));
    }
    return inner()->forward(x);
}

int64_t attach_norm_monitors(Module& model, double momentum) {
    // Collect first, then replace, so the walk does not see the monitors it creates.
    std::vector<std::pair<Module*, std::string>> targets;
    for (auto& [path, module] : model.named_modules()) {
        if (dynamic_cast<NormMonitor*>(module) != nullptr) continue;  // its child is already monitored
        for (auto& [name, child] : module->named_children()) {
            if (std::dynamic_pointer_cast<Norm>(child) && !std::dynamic_pointer_cast<NormMonitor>(child))
                targets.emplace_back(module, name);
        }
    }
    for (auto& [parent, name] : targets) {
        auto norm = std::dynamic_pointer_cast<Norm>(parent->child(name));
        auto monitor = std::make_shared<NormMonitor>(norm, momentum);
        monitor->train(norm->is_training());
        parent->replace_module(name, monitor);
    }
    return static_cast<int64_t>(targets.size());
}

std::vector<std::pair<std::string, double>> norm_monitor_readings(Module& model) {
    std::vector<std::pair<std::string, double>> out;
    for (auto& [path, module] : model.named_modules()) {
        if (auto* monitor = dynamic_cast<NormMonitor*>(module)) out.emplace_back(path, monitor->running_rms());
    }
    return out;
}

}  // namespace nl
