// normlab's f32 gemm engine: the loop nest of BLIS (Van Zee & van de Geijn, "BLIS: A Framework for
// Rapidly Instantiating BLAS Functionality", TOMS 2015) around one register-tile micro-kernel.
//
//   for jc in n, step NC:
//     for pc in k, step KC:
//       pack op(B)[pc:pc+kc, jc:jc+nc] into NR-wide panels (kc, NR), shared by the threads (L2/L3)
//       for each task (a block of MC rows x a group of B panels), over the threads:
//         for ir: pack op(A) rows [ir, ir+MR) into a panel (kc, MR) (L1)
//           for jr: micro-kernel: an MR x NR tile of C += A panel (kc, MR) . B panel (kc, NR)
//
// B's packed panels make the micro-kernel's vector loads contiguous whatever the transpose, and are
// zero-padded, so a partial tile needs no special loads. Both kernels read A from its packed panel
// (the micro-kernel interface also takes A in place, through its own row and column strides, for a
// kernel that does not pack). The sum over k for any element of C runs in the same KC blocks and
// the same order whatever the thread count or kernel: the bits do not change with either.
#include "core/cpu/cpu_sgemm.h"
#include "core/cpu/cpu_prefetch.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NL_SGEMM_X86 1
#endif

#include <cblas.h>

#include "core/cpu/cpu_engine_choice.h"
#include "core/cpu/cpu_math.h"
#include "core/cpu_runtime.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nl {

namespace {

// One micro-kernel: C tile (mr, nr) at c, row stride ldc, = alpha * sum_p a[p] (x) b[p] + beta * C,
// where a[p] is the mr values a[i * a_rs + p * a_cs] (A in place with its own strides, or a packed
// panel: a_rs 1, a_cs mr; a kernel with Engine::packs_a is only given packed panels) and b[p] the nr values at b + p * b_step (a packed B panel, b_step nr, or
// B in place, b_step ldb). read_c false means beta == 0: C is written without being read (it may
// hold NaN).
using MicroKernel = void (*)(int64_t kc, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                             int64_t b_step, float* c, int64_t ldc, float alpha, float beta, bool read_c);
// The same with B's rows as bf16 bit patterns, read in place and widened as they are loaded (a bf16
// gemm's weight gradient, whose B is read in place): the same f32 arithmetic on the same values.
using MicroKernelBf16B = void (*)(int64_t kc, const float* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
                                  int64_t b_step, float* c, int64_t ldc, float alpha, float beta, bool read_c);
// A (tw, tw) block transpose for the packs (see transpose_16x16_avx512); nullptr: scalar packs. The
// bf16 one widens the rows it loads (bf16 operands: sgemm_native_bf16).
using Transpose = void (*)(const float* src, int64_t ld, int rows, float* dst, int64_t dst_ld, int lanes);
using TransposeBf16 = void (*)(const uint16_t* src, int64_t ld, int rows, float* dst, int64_t dst_ld, int lanes);

struct Engine {
    const char* key;     // NORMLAB_GEMM's name for it
    const char* name;    // what `normlab info` shows
    int mr, nr;          // register tile
    int64_t kc_max;      // k block: an A panel (kc, mr) stays in L1 while the B panels (kc, nr) stream past it
    int64_t mc_max;      // row block: the A rows (mc, kc) of a task
    bool packs_a;        // the kernel reads A from a packed panel (kc, mr) only, never in place
    MicroKernel kernel;  // nullptr: OpenBLAS
    Transpose transpose;
    int tw;              // the transpose's block size; mr <= tw and nr a multiple of it
    MicroKernelBf16B kernel_bf16_b = nullptr;  // nullptr: a bf16 B is always packed (widened)
    TransposeBf16 transpose_bf16 = nullptr;    // nullptr: scalar packs for bf16
};

#ifdef NL_SGEMM_X86

// 16 x 16 on AVX-512, A from a packed panel (kc, 16): 16 accumulators and one B vector per k step.
// Each A value feeds one FMA, so the compiler folds its broadcast into the FMA ({1to16} from memory):
// a k step is 16 FMAs and one load, about 1.1 instructions per FMA against 1.6 for a 12 x 32 tile
// that broadcasts each A value into a register for two FMAs. Both reach the FMA peak when a core
// runs them alone; on a core shared with other work the lighter instruction stream is the faster
// one (docs/benchmarks.md).
// GCC 12's own headers trip -Wmaybe-uninitialized in the widening intrinsics (their _mm512_undefined
// operands; GCC bug 105593): the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// 16 values of a row as f32: f32 loaded, bf16 widened (its bits are an f32's high half).
__attribute__((target("avx512f"))) inline __m512 load_row16(const float* b) { return _mm512_loadu_ps(b); }
__attribute__((target("avx512f"))) inline __m512 load_row16(const uint16_t* b) {
    return cpu_math::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
}

template <typename BValue>
__attribute__((target("avx512f"))) void kernel_avx512_16x16_of(int64_t kc, const float* a, const BValue* b,
                                                               int64_t b_step, float* c, int64_t ldc, float alpha,
                                                               float beta, bool read_c) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i)  // the C tile is read only at the end: fetch it while the FMAs run
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4  // four k steps per trip: faster than two at a training step's shapes
    for (int64_t p = 0; p < kc; ++p) {
        const __m512 bp = load_row16(b);  // (16): row p of the B panel
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), bp, acc[i]);
        a += 16;
        b += b_step;
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        float* row = c + i * ldc;  // (16)
        _mm512_storeu_ps(row, read_c ? _mm512_fmadd_ps(acc[i], va, _mm512_mul_ps(vb, _mm512_loadu_ps(row)))
                                     : _mm512_mul_ps(acc[i], va));
    }
}

__attribute__((target("avx512f"))) void kernel_avx512_16x16(int64_t kc, const float* a, int64_t /*a_rs*/,
                                                            int64_t /*a_cs*/, const float* b, int64_t b_step,
                                                            float* c, int64_t ldc, float alpha, float beta,
                                                            bool read_c) {
    kernel_avx512_16x16_of(kc, a, b, b_step, c, ldc, alpha, beta, read_c);
}

__attribute__((target("avx512f"))) void kernel_avx512_16x16_bf16_b(int64_t kc, const float* a, int64_t /*a_rs*/,
                                                                   int64_t /*a_cs*/, const uint16_t* b,
                                                                   int64_t b_step, float* c, int64_t ldc, float alpha,
                                                                   float beta, bool read_c) {
    kernel_avx512_16x16_of(kc, a, b, b_step, c, ldc, alpha, beta, read_c);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// 8 values of a row as f32: f32 loaded, bf16 widened (its bits are an f32's high half).
__attribute__((target("avx2"))) inline __m256 load_row8(const float* b) { return _mm256_loadu_ps(b); }
__attribute__((target("avx2"))) inline __m256 load_row8(const uint16_t* b) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// 6 x 16 on AVX2 + FMA: 12 accumulators, two B vectors, one broadcast: 15 of 16 registers.
template <typename BValue>
__attribute__((target("avx2,fma"))) void kernel_avx2_6x16_of(int64_t kc, const float* a, int64_t a_rs, int64_t a_cs,
                                                             const BValue* b, int64_t b_step, float* c, int64_t ldc,
                                                             float alpha, float beta, bool read_c) {
    const float* a0 = a;  // rows 0-3 as in the AVX-512 kernel; rows 4-5 from a second base
    const float* a4 = a + 4 * a_rs;
    const int64_t rs1 = a_rs, rs3 = 3 * a_rs;
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int i = 0; i < 6; ++i)  // the C tile is read only at the end: fetch it while the FMAs run
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4  // four k steps per trip: fewer loop branches between the FMAs
    for (int64_t p = 0; p < kc; ++p) {
        const __m256 b0 = load_row8(b), b1 = load_row8(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) {
            const float* base = i < 4 ? a0 : a4;
            const int r = i % 4;
            const float* ap = r == 0 ? base : r == 1 ? base + rs1 : r == 2 ? base + 2 * rs1 : base + rs3;
            const __m256 ai = _mm256_broadcast_ss(ap);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a0 += a_cs;
        a4 += a_cs;
        b += b_step;
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
        float* row = c + i * ldc;  // (16)
        if (read_c) {
            _mm256_storeu_ps(row, _mm256_fmadd_ps(acc[i][0], va, _mm256_mul_ps(vb, _mm256_loadu_ps(row))));
            _mm256_storeu_ps(row + 8,
                             _mm256_fmadd_ps(acc[i][1], va, _mm256_mul_ps(vb, _mm256_loadu_ps(row + 8))));
        } else {
            _mm256_storeu_ps(row, _mm256_mul_ps(acc[i][0], va));
            _mm256_storeu_ps(row + 8, _mm256_mul_ps(acc[i][1], va));
        }
    }
}

__attribute__((target("avx2,fma"))) void kernel_avx2_6x16(int64_t kc, const float* a, int64_t a_rs, int64_t a_cs,
                                                          const float* b, int64_t b_step, float* c, int64_t ldc,
                                                          float alpha, float beta, bool read_c) {
    kernel_avx2_6x16_of(kc, a, a_rs, a_cs, b, b_step, c, ldc, alpha, beta, read_c);
}

__attribute__((target("avx2,fma"))) void kernel_avx2_6x16_bf16_b(int64_t kc, const float* a, int64_t a_rs,
                                                                 int64_t a_cs, const uint16_t* b, int64_t b_step,
                                                                 float* c, int64_t ldc, float alpha, float beta,
                                                                 bool read_c) {
    kernel_avx2_6x16_of(kc, a, a_rs, a_cs, b, b_step, c, ldc, alpha, beta, read_c);
}

// The first `lanes` (<= 8) values of v to dst. Whole vectors and the A panels' 6 lanes get plain
// stores: AMD's masked stores are microcoded, slower than the scalar moves they would replace.
__attribute__((target("avx2"))) inline void store_lanes8(float* dst, __m256 v, int lanes) {
    if (lanes == 8) {
        _mm256_storeu_ps(dst, v);
    } else if (lanes == 6) {
        _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
        _mm_storel_pi(reinterpret_cast<__m64*>(dst + 4), _mm256_extractf128_ps(v, 1));
    } else {
        alignas(32) float all[8];
        _mm256_store_ps(all, v);
        for (int j = 0; j < lanes; ++j) dst[j] = all[j];
    }
}

// Rows [0, rows) of an (8, 8) block at src (row stride ld), rows past `rows` taken as zero, written
// transposed: dst row q (stride dst_ld) gets column q, its first `lanes` values. The AVX2 packs'
// inner step, in three rounds of shuffles (unpack, shuffle, permute2f128) instead of 64 scalar moves.
template <typename Source>
__attribute__((target("avx2"))) void transpose_8x8_avx2_of(const Source* src, int64_t ld, int rows, float* dst,
                                                           int64_t dst_ld, int lanes) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? load_row8(src + i * ld) : _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {  // pairs of rows interleaved, within each 128-bit half
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // r[4i + c]: column c and c + 4 of rows 4i..4i+3 (one per half)
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int c = 0; c < 4; ++c) {  // the halves joined: column c from the low halves, c + 4 from the high
        store_lanes8(dst + c * dst_ld, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20), lanes);
        store_lanes8(dst + (c + 4) * dst_ld, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31), lanes);
    }
}

__attribute__((target("avx2"))) void transpose_8x8_avx2(const float* src, int64_t ld, int rows, float* dst,
                                                        int64_t dst_ld, int lanes) {
    transpose_8x8_avx2_of(src, ld, rows, dst, dst_ld, lanes);
}

__attribute__((target("avx2"))) void transpose_8x8_avx2_bf16(const uint16_t* src, int64_t ld, int rows, float* dst,
                                                             int64_t dst_ld, int lanes) {
    transpose_8x8_avx2_of(src, ld, rows, dst, dst_ld, lanes);
}

// Rows [0, rows) of a (16, 16) block at src (row stride ld), rows past `rows` taken as zero, written
// transposed: dst row q (stride dst_ld) gets column q, its first `lanes` values. The packs' inner step:
// four rounds of shuffles instead of 256 scalar moves (the classic unpack / shuffle_f32x4 transpose).
// GCC 12's own headers trip -Wuninitialized in the unpack intrinsics (their _mm512_undefined_ps
// masks; GCC bug 105593): the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <typename Source>
__attribute__((target("avx512f"))) void transpose_16x16_avx512_of(const Source* src, int64_t ld, int rows,
                                                                  float* dst, int64_t dst_ld, int lanes) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? load_row16(src + i * ld) : _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + c]: columns c, c+4, c+8, c+12 of rows 4i..4i+3
        const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
    for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[c + 4], 0x88);   // columns c, c+8 of rows 0..7
        const __m512 w0 = _mm512_shuffle_f32x4(r[c], r[c + 4], 0xdd);   // columns c+4, c+12
        const __m512 v1 = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0x88);  // the same of rows 8..15
        const __m512 w1 = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0xdd);
        _mm512_mask_storeu_ps(dst + c * dst_ld, mask, _mm512_shuffle_f32x4(v0, v1, 0x88));
        _mm512_mask_storeu_ps(dst + (c + 8) * dst_ld, mask, _mm512_shuffle_f32x4(v0, v1, 0xdd));
        _mm512_mask_storeu_ps(dst + (c + 4) * dst_ld, mask, _mm512_shuffle_f32x4(w0, w1, 0x88));
        _mm512_mask_storeu_ps(dst + (c + 12) * dst_ld, mask, _mm512_shuffle_f32x4(w0, w1, 0xdd));
    }
}

__attribute__((target("avx512f"))) void transpose_16x16_avx512(const float* src, int64_t ld, int rows, float* dst,
                                                               int64_t dst_ld, int lanes) {
    transpose_16x16_avx512_of(src, ld, rows, dst, dst_ld, lanes);
}

__attribute__((target("avx512f"))) void transpose_16x16_avx512_bf16(const uint16_t* src, int64_t ld, int rows,
                                                                    float* dst, int64_t dst_ld, int lanes) {
    transpose_16x16_avx512_of(src, ld, rows, dst, dst_ld, lanes);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // NL_SGEMM_X86

// Every kernel normlab has, best first. "auto" takes the first this CPU runs among those marked
// for it; the AVX2 kernel is not. On an AVX2 CPU (AMD EPYC) it matches OpenBLAS's Zen kernels at a
// nanoGPT-sized step's GEMM shapes, but whole training steps on it are no faster
// (docs/benchmarks.md). So on an AVX2-only CPU auto keeps OpenBLAS for f32 and NORMLAB_GEMM=avx2 asks
// for it; bf16 gemms take it there all the same (bf16_engine below), as its packs widen bf16.
struct KernelEntry {
    Engine engine;
    bool (*cpu_runs)();
    bool automatic;
};

#ifdef NL_SGEMM_X86
// __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
const KernelEntry kKernels[] = {
    {{"avx512", "normlab avx512 16x16", 16, 16, 256, 480, true, kernel_avx512_16x16, transpose_16x16_avx512, 16,
      kernel_avx512_16x16_bf16_b, transpose_16x16_avx512_bf16},
     cpu_has_avx512, true},
    {{"avx2", "normlab avx2 6x16", 6, 16, 256, 240, true, kernel_avx2_6x16, transpose_8x8_avx2, 8,
      kernel_avx2_6x16_bf16_b, transpose_8x8_avx2_bf16},
     cpu_has_avx2, false},
};
#else
const KernelEntry* const kKernels = nullptr;
#endif

const Engine kOpenBlas{"openblas", "openblas", 0, 0, 0, 0, false, nullptr, nullptr, 0};

std::vector<const KernelEntry*> all_kernels() {
    std::vector<const KernelEntry*> out;
#ifdef NL_SGEMM_X86
    for (const KernelEntry& k : kKernels) out.push_back(&k);
#endif
    return out;
}

// The kernel named `name` ("avx512", "avx2"), which this CPU must run; throws nl::Error otherwise,
// naming what `what` accepts: NORMLAB_GEMM (`environment`) also takes auto and openblas, the
// *_with_kernel functions a kernel's name only.
const Engine& kernel_named(const std::string& name, const char* what, bool environment = false) {
    std::string known;
    for (const KernelEntry* k : all_kernels()) {
        if (name == k->engine.key) {
            NL_REQUIRE(k->cpu_runs(), what, ": this CPU cannot run normlab's ", name, " gemm kernel");
            return k->engine;
        }
        known += std::string(k->engine.key) + ", ";
    }
    if (environment) NL_REQUIRE(false, what, ": expected auto, ", known, "or openblas, found '", name, "'");
    NL_REQUIRE(!known.empty(), what, ": this build has no normlab gemm kernel, found '", name, "'");
    NL_REQUIRE(false, what, ": expected a kernel's name, ", known.substr(0, known.size() - 2), ", found '", name, "'");
    return kOpenBlas;  // not reached
}

// The probe (core/cpu/cpu_engine_choice.h): C (m, n) = A (m, k) B^T, B stored (n, k).
struct EngineProbeData {
    const int64_t m = kEngineProbeM, n = kEngineProbeN, k = kEngineProbeK;
    EngineProbeOperands in;
    std::vector<float> c = std::vector<float>(static_cast<size_t>(m * n));
};

void run_probe(const Engine& e, EngineProbeData& data);

struct EngineInUse {
    const Engine* engine;
    std::string reason;
};

// The engine for this CPU and NORMLAB_GEMM, chosen once: the variable's, or auto's, the fastest of
// every kernel this CPU runs and OpenBLAS as measured on this machine (core/cpu/cpu_engine_choice.h).
EngineInUse choose_engine() {
    const char* env = std::getenv("NORMLAB_GEMM");
    const std::string want = env == nullptr || *env == '\0' ? "auto" : env;
    if (want == "openblas") return {&kOpenBlas, "NORMLAB_GEMM=openblas"};
    if (want != "auto") return {&kernel_named(want, "NORMLAB_GEMM", true), "NORMLAB_GEMM=" + want};
    std::vector<EngineRate> candidates;
    for (const KernelEntry* k : all_kernels())
        candidates.push_back({k->engine.key, k->cpu_runs() ? "" : "this CPU cannot run it"});
    candidates.push_back({kOpenBlas.key, ""});
    EngineProbeData data;
    const EngineChoice choice = choose_engine_by_rate(
        "f32", candidates,
        [&data](const std::string& key) {
            run_probe(key == kOpenBlas.key ? kOpenBlas : kernel_named(key, "NORMLAB_GEMM"), data);
        },
        kEngineProbeFlops);
    const Engine& chosen = choice.key == kOpenBlas.key ? kOpenBlas : kernel_named(choice.key, "NORMLAB_GEMM");
    return {&chosen, "auto: the fastest measured here, " + choice.rates_text() + "; " + choice.source};
}

const EngineInUse& engine_in_use() {
    static const EngineInUse chosen = choose_engine();
    return chosen;
}

const Engine& engine() { return *engine_in_use().engine; }

// The kernel bf16 gemms widen into, chosen once: the f32 engine's where it is normlab's; where auto
// left f32 on OpenBLAS, the best kernel this CPU runs, marked for auto or not (on an AVX2-only CPU,
// packs that widen bf16 as they copy it beat widened copies handed to OpenBLAS: docs/benchmarks.md);
// nullptr where NORMLAB_GEMM=openblas asks for OpenBLAS or no normlab kernel runs here.
const Engine* bf16_engine() {
    static const Engine* chosen = []() -> const Engine* {
        if (engine().kernel != nullptr) return &engine();
        const char* env = std::getenv("NORMLAB_GEMM");
        if (env != nullptr && std::string(env) == "openblas") return nullptr;
        for (const KernelEntry* k : all_kernels())
            if (k->cpu_runs()) return &k->engine;
        return nullptr;
    }();
    return chosen;
}

// A 64-byte-aligned float buffer that only grows, one per thread, so a gemm allocates nothing once
// warm. Its contents are scratch.
class PackBuffer {
public:
    float* get(int64_t floats) {
        if (floats > capacity_) {
            const int64_t rounded = (floats + 15) / 16 * 16;  // aligned_alloc wants a multiple of 64 B
            data_.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(rounded) * sizeof(float))));
            NL_CHECK(data_ != nullptr, "gemm pack buffer: out of memory for ", rounded, " floats");
            capacity_ = rounded;
        }
        return data_.get();
    }

private:
    struct Free {
        void operator()(float* p) const { std::free(p); }
    };
    std::unique_ptr<float, Free> data_;
    int64_t capacity_ = 0;
};

// The packs read f32 operands, or bf16 ones (sgemm_native_bf16) widened as they are copied: bf16 to
// f32 is exact, so a panel packed from bf16 holds the values a panel packed from an f32 copy would,
// without that copy. Where the f32 plan reads B in place (a weight gradient's), a bf16 B is read in
// place too, by a kernel that widens its rows as it loads them (Engine::kernel_bf16_b): the same plan,
// so the same sums in the same order as the f32 engine on the widened operands.
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

// count floats from src to dst, then zeros up to width. The whole-width copies of the tile widths
// get a size known at compile time, so they compile to a few vector moves instead of a memcpy call.
inline void copy_padded(float* dst, const float* src, int count, int width) {
    if (count == width) {
        switch (width) {
            case 6: std::memcpy(dst, src, 6 * sizeof(float)); return;
            case 12: std::memcpy(dst, src, 12 * sizeof(float)); return;
            case 16: std::memcpy(dst, src, 16 * sizeof(float)); return;
            case 32: std::memcpy(dst, src, 32 * sizeof(float)); return;
            default: break;
        }
    }
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    for (int j = count; j < width; ++j) dst[j] = 0.0f;
}

// count bf16 values from src widened into dst, then zeros up to width.
inline void widen_n(float* dst, const uint16_t* src, int count) {
    for (int j = 0; j < count; ++j) dst[j] = bf16_to_f32(src[j]);
}
inline void copy_padded(float* dst, const uint16_t* src, int count, int width) {
    if (count == width) {  // the tile widths' whole rows with a trip count known to the vectorizer
        switch (width) {
            case 6: widen_n(dst, src, 6); return;
            case 16: widen_n(dst, src, 16); return;
            case 32: widen_n(dst, src, 32); return;
            default: break;
        }
    }
    widen_n(dst, src, count);
    for (int j = count; j < width; ++j) dst[j] = 0.0f;
}

// The engine's block transpose for the source type (nullptr: none, the packs go scalar).
inline Transpose transpose_for(const Engine& e, const float*) { return e.transpose; }
inline TransposeBf16 transpose_for(const Engine& e, const uint16_t*) { return e.transpose_bf16; }

// op(A)[i0:i0+rows, p0:p0+kc] as one packed panel (kc, mr), rows past `rows` zero: every panel for
// a kernel that packs A, else the last, partial one. Source: float, or uint16_t (bf16).
template <typename Source>
void pack_a_panel(const Engine& e, bool trans_a, const Source* a, int64_t lda, int64_t i0, int rows, int64_t p0,
                  int64_t kc, float* panel) {
    const int mr = e.mr;
    if (trans_a) {  // A is stored (k, m): the panel's row p is a contiguous piece of A's row p
        for (int64_t p = 0; p < kc; ++p) copy_padded(panel + p * mr, a + (p0 + p) * lda + i0, rows, mr);
        return;
    }
    // A is stored (m, k): the panel is a transpose of `rows` rows of A.
    const Source* src = a + i0 * lda + p0;
    int64_t p = 0;
    if (const auto transpose = transpose_for(e, a); transpose != nullptr)
        for (; p + e.tw <= kc; p += e.tw) transpose(src + p, lda, rows, panel + p * mr, mr, mr);
    for (; p < kc; ++p)
        for (int r = 0; r < mr; ++r) panel[p * mr + r] = r < rows ? to_f32(src[r * lda + p]) : 0.0f;
}

// Panel jp (columns j0 + jp*nr ...) of op(B)[p0:p0+kc, j0:j0+nc], as (kc, nr), columns past nc zero.
template <typename Source>
void pack_b_panel(const Engine& e, bool trans_b, const Source* b, int64_t ldb, int64_t p0, int64_t kc,
                  int64_t j0, int64_t nc, int64_t jp, float* panel) {
    const int nr = e.nr;
    const int64_t jr = jp * nr;
    const int cols = static_cast<int>(std::min<int64_t>(nr, nc - jr));
    if (!trans_b) {
        // B is stored (k, n): row p of the panel is a contiguous piece of row p of B.
        for (int64_t p = 0; p < kc; ++p) {
            const Source* src = b + (p0 + p) * ldb + j0 + jr;
            copy_padded(panel + p * nr, src, cols, nr);
        }
        return;
    }
    // B is stored (n, k): row j of the storage is column j of op(B), contiguous in p: a transpose.
    const Source* src = b + (j0 + jr) * ldb + p0;
    int64_t p = 0;
    if (const auto transpose = transpose_for(e, b); transpose != nullptr) {
        for (; p + e.tw <= kc; p += e.tw) {
            for (int g = 0; g < nr; g += e.tw) {
                const int rows = std::clamp(cols - g, 0, e.tw);
                transpose(src + g * ldb + p, ldb, rows, panel + p * nr + g, nr, e.tw);
            }
        }
    }
    for (; p < kc; ++p)
        for (int j = 0; j < nr; ++j) panel[p * nr + j] = j < cols ? to_f32(src[j * ldb + p]) : 0.0f;
}

// One tile of C: the full micro-kernel when the tile is whole, else the kernel into a scratch tile
// and the valid part merged with the same arithmetic (alpha * acc, or fma(acc, alpha, beta * c)).
// `kernel` is e.kernel (f32 B) or e.kernel_bf16_b (bf16 B read in place).
template <typename BValue, typename Kernel>
void run_tile(const Engine& e, Kernel kernel, int64_t kc, const float* a_panel, int64_t a_rs, int64_t a_cs,
              const BValue* b_panel, int64_t b_step, float* c, int64_t ldc, int rows, int cols, float alpha,
              float beta, bool read_c) {
    if (rows == e.mr && cols == e.nr) {
        kernel(kc, a_panel, a_rs, a_cs, b_panel, b_step, c, ldc, alpha, beta, read_c);
        return;
    }
    alignas(64) float tile[16 * 16];  // (mr, nr): the largest register tile
    kernel(kc, a_panel, a_rs, a_cs, b_panel, b_step, tile, e.nr, 1.0f, 0.0f, false);
    for (int i = 0; i < rows; ++i) {
        float* row = c + i * ldc;
        const float* acc = tile + i * e.nr;
        for (int j = 0; j < cols; ++j)
            row[j] = read_c ? std::fma(acc[j], alpha, beta * row[j]) : acc[j] * alpha;
    }
}

// Below this many multiply-adds a gemm runs on the calling thread: waking the team costs more.
constexpr int64_t kThreadedMinWork = int64_t(64) * 64 * 64;
constexpr int64_t kNcMax = 4096;  // the packed B block: kc_max x 4096 floats = 4 MiB at most
// Up to this many A panels (m / mr: 256 rows for the AVX-512 kernel, 96 for AVX2's), a
// non-transposed B is read in place: each B panel serves that many A panels, too few for a pack to
// pay for itself.
constexpr int64_t kDirectBMaxPanels = 16;
// Up to this many A panels, B is read in place too when its rows are not a multiple of 1 KiB apart:
// then a panel's rows fall in 8 or more L1 sets. At a weight gradient dW = dY^T X of up to 32 A
// panels so spread, reading B in place is faster than packing it; beyond, or with B's rows 4 KiB
// apart (all in one set), packing is the faster (docs/benchmarks.md).
constexpr int64_t kDirectBMaxPanelsSpread = 32;
constexpr int64_t kSplitMaxOutputs = int64_t(1) << 19;  // C of up to 2 MiB is summed in two parts (below)

}  // namespace

const char* sgemm_engine_name() { return engine().name; }

std::string sgemm_engine_reason() { return engine_in_use().reason; }

bool sgemm_engine_is_native() { return engine().kernel != nullptr; }

const char* sgemm_bf16_kernel() { return bf16_engine() == nullptr ? nullptr : bf16_engine()->key; }

std::vector<std::string> sgemm_kernels_this_cpu_runs() {
    std::vector<std::string> out;
    for (const KernelEntry* k : all_kernels())
        if (k->cpu_runs()) out.emplace_back(k->engine.key);
    return out;
}

namespace {

// One gemm's operands, as sgemm_native takes them: C = alpha * op(A) op(B) + beta * C.
struct GemmArgs {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha;
    const float* a;
    int64_t lda;
    const float* b;
    int64_t ldb;
    float beta;
    float* c;
    int64_t ldc;
    const uint16_t* a16 = nullptr;  // bf16 A and B instead of a and b (sgemm_native_bf16): always packed
    const uint16_t* b16 = nullptr;
    // A bf16 C (sgemm_native_bf16): the sums go to c, an f32 scratch (m, n) run with alpha 1 and
    // beta 0, and each block of it, once final, becomes c16 = bf16(c16_alpha * sum + c16_beta * c16).
    uint16_t* c16 = nullptr;
    int64_t ldc16 = 0;
    float c16_alpha = 1.0f, c16_beta = 0.0f;
};

// Rows [i0, i1) x columns [j0, j1) of a finished f32 sum (g.c) rounded into the bf16 C.
void round_into_c16(const GemmArgs& g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    round_sums_to_bf16(g.c + i0 * g.ldc + j0, g.ldc, g.c16 + i0 * g.ldc16 + j0, g.ldc16, i1 - i0, j1 - j0,
                       g.c16_alpha, g.c16_beta);
}

// How a gemm is cut into blocks and shared out over the threads, decided from its sizes before any work.
struct GemmPlan {
    int threads;         // the team (1: the calling thread alone)
    int64_t kc_step;     // the k block: k in blocks of equal size, at most kc_max
    int64_t nc_max;      // the column block: whole B panels, at most kNcMax columns
    bool direct_b;       // B read in place; false: packed, once per k block, shared by the team
    int64_t want_tasks;  // the tasks wanted per column block: 4 per thread, or 1 on one thread
    int64_t m_blocks;    // row blocks of mc_step rows (whole A panels), the last one partial
    int64_t mc_step;
    int64_t k_parts;     // 1, or 2: the sum over k in two parts, the second into a scratch C
    int64_t part_split;  // the second part's first k row
};

GemmPlan plan_gemm(const Engine& e, const GemmArgs& g) {
    GemmPlan plan;
    // k blocks of equal size (so a k of 300 runs as 150 + 150, not 256 + 44); they depend on k only.
    const int64_t k_blocks = (g.k + e.kc_max - 1) / e.kc_max;
    plan.kc_step = (g.k + k_blocks - 1) / k_blocks;
    plan.nc_max = std::min(kNcMax, (g.n + e.nr - 1) / e.nr * e.nr);
    // An A panel is packed once per (row panel, k block) and read by all of the task's B panels, so
    // the pack is about 1/nc of the panel's work.
    //
    // B is packed, once per k block and shared by the threads (a barrier each side), when its panels
    // are read by many A panels, or when it is stored transposed. A gemm of few rows (a weight
    // gradient dW = dY^T X of a small layer, k the batch's rows) reuses each B panel a few times
    // only: there packing costs more than it saves, so B is read in place (b_step ldb) and nothing
    // is shared, and each thread runs a fixed run of tasks with the k blocks outermost and no
    // barrier. In place, a B panel's rows are ldb apart, which for wide layers (ldb of 1024 floats,
    // 4 KiB) maps them all to the same L1 sets: that is why larger gemms pack, and why gemms of up
    // to kDirectBMaxPanelsSpread A panels read B in place only where its rows spread over the sets.
    const bool b_rows_spread = (g.ldb * static_cast<int64_t>(sizeof(float))) % 1024 != 0;
    const int64_t a_panels = (g.m + e.mr - 1) / e.mr;
    plan.direct_b = (g.b16 == nullptr || e.kernel_bf16_b != nullptr) && !g.trans_b &&
                    (a_panels <= kDirectBMaxPanels || (a_panels <= kDirectBMaxPanelsSpread && b_rows_spread));
    plan.threads = omp_in_parallel() || g.m * g.n * g.k < kThreadedMinWork ? 1 : omp_get_max_threads();
    // Row blocks: whole MR panels, at most mc_max rows, and at least 4 per thread where m allows:
    // with packed B they are handed out dynamically, so a thread slowed by another process on its
    // core (a shared machine) does not hold the others at the barrier.
    const int64_t m_panels = (g.m + e.mr - 1) / e.mr;
    const int64_t max_panels = e.mc_max / e.mr;
    plan.want_tasks = plan.threads > 1 ? 4 * plan.threads : 1;
    plan.m_blocks = std::max((m_panels + max_panels - 1) / max_panels, std::min(m_panels, plan.want_tasks));
    // A whole number of blocks per thread: 9 equal blocks on 2 threads leave one thread idle for a
    // ninth of the gemm; 10 slightly smaller ones keep both busy to the end.
    if (plan.threads > 1)
        plan.m_blocks = std::min(m_panels, (plan.m_blocks + plan.threads - 1) / plan.threads * plan.threads);
    plan.mc_step = (m_panels + plan.m_blocks - 1) / plan.m_blocks * e.mr;
    plan.m_blocks = (g.m + plan.mc_step - 1) / plan.mc_step;
    // A long sum into a small C with B read in place (a weight gradient dW = dY^T X, k the batch's
    // token rows) runs in two parts: the first half of the k blocks into C, the second into a
    // scratch C, added at the end. Two threads then each read half of dY's and X's rows instead of
    // both reading all of X, which in a training step comes cold from memory (docs/benchmarks.md).
    // The parts are decided by the sizes alone, never by the thread count, so the bits are the same
    // on any number of threads.
    plan.k_parts = plan.direct_b && k_blocks >= 4 && g.m * g.n <= kSplitMaxOutputs ? 2 : 1;
    plan.part_split = (k_blocks / 2) * plan.kc_step;
    return plan;
}

// Columns [jc, jc + nc) of C, cut into tasks: m_blocks row blocks x n_groups groups of B panels,
// at least want_tasks where the sizes allow (so a small-m gemm also splits along n).
struct ColumnBlock {
    int64_t jc, nc;
    int64_t n_panels;  // B panels of nr columns, the last one partial
    int64_t n_groups;
    int64_t panels_per_group;
    int64_t tasks;
};

ColumnBlock column_block(const Engine& e, const GemmPlan& plan, int64_t n, int64_t jc) {
    ColumnBlock block;
    block.jc = jc;
    block.nc = std::min(plan.nc_max, n - jc);
    block.n_panels = (block.nc + e.nr - 1) / e.nr;
    const int64_t groups_wanted = (plan.want_tasks + plan.m_blocks - 1) / plan.m_blocks;
    block.n_groups = std::max<int64_t>(1, std::min<int64_t>(block.n_panels, groups_wanted));
    block.panels_per_group = (block.n_panels + block.n_groups - 1) / block.n_groups;
    block.tasks = plan.m_blocks * block.n_groups;
    return block;
}

// What a thread's tasks read B and A through: b_packed, the team's packed B block (packed B only);
// a_packed, the thread's A panel (kc, mr); b_edge, its partial last B panel (kc, nr) (direct B only).
struct TaskPanels {
    const float* b_packed;
    float* a_packed;
    float* b_edge;
};

// One task over the k block [pc, pc + kc): each A panel of its row block against the task's B
// panels in turn (the A panel stays in L1 while the B panels stream from L2), C row tile by row
// tile. The task's sum goes to out (row stride ld_out); first: pc is the first k block of that sum,
// which scales out by first_beta (0: out is written without being read). The gemm's hot loops.
void run_task(const Engine& e, const GemmArgs& g, const GemmPlan& plan, const ColumnBlock& block,
              const TaskPanels& panels, int64_t task, int64_t pc, int64_t kc, float* out, int64_t ld_out,
              bool first, float first_beta) {
    const bool trans_a = g.trans_a, direct_b = plan.direct_b;
    const float *a = g.a, *b = g.b;
    const int64_t lda = g.lda, ldb = g.ldb, jc = block.jc, nc = block.nc, n_panels = block.n_panels;
    const float alpha = g.alpha;
    const int64_t ic = task / block.n_groups * plan.mc_step, mc = std::min(plan.mc_step, g.m - ic);
    const int64_t group = task % block.n_groups;
    const int64_t jp_begin = group * block.panels_per_group;
    const int64_t jp_end = std::min(n_panels, (group + 1) * block.panels_per_group);
    const float block_beta = first ? first_beta : 1.0f;
    const bool read_c = !(first && first_beta == 0.0f);
    if (direct_b && jp_end == n_panels && nc % e.nr != 0) {  // the partial last B panel
        if (g.b16 != nullptr)
            pack_b_panel(e, false, g.b16, ldb, pc, kc, jc, nc, n_panels - 1, panels.b_edge);
        else
            pack_b_panel(e, false, b, ldb, pc, kc, jc, nc, n_panels - 1, panels.b_edge);
    }
    for (int64_t ir = 0; ir < mc; ir += e.mr) {
        const int rows = static_cast<int>(std::min<int64_t>(e.mr, mc - ir));
        const float* a_panel = a == nullptr ? nullptr : trans_a ? a + pc * lda + ic + ir : a + (ic + ir) * lda + pc;
        int64_t a_rs = trans_a ? 1 : lda, a_cs = trans_a ? lda : 1;
        if (g.a16 != nullptr) {
            pack_a_panel(e, trans_a, g.a16, lda, ic + ir, rows, pc, kc, panels.a_packed);
            a_panel = panels.a_packed;
            a_rs = 1;
            a_cs = e.mr;
        } else if (rows < e.mr || e.packs_a) {
            pack_a_panel(e, trans_a, a, lda, ic + ir, rows, pc, kc, panels.a_packed);
            a_panel = panels.a_packed;
            a_rs = 1;
            a_cs = e.mr;
        }
        // The next A panel's source (A comes cold from memory in a training step), asked for a share
        // at a time while this panel runs against the task's B panels: its pack then finds it in
        // cache instead of waiting on every row. Packed from f32 A only (a bf16 A is the widened
        // engine's).
        cpu_prefetch::RowLines next;
        if (a != nullptr && ir + e.mr < mc) {
            const int64_t next_rows = std::min<int64_t>(e.mr, mc - ir - e.mr), shares = jp_end - jp_begin;
            const int64_t ld_bytes = lda * static_cast<int64_t>(sizeof(float));
            // Stored (m, k): the next rows' kc values each; stored (k, m): kc rows, the next rows' values of each.
            next = trans_a ? cpu_prefetch::RowLines(a + pc * lda + ic + ir + e.mr, ld_bytes, kc, next_rows * 4, shares)
                           : cpu_prefetch::RowLines(a + (ic + ir + e.mr) * lda + pc, ld_bytes, next_rows, kc * 4, shares);
        }
        for (int64_t jp = jp_begin; jp < jp_end; ++jp) {
            next.share();
            const int64_t jr = jp * e.nr;
            const int cols = static_cast<int>(std::min<int64_t>(e.nr, nc - jr));
            const bool in_place = direct_b && cols == e.nr;
            float* c_tile = out + (ic + ir) * ld_out + jc + jr;
            if (in_place && g.b16 != nullptr) {  // bf16 B in place, widened by the kernel's loads
                run_tile(e, e.kernel_bf16_b, kc, a_panel, a_rs, a_cs, g.b16 + pc * ldb + jc + jr, ldb, c_tile, ld_out,
                         rows, cols, alpha, block_beta, read_c);
                continue;
            }
            const float* b_panel = in_place ? b + pc * ldb + jc + jr
                                   : direct_b ? panels.b_edge
                                              : panels.b_packed + jp * kc * e.nr;
            run_tile(e, e.kernel, kc, a_panel, a_rs, a_cs, b_panel, in_place ? ldb : e.nr, c_tile, ld_out, rows, cols,
                     alpha, block_beta, read_c);
        }
    }
    // A bf16 C: the task's block is final after the last k block (unless a second part is still to
    // come), and is rounded now, while in cache, rather than in a pass of its own.
    if (g.c16 != nullptr && plan.k_parts == 1 && pc + kc == g.k)
        round_into_c16(g, ic, ic + mc, jc + jp_begin * e.nr, jc + std::min(nc, jp_end * e.nr));
}

// A column block with B read in place: the thread's fixed run of (part, task) pairs, parts
// outermost, no barrier. With two parts on two threads, each thread reads half of A's and B's k rows.
void run_tasks_direct_b(const Engine& e, const GemmArgs& g, const GemmPlan& plan, const ColumnBlock& block,
                        const TaskPanels& panels, float* k_scratch) {
    const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t tasks = block.tasks;
    const int64_t pairs = tasks * plan.k_parts;
    const int64_t pair_begin = pairs * t / team, pair_end = pairs * (t + 1) / team;
    for (int64_t part = 0; part < plan.k_parts; ++part) {
        const int64_t part_begin = part == 0 ? 0 : plan.part_split;
        const int64_t part_end = part + 1 == plan.k_parts ? g.k : plan.part_split;
        float* out = part == 0 ? g.c : k_scratch;
        const int64_t ld_out = part == 0 ? g.ldc : g.n;
        for (int64_t pc = part_begin; pc < part_end; pc += plan.kc_step)
            for (int64_t pair = std::max(pair_begin, part * tasks); pair < std::min(pair_end, (part + 1) * tasks);
                 ++pair)
                run_task(e, g, plan, block, panels, pair - part * tasks, pc, std::min(plan.kc_step, g.k - pc), out,
                         ld_out, pc == part_begin, part == 0 ? g.beta : 0.0f);
    }
}

// A column block with B packed: per k block the team packs B's panels into b_packed (a barrier
// after), then takes the tasks one at a time (a barrier after, before the next pack).
void run_tasks_packed_b(const Engine& e, const GemmArgs& g, const GemmPlan& plan, const ColumnBlock& block,
                        float* b_packed, const TaskPanels& panels) {
    for (int64_t pc = 0; pc < g.k; pc += plan.kc_step) {
        const int64_t kc = std::min(plan.kc_step, g.k - pc);
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < block.n_panels; ++jp) {
            float* panel = b_packed + jp * kc * e.nr;
            if (g.b16 != nullptr)
                pack_b_panel(e, g.trans_b, g.b16, g.ldb, pc, kc, block.jc, block.nc, jp, panel);
            else
                pack_b_panel(e, g.trans_b, g.b, g.ldb, pc, kc, block.jc, block.nc, jp, panel);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < block.tasks; ++task)
            run_task(e, g, plan, block, panels, task, pc, kc, g.c, g.ldc, pc == 0, g.beta);
    }
}

// C += the second part's sum k_scratch (m, n), once every thread's tasks are done (called by the team).
void add_second_part(const GemmArgs& g, const float* k_scratch) {
    float* c = g.c;
    const int64_t m = g.m, n = g.n, ldc = g.ldc;
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] += k_scratch[i * n + j];
}

void sgemm_on(const Engine& e, const GemmArgs& g) {
    NL_CHECK(e.kernel != nullptr, "sgemm_native called with the OpenBLAS engine");
    NL_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "sgemm_native: negative size");
    if (g.m == 0 || g.n == 0) return;
    if (g.k == 0) {  // an empty sum: C = beta * C, and beta == 0 must not read C
        NL_CHECK(g.c16 == nullptr, "sgemm_native_bf16: k == 0 is the caller's");
        for (int64_t i = 0; i < g.m; ++i)
            for (int64_t j = 0; j < g.n; ++j)
                g.c[i * g.ldc + j] = g.beta == 0.0f ? 0.0f : g.beta * g.c[i * g.ldc + j];
        return;
    }
    const GemmPlan plan = plan_gemm(e, g);
    thread_local PackBuffer b_buffer;  // the calling thread's: shared with its team below
    float* b_packed = plan.direct_b ? nullptr : b_buffer.get(plan.kc_step * plan.nc_max);  // (nc / nr panels, kc, nr)
    thread_local PackBuffer scratch_buffer;
    float* k_scratch = plan.k_parts == 2 ? scratch_buffer.get(g.m * g.n) : nullptr;  // (m, n): the second part's sum

#pragma omp parallel num_threads(plan.threads)
    {
        thread_local PackBuffer a_buffer, b_edge_buffer;
        TaskPanels panels;
        panels.b_packed = b_packed;
        panels.a_packed = a_buffer.get(e.mr * plan.kc_step);                                 // (kc, mr)
        panels.b_edge = plan.direct_b ? b_edge_buffer.get(plan.kc_step * e.nr) : nullptr;  // (kc, nr)
        for (int64_t jc = 0; jc < g.n; jc += plan.nc_max) {
            const ColumnBlock block = column_block(e, plan, g.n, jc);
            if (plan.direct_b) run_tasks_direct_b(e, g, plan, block, panels, k_scratch);
            else run_tasks_packed_b(e, g, plan, block, b_packed, panels);
        }
        if (plan.k_parts == 2) {
            add_second_part(g, k_scratch);
            if (g.c16 != nullptr) {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < g.m; ++i) round_into_c16(g, i, i + 1, 0, g.n);
            }
        }
    }
}

// One probe gemm (a Linear's forward) on the engine, on this process's threads.
void run_probe(const Engine& e, EngineProbeData& d) {
    if (e.kernel == nullptr) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(d.m), int(d.n), int(d.k), 1.0f, d.in.a.data(), int(d.k),
                    d.in.b.data(), int(d.k), 0.0f, d.c.data(), int(d.n));
        return;
    }
    sgemm_on(e, {false, true, d.m, d.n, d.k, 1.0f, d.in.a.data(), d.k, d.in.b.data(), d.k, 0.0f, d.c.data(), d.n});
}

}  // namespace

void sgemm_native(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
    sgemm_on(engine(), {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
}

void round_sums_to_bf16(const float* sums, int64_t ld_sums, uint16_t* c, int64_t ldc, int64_t rows, int64_t cols,
                        float alpha, float beta) {
    for (int64_t i = 0; i < rows; ++i) {
        const float* sum = sums + i * ld_sums;  // (cols)
        uint16_t* row = c + i * ldc;            // (cols)
        if (beta != 0.0f) {
            for (int64_t j = 0; j < cols; ++j) row[j] = f32_to_bf16(alpha * sum[j] + beta * bf16_to_f32(row[j]));
        } else {
            for (int64_t j = 0; j < cols; ++j) row[j] = f32_to_bf16(alpha * sum[j]);
        }
    }
}

namespace {
// sgemm_native_bf16 on kernel e.
void sgemm_bf16_on(const Engine& e, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, bool c_f32,
                   int64_t ldc) {
    GemmArgs g{trans_a, trans_b, m, n, k, alpha, nullptr, lda, nullptr, ldb, beta, nullptr, ldc};
    g.a16 = a;
    g.b16 = b;
    if (c_f32) {
        g.c = static_cast<float*>(c);
    } else {  // the f32 sums in scratch (m, n), rounded into C block by block as they finish
        thread_local PackBuffer sums;
        g.c = sums.get(m * n);
        g.ldc = n;
        g.alpha = 1.0f;
        g.beta = 0.0f;
        g.c16 = static_cast<uint16_t*>(c);
        g.ldc16 = ldc;
        g.c16_alpha = alpha;
        g.c16_beta = beta;
    }
    sgemm_on(e, g);
}
}  // namespace

void sgemm_native_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, bool c_f32,
                       int64_t ldc) {
    NL_CHECK(bf16_engine() != nullptr, "sgemm_native_bf16: no normlab kernel for bf16 here (sgemm_bf16_kernel())");
    sgemm_bf16_on(*bf16_engine(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, c_f32, ldc);
}

void sgemm_bf16_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                            void* c, bool c_f32, int64_t ldc) {
    sgemm_bf16_on(kernel_named(kernel, "sgemm_bf16_with_kernel"), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                  beta, c, c_f32, ldc);
}

void sgemm_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float beta, float* c, int64_t ldc) {
    sgemm_on(kernel_named(kernel, "sgemm_with_kernel"),
             {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
}

void transpose_pad_f32(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t dst_ld,
                       int64_t dst_cols) {
    NL_CHECK(rows >= 0 && cols >= 0 && dst_cols >= rows, "transpose_pad_f32: rows ", rows, ", dst_cols ", dst_cols);
    int64_t q0 = 0;
#ifdef NL_SGEMM_X86
    static const bool avx512 = cpu_has_avx512();
    if (avx512) {
        // Whole 16-column strips of src through the block transpose; a block of fewer than 16 rows
        // reads zeros for the rest, which become dst's zero columns up to a multiple of 16.
        for (; q0 + 16 <= cols; q0 += 16) {
            int64_t i0 = 0;
            for (; i0 < rows; i0 += 16) {
                const int64_t block_rows = std::min<int64_t>(16, rows - i0);
                const int lanes = static_cast<int>(std::min<int64_t>(16, dst_cols - i0));
                transpose_16x16_avx512(src + i0 * ld + q0, ld, static_cast<int>(block_rows), dst + q0 * dst_ld + i0,
                                       dst_ld, lanes);
            }
            const int64_t written = std::min(i0, dst_cols);  // the blocks' lanes, zeros included
            for (int64_t q = q0; q < q0 + 16; ++q) std::fill(dst + q * dst_ld + written, dst + q * dst_ld + dst_cols, 0.0f);
        }
    }
#endif
    for (int64_t q = q0; q < cols; ++q) {  // the columns left, one at a time
        float* row = dst + q * dst_ld;
        for (int64_t i = 0; i < rows; ++i) row[i] = src[i * ld + q];
        std::fill(row + rows, row + dst_cols, 0.0f);
    }
}

}  // namespace nl
