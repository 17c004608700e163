// CPU kernels for the one-pass optimizer updates (Adam/AdamW, SGD with momentum): each reads and
// writes every element of param, grad and state exactly once. The per-element op order mirrors
// PyTorch's torch/optim/adam.py (_single_tensor_adam) and sgd.py (_single_tensor_sgd), with scalars
// rounded to the tensor's dtype as PyTorch's CPU kernels do, so trajectories match step for step.
#include <algorithm>
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace nl {

namespace {

constexpr int64_t kParallelElements = 32768;

// torch.lerp on CPU (aten/src/ATen/native/Lerp.h): the form chosen by |weight| < 0.5.
template <typename T>
T lerp(T self, T end, T weight) {
    return std::abs(weight) < T(0.5) ? self + weight * (end - self) : end - (end - self) * (T(1) - weight);
}

// Adam's per-step scalars, as adam.py computes them (Python floats, then rounded to the dtype).
template <typename T>
struct AdamScalars {
    T step_size, bias_correction2_sqrt, decay_factor, wd, one_minus_beta1, one_minus_beta2, beta2, eps;
    bool decoupled_wd, coupled_wd;  // weight decay on the parameter (AdamW) or added to the gradient
};

// One element's update. v_max: AMSGrad's running max of exp_avg_sq, or nullptr. Taken by value and
// inlined into plain loops, so the scalars are registers and the common loop vectorizes.
template <typename T>
inline void adam_element(int64_t i, T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* v_max,
                         const AdamScalars<T> s) {
    // Selects on loop-invariant flags rather than branches, which GCC does not vectorize.
    const T p = s.decoupled_wd ? param[i] * s.decay_factor : param[i];  // AdamW: param.mul_(1 - lr * wd)
    const T g = s.coupled_wd ? grad[i] + s.wd * param[i] : grad[i];     // Adam: grad.add(param, alpha=wd)
    const T m = lerp(exp_avg[i], g, s.one_minus_beta1);           // exp_avg.lerp_(grad, 1 - beta1)
    const T v = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;  // .mul_(beta2).addcmul_(g, g, 1 - beta2)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    T v_used = v;
    if (v_max != nullptr) {  // AMSGrad: torch.maximum(max_exp_avg_sq, exp_avg_sq)
        v_used = std::max(v_max[i], v);
        v_max[i] = v_used;
    }
    const T denom = std::sqrt(v_used) / s.bias_correction2_sqrt + s.eps;
    param[i] = p + -s.step_size * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
}

template <typename T>
void adam_impl(const AdamStepArgs& a) {
    T* param = static_cast<T*>(a.param);                    // (n)
    const T* grad = static_cast<const T*>(a.grad);          // (n)
    T* exp_avg = static_cast<T*>(a.exp_avg);                // (n)
    T* exp_avg_sq = static_cast<T*>(a.exp_avg_sq);          // (n)
    T* max_exp_avg_sq = static_cast<T*>(a.max_exp_avg_sq);  // (n) or null
    const int64_t n = a.n;
    const double lr = a.lr, beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, weight_decay = a.weight_decay;
    const int64_t step = a.step;
    const bool decoupled = a.decoupled;
    const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    const AdamScalars<T> s{static_cast<T>(lr / bias_correction1), static_cast<T>(std::sqrt(bias_correction2)),
                           static_cast<T>(1.0 - lr * weight_decay), static_cast<T>(weight_decay),
                           static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2), static_cast<T>(beta2),
                           static_cast<T>(eps), weight_decay != 0.0 && decoupled, weight_decay != 0.0 && !decoupled};
    // Each thread copies the scalars (a shared struct could alias the float stores, so GCC reloaded
    // it every element), and the common case (no AMSGrad) has a loop of its own without the
    // conditional store: so it vectorizes.
#pragma omp parallel if (n > kParallelElements)
    {
        const AdamScalars<T> local = s;
        if (max_exp_avg_sq == nullptr) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n; ++i) adam_element<T>(i, param, grad, exp_avg, exp_avg_sq, nullptr, local);
        } else {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n; ++i) adam_element(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, local);
        }
    }
}

template <typename T>
void sgd_impl(const SgdStepArgs& a) {
    T* param = static_cast<T*>(a.param);            // (n)
    const T* grad = static_cast<const T*>(a.grad);  // (n)
    T* buf = static_cast<T*>(a.momentum_buffer);    // (n) or null
    const int64_t n = a.n;
    const double lr = a.lr, momentum = a.momentum, dampening = a.dampening, weight_decay = a.weight_decay;
    const bool nesterov = a.nesterov, first_step = a.first_step;
    const T wd = static_cast<T>(weight_decay);
    const T mom = static_cast<T>(momentum);
    const T one_minus_dampening = static_cast<T>(1.0 - dampening);
    const T neg_lr = static_cast<T>(-lr);
#pragma omp parallel for schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
        T g = grad[i];
        if (weight_decay != 0.0) g = g + wd * param[i];  // grad.add(param, alpha=weight_decay)
        if (momentum != 0.0) {
            // First step: buf = clone(grad); then buf.mul_(momentum).add_(grad, alpha=1 - dampening).
            const T b = first_step ? g : buf[i] * mom + one_minus_dampening * g;
            buf[i] = b;
            g = nesterov ? g + mom * b : b;
        }
        param[i] = param[i] + neg_lr * g;  // param.add_(grad, alpha=-lr)
    }
}

}  // namespace

void CpuBackend::adam_step(const AdamStepArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        adam_impl<double>(a);
    } else {
        adam_impl<float>(a);
    }
}

void CpuBackend::sgd_step(const SgdStepArgs& a) {
    check_kernel_args(a);
    if (a.dtype == DType::F64) {
        sgd_impl<double>(a);
    } else {
        sgd_impl<float>(a);
    }
}

}  // namespace nl
