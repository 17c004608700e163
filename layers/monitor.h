// NormMonitor: wraps any Norm and keeps a running RMS of the norm's input, to see after training
// how large the activations entering each norm grew (the stability experiments' question).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/norms.h"

namespace nl {

// Forward is the wrapped norm's forward. In training mode it also updates, without recording
// graph, running_rms = (1 - momentum) * running_rms + momentum * rms(x), where rms(x) =
// sqrt(mean(x^2)) over every element of the batch (in f64); the first update sets running_rms =
// rms(x). Buffers (saved in state_dict): "running_rms" (f32, []) and "num_batches_tracked" (i64, []),
// as BatchNorm's. The wrapped norm is registered as a transparent child (name ""), so a monitored
// norm keeps the wrapped norm's parameter names ("ln1.weight", not "ln1.norm.weight").
class NormMonitor : public Norm {
public:
    explicit NormMonitor(std::shared_ptr<Norm> norm, double momentum = 0.1);
    std::string type_name() const override { return "NormMonitor"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;

    std::shared_ptr<Norm> inner() const;  // the wrapped norm (reads the child, so it sees replacements)
    double momentum() const { return momentum_; }
    double running_rms() const;           // NaN before the first training-mode forward
    int64_t num_batches_tracked() const;
    bool fused() const override;
    void set_fused(bool fused) override;  // forwards to the wrapped norm

private:
    double momentum_;
};

// Wraps every Norm in `model` (at any depth, not already monitored) in a NormMonitor, in place.
// Returns how many were wrapped.
int64_t attach_norm_monitors(Module& model, double momentum = 0.1);
// Each monitor's dotted module name and running RMS, in named_modules() order.
std::vector<std::pair<std::string, double>> norm_monitor_readings(Module& model);

}  // namespace nl
