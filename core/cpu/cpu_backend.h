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

    // cpu_copy.cpp
    void copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) override;
    void fill(const Shape& shape, const StridedArg& dst, double value) override;

    // cpu_elementwise.cpp
    void binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                const StridedArg& b) override;
    void unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) override;
    void where(const Shape& shape, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
               const StridedArg& b) override;

    // cpu_reduce.cpp
    void reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len,
                int64_t inner, int64_t correction) override;
    void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                         bool log) override;
    void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                          int64_t cols, bool log) override;

    // cpu_blas.cpp
    void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
              int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
              int64_t batch) override;

    // cpu_index.cpp
    void index_select(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                      int64_t src_size, int64_t inner, int64_t n) override;
    void index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                   int64_t dst_size, int64_t inner, int64_t n) override;
    void gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                int64_t src_size, int64_t inner, int64_t n) override;
    void scatter_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer,
                     int64_t dst_size, int64_t inner, int64_t n) override;

    // ---- fused kernels (norms, loss, optimizer) ----
    // cpu_norms.cpp
    void norm_forward(const NormForwardArgs& a) override;
    void norm_backward(const NormBackwardArgs& a) override;
    void dyt_forward(const DytForwardArgs& a) override;
    void dyt_backward(const DytBackwardArgs& a) override;
    // cpu_loss.cpp
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override;
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override;
    // cpu_optim.cpp
    void adam_step(const AdamStepArgs& a) override;
    void sgd_step(const SgdStepArgs& a) override;
    // cpu_swiglu.cpp
    void swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) override;
    void swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                         int64_t n) override;
    // cpu_softcap.cpp
    void softcap_forward(DType dtype, const void* x, void* y, int64_t n, double cap) override;
    void softcap_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, double cap) override;
    // cpu_attention.cpp
    void attention_forward(const AttentionForwardArgs& a) override;
    void attention_backward(const AttentionBackwardArgs& a) override;
    // cpu_rope.cpp
    void rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq,
              int64_t heads, int64_t head_dim, bool inverse) override;
};

}  // namespace nl
