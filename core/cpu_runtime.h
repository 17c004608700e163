// What the CPU backend runs on this machine, and the runtime settings a program can give it: the
// vector instructions the kernels were built for, the f32 GEMM engine, and OpenBLAS's kernel choice.
// This is the public face of core/cpu/ (whose own headers are the backend's and are not installed):
// `normlab info` prints these, and the normlab program makes the OpenBLAS and OpenMP settings below
// for itself before any work (examples/cli/main.cpp); a program of your own can do the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nl {

// ---- vector code ----

// The vector instructions the CPU kernels were compiled for (they follow the build's -march, not
// the CPU that runs them): "AVX-512, 512-bit loops", "AVX-512, 256-bit loops", "AVX2 + FMA", "AVX",
// or "SSE2".
const char* cpu_vector_target();
// The widest vector instructions the CPU running this process has, in the same words: "AVX-512",
// "AVX2 + FMA", "AVX" or "SSE2" ("a non-x86 vector unit" elsewhere). A target wider than this
// would not run; a narrower one leaves speed unused.
const char* cpu_vector_support();

// ---- the f32 GEMM engine ----

// The f32 gemm engine the CPU backend uses: "normlab avx512 16x16", "normlab avx2 6x16" or
// "openblas", and why. Chosen once, from the environment variable NORMLAB_GEMM: auto (the default)
// takes the fastest of the kernels this CPU runs and OpenBLAS as measured on this machine, once per
// machine (core/cpu/cpu_engine_choice.h: the choice is cached, so runs keep their bits); avx512 or
// avx2 ask for that kernel; openblas for OpenBLAS. Another value, or a kernel this CPU cannot run,
// throws nl::Error naming the variable.
const char* sgemm_engine_name();
std::string sgemm_engine_reason();
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

// ---- normlab's bf16 gemm (core/cpu/cpu_bgemm.cpp): bf16 A and B, f32 sums, C in f32 or bf16 ----
// The bf16 gemm engine the CPU backend uses: "normlab amx 32x32 (tdpbf16ps tiles)", "normlab
// avx512-bf16 16x16 (vdpbf16ps)", "bf16 widened to f32 in the packs of normlab's <avx512|avx2> kernel"
// (AVX2's on an AVX2-only CPU, where f32 stays on OpenBLAS) or "bf16 widened to f32 copies, then
// openblas" (NORMLAB_GEMM=openblas, or no normlab kernel runs here), and why it was chosen
// (NORMLAB_GEMM_BF16, the measured rates, the CPU's features, Linux's answer to the AMX tile-data
// request). Chosen once from NORMLAB_GEMM_BF16: auto (the default) takes the fastest of the engines
// this CPU runs as measured on this machine, once per machine (core/cpu/cpu_engine_choice.h); amx,
// avx512bf16 and f32 ask for one. Another value, or an engine this CPU cannot run, throws nl::Error
// naming the variable and why.
const char* bgemm_engine_name();
std::string bgemm_engine_reason();

// The engines this CPU runs ("amx", "avx512bf16", "f32"), best first: for tests and benchmarks.
std::vector<std::string> bgemm_kernels_this_cpu_runs();

// For benchmarks: `trips` x 16 AMX tdpbf16ps (each 16 x 16 x 32 bf16 products: 16,384 FLOP) on the
// tile registers alone, on the calling thread; returns one of the sums. Throws nl::Error, naming why,
// where the amx engine cannot run.
float bgemm_amx_register_loop(int64_t trips);
// The same for AVX512-BF16: `trips` x 16 vdpbf16ps (each 16 lanes x 2 products: 64 FLOP) on 16
// accumulator registers.
float bgemm_avx512bf16_register_loop(int64_t trips);

// C = alpha * op(A) op(B) + beta * C, row-major. op(A) is (m, k): A is stored (m, k) with row stride
// lda, or (k, m) when trans_a; op(B) is (k, n): B stored (k, n) with row stride ldb, or (n, k) when
// trans_b. A and B are bf16 bit patterns. C is (m, n) with row stride ldc: f32 when c_f32, else bf16.
// beta == 0 never reads C. Each element's sum over k runs in one fixed order whatever the thread
// count: the bits do not depend on it. Threads over OpenMP's team unless called in a parallel region.
void bgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
           int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, bool c_f32, int64_t ldc);

// bgemm on the named engine rather than the chosen one (tests compare them).
void bgemm_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                       void* c, bool c_f32, int64_t ldc);

// Whether vdpbf16ps multiplies bf16 faster than bf16 widened to f32 on this machine: the avx512bf16
// engine's rate at least kEngineMargin (1.10) times the widened engine's in the engine choice's
// measurement (core/cpu/cpu_engine_choice.h; twice on a Zen 4 EPYC, half on a Sapphire Rapids
// Xeon), or NORMLAB_GEMM_BF16=avx512bf16; false under any other NORMLAB_GEMM_BF16.
bool bgemm_vdpbf16ps_beats_widened();

// ---- fused attention on bf16 (core/cpu/cpu_attention.cpp) ----
// The kernel fused attention runs on bf16 q, k and v: "vdpbf16ps" (every product on bf16 operands
// with f32 sums; the softmax, P and dS in f32, P and dS rounded to bf16 before the products that take
// them, as PyTorch's CPU flash attention does) where the build targets AVX512-BF16 and
// bgemm_vdpbf16ps_beats_widened(), else "widened" (each (batch, kv head) widened to f32 and run on the
// f32 kernels, its results rounded once: the f32 kernels' bits on the widened values). A head size
// that is not a multiple of 16 always widens.
const char* attention_bf16_kernel();
// Asks for a kernel: "auto" (the default, as above), "widened", or "vdpbf16ps" (where the build
// targets AVX512-BF16); another value throws nl::Error. Process-wide, for tests and benchmarks.
void set_attention_bf16_kernel(const std::string& kernel);

// ---- OpenBLAS's kernel choice ----
// OpenBLAS's DYNAMIC_ARCH builds (Debian's) pick their kernels for the CPU once, when the library is
// loaded. On a CPU its table does not know (a virtualized Xeon with AVX-512 that Debian's OpenBLAS
// 0.3.21 does not recognize) it falls back to Prescott's SSE3 kernels, several times slower at
// sgemm than the AVX-512 kernels the same CPU can run (docs/benchmarks.md). OPENBLAS_CORETYPE, read
// at load time, overrides the choice: export it before the program starts, or set it and restart
// the program as `normlab` does when blas_kernel_override() names a kernel.

// The OPENBLAS_CORETYPE value this process should have been started with, or nullptr when nothing
// needs correcting: OpenBLAS is not on its Prescott fallback, or the CPU has neither AVX2 + FMA nor
// AVX-512, or OPENBLAS_CORETYPE is already set (a choice by the user or the machine's owner, which
// normlab never overrides). "SkylakeX" for AVX-512 F/BW/DQ/VL (OpenBLAS's AVX-512 sgemm), else "Haswell".
const char* blas_kernel_override();
// OpenBLAS's kernel name ("SkylakeX", "Haswell", "Prescott", ...).
const char* blas_kernel_name();

}  // namespace nl
