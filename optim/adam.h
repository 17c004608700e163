// Adam and AdamW with torch.optim's exact semantics (Kingma & Ba 2015; Loshchilov & Hutter 2019):
//   g = grad (+ wd * p for Adam: L2 added to the gradient)
//   p *= 1 - lr * wd                                  (AdamW only: decoupled weight decay)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2   (v_max = max(v_max, v) with amsgrad)
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (eps outside the sqrt)
// t is the parameter's own step count (1 on its first update), as PyTorch keeps per parameter.
#pragma once

#include <map>
#include <string>

#include "optim/optimizer.h"

namespace nl {

struct AdamOptions {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;  // Adam: L2 coefficient; AdamW: decoupled decay
    // Per parameter name, a weight_decay of its own (torch's param_groups with their own weight_decay,
    // e.g. nanoGPT's no decay for gains and biases); parameters not named take weight_decay.
    std::map<std::string, double> weight_decay_of = {};
    bool amsgrad = false;
};

class Adam : public Optimizer {
public:
    Adam(const NamedVars& params, const AdamOptions& options);
    std::string type_name() const override { return decoupled_ ? "AdamW" : "Adam"; }
    const AdamOptions& options() const { return options_; }

protected:
    Adam(const NamedVars& params, const AdamOptions& options, bool decoupled);
    void update(const std::string& name, Var& param, const Tensor& grad,
                std::map<std::string, Tensor>& state) override;
    std::map<std::string, double> hyper() const override;
    void set_hyper(const std::string& key, double value) override;
    std::vector<std::string> state_names() const override;

private:
    AdamOptions options_;
    bool decoupled_;
};

// torch.optim.AdamW: note its default weight_decay is 1e-2 (pass it explicitly in options).
class AdamW : public Adam {
public:
    AdamW(const NamedVars& params, const AdamOptions& options);
};

// AdamOptions with torch.optim.AdamW's defaults (weight_decay 1e-2).
AdamOptions adamw_defaults();

}  // namespace nl
