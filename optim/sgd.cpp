// SGD: torch.optim.SGD through core/fused.h sgd_step (weight decay, momentum, dampening, Nesterov).
#include "optim/sgd.h"

#include "core/fused.h"

namespace nl {

SGD::SGD(const NamedVars& params, const SGDOptions& options) : Optimizer(params), options_(options) {
    set_lr(options.lr);
    NL_REQUIRE(options.momentum >= 0.0, "SGD: invalid momentum ", options.momentum, " (expected >= 0)");
    NL_REQUIRE(options.weight_decay >= 0.0, "SGD: invalid weight_decay ", options.weight_decay, " (expected >= 0)");
    NL_REQUIRE(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
               "SGD: nesterov momentum requires a momentum and zero dampening, found momentum ", options.momentum,
               " and dampening ", options.dampening);
}

void SGD::update(const std::string& name, Var& param, const Tensor& grad, std::map<std::string, Tensor>& state) {
    SgdParams p;
    p.lr = lr_;
    p.momentum = options_.momentum;
    p.dampening = options_.dampening;
    p.weight_decay = options_.weight_decay;
    p.nesterov = options_.nesterov;
    Tensor buffer;
    bool first = false;
    if (options_.momentum != 0.0) {
        auto it = state.find("momentum_buffer");
        first = it == state.end();
        // On the first step sgd_step overwrites the buffer with the gradient, so empty() is enough.
        if (first) state["momentum_buffer"] = Tensor::empty(param.shape(), param.dtype(), param.device());
        buffer = state["momentum_buffer"];
    }
    sgd_step(param.data(), grad, buffer, p, first);
}

std::map<std::string, double> SGD::hyper() const {
    return {{"momentum", options_.momentum},
            {"dampening", options_.dampening},
            {"weight_decay", options_.weight_decay},
            {"nesterov", options_.nesterov ? 1.0 : 0.0}};
}

void SGD::set_hyper(const std::string& key, double value) {
    if (key == "momentum") {
        // The momentum buffer exists or not depending on it: a resume must keep it.
        NL_REQUIRE(value == options_.momentum || (value != 0.0 && options_.momentum != 0.0),
                   "SGD::load_state_dict: momentum ", value, " in the state, ", options_.momentum,
                   " here: with and without momentum keep different state");
        options_.momentum = value;
    } else if (key == "dampening") {
        options_.dampening = value;
    } else if (key == "weight_decay") {
        options_.weight_decay = value;
    } else if (key == "nesterov") {
        options_.nesterov = value != 0.0;
    } else {
        throw Error("SGD::load_state_dict: unknown hyperparameter '" + key +
                    "' (expected lr, momentum, dampening, weight_decay, nesterov)");
    }
}

std::vector<std::string> SGD::state_names() const {
    if (options_.momentum == 0.0) return {};
    return {"momentum_buffer"};
}

}  // namespace nl
