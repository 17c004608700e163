// Grad mode: one thread-local flag, so a NoGradGuard on one thread does not affect another.
#include "autograd/grad_mode.h"

namespace nl {

namespace {
thread_local bool grad_enabled = true;
}

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

GradModeGuard::GradModeGuard(bool enabled) : previous_(grad_enabled) { grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { grad_enabled = previous_; }

}  // namespace nl
