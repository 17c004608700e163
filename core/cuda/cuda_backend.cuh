// The CUDA backend: one instance per GPU (see cuda_backend(index) in nl_cuda_api.h). Every kernel
// runs on that GPU's legacy default stream; cuBLAS does the gemm. Methods take device pointers (copy
// also accepts one host operand: see cuda_elementwise.cu).
#pragma once

#include <cublas_v2.h>

#include <mutex>

#include "core/backend.h"

namespace nl {

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int index) : index_(index) {}
    ~CudaBackend() override;  // leaves the cuBLAS handle alone at exit (see cuda_blas.cu)
    Device device() const override { return Device::cuda(index_); }
    int index() const { return index_; }

    // Every kernel of core/kernels.def. Where each lives: copy, fill, binary, unary, where in
    // cuda_elementwise.cu; reduce and softmax in cuda_reduce.cu; gemm in cuda_blas.cu; the indexing
    // kernels in cuda_index.cu; norm and dyt in cuda_norms.cu; cross_entropy in cuda_loss.cu;
    // adam_step, sgd_step in cuda_optim.cu; swiglu in cuda_swiglu.cu; softcap in cuda_softcap.cu;
    // attention in cuda_attention.cu; rope in cuda_rope.cu.
#define NL_KERNEL(name, params, args, profile_label, flops, bytes) void name params override;
#include "core/kernels.def"
#undef NL_KERNEL

private:
    // The cuBLAS handle of this GPU, created on first use (cuda_blas.cu).
    cublasHandle_t cublas();

    int index_;
    std::mutex cublas_mutex_;
    cublasHandle_t cublas_ = nullptr;
};

}  // namespace nl
