// CUDA kernels for the one-pass optimizer updates: Adam/AdamW (reading and writing p, g, m, v once
// each) and SGD with momentum. The per-element op order follows PyTorch's torch/optim/adam.py
// (_single_tensor_adam) and sgd.py, as the CPU kernels in core/cpu/cpu_optim.cpp; the scalars are
// computed once on the host in double and rounded to the tensor's dtype, as there.
#include <cmath>

#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"

namespace nl {

namespace {

template <typename T>
struct AdamScalars {
    T step_size, bias_correction2_sqrt, decay_factor, wd, one_minus_beta1, one_minus_beta2, beta2, eps;
    bool weight_decay, decoupled;
};

// torch.lerp (aten/src/ATen/native/Lerp.h): the form chosen by |weight| < 0.5.
template <typename T>
__device__ __forceinline__ T lerp(T self, T end, T weight) {
    return cuda::m_abs(weight) < T(0.5) ? self + weight * (end - self) : end - (end - self) * (T(1) - weight);
}

template <typename T>
__global__ void adam_kernel(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq, int64_t n,
                            AdamScalars<T> s) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        T p = param[i];
        T g = grad[i];
        if (s.weight_decay) {
            if (s.decoupled) p = p * s.decay_factor;  // AdamW: param.mul_(1 - lr*wd)
            else g = g + s.wd * p;                    // grad.add(param, alpha=weight_decay)
        }
        const T m = lerp(exp_avg[i], g, s.one_minus_beta1);              // exp_avg.lerp_(grad, 1 - beta1)
        const T v = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;  // .mul_(beta2).addcmul_(g, g, 1-beta2)
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        T v_used = v;
        if (max_exp_avg_sq != nullptr) {  // AMSGrad: torch.maximum(max_exp_avg_sq, exp_avg_sq)
            const T old = max_exp_avg_sq[i];
            v_used = old < v ? v : old;  // std::max, as the CPU kernel
            max_exp_avg_sq[i] = v_used;
        }
        const T denom = cuda::m_sqrt(v_used) / s.bias_correction2_sqrt + s.eps;
        param[i] = p + (-s.step_size) * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
    }
}

template <typename T>
void adam_typed(const AdamStepArgs& a) {
    const double lr = a.lr, beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, weight_decay = a.weight_decay;
    // Python-float scalars, as adam.py computes them.
    const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(a.step));
    const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(a.step));
    AdamScalars<T> s;
    s.step_size = static_cast<T>(lr / bias_correction1);
    s.bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    s.decay_factor = static_cast<T>(1.0 - lr * weight_decay);
    s.wd = static_cast<T>(weight_decay);
    s.one_minus_beta1 = static_cast<T>(1.0 - beta1);
    s.one_minus_beta2 = static_cast<T>(1.0 - beta2);
    s.beta2 = static_cast<T>(beta2);
    s.eps = static_cast<T>(eps);
    s.weight_decay = weight_decay != 0.0;
    s.decoupled = a.decoupled;
    NL_LAUNCH(adam_kernel<T>, cuda::blocks_for(a.n), cuda::kThreads)(
        static_cast<T*>(a.param), static_cast<const T*>(a.grad), static_cast<T*>(a.exp_avg),
        static_cast<T*>(a.exp_avg_sq), static_cast<T*>(a.max_exp_avg_sq), a.n, s);
    NL_CUDA_CHECK_LAUNCH();
}

template <typename T>
__global__ void sgd_kernel(T* param, const T* grad, T* buf, int64_t n, T neg_lr, T momentum, T one_minus_dampening,
                           T wd, bool use_wd, bool use_momentum, bool nesterov, bool first_step) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        T g = grad[i];
        if (use_wd) g = g + wd * param[i];  // grad.add(param, alpha=weight_decay)
        if (use_momentum) {
            // First step: buf = clone(grad); then buf.mul_(momentum).add_(grad, alpha=1 - dampening).
            const T b = first_step ? g : buf[i] * momentum + one_minus_dampening * g;
            buf[i] = b;
            g = nesterov ? g + momentum * b : b;
        }
        param[i] = param[i] + neg_lr * g;  // param.add_(grad, alpha=-lr)
    }
}

template <typename T>
void sgd_typed(const SgdStepArgs& a) {
    NL_LAUNCH(sgd_kernel<T>, cuda::blocks_for(a.n), cuda::kThreads)(
        static_cast<T*>(a.param), static_cast<const T*>(a.grad), static_cast<T*>(a.momentum_buffer), a.n,
        static_cast<T>(-a.lr), static_cast<T>(a.momentum), static_cast<T>(1.0 - a.dampening),
        static_cast<T>(a.weight_decay), a.weight_decay != 0.0, a.momentum != 0.0, a.nesterov, a.first_step);
    NL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::adam_step(const AdamStepArgs& a) {
    check_kernel_args(a);
    if (a.n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64)
        adam_typed<double>(a);
    else
        adam_typed<float>(a);
}

void CudaBackend::sgd_step(const SgdStepArgs& a) {
    check_kernel_args(a);
    if (a.n == 0) return;
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64)
        sgd_typed<double>(a);
    else
        sgd_typed<float>(a);
}

}  // namespace nl
