// normlab's own f32 gemm engine: BLIS-style blocking and packing around an AVX-512 (16 x 16) or AVX2
// (6 x 16) register-tile micro-kernel, chosen at run time. The CPU backend runs f32 gemms on it where
// the CPU has AVX-512 (or where NORMLAB_GEMM asks for it); elsewhere, and for f64, on OpenBLAS.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu_runtime.h"  // sgemm_engine_name, sgemm_native

namespace nl {

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
