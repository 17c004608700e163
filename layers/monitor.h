// NormMonitor: wraps any Norm and keeps a running RMS of the norm's input, to see after training
// how large the activations entering each norm grew (the stability experiments' question). A
// monitored RMSNorm is the article's DebuggableRMSNorm (7.3): same state dict, same updates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/norms.h"

namespace nl {

// Forward is the wrapped norm's forward. Every forward (training and eval, as the article's) also
// updates, without recording graph,
//   running_rms = (1 - momentum) * running_rms + momentum * sqrt(mean(x^2))
// with the mean over every element of x (computed in f64). Buffer (saved in state_dict):
// "running_rms", shape [1] in the norm's dtype, starting at 1 (register_buffer("running_rms",
// torch.ones(1))). The wrapped norm is registered as a transparent child (name ""), so a monitored
// norm keeps the wrapped norm's parameter names ("ln1.weight", not "ln1.norm.weight").
struct NormDebugInfo {
    double running_rms = 0.0;
    double weight_mean = 0.0;  // of the wrapped norm's "weight"; NaN when it has none
    double weight_std = 0.0;   // unbiased (torch.std's default); NaN when it has none
};

class NormMonitor : public Norm {
public:
    explicit NormMonitor(std::shared_ptr<Norm> norm, double momentum = 0.1);
    std::string type_name() const override { return "NormMonitor"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;

    std::shared_ptr<Norm> inner() const;  // the wrapped norm (reads the child, so it sees replacements)
    double momentum() const { return momentum_; }
    double running_rms() const;           // 1 before the first forward
    NormDebugInfo debug_info() const;     // the article's get_debug_info()
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
