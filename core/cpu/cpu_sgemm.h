// normlab's own f32 gemm engine: BLIS-style blocking and packing around an AVX-512 (16 x 16) or AVX2
// (6 x 16) register-tile micro-kernel, chosen at run time. The CPU backend runs f32 gemms on it where
// the CPU has AVX-512 (or where NORMLAB_GEMM asks for it); elsewhere, and for f64, on OpenBLAS. The
// bf16 gemm's portable engine widens bf16 in its packs wherever one of its kernels runs (AVX2's too).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu_runtime.h"  // sgemm_engine_name, sgemm_native
#include "core/error.h"

namespace nl {

// The kernels this CPU runs ("avx512", "avx2"), best first, whether or not auto takes them: for
// tests and benchmarks.
std::vector<std::string> sgemm_kernels_this_cpu_runs();

// sgemm_native on the named kernel rather than the chosen engine (tests compare them).
void sgemm_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float beta, float* c, int64_t ldc);

// sgemm_native with bf16 A and B (bit patterns): the kernel's packs widen them (exactly) as they copy
// them into the f32 panels, so no f32 copy of A or B is made; the sums are f32 as in sgemm_native. C
// is f32 (c_f32) or bf16: then alpha * sum + beta * C is rounded once, block by block as the sums
// finish. Runs on sgemm_bf16_kernel(), which must not be nullptr, and k > 0. (The bf16 gemm's
// portable engine.)
void sgemm_native_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, bool c_f32,
                       int64_t ldc);
// The same on the named kernel ("avx512", "avx2"; tests compare them).
void sgemm_bf16_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                            void* c, bool c_f32, int64_t ldc);
// The kernel sgemm_native_bf16 runs on ("avx512", "avx2"): the f32 engine's where that is normlab's;
// where auto leaves f32 on OpenBLAS (an AVX2-only CPU), the best normlab kernel this CPU runs, whose
// widening packs beat widened copies handed to OpenBLAS; nullptr where NORMLAB_GEMM=openblas asks
// for OpenBLAS or no normlab kernel runs here (bf16 gemms then widen copies for OpenBLAS).
const char* sgemm_bf16_kernel();

// c[i][j] = bf16(alpha * sums[i][j] + beta * c[i][j]) for a (rows, cols) block, rounded once to nearest
// even (f32_to_bf16); beta == 0 never reads c. How every bf16 gemm engine writes a bf16 C from its f32 sums.
void round_sums_to_bf16(const float* sums, int64_t ld_sums, uint16_t* c, int64_t ldc, int64_t rows, int64_t cols,
                        float alpha, float beta);

// dst (cols, dst_cols), row stride dst_ld, gets src (rows, cols), row stride ld, transposed:
// dst[q][i] = src[i][q] for i < rows and 0 for rows <= i < dst_cols (dst_cols >= rows). Runs the
// engine's AVX-512 16 x 16 block transpose where the CPU has AVX-512, scalar moves elsewhere; never
// reads past src's `cols` columns. The fused attention packs its key and value tiles with it.
void transpose_pad_f32(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t dst_ld,
                       int64_t dst_cols);

// A 64-byte-aligned buffer of 32-bit words that only grows (the panels pack_bf16_pairs writes), one
// per thread: the bf16 gemm's packs and the fused attention's.
class WordBuffer {
public:
    explicit WordBuffer(int64_t words = 0) { get(words); }
    uint32_t* get(int64_t words) {
        if (words > capacity_) {
            const int64_t rounded = (words + 15) / 16 * 16;
            data_.reset(static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>(rounded) * 4)));
            NL_CHECK(data_ != nullptr, "packed words buffer: out of memory for ", rounded, " words");
            capacity_ = rounded;
        }
        return data_.get();
    }
    uint32_t* data() { return data_.get(); }

private:
    struct Free {
        void operator()(uint32_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint32_t, Free> data_;
    int64_t capacity_ = 0;
};

// Lines [j0, j0 + lines) (lines <= 16) of a bf16 operand as a panel (kp_padded, 16) of 32-bit words
// for vdpbf16ps and AMX: panel row p holds each line's (value 2p, value 2p + 1), lines past `lines`
// and pairs past k zero. k_inner: line j is row j of a (lines, k) storage (row stride ld); else a
// column of a (k, lines) storage. The panel is 64-byte aligned. AVX-512 BW/VL code, for CPUs with
// AVX512-BF16 only (x86-64): the bf16 gemm's packs, and the fused attention's on vdpbf16ps.
void pack_bf16_pairs(const uint16_t* data, int64_t ld, bool k_inner, int64_t k, int64_t j0, int lines,
                     int64_t kp_padded, uint32_t* panel);

}  // namespace nl
