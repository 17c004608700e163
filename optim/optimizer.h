// Optimizer base: holds the parameters by name (from module.named_parameters(), so state is keyed
// by PyTorch's names), zero_grad, step, the learning rate, and state save/load for exact resumes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layers/checkpoint.h"
#include "layers/module.h"

namespace nl {

class Optimizer : public StatefulOptimizer {
public:
    // Names must be unique; a Var listed twice (tied weights) is kept once, under its first name,
    // as torch's named_parameters() does. Every parameter must be a floating leaf.
    explicit Optimizer(const NamedVars& params);
    ~Optimizer() override;

    virtual std::string type_name() const = 0;

    // Applies one update to every parameter whose grad is defined (others are skipped and their
    // state left untouched, as in PyTorch), then counts the step.
    void step();
    // Clears every parameter's grad (set_to_none, PyTorch's default).
    void zero_grad();

    double lr() const { return lr_; }
    void set_lr(double lr);
    int64_t step_count() const { return step_count_; }
    const NamedVars& params() const { return params_; }

    OptimizerState state_dict() const override;
    void load_state_dict(const OptimizerState& state) override;

protected:
    // One parameter's update; `state` is its buffers by short name ("exp_avg", ...), empty before
    // its first update (the subclass creates them).
    virtual void update(const std::string& name, Var& param, const Tensor& grad,
                        std::map<std::string, Tensor>& state) = 0;
    // Hyperparameters other than lr, for state_dict; set_hyper restores one (error on unknown).
    virtual std::map<std::string, double> hyper() const = 0;
    virtual void set_hyper(const std::string& key, double value) = 0;
    // The buffers a parameter's state holds, for load_state_dict's checks.
    virtual std::vector<std::string> state_names() const = 0;

    double lr_ = 1e-3;

private:
    NamedVars params_;
    std::map<std::string, std::map<std::string, Tensor>> state_;  // param name -> buffer -> tensor
    int64_t step_count_ = 0;
};

}  // namespace nl
