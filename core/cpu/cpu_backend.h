// The CPU backend: gemm on normlab's own f32 engine (core/cpu/cpu_sgemm.h) where the CPU has AVX-512,
// else OpenBLAS, which also runs f64; OpenMP across rows/chunks, contiguous fast paths with
// vectorizable inner loops and a general strided path for views.
#pragma once

#include "core/backend.h"
#include "core/cpu_runtime.h"  // cpu_vector_target, cpu_vector_support

namespace nl {

class CpuBackend final : public Backend {
public:
    Device device() const override { return Device::cpu(); }

    // Every kernel of core/kernels.def. Where each lives: copy, fill in cpu_copy.cpp; binary, unary,
    // where in cpu_elementwise.cpp; reduce and softmax in cpu_reduce.cpp; gemm in cpu_blas.cpp
    // (cpu_sgemm.cpp, cpu_bgemm.cpp); index_select, index_add, gather, scatter_add in cpu_index.cpp;
    // norm and dyt in cpu_norms.cpp; cross_entropy in cpu_loss.cpp; adam_step, sgd_step in
    // cpu_optim.cpp; swiglu in cpu_swiglu.cpp; softcap in cpu_softcap.cpp; attention in
    // cpu_attention.cpp; rope in cpu_rope.cpp.
#define NL_KERNEL(name, params, args, profile_label, flops, bytes) void name params override;
#include "core/kernels.def"
#undef NL_KERNEL
};

}  // namespace nl
