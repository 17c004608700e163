// Global-norm gradient clipping, torch.nn.utils.clip_grad_norm_(params, max_norm) with norm_type 2.
#pragma once

#include <vector>

#include "autograd/var.h"
#include "layers/module.h"

namespace nl {

// total = sqrt(sum over params of sum(grad^2)) (accumulated in f64; params without a grad are
// skipped); every grad is multiplied by min(1, max_norm / (total + 1e-6)). Returns total (before
// clipping; inf/nan when a grad is not finite, then the grads are scaled by nan as in PyTorch).
double clip_grad_norm_(const std::vector<Var>& params, double max_norm);
double clip_grad_norm_(const NamedVars& params, double max_norm);

// The same total norm, without clipping.
double grad_norm(const std::vector<Var>& params);

}  // namespace nl
