// The device -> backend registry (backend_for: one static CpuBackend, the CUDA backends when built
// with CUDA, each behind the profiler's wrapper while it is on) and the fused kernels' invariants.
#include "core/backend.h"

#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/profiler.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl {

namespace {

Backend& unprofiled_backend_for(Device device) {
    if (device.is_cpu()) {
        static CpuBackend cpu;
        return cpu;
    }
#ifdef NORMLAB_HAVE_CUDA
    return cuda_backend(device.index);
#else
    throw Error("backend_for: normlab was built without CUDA (asked for " + device.str() + ")");
#endif
}

void check_norm_sizes(const char* op, DType dtype, int64_t rows, int64_t d, int64_t k) {
    NL_CHECK(is_floating(dtype), op, ": dtype ", dtype_name(dtype));
    NL_CHECK(rows >= 0 && d >= 1 && k >= 1 && k <= d, op, ": rows ", rows, " d ", d, " k ", k);
}

void check_cross_entropy_sizes(const char* op, DType dtype, int64_t rows, int64_t classes) {
    NL_CHECK(is_floating(dtype) && rows >= 0 && classes >= 1, op, ": ", dtype_name(dtype), " rows ", rows,
             " classes ", classes);
}

void check_optim_dtype(const char* op, DType dtype) {
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, op, ": dtype ", dtype_name(dtype));
}

void check_attention(DType dtype, const AttentionDims& s) {
    NL_CHECK(s.batch >= 0 && s.q_len >= 0 && s.kv_len >= s.q_len && (s.kv_len > 0 || s.q_len == 0) &&
                 s.head_dim > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
             "attention sizes: batch ", s.batch, ", q_len ", s.q_len, ", kv_len ", s.kv_len, ", heads ", s.heads,
             ", kv_heads ", s.kv_heads, ", head_dim ", s.head_dim);
    NL_CHECK(dtype == DType::F32 || dtype == DType::F64, "attention: dtype ", dtype_name(dtype));
}

}  // namespace

const std::vector<const char*>& kernel_names() {
    static const std::vector<const char*> names = {
#define NL_KERNEL(name, params, args, profile_label, flops, bytes) #name,
#include "core/kernels.def"
#undef NL_KERNEL
    };
    return names;
}

Backend& backend_for(Device device) {
    // The profiler's switch (core/profiler.h): one branch when it is off.
    if (profiler::enabled()) return profiler::profiled(unprofiled_backend_for(device));
    return unprofiled_backend_for(device);
}

void check_kernel_args(const NormForwardArgs& a) {
    check_norm_sizes("norm_forward", a.dtype, a.rows, a.d, a.stat_count);
}

void check_kernel_args(const NormBackwardArgs& a) {
    check_norm_sizes("norm_backward", a.dtype, a.rows, a.d, a.stat_count);
    NL_CHECK(!a.subtract_mean || a.mean != nullptr || a.rows == 0, "norm_backward: LayerNorm needs mean");
}

void check_kernel_args(const DytForwardArgs& a) {
    check_norm_sizes("dyt_forward", a.dtype, a.rows, a.d, a.d);
    NL_CHECK(a.alpha != nullptr || a.rows == 0, "dyt_forward: alpha is null");
}

void check_kernel_args(const DytBackwardArgs& a) {
    check_norm_sizes("dyt_backward", a.dtype, a.rows, a.d, a.d);
    NL_CHECK(a.alpha != nullptr, "dyt_backward: alpha is null");
}

void check_kernel_args(const CrossEntropyForwardArgs& a) {
    check_cross_entropy_sizes("cross_entropy_forward", a.dtype, a.rows, a.classes);
}

void check_kernel_args(const CrossEntropyBackwardArgs& a) {
    check_cross_entropy_sizes("cross_entropy_backward", a.dtype, a.rows, a.classes);
    NL_CHECK(std::isfinite(a.z_loss) && a.z_loss >= 0.0, "cross_entropy_backward: z_loss ", a.z_loss);
}

void check_kernel_args(const AdamStepArgs& a) {
    check_optim_dtype("adam_step", a.dtype);
    NL_CHECK(a.step >= 1, "adam_step: step ", a.step);
}

void check_kernel_args(const SgdStepArgs& a) {
    check_optim_dtype("sgd_step", a.dtype);
    NL_CHECK(a.momentum == 0.0 || a.momentum_buffer != nullptr, "sgd_step: momentum needs a buffer");
}

void check_kernel_args(const AttentionForwardArgs& a) {
    check_attention(a.dtype, a.dims);
    NL_CHECK(std::isfinite(a.softcap) && a.softcap >= 0.0, "attention_forward: softcap ", a.softcap);
}

void check_kernel_args(const AttentionBackwardArgs& a) {
    check_attention(a.dtype, a.dims);
    NL_CHECK(std::isfinite(a.softcap) && a.softcap >= 0.0, "attention_backward: softcap ", a.softcap);
}

}  // namespace nl
