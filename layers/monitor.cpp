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
    register_buffer("running_rms", ones({1}, options_.dtype));  // torch.ones(1)
}

std::shared_ptr<Norm> NormMonitor::inner() const {
    auto norm = std::dynamic_pointer_cast<Norm>(child(""));
    NL_REQUIRE(norm != nullptr, "NormMonitor: the wrapped module is a ", child("")->type_name(), ", not a Norm");
    return norm;
}

std::string NormMonitor::extra_repr() const { return detail::concat("momentum=", momentum_); }

bool NormMonitor::fused() const { return inner()->fused(); }
void NormMonitor::set_fused(bool fused) { inner()->set_fused(fused); }

double NormMonitor::running_rms() const { return buffer("running_rms").to(DType::F64).item(); }

NormDebugInfo NormMonitor::debug_info() const {
    NormDebugInfo info;
    info.running_rms = running_rms();
    info.weight_mean = info.weight_std = std::numeric_limits<double>::quiet_NaN();
    std::shared_ptr<Norm> norm = inner();
    if (norm->has_parameter("weight")) {
        Tensor w = norm->parameter("weight").data().to(DType::F64);
        info.weight_mean = mean(w).item();
        info.weight_std = std::sqrt(var(w, {0}, 1, false).item());  // self.weight.std(): unbiased
    }
    return info;
}

Var NormMonitor::forward(const Var& x) {
    // Every forward, as the article's DebuggableRMSNorm (it has no training-mode test).
    if (x.defined() && x.numel() > 0) {
        NoGradGuard no_grad;
        // current_rms = x.pow(2).mean().sqrt() over the whole tensor, in f64 so large activations
        // cannot overflow
        const double rms = std::sqrt(mean(square(x.data().to(DType::F64))).item());
        const double updated = (1.0 - momentum_) * running_rms() + momentum_ * rms;
        Tensor running = buffer("running_rms");  // shares the buffer's storage: updated in place
        running.fill_(updated);
    }
    probe_input(x);
    return inner()->forward(x);
}

int64_t attach_norm_monitors(Module& model, double momentum) {
    // Collect first, then replace, so the walk does not see the monitors it creates.
    std::vector<std::pair<Module*, std::string>> targets;
    for (auto& [path, module] : model.named_modules()) {
        // A norm's children are parts of it (HybridNorm's branches, a monitor's wrapped norm).
        if (dynamic_cast<Norm*>(module) != nullptr) continue;
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
