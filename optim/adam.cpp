// Adam / AdamW: torch.optim semantics through core/fused.h adam_step, with a per-parameter step
// count (PyTorch's state["step"]), so a parameter that skipped steps gets its own bias correction.
#include "optim/adam.h"

#include "core/fused.h"

namespace nl {

Adam::Adam(const NamedVars& params, const AdamOptions& options) : Adam(params, options, false) {}

Adam::Adam(const NamedVars& params, const AdamOptions& options, bool decoupled)
    : Optimizer(params), options_(options), decoupled_(decoupled) {
    const std::string op = decoupled ? "AdamW" : "Adam";
    set_lr(options.lr);
    NL_REQUIRE(options.eps >= 0.0, op, ": invalid eps ", options.eps, " (expected >= 0)");
    NL_REQUIRE(options.beta1 >= 0.0 && options.beta1 < 1.0, op, ": invalid beta1 ", options.beta1,
               " (expected in [0, 1))");
    NL_REQUIRE(options.beta2 >= 0.0 && options.beta2 < 1.0, op, ": invalid beta2 ", options.beta2,
               " (expected in [0, 1))");
    NL_REQUIRE(options.weight_decay >= 0.0, op, ": invalid weight_decay ", options.weight_decay, " (expected >= 0)");
    for (const auto& [name, decay] : options.weight_decay_of)
        NL_REQUIRE(decay >= 0.0, op, ": invalid weight_decay ", decay, " for ", name, " (expected >= 0)");
}

void Adam::update(const std::string& name, Var& param, const Tensor& grad, std::map<std::string, Tensor>& state) {
    if (state.empty()) {
        state["exp_avg"] = zeros(param.shape(), param.dtype(), param.device());
        state["exp_avg_sq"] = zeros(param.shape(), param.dtype(), param.device());
        if (options_.amsgrad) state["max_exp_avg_sq"] = zeros(param.shape(), param.dtype(), param.device());
        state["step"] = from_vector(std::vector<int64_t>{0}, Shape{}, DType::I64);
    }
    int64_t* step = state["step"].data<int64_t>();
    *step += 1;
    AdamParams p;
    p.lr = lr_;
    p.beta1 = options_.beta1;
    p.beta2 = options_.beta2;
    p.eps = options_.eps;
    const auto own = options_.weight_decay_of.find(name);
    p.weight_decay = own == options_.weight_decay_of.end() ? options_.weight_decay : own->second;
    p.decoupled = decoupled_;
    p.amsgrad = options_.amsgrad;
    adam_step(param.data(), grad, state["exp_avg"], state["exp_avg_sq"], p, *step,
              options_.amsgrad ? state["max_exp_avg_sq"] : Tensor());
}

std::map<std::string, double> Adam::hyper() const {
    return {{"beta1", options_.beta1},
            {"beta2", options_.beta2},
            {"eps", options_.eps},
            {"weight_decay", options_.weight_decay},
            {"amsgrad", options_.amsgrad ? 1.0 : 0.0}};
}

void Adam::set_hyper(const std::string& key, double value) {
    const std::string op = type_name() + "::load_state_dict";
    if (key == "beta1") {
        options_.beta1 = value;
    } else if (key == "beta2") {
        options_.beta2 = value;
    } else if (key == "eps") {
        options_.eps = value;
    } else if (key == "weight_decay") {
        options_.weight_decay = value;
    } else if (key == "amsgrad") {
        options_.amsgrad = value != 0.0;
    } else {
        throw Error(op + ": unknown hyperparameter '" + key + "' (expected lr, beta1, beta2, eps, weight_decay, amsgrad)");
    }
}

std::vector<std::string> Adam::state_names() const {
    if (options_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"};
    return {"exp_avg", "exp_avg_sq", "step"};
}

AdamW::AdamW(const NamedVars& params, const AdamOptions& options) : Adam(params, options, true) {}

AdamOptions adamw_defaults() {
    AdamOptions options;
    options.weight_decay = 1e-2;
    return options;
}

}  // namespace nl
