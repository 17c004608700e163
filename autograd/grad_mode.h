// Grad mode: a thread-local switch that says whether differentiable ops record a graph.
// NoGradGuard turns recording off for a scope (evaluation, optimizer steps, backward without
// create_graph), as torch.no_grad() does.
#pragma once

namespace nl {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Sets grad mode to `enabled` for its lifetime, then restores the previous mode.
class GradModeGuard {
public:
    explicit GradModeGuard(bool enabled);
    ~GradModeGuard();
    GradModeGuard(const GradModeGuard&) = delete;
    GradModeGuard& operator=(const GradModeGuard&) = delete;

private:
    bool previous_;
};

// RAII: no graph is recorded while it lives (results have no grad_fn and requires_grad false).
class NoGradGuard : public GradModeGuard {
public:
    NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace nl
