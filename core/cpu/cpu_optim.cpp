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
void adam_impl(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq, int64_t n, double lr,
               double beta1, double beta2, double eps, double weight_decay, int64_t step, bool decoupled) {
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
void sgd_impl(T* param, const T* grad, T* buf, int64_t n, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first_step) {
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

void CpuBackend::adam_step(DType dtype, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                           void* max_exp_avg_sq, int64_t n, double lr, double beta1, double beta2, double eps,
                           double weight_decay, int64_t step, bool decoupled) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "adam_step: dtype ", dtype_name(dtype));
    NL_CHECK(step >= 1, "adam_step: step ", step);
    if (dtype == DType::F64) {
        adam_impl<double>(static_cast<double*>(param), static_cast<const double*>(grad),
                          static_cast<double*>(exp_avg), static_cast<double*>(exp_avg_sq),
                          static_cast<double*>(max_exp_avg_sq), n, lr, beta1, beta2, eps, weight_decay, step,
                          decoupled);
    } else {
        adam_impl<float>(static_cast<float*>(param), static_cast<const float*>(grad),
                         static_cast<float*>(exp_avg), static_cast<float*>(exp_avg_sq),
                         static_cast<float*>(max_exp_avg_sq), n, lr, beta1, beta2, eps, weight_decay, step,
                         decoupled);
    }
}

void CpuBackend::sgd_step(DType dtype, void* param, const void* grad, void* momentum_buffer, int64_t n,
                          double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                          bool first_step) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "sgd_step: dtype ", dtype_name(dtype));
    NL_CHECK(momentum == 0.0 || momentum_buffer != nullptr, "sgd_step: momentum needs a buffer");
    if (dtype == DType::F64) {
        sgd_impl<double>(static_cast<double*>(param), static_cast<const double*>(grad),
                         static_cast<double*>(momentum_buffer), n, lr, momentum, dampening, weight_decay,
                         nesterov, first_step);
    } else {
        sgd_impl<float>(static_cast<float*>(param), static_cast<const float*>(grad),
                        static_cast<float*>(momentum_buffer), n, lr, momentum, dampening, weight_decay,
                        nesterov, first_step);
    }
}

}  // namespace nl
