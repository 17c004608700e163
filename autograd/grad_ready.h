// A hook the backward engine calls as each leaf's .grad becomes final during Var::backward: every
// path from the root into that leaf has been accumulated. Data-parallel training uses it to start
// communicating a bucket of gradients while backward still computes the rest (PyTorch DDP's design).
#pragma once

#include <functional>

namespace nl {

struct VarImpl;

using GradReadyFn = std::function<void(VarImpl& leaf)>;

// Installs `fn` for backward passes run by this thread while the guard lives (nesting restores the
// outer hook). Not called by gradients(), which fills no .grad.
class GradReadyGuard {
public:
    explicit GradReadyGuard(GradReadyFn fn);
    ~GradReadyGuard();
    GradReadyGuard(const GradReadyGuard&) = delete;
    GradReadyGuard& operator=(const GradReadyGuard&) = delete;

private:
    GradReadyFn previous_;
};

}  // namespace nl
