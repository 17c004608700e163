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

    // cuda_elementwise.cu
    void copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) override;
    void fill(const Shape& shape, const StridedArg& dst, double value) override;
    void binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                const StridedArg& b) override;
    void unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) override;
    void where(const Shape& shape, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
               const StridedArg& b) override;

    // cuda_reduce.cu
    void reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len,
                int64_t inner, int64_t correction) override;
    void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                         bool log) override;
    void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                          int64_t cols, bool log) override;

    // cuda_blas.cu
    void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
              int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
              int64_t batch) override;

    // cuda_index.cu
    void index_select(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                      int64_t src_size, int64_t inner, int64_t n) override;
    void index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                   int64_t dst_size, int64_t inner, int64_t n) override;
    void gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                int64_t src_size, int64_t inner, int64_t n) override;
    void scatter_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                     int64_t dst_size, int64_t inner, int64_t n) override;

    // cuda_norms.cu
    void norm_forward(const NormForwardArgs& a) override;
    void norm_backward(const NormBackwardArgs& a) override;
    void dyt_forward(const DytForwardArgs& a) override;
    void dyt_backward(const DytBackwardArgs& a) override;

    // cuda_loss.cu
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override;
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override;

    // cuda_optim.cu
    void adam_step(const AdamStepArgs& a) override;
    void sgd_step(const SgdStepArgs& a) override;
    // cuda_swiglu.cu
    void swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) override;
    void swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                         int64_t n) override;
    // cuda_softcap.cu
    void softcap_forward(DType dtype, const void* x, void* y, int64_t n, double cap) override;
    void softcap_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, double cap) override;
    // cuda_attention.cu
    void attention_forward(const AttentionForwardArgs& a) override;
    void attention_backward(const AttentionBackwardArgs& a) override;
    // cuda_rope.cu
    void rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq,
              int64_t heads, int64_t head_dim, bool inverse) override;

private:
    // The cuBLAS handle of this GPU, created on first use (cuda_blas.cu).
    cublasHandle_t cublas();

    int index_;
    std::mutex cublas_mutex_;
    cublasHandle_t cublas_ = nullptr;
};

}  // namespace nl
