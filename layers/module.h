// Module: the libtorch-like base of every layer. Parameters (Vars), buffers (non-trainable Tensors)
// and submodules are registered by name, in registration order, so named_parameters() and
// state_dict() produce PyTorch's dotted names ("fc1.weight", "layers.0.attention.wq.weight").
// Also: train/eval mode, zero_grad, strict load_state_dict, dtype/device moves, and small
// containers (Sequential of one-input modules, ModuleList named "0", "1", ... as in PyTorch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace nl {

using NamedVars = std::vector<std::pair<std::string, Var>>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
public:
    Module() = default;
    virtual ~Module();
    Module(const Module&) = delete;             // parameters are shared handles: copying a module
    Module& operator=(const Module&) = delete;  // would silently alias them

    // "Linear", "RMSNorm", ...: used by str() and in error messages.
    virtual std::string type_name() const { return "Module"; }
    // The part inside the parentheses of str(), e.g. "in_features=4, out_features=8, bias=true".
    virtual std::string extra_repr() const { return ""; }
    // PyTorch-like multi-line print of the module tree.
    std::string str() const;

    // ---- registration (returns the registered thing; names must be unique within this module) ----
    // A floating parameter is made a leaf that requires grad (as nn.Parameter does).
    Var register_parameter(const std::string& name, Var param);
    // A buffer is state that is saved in state_dict but not trained (the monitor's running RMS).
    Tensor register_buffer(const std::string& name, Tensor buffer);
    template <typename M>
    std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
        register_module_impl(name, module);
        return module;
    }
    // Replaces the direct child `name` (which must exist) with `module`: how the LayerNorm ->
    // RMSNorm migration swaps norms in place. A module keeping a typed pointer to its child must
    // read the child back through child(name) to see the replacement.
    void replace_module(const std::string& name, std::shared_ptr<Module> module);

    // ---- access ----
    // Dotted names, depth first: own parameters first, then each child's in registration order.
    // A child registered under the empty name "" is transparent: its names get no prefix (the
    // NormMonitor uses this so a monitored norm keeps the wrapped norm's PyTorch names).
    NamedVars named_parameters(bool recurse = true) const;
    std::vector<Var> parameters(bool recurse = true) const;
    NamedTensors named_buffers(bool recurse = true) const;
    // Direct children in registration order.
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
    // This module (name "") and every descendant with its dotted name, depth first (PyTorch order).
    std::vector<std::pair<std::string, Module*>> named_modules();
    // Own parameter / buffer / child by name; nl::Error naming the module type and the names present.
    Var parameter(const std::string& name) const;
    const Tensor& buffer(const std::string& name) const;
    void set_buffer(const std::string& name, Tensor value);  // replace a buffer's tensor
    std::shared_ptr<Module> child(const std::string& name) const;
    bool has_parameter(const std::string& name) const;
    bool has_child(const std::string& name) const;

    // ---- mode ----
    virtual void train(bool on = true);  // recursive
    void eval() { train(false); }
    bool is_training() const { return training_; }

    // Clears every parameter's .grad (set_to_none semantics, like PyTorch's default).
    void zero_grad();

    // ---- state ----
    // Parameters and buffers with dotted names (PyTorch order: each module's parameters, then its
    // buffers, then its children). The tensors are the live data (not copies).
    NamedTensors state_dict() const;
    // Copies each value into the existing parameter/buffer (so optimizers holding the Vars see
    // it). strict: a missing or unexpected key is an error; always: a shape or dtype mismatch is an
    // nl::Error naming the key and both shapes/dtypes. Values may come from any device.
    void load_state_dict(const NamedTensors& entries, bool strict = true);

    // ---- moves (recursive; parameter Vars keep their identity, only their data changes) ----
    // Floating parameters and floating buffers are converted; i64 buffers stay i64.
    void to(DType dtype);
    void to(Device device);

    int64_t num_parameters() const;  // total elements over parameters()

protected:
    void register_module_impl(const std::string& name, std::shared_ptr<Module> module);

private:
    void check_new_name(const std::string& name, const char* what) const;
    void collect_parameters(const std::string& prefix, NamedVars& out) const;
    void collect_buffers(const std::string& prefix, NamedTensors& out) const;
    void collect_state(const std::string& prefix, NamedTensors& out) const;
    void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out);
    void str_into(std::string& out, int indent) const;

    NamedVars params_;
    NamedTensors buffers_;
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
    bool training_ = true;
};

// "a.b" for non-empty parts; a transparent (empty) part adds nothing.
std::string join_name(const std::string& prefix, const std::string& name);

// A module with one input and one output Var: what Sequential chains (activations, Linear, norms).
class UnaryModule : public Module {
public:
    virtual Var forward(const Var& x) = 0;
    Var operator()(const Var& x) { return forward(x); }
};

// Runs its children in order; children are named "0", "1", ... as in nn.Sequential.
class Sequential : public UnaryModule {
public:
    Sequential() = default;
    explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> modules);
    std::string type_name() const override { return "Sequential"; }
    void push_back(std::shared_ptr<UnaryModule> module);
    int64_t size() const { return static_cast<int64_t>(named_children().size()); }
    Var forward(const Var& x) override;
};

// Holds modules of any kind, named "0", "1", ... as in nn.ModuleList (transformer blocks).
class ModuleList : public Module {
public:
    ModuleList() = default;
    std::string type_name() const override { return "ModuleList"; }
    void push_back(std::shared_ptr<Module> module);
    int64_t size() const { return static_cast<int64_t>(named_children().size()); }
    std::shared_ptr<Module> operator[](int64_t index) const;  // nl::Error when out of range
    // The i-th module as M; nl::Error naming both types when it is not an M.
    template <typename M>
    std::shared_ptr<M> at(int64_t index) const {
        std::shared_ptr<Module> module = (*this)[index];
        std::shared_ptr<M> typed = std::dynamic_pointer_cast<M>(module);
        NL_REQUIRE(typed != nullptr, "ModuleList::at: module ", index, " is a ", module->type_name(),
                   ", not the requested type");
        return typed;
    }
};

}  // namespace nl
