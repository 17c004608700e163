// The train job's curvature probe (train.sharpness_every): the sharpness of the step's training
// objective, the largest eigenvalue of its Hessian with respect to every parameter (Cohen et al. 2021,
// "Gradient Descent on Neural Networks Typically Occurs at the Edge of Stability"), and of the same
// Hessian preconditioned by AdamW's second moments (Cohen et al. 2022, "Adaptive Gradient Methods at
// the Edge of Stability"), beside the threshold that paper compares it with. Both by Lanczos
// (autograd/functional.h) on Hessian-vector products, each a forward and a double backward through
// the model (fused kernels included, through their composed twins).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/var.h"
#include "layers/checkpoint.h"

namespace nl {

// probes.csv's sharpness columns, in order.
const std::vector<std::string>& sharpness_columns();  // sharpness, sharpness_adam, sharpness_adam_threshold

// The objective whose curvature is measured: a sum of terms, each a function that runs a forward and
// returns its (already weighted) single-element loss. The train job has one term per gradient shard
// this process computes; the terms' Hessian-vector products are summed, then summed over MPI ranks,
// so every rank sees the Hessian of the whole batch's objective.
using ObjectiveTerms = std::vector<std::function<Var()>>;

// (H u) for the objective's Hessian H at the parameters' current values, with u and the result
// flattened over `params` in order, in f64 (each parameter's slice converted to its own dtype and
// device for the product, and back).
void hessian_vector_product(const ObjectiveTerms& terms, const std::vector<Var>& params, const std::vector<double>& u,
                            std::vector<double>& out);

// Adam's preconditioner for Cohen et al. 2022: P = diag(sqrt(v_hat) + eps), v_hat = exp_avg_sq / (1 -
// beta2^t) with each parameter's own step count t, from an Adam/AdamW state (a state_dict). Returns
// P^{-1/2} flattened over `names` in order (the eigenvalues of P^{-1} H are those of the symmetric
// P^{-1/2} H P^{-1/2}); a parameter without state (never updated) gets 0: the update does not move it.
std::vector<double> adam_inverse_sqrt_preconditioner(const OptimizerState& state, const std::vector<std::string>& names,
                                                     const std::vector<Var>& params, double beta2, double eps);

// The largest algebraic eigenvalue of H (or, with `scale` = P^{-1/2} non-empty, of P^{-1} H) by
// `iterations` Lanczos steps from the start vector Generator(seed) draws.
double objective_sharpness(const ObjectiveTerms& terms, const std::vector<Var>& params, int64_t iterations,
                           uint64_t seed, const std::vector<double>& scale = {});

// Cohen et al. 2022's stability threshold for the preconditioned sharpness of Adam with momentum beta1
// at learning rate lr: (2 + 2 beta1) / ((1 - beta1) lr), 38 / lr at beta1 = 0.9.
double adam_sharpness_threshold(double beta1, double lr);

}  // namespace nl
