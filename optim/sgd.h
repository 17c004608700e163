// SGD with momentum, dampening, weight decay and Nesterov: torch.optim.SGD's exact update
// (core/fused.h sgd_step has the formula).
#pragma once

#include "optim/optimizer.h"

namespace nl {

struct SGDOptions {
    double lr = 1e-3;
    double momentum = 0.0;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
};

class SGD : public Optimizer {
public:
    SGD(const NamedVars& params, const SGDOptions& options);
    std::string type_name() const override { return "SGD"; }
    const SGDOptions& options() const { return options_; }

protected:
    void update(const std::string& name, Var& param, const Tensor& grad,
                std::map<std::string, Tensor>& state) override;
    std::map<std::string, double> hyper() const override;
    void set_hyper(const std::string& key, double value) override;
    std::vector<std::string> state_names() const override;

private:
    SGDOptions options_;
};

}  // namespace nl
