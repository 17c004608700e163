// normlab's own f32 gemm engine: BLIS-style blocking and packing around an AVX-512 (16 x 16) or AVX2
// (6 x 16) register-tile micro-kernel, chosen at run time. The CPU backend runs f32 gemms on it where
// the CPU has AVX-512 (or where NORMLAB_GEMM asks for it); elsewhere, and for f64, on OpenBLAS.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nl {

// The f32 gemm engine the CPU backend uses, for `normlab info` and the benchmarks: "normlab avx512
// 16x16", "normlab avx2 6x16" or "openblas". Chosen once, from the environment variable NORMLAB_GEMM
// and the CPU: auto (the default) takes the AVX-512 kernel where the CPU has AVX-512, else OpenBLAS;
// avx512 or avx2 ask for that kernel; openblas for OpenBLAS. Another value, or a kernel this CPU cannot run, throws
// nl::Error naming the variable.
const char* sgemm_engine_name();

// Whether f32 gemms run on normlab's engine (sgemm_engine_name() is not "openblas").
bool sgemm_engine_is_native();

// C = alpha * op(A) * op(B) + beta * C, row-major, on normlab's engine (requires
// sgemm_engine_is_native()). op(A) is (m, k): A is stored (m, k) with row stride lda, or (k, m) when
// trans_a. op(B) is (k, n): B is stored (k, n) with row stride ldb, or (n, k) when trans_b. C is
// (m, n) with row stride ldc; beta == 0 never reads C. Threads over OpenMP's current team size
// unless called inside a parallel region. The bits do not depend on the thread count: the sum over
// k runs in the same blocks and order for every element however the rows are shared out.
void sgemm_native(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc);

// The kernels this CPU runs ("avx512", "avx2"), best first, whether or not auto takes them: for
// tests and benchmarks.
std::vector<std::string> sgemm_kernels_this_cpu_runs();

// sgemm_native on the named kernel rather than the chosen engine (tests compare them).
void sgemm_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float beta, float* c, int64_t ldc);

// dst (cols, dst_cols), row stride dst_ld, gets src (rows, cols), row stride ld, transposed:
// dst[q][i] = src[i][q] for i < rows and 0 for rows <= i < dst_cols (dst_cols >= rows). Runs the
// engine's AVX-512 16 x 16 block transpose where the CPU has AVX-512, scalar moves elsewhere; never
// reads past src's `cols` columns. The fused attention packs its key and value tiles with it.
void transpose_pad_f32(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t dst_ld,
                       int64_t dst_cols);

}  // namespace nl
