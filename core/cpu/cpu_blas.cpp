// CPU gemm: row-major batched matrix multiply, f32 on normlab's own engine (core/cpu/cpu_sgemm.h)
// where the CPU has AVX-512 (or NORMLAB_GEMM asks for it), else on OpenBLAS (cblas_sgemm); f64 on
// OpenBLAS; bf16 (f32 sums; C rounded once to bf16, or kept in f32) on normlab's bf16 engine (core/cpu/cpu_bgemm.cpp).
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/cpu_runtime.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_sgemm.h"
#include "core/error.h"

namespace nl {

const char* blas_kernel_name() { return openblas_get_corename(); }

const char* blas_kernel_override() {
    if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
    if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return nullptr;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return nullptr;
}

namespace {

// One row-major gemm on BLAS, typed.
void blas_gemm(float, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const float* a, int lda, const float* b, int ldb, double beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb,
                static_cast<float>(beta), c, ldc);
}
void blas_gemm(double, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C = beta * C for every batch matrix: what gemm means when k == 0 (an empty sum). Done here rather
// than in BLAS because implementations disagree on k == 0, and beta == 0 must not read C (it may be
// uninitialized memory holding NaN).
template <typename T>
void scale_c(int64_t m, int64_t n, double beta, T* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    for (int64_t p = 0; p < batch; ++p) {
        for (int64_t i = 0; i < m; ++i) {
            T* row = c + p * stride_c + i * ldc;  // (n)
            for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0 ? T(0) : static_cast<T>(beta * row[j]);
        }
    }
}

// openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP.
bool openblas_omp_build() {
    static const bool omp = openblas_get_parallel() == 2;
    return omp;
}

// f32 on normlab's engine: it threads inside each gemm past a small size, so only small gemms are
// spread over the batch (each then runs on its own thread: the engine sees the parallel region).
void gemm_native(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const float* a,
                 int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, double beta,
                 float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    auto one = [&](int64_t p) {
        sgemm_native(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a + p * stride_a, lda,
                     b + p * stride_b, ldb, static_cast<float>(beta), c + p * stride_c, ldc);
    };
    if (batch > 1 && m * n * k < 64 * 64 * 64) {
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < batch; ++p) one(p);
    } else {
        for (int64_t p = 0; p < batch; ++p) one(p);
    }
}

// bf16 A and B on the bf16 engine, C in bf16 or (c_f32) f32; it threads inside each gemm as the f32
// engine does.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const uint16_t* a,
               int64_t lda, int64_t stride_a, const uint16_t* b, int64_t ldb, int64_t stride_b, double beta, void* c,
               bool c_f32, int64_t ldc, int64_t stride_c, int64_t batch) {
    auto one = [&](int64_t p) {
        void* c_at = c_f32 ? static_cast<void*>(static_cast<float*>(c) + p * stride_c)
                           : static_cast<void*>(static_cast<uint16_t*>(c) + p * stride_c);
        bgemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a + p * stride_a, lda, b + p * stride_b, ldb,
              static_cast<float>(beta), c_at, c_f32, ldc);
    };
    if (batch > 1 && m * n * k < 64 * 64 * 64) {
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < batch; ++p) one(p);
    } else {
        for (int64_t p = 0; p < batch; ++p) one(p);
    }
}

template <typename T>
void gemm_typed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a,
                int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, double beta,
                T* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) {
        scale_c(m, n, beta, c, ldc, stride_c, batch);
        return;
    }
    // cblas takes int sizes; a matrix past 2^31 elements per dim is not something normlab makes.
    const int64_t int_max = INT32_MAX;
    NL_CHECK(m <= int_max && n <= int_max && k <= int_max && lda <= int_max && ldb <= int_max &&
             ldc <= int_max, "gemm sizes exceed int range");
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    auto one = [&](int64_t p) {
        blas_gemm(T(0), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                  a + p * stride_a, static_cast<int>(lda), b + p * stride_b, static_cast<int>(ldb), beta,
                  c + p * stride_c, static_cast<int>(ldc));
    };
    // OpenBLAS threads inside each call once a gemm is big enough (m*n*k >= 64^3), so only small
    // gemms are spread over the batch with OpenMP. And only with an OpenMP build of OpenBLAS: the
    // pthreads build, called from several threads at once, serializes on its internal spin lock, far
    // slower than one thread looping over the batch.
    const bool small = m * n * k < 64 * 64 * 64;
    if (batch > 1 && small && openblas_omp_build()) {
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < batch; ++p) one(p);
    } else {
        for (int64_t p = 0; p < batch; ++p) one(p);
    }
}

}  // namespace

void CpuBackend::gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                      int64_t ldb, int64_t stride_b, double beta, void* c, int64_t ldc,
                      int64_t stride_c, int64_t batch) {
    NL_CHECK(c_dtype == dtype || (dtype == DType::BF16 && c_dtype == DType::F32), "gemm: C in ",
             dtype_name(c_dtype), " for ", dtype_name(dtype), " operands");
    switch (dtype) {
        case DType::F32:
            if (m != 0 && n != 0 && batch != 0 && k != 0 && sgemm_engine_is_native()) {
                gemm_native(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda, stride_a,
                            static_cast<const float*>(b), ldb, stride_b, beta, static_cast<float*>(c), ldc,
                            stride_c, batch);
                return;
            }
            gemm_typed(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda, stride_a,
                       static_cast<const float*>(b), ldb, stride_b, beta, static_cast<float*>(c), ldc,
                       stride_c, batch);
            return;
        case DType::F64:
            gemm_typed(trans_a, trans_b, m, n, k, alpha, static_cast<const double*>(a), lda, stride_a,
                       static_cast<const double*>(b), ldb, stride_b, beta, static_cast<double*>(c), ldc,
                       stride_c, batch);
            return;
        case DType::BF16:
            gemm_bf16(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a), lda, stride_a,
                      static_cast<const uint16_t*>(b), ldb, stride_b, beta, c, c_dtype == DType::F32, ldc, stride_c,
                      batch);
            return;
        default:
            NL_CHECK(false, "gemm: the CPU kernels see f32, f64 and bf16, found ", dtype_name(dtype));
    }
}

}  // namespace nl
