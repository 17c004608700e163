// Optimizer base: parameter bookkeeping, the step loop (skipping grad-less parameters), and the
// state save/load that lets a run resume bit for bit.
#include "optim/optimizer.h"

#include <set>

namespace nl {

namespace {

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out.empty() ? "none" : out;
}

}  // namespace

Optimizer::Optimizer(const NamedVars& params) {
    std::set<std::string> names;
    std::set<const VarImpl*> seen;
    for (const auto& [name, param] : params) {
        NL_REQUIRE(param.defined(), "Optimizer: parameter '", name, "' is undefined");
        NL_REQUIRE(names.insert(name).second, "Optimizer: parameter name '", name, "' appears twice");
        NL_REQUIRE(is_floating(param.dtype()), "Optimizer: parameter '", name, "' must be floating, found ",
                   dtype_name(param.dtype()));
        NL_REQUIRE(param.is_leaf(), "Optimizer: parameter '", name, "' is not a leaf (it has a grad_fn)");
        // Tied weights: one Var under two names is updated once (torch dedups named_parameters()).
        if (!seen.insert(param.impl().get()).second) continue;
        params_.emplace_back(name, param);
    }
}

Optimizer::~Optimizer() = default;

void Optimizer::set_lr(double lr) {
    NL_REQUIRE(lr >= 0.0, type_name(), ": invalid learning rate ", lr, " (expected >= 0)");
    lr_ = lr;
}

void Optimizer::zero_grad() {
    for (auto& entry : params_) entry.second.zero_grad();
}

void Optimizer::step() {
    for (auto& [name, param] : params_) {
        const Var grad = param.grad();
        if (!grad.defined()) continue;  // PyTorch skips parameters whose .grad is None
        update(name, param, grad.data(), state_[name]);
    }
    ++step_count_;
}

OptimizerState Optimizer::state_dict() const {
    OptimizerState out;
    out.type = type_name();
    out.step = step_count_;
    out.hyper = hyper();
    out.hyper["lr"] = lr_;
    // In parameter order, so a file lists the state the same way every time.
    for (const auto& [name, param] : params_) {
        auto it = state_.find(name);
        if (it == state_.end()) continue;
        for (const auto& [buffer, tensor] : it->second) out.tensors.emplace_back(name + "." + buffer, tensor.clone());
    }
    return out;
}

void Optimizer::load_state_dict(const OptimizerState& state) {
    const std::string op = type_name() + "::load_state_dict";
    NL_REQUIRE(state.type == type_name(), op, ": the state is from a ", state.type, " optimizer, expected ",
               type_name());
    NL_REQUIRE(state.step >= 0, op, ": step must be >= 0, found ", state.step);

    // Hyperparameters first (they can change which buffers exist, e.g. amsgrad); undone on error so
    // a bad state leaves the optimizer as it was.
    const std::map<std::string, double> old_hyper = hyper();
    const double old_lr = lr_;
    auto restore = [&] {
        for (const auto& [key, value] : old_hyper) set_hyper(key, value);
        lr_ = old_lr;
    };
    try {
        for (const auto& [key, value] : state.hyper) {
            if (key == "lr") set_lr(value);
            else set_hyper(key, value);
        }

        const std::vector<std::string> buffers = state_names();
        std::map<std::string, const Var*> by_name;
        for (const auto& [name, param] : params_) by_name[name] = &param;
        std::map<std::string, std::map<std::string, Tensor>> loaded;
        for (const auto& [key, tensor] : state.tensors) {
            // "<param name>.<buffer>": parameter names have dots, buffer names never do.
            const size_t dot = key.rfind('.');
            const std::string name = dot == std::string::npos ? "" : key.substr(0, dot);
            const std::string buffer = dot == std::string::npos ? key : key.substr(dot + 1);
            auto param = by_name.find(name);
            NL_REQUIRE(param != by_name.end(), op, ": unexpected key '", key, "': no parameter named '", name, "'");
            bool known = false;
            for (const auto& b : buffers) known = known || b == buffer;
            NL_REQUIRE(known, op, ": unexpected key '", key, "': ", type_name(), " keeps the buffers ", join(buffers));
            const Var& p = *param->second;
            if (buffer == "step") {
                NL_REQUIRE(tensor.numel() == 1, op, ": '", key, "' must hold one number, found shape ",
                           shape_str(tensor.shape()));
                const double value = tensor.item();
                NL_REQUIRE(value >= 1 && value == static_cast<double>(static_cast<int64_t>(value)), op, ": '", key,
                           "' must be an integer >= 1, found ", value);
                loaded[name][buffer] =
                    from_vector(std::vector<int64_t>{static_cast<int64_t>(value)}, Shape{}, DType::I64);
                continue;
            }
            NL_REQUIRE(tensor.shape() == p.shape(), op, ": '", key, "' has shape ", shape_str(tensor.shape()),
                       ", expected ", shape_str(p.shape()), " (the parameter's)");
            NL_REQUIRE(tensor.dtype() == p.dtype(), op, ": '", key, "' has dtype ", dtype_name(tensor.dtype()),
                       ", expected ", dtype_name(p.dtype()), " (the parameter's)");
            Tensor copy = Tensor::empty(tensor.shape(), tensor.dtype(), p.device());
            copy.copy_(tensor);
            loaded[name][buffer] = copy;
        }
        for (const auto& [name, entries] : loaded) {
            std::vector<std::string> missing;
            for (const auto& b : buffers)
                if (!entries.count(b)) missing.push_back(name + "." + b);
            NL_REQUIRE(missing.empty(), op, ": missing key(s) ", join(missing),
                       " (a parameter's state must be complete to resume)");
        }
        state_ = std::move(loaded);
        step_count_ = state.step;
    } catch (...) {
        restore();
        throw;
    }
}

}  // namespace nl
