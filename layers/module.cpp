// Module: registration by name, PyTorch-style dotted names, modes, state_dict load/save, moves.
#include "layers/module.h"

#include <algorithm>
#include <map>
#include <set>

namespace nl {

Module::~Module() = default;

std::string join_name(const std::string& prefix, const std::string& name) {
    if (prefix.empty()) return name;
    if (name.empty()) return prefix;
    return prefix + "." + name;
}

namespace {

template <typename T>
std::string names_of(const std::vector<std::pair<std::string, T>>& entries) {
    std::string out;
    for (const auto& [name, value] : entries) out += (out.empty() ? "" : ", ") + std::string("'") + name + "'";
    return out.empty() ? "none" : out;
}

}  // namespace

// ---- registration ----

void Module::check_new_name(const std::string& name, const char* what) const {
    NL_REQUIRE(name.find('.') == std::string::npos, type_name(), ": ", what, " name '", name,
               "' must not contain '.'");
    auto taken = [&](const auto& entries) {
        return std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == name; });
    };
    NL_REQUIRE(!taken(params_) && !taken(buffers_) && !taken(children_), type_name(), ": cannot register ",
               what, " '", name, "': the name is already taken");
}

Var Module::register_parameter(const std::string& name, Var param) {
    NL_REQUIRE(!name.empty(), type_name(), ": a parameter needs a non-empty name");
    NL_REQUIRE(param.defined(), type_name(), ": parameter '", name, "' is undefined");
    check_new_name(name, "parameter");
    NL_REQUIRE(param.is_leaf(), type_name(), ": parameter '", name,
               "' must be a leaf Var (detach() it first)");
    if (is_floating(param.dtype())) param.set_requires_grad(true);
    params_.emplace_back(name, param);
    return param;
}

Tensor Module::register_buffer(const std::string& name, Tensor buffer) {
    NL_REQUIRE(!name.empty(), type_name(), ": a buffer needs a non-empty name");
    NL_REQUIRE(buffer.defined(), type_name(), ": buffer '", name, "' is undefined");
    check_new_name(name, "buffer");
    buffers_.emplace_back(name, buffer);
    return buffer;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
    NL_REQUIRE(module != nullptr, type_name(), ": submodule '", name, "' is null");
    NL_REQUIRE(module.get() != this, type_name(), ": a module cannot be its own child");
    check_new_name(name, "submodule");
    children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
    NL_REQUIRE(module != nullptr, type_name(), ": replace_module('", name, "'): the new module is null");
    for (auto& [child_name, child] : children_) {
        if (child_name == name) {
            child = std::move(module);
            return;
        }
    }
    throw Error(detail::concat(type_name(), ": replace_module: no submodule named '", name,
                               "' (submodules: ", names_of(children_), ")"));
}

// ---- access ----

void Module::collect_parameters(const std::string& prefix, NamedVars& out) const {
    for (const auto& [name, param] : params_) out.emplace_back(join_name(prefix, name), param);
    for (const auto& [name, child] : children_) child->collect_parameters(join_name(prefix, name), out);
}

void Module::collect_buffers(const std::string& prefix, NamedTensors& out) const {
    for (const auto& [name, buffer] : buffers_) out.emplace_back(join_name(prefix, name), buffer);
    for (const auto& [name, child] : children_) child->collect_buffers(join_name(prefix, name), out);
}

void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
    for (const auto& [name, param] : params_) out.emplace_back(join_name(prefix, name), param.data());
    for (const auto& [name, buffer] : buffers_) out.emplace_back(join_name(prefix, name), buffer);
    for (const auto& [name, child] : children_) child->collect_state(join_name(prefix, name), out);
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
    out.emplace_back(prefix, this);
    for (auto& [name, child] : children_) child->collect_modules(join_name(prefix, name), out);
}

NamedVars Module::named_parameters(bool recurse) const {
    if (!recurse) return params_;
    NamedVars out;
    collect_parameters("", out);
    return out;
}

std::vector<Var> Module::parameters(bool recurse) const {
    std::vector<Var> out;
    for (auto& [name, param] : named_parameters(recurse)) out.push_back(param);
    return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
    if (!recurse) return buffers_;
    NamedTensors out;
    collect_buffers("", out);
    return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
    return children_;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
    std::vector<std::pair<std::string, Module*>> out;
    collect_modules("", out);
    return out;
}

Var Module::parameter(const std::string& name) const {
    for (const auto& [n, p] : params_)
        if (n == name) return p;
    throw Error(detail::concat(type_name(), ": no parameter named '", name, "' (parameters: ",
                               names_of(params_), ")"));
}

bool Module::has_parameter(const std::string& name) const {
    return std::any_of(params_.begin(), params_.end(), [&](const auto& e) { return e.first == name; });
}

const Tensor& Module::buffer(const std::string& name) const {
    for (const auto& [n, b] : buffers_)
        if (n == name) return b;
    throw Error(detail::concat(type_name(), ": no buffer named '", name, "' (buffers: ", names_of(buffers_),
                               ")"));
}

void Module::set_buffer(const std::string& name, Tensor value) {
    NL_REQUIRE(value.defined(), type_name(), ": set_buffer('", name, "'): the tensor is undefined");
    for (auto& [n, b] : buffers_) {
        if (n == name) {
            b = std::move(value);
            return;
        }
    }
    throw Error(detail::concat(type_name(), ": no buffer named '", name, "' (buffers: ", names_of(buffers_),
                               ")"));
}

bool Module::has_child(const std::string& name) const {
    return std::any_of(children_.begin(), children_.end(), [&](const auto& e) { return e.first == name; });
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
    for (const auto& [n, c] : children_)
        if (n == name) return c;
    throw Error(detail::concat(type_name(), ": no submodule named '", name, "' (submodules: ",
                               names_of(children_), ")"));
}

// ---- mode, grads ----

void Module::train(bool on) {
    training_ = on;
    for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
    for (Var& p : parameters()) p.zero_grad();
}

int64_t Module::num_parameters() const {
    int64_t total = 0;
    for (const Var& p : parameters()) total += p.numel();
    return total;
}

// ---- state ----

NamedTensors Module::state_dict() const {
    NamedTensors out;
    collect_state("", out);
    return out;
}

void Module::load_state_dict(const NamedTensors& entries, bool strict) {
    NamedTensors own = state_dict();
    std::map<std::string, const Tensor*> given;
    for (const auto& [name, tensor] : entries) {
        NL_REQUIRE(given.emplace(name, &tensor).second, "load_state_dict: key '", name, "' appears twice");
    }
    if (strict) {
        // As PyTorch's strict load: every missing and every unexpected key, in one message.
        std::set<std::string> own_names;
        for (const auto& [name, t] : own) own_names.insert(name);
        std::string missing, unexpected;
        for (const auto& [name, t] : own)
            if (!given.count(name))
                missing += detail::concat(missing.empty() ? "" : ", ", "'", name, "' (", shape_str(t.shape()), " ",
                                          dtype_name(t.dtype()), ")");
        for (const auto& [name, t] : entries)
            if (!own_names.count(name))
                unexpected += detail::concat(unexpected.empty() ? "" : ", ", "'", name, "' (", shape_str(t.shape()), ")");
        std::string problems;
        if (!missing.empty()) problems = "missing key(s) " + missing;
        if (!unexpected.empty())
            problems += (problems.empty() ? "" : "; ") + std::string("unexpected key(s) ") + unexpected;
        NL_REQUIRE(problems.empty(), "load_state_dict: ", problems, " for ", type_name());
    }
    // Check everything before copying anything, so a failed load leaves the module untouched.
    for (const auto& [name, dst] : own) {
        auto it = given.find(name);
        if (it == given.end()) continue;
        const Tensor& src = *it->second;
        NL_REQUIRE(src.defined(), "load_state_dict: key '", name, "' holds an undefined tensor");
        NL_REQUIRE(src.shape() == dst.shape(), "load_state_dict: shape mismatch for '", name,
                   "': the module has ", shape_str(dst.shape()), ", the state has ", shape_str(src.shape()));
        NL_REQUIRE(src.dtype() == dst.dtype(), "load_state_dict: dtype mismatch for '", name,
                   "': the module has ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()),
                   ", the state has ", dtype_name(src.dtype()), " ", shape_str(src.shape()));
    }
    NoGradGuard no_grad;
    for (auto& [name, dst] : own) {
        auto it = given.find(name);
        if (it == given.end()) continue;
        // dst shares storage with the live parameter/buffer, so copy_ updates it in place.
        Tensor target = dst;
        target.copy_(it->second->to(dst.device()));
    }
}

// ---- moves ----

void Module::to(DType dtype) {
    NL_REQUIRE(is_floating(dtype), type_name(), ".to: expected a floating dtype, found ", dtype_name(dtype));
    for (auto& [name, param] : params_)
        if (is_floating(param.dtype())) param.set_data(param.data().to(dtype));
    for (auto& [name, buffer] : buffers_)
        if (is_floating(buffer.dtype())) buffer = buffer.to(dtype);
    for (auto& [name, child] : children_) child->to(dtype);
}

void Module::to(Device device) {
    for (auto& [name, param] : params_) param.set_data(param.data().to(device));
    for (auto& [name, buffer] : buffers_) buffer = buffer.to(device);
    for (auto& [name, child] : children_) child->to(device);
}

// ---- printing ----

void Module::str_into(std::string& out, int indent) const {
    out += type_name() + "(" + extra_repr();
    if (children_.empty()) {
        out += ")";
        return;
    }
    out += "\n";
    for (const auto& [name, child] : children_) {
        out += std::string(indent + 2, ' ') + "(" + name + "): ";
        child->str_into(out, indent + 2);
        out += "\n";
    }
    out += std::string(indent, ' ') + ")";
}

std::string Module::str() const {
    std::string out;
    str_into(out, 0);
    return out;
}

// ---- containers ----

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> modules) {
    for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
    register_module(std::to_string(size()), std::move(module));
}

Var Sequential::forward(const Var& x) {
    Var h = x;
    for (const auto& [name, child] : named_children()) {
        auto unary = std::dynamic_pointer_cast<UnaryModule>(child);
        NL_REQUIRE(unary != nullptr, "Sequential: child ", name, " is a ", child->type_name(),
                   ", which does not take one Var (not a UnaryModule)");
        h = unary->forward(h);
    }
    return h;
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
    register_module(std::to_string(size()), std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](int64_t index) const {
    int64_t n = size();
    NL_REQUIRE(index >= -n && index < n, "ModuleList: index ", index, " is out of range for ", n, " modules");
    return named_children()[static_cast<size_t>(index < 0 ? index + n : index)].second;
}

}  // namespace nl
