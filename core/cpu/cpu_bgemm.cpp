// normlab's bf16 gemm (declared in core/cpu_runtime.h): C = alpha * op(A) op(B) + beta * C with A and B
// in bf16, every sum in f32, and C in f32 or bf16 (rounded once, to nearest even). Three engines, chosen
// at run time (so the portable build has them all): AMX tiles (tdpbf16ps) where the CPU has AMX-BF16 and
// Linux grants the tile data, AVX512-BF16's vdpbf16ps where the CPU has it, and bf16 widened to f32 and
// run on the f32 engine everywhere. The two bf16 engines are the loop nest of BLIS (Van Zee & van de
// Geijn, TOMS 2015) without the k blocking:
//
//   for jc in n, step NC:
//     pack op(B)[:, jc:jc+nc] into 16-wide panels of k pairs (kp, 16), shared by the threads
//     for each task (one MR-row panel of A x a group of B panels), over the threads:
//       pack op(A) rows [i, i+MR) (the layout the engine reads)
//       for each NR-wide group of B panels: the micro-kernel sums the whole k into an MR x NR f32
//       tile, then C is written
//
// Both instructions multiply pairs of bf16 and add both products to an f32 lane: vdpbf16ps (Intel SDM,
// "VDPBF16PS") lane j += x[2j] y[2j] + x[2j+1] y[2j+1]; tdpbf16ps (Intel SDM, "TDPBF16PS") the same for
// each element of a 16 x 16 tile over the 16 pairs of a 16 x 32 A tile and a 16-pair x 16 B tile. So
// B is packed in k pairs: a B panel's row p holds the 16 words (op(B)[2p][j], op(B)[2p+1][j]), which is
// both vdpbf16ps's B vector and a row of an AMX B tile ("VNNI layout"). An odd k's last pair has a zero
// second half; AMX pads k to whole 32-wide tiles with zero pairs, which add exact zeros. Products of
// two bf16 are exact in f32, so the only rounding is the f32 sums' (and bf16 C's one final rounding);
// both instructions take denormal inputs as zero and flush denormal results, below 1.2e-38.
//
// Each tile's whole sum runs in one kernel call (no k blocks, so a bf16 C is rounded once and never
// re-read): the A and B panels then stream from L2 for large k. The bits do not depend on the thread
// count: a tile's sum is always the same kernel over the same pairs in the same order.
#include "core/cpu/cpu_engine_choice.h"
#include "core/cpu/cpu_math.h"
#include "core/cpu_runtime.h"

#include <cblas.h>
#include <omp.h>

#include <cerrno>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define NL_BGEMM_X86 1
#endif
#if defined(__linux__) && defined(NL_BGEMM_X86)
#include <sys/syscall.h>
#include <unistd.h>
#define NL_BGEMM_AMX 1
#endif

#include "core/cpu/cpu_sgemm.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nl {

namespace {

struct BGemmArgs {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha;
    const uint16_t* a;
    int64_t lda;
    const uint16_t* b;
    int64_t ldb;
    float beta;
    void* c;
    bool c_f32;
    int64_t ldc;
};

constexpr int kTile = 16;                          // MR = NR = 16
constexpr int64_t kThreadedMinWork = int64_t(64) * 64 * 64;  // below: the calling thread alone
// A packed B block of up to 4 MiB. A kernel call reads a B panel at 64 bytes per 16 vdpbf16ps, which
// L3 keeps up with; each block re-packs all of A, and blocks sized for L2 (1 MiB) made a weight
// gradient (k = tokens, A read across the rows of its storage) pack A 2 to 4 times.
constexpr int64_t kBBlockBytes = int64_t(4) << 20;

// One operand of the sum as the kernels read it: `lines` 16 at a time (A's rows of op(A), B's columns
// of op(B)), each a run of k values. `k_inner`: a line's k values are neighbours in memory (A stored
// (m, k), B stored (n, k)), else a line is a column of a (k, lines) storage (A stored (k, m), B stored
// (k, n)). ld is the storage's row stride.
struct PairOperand {
    const uint16_t* data;
    int64_t ld;
    bool k_inner;
};
inline PairOperand a_operand(const BGemmArgs& g) { return {g.a, g.lda, !g.trans_a}; }
inline PairOperand b_operand(const BGemmArgs& g) { return {g.b, g.ldb, g.trans_b}; }

// Lines [j0, j0 + lines) of `s` as a panel of k pairs (kp_padded, 16) of words: panel row p holds the
// 16 lines' words (value 2p, value 2p + 1). Lines past `lines` and pairs past k are zero. AVX-512 code
// (defined below), which every CPU that runs the bf16 instructions has.
#ifdef NL_BGEMM_X86
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_pairs(const PairOperand& s, int64_t k, int64_t j0,
                                                                      int lines, int64_t kp_padded, uint32_t* panel);
#endif

// An empty sum (k == 0): C = beta * C, and beta == 0 does not read C.
void scale_c(const BGemmArgs& g) {
    for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < g.n; ++j) {
            if (g.c_f32) {
                float& v = static_cast<float*>(g.c)[i * g.ldc + j];
                v = g.beta == 0.0f ? 0.0f : g.beta * v;
            } else {
                uint16_t& v = static_cast<uint16_t*>(g.c)[i * g.ldc + j];
                v = g.beta == 0.0f ? uint16_t(0) : f32_to_bf16(g.beta * bf16_to_f32(v));
            }
        }
    }
}

// GCC 12's own headers trip -Wmaybe-uninitialized in the masked and widening intrinsics below (their
// _mm512_undefined operands; GCC bug 105593): the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#ifdef NL_BGEMM_X86

// The engine's packs are AVX-512 BW/VL code (every CPU with AVX512-BF16 so far has both).
bool cpu_has_avx512_bf16() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// C[i, j:j+n] (n <= 16) from 16 f32 sums: alpha * sum (+ beta * C where beta != 0), then for a bf16 C
// rounded once to nearest even by f32_to_bf16's rule (core/dtype.h: add 0x7fff plus the lowest kept
// bit, truncate; a NaN stays a quiet NaN). The one epilogue of both bf16 engines, vector for vector the
// operations of the scalar rule, so every tile gets the same bits whichever engine or thread made it.
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void store_sums_16(const BGemmArgs& g,
                                                                                         __m512 sums, int64_t i,
                                                                                         int64_t j, int n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
    const __m512 scaled = _mm512_mul_ps(_mm512_set1_ps(g.alpha), sums);
    const __m512 beta = _mm512_set1_ps(g.beta);
    const bool read_c = g.beta != 0.0f;
    if (g.c_f32) {
        float* c = static_cast<float*>(g.c) + i * g.ldc + j;
        _mm512_mask_storeu_ps(c, mask, read_c ? _mm512_add_ps(scaled, _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask, c)))
                                              : scaled);
        return;
    }
    uint16_t* c = static_cast<uint16_t*>(g.c) + i * g.ldc + j;
    __m512 v = scaled;
    if (read_c) {
        const __m512 old = cpu_math::bf16x16_to_f32(_mm256_maskz_loadu_epi16(mask, c));
        v = _mm512_add_ps(scaled, _mm512_mul_ps(beta, old));
    }
    _mm256_mask_storeu_epi16(c, mask, cpu_math::f32x16_to_bf16x16(v));
}

// The micro-kernel: C[i0:i0+rows, j0:j0+cols] from the (16, 16) sums over kp pairs of A panel (kp, 16)
// (x) B panel (kp, 16). 16 accumulators and one B vector; each A word is broadcast from memory into its
// vdpbf16ps; the sums go from the registers to C.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void kernel_avx512bf16_16x16(
    int64_t kp, const uint32_t* a, const uint32_t* b, const BGemmArgs& g, int64_t i0, int64_t j0, int rows, int cols) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t p = 0; p < kp; ++p) {
        const __m512bh bp = (__m512bh)_mm512_load_si512(b);  // (16 words): k pair p of the B panel
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r)
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r])), bp);
        a += 16;
        b += 16;
    }
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
        if (r < rows) store_sums_16(g, acc[r], i0 + r, j0, cols);
}

// `trips` rounds of 16 vdpbf16ps over 16 accumulator registers alone (independent, so the
// instruction's throughput and not its latency sets the pace; the products of bf16 1.0 and the
// smallest bf16 keep the sums finite): the instruction's rate on this core, for benchmarks.
__attribute__((target("avx512f,avx512bf16"), noinline)) float avx512bf16_register_loop(int64_t trips) {
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);        // pairs of bf16 1.0
    const __m512bh y = (__m512bh)_mm512_set1_epi32(0x00010001);  // pairs of the smallest bf16
    for (int64_t t = 0; t < trips; ++t) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
        __asm__ volatile("" : "+v"(x));  // keeps the loop from being folded
    }
    __m512 sum = acc[0];
    for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    float total = 0;
    for (float v : lanes) total += v;
    return total;
}

void bgemm_avx512bf16(const BGemmArgs& g) {
    const int64_t kp = (g.k + 1) / 2;
    const int64_t m_panels = (g.m + kTile - 1) / kTile;
    const int64_t nc_max =
        std::max<int64_t>(kTile, std::min<int64_t>((g.n + kTile - 1) / kTile * kTile, kBBlockBytes / (kp * 64) * kTile));
    const int threads = omp_in_parallel() || g.m * g.n * g.k < kThreadedMinWork ? 1 : omp_get_max_threads();
    thread_local WordBuffer b_buffer;  // the calling thread's, shared with its team
    uint32_t* b_packed = b_buffer.get(kp * nc_max);  // (nc / 16 panels, kp, 16)
#pragma omp parallel num_threads(threads)
    {
        thread_local WordBuffer a_buffer;
        uint32_t* a_panel = a_buffer.get(kp * kTile);  // (kp, 16)
        for (int64_t jc = 0; jc < g.n; jc += nc_max) {
            const int64_t nc = std::min(nc_max, g.n - jc);
            const int64_t n_panels = (nc + kTile - 1) / kTile;
            // At least 4 tasks per thread where the sizes allow, so a small m also splits along n.
            const int64_t want = threads > 1 ? 4 * threads : 1;
            const int64_t n_groups = std::clamp<int64_t>((want + m_panels - 1) / m_panels, 1, n_panels);
            const int64_t per_group = (n_panels + n_groups - 1) / n_groups;
#pragma omp for schedule(static)
            for (int64_t jp = 0; jp < n_panels; ++jp)
                pack_pairs(b_operand(g), g.k, jc + jp * kTile, static_cast<int>(std::min<int64_t>(kTile, nc - jp * kTile)),
                           kp, b_packed + jp * kp * kTile);
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < m_panels * n_groups; ++task) {
                const int64_t i0 = task / n_groups * kTile, group = task % n_groups;
                const int rows = static_cast<int>(std::min<int64_t>(kTile, g.m - i0));
                pack_pairs(a_operand(g), g.k, i0, rows, kp, a_panel);
                const int64_t jp_end = std::min(n_panels, (group + 1) * per_group);
                for (int64_t jp = group * per_group; jp < jp_end; ++jp) {
                    kernel_avx512bf16_16x16(kp, a_panel, b_packed + jp * kp * kTile, g, i0, jc + jp * kTile, rows,
                                            static_cast<int>(std::min<int64_t>(kTile, nc - jp * kTile)));
                }
            }
        }
    }
}

// pack_pairs, 16 pairs at a time. Lines across the storage (!k_inner): a panel row is two
// storage rows' 16 values interleaved (lo in the low half). Lines along the storage (k_inner): the 16
// lines' rows hold their pairs as words already, so 16 words of each of the 16 rows are loaded and
// transposed.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_pairs(const PairOperand& s, int64_t k, int64_t j0,
                                                                      int lines, int64_t kp_padded, uint32_t* panel) {
    const int64_t kp = (k + 1) / 2, ld = s.ld;
    const __mmask16 line_mask = static_cast<__mmask16>((1u << lines) - 1u);
    std::memset(panel + kp * kTile, 0, static_cast<size_t>((kp_padded - kp) * kTile) * 4);
    if (!s.k_inner) {
        for (int64_t p = 0; p < kp; ++p) {
            const __m256i lo = _mm256_maskz_loadu_epi16(line_mask, s.data + (2 * p) * ld + j0);
            const __m256i hi =
                2 * p + 1 < k ? _mm256_maskz_loadu_epi16(line_mask, s.data + (2 * p + 1) * ld + j0) : _mm256_setzero_si256();
            _mm512_store_si512(panel + p * kTile, _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                                                  _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
        }
        return;
    }
    for (int64_t p0 = 0; p0 < kp; p0 += 16) {
        // Values [2 p0, 2 p0 + 32) of each line's row, past k zero: 16 words a row.
        const int64_t values = std::min<int64_t>(32, k - 2 * p0);
        const __mmask32 k_mask = values >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << values) - 1u);
        __m512i words[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j)
            words[j] = j < lines ? _mm512_maskz_loadu_epi16(k_mask, s.data + (j0 + j) * ld + 2 * p0) : _mm512_setzero_si512();
        cpu_math::transpose_16x16_words(words);  // words[p][j]: pair p0 + p of line j
        const int64_t count = std::min<int64_t>(16, kp - p0);
        // Unrolled, so each words[p] is a register: an index known only at run time kept all 16 on
        // the stack, a store and a load of each.
#pragma GCC unroll 16
        for (int p = 0; p < 16; ++p)
            if (p < count) _mm512_store_si512(panel + (p0 + p) * kTile, words[p]);
    }
}

#endif  // NL_BGEMM_X86

#ifdef NL_BGEMM_AMX

// ---- AMX: tdpbf16ps on 16 x 16 f32 tiles ----
// Linux keeps AMX's 8 KiB of tile data out of a process until it asks (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA: the kernel's Documentation/arch/x86/xstate.rst); the grant is for the whole process.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct AmxStatus {
    bool usable;
    std::string why;  // what the CPU has and what the kernel said
};

const AmxStatus& amx_status() {
    static const AmxStatus status = []() -> AmxStatus {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        // CPUID.(EAX=7, ECX=0):EDX bit 22 is AMX-BF16, bit 24 AMX-TILE (Intel SDM vol. 2, CPUID).
        const bool has = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (edx >> 22 & 1u) != 0 &&
                         (edx >> 24 & 1u) != 0;
        if (!has) return {false, "this CPU lacks AMX-BF16"};
        // The packs and stores around the tiles are AVX-512 (every AMX CPU so far has it).
        if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
            return {false, "this CPU has AMX-BF16 but lacks AVX512-BW/VL, which the AMX engine's packs use"};
        if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
            return {false, std::string("this CPU has AMX-BF16 but Linux refused its tile data (arch_prctl "
                                       "ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) + ")"};
        }
        return {true, "this CPU has AMX-BF16 and Linux granted its tile data"};
    }();
    return status;
}

constexpr int kAmxRows = 32;      // MR: two 16-row A tiles
constexpr int kAmxCols = 32;      // NR: two 16-column B tiles
constexpr int64_t kAmxPairs = 16;  // k pairs in one tile: 32 bf16, a 64-byte tile row

// The tile configuration (Intel SDM, LDTILECFG, palette 1): tiles 0-3 hold the 2 x 2 f32 sums (16 rows
// of 16 floats), 4-5 the two A tiles (16 rows of 16 pairs), 6-7 the two B tiles (16 pairs of 16 columns):
// every one 16 rows of 64 bytes.
struct alignas(64) AmxTileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};


// pack_a_amx's blocks [q_begin, q_end) for A stored (k, m): per block of 16 pairs, the 16 pair words of each of 16 columns of
// the storage are made from two rows (lo in the low half), then transposed to the tile's rows.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a_amx_transposed(const BGemmArgs& g, int64_t i0,
                                                                                 int rows, int64_t q_begin,
                                                                                 int64_t q_end, uint32_t* panel) {
    const int64_t k = g.k;
    const __mmask16 row_mask = static_cast<__mmask16>((1u << rows) - 1u);
    for (int64_t q = q_begin; q < q_end; ++q) {
        __m512i words[16];  // words[p][r]: pair 16q + p of row r
        for (int p = 0; p < 16; ++p) {
            const int64_t lo_k = 2 * (q * kAmxPairs + p), hi_k = lo_k + 1;
            const __m256i lo = lo_k < k ? _mm256_maskz_loadu_epi16(row_mask, g.a + lo_k * g.lda + i0) : _mm256_setzero_si256();
            const __m256i hi = hi_k < k ? _mm256_maskz_loadu_epi16(row_mask, g.a + hi_k * g.lda + i0) : _mm256_setzero_si256();
            words[p] = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        }
        cpu_math::transpose_16x16_words(words);
        for (int r = 0; r < 16; ++r) _mm512_store_si512(panel + ((q - q_begin) * 16 + r) * kAmxPairs, words[r]);
    }
}

// A finished (32, 32) AMX tile (rows, cols) into C, one row of 16 sums at a time.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void store_tile_amx(const BGemmArgs& g, const float* tile, int64_t i0,
                                                                int64_t j0, int rows, int cols) {
    for (int r = 0; r < rows; ++r)
        for (int half = 0; half * 16 < cols; ++half)
            store_sums_16(g, _mm512_load_ps(tile + r * kAmxCols + half * 16), i0 + r, j0 + half * 16,
                          std::min(16, cols - half * 16));
}


// Blocks [q_begin, q_end) of op(A) rows [i0, i0 + rows) as 16 x 16-word tiles (q_end - q_begin, 16,
// 16): block q holds k pairs [16q, 16q + 16) of the 16 rows, one 64-byte row each, as an AMX A tile
// reads them. Rows past `rows` and pairs past k are zero.
void pack_a_amx(const BGemmArgs& g, int64_t i0, int rows, int64_t q_begin, int64_t q_end, uint32_t* panel) {
    if (q_end <= q_begin) return;
    if (g.trans_a) return pack_a_amx_transposed(g, i0, rows, q_begin, q_end, panel);  // A stored (k, m)
    // A stored (m, k): a tile row is 32 neighbouring bf16 of one A row, copied as they are.
    std::memset(panel, 0, static_cast<size_t>((q_end - q_begin) * 16 * kAmxPairs) * 4);
    for (int r = 0; r < rows; ++r) {
        const uint16_t* row = g.a + (i0 + r) * g.lda;  // (k)
        for (int64_t q = q_begin; q < q_end; ++q) {
            const int64_t first = q * 2 * kAmxPairs, count = std::min<int64_t>(2 * kAmxPairs, g.k - first);
            if (count > 0)
                std::memcpy(panel + ((q - q_begin) * 16 + r) * kAmxPairs, row + first, static_cast<size_t>(count) * 2);
        }
    }
}

// The micro-kernel: tile (32, 32) += the sum over `blocks` k blocks of A tiles (x) B panels b0, b1
// (blocks * 16 pairs, 16 words); `tile` starts from zero unless `accumulate`. The two A tiles of block
// q (rows 0-15 and 16-31) are 16 rows `a_stride` bytes apart at a0 and a1 + q * a_step bytes: a packed
// panel (a_step 1 KiB, a_stride 64) or A itself (a_step 64, a_stride its row in bytes). The four sums
// stay in tiles 0-3 over the blocks; between calls they rest in `tile` as f32, which holds them
// exactly, so a sum split over several calls has the bits of one call over all the blocks.
__attribute__((target("amx-tile,amx-bf16"))) void kernel_amx_32x32(int64_t blocks, const void* a0, const void* a1,
                                                                   int64_t a_step, int64_t a_stride,
                                                                   const uint32_t* b0, const uint32_t* b1, float* tile,
                                                                   bool accumulate) {
    constexpr int stride = kAmxCols * 4;  // bytes per row of `tile`
    if (accumulate) {
        _tile_loadd(0, tile, stride);
        _tile_loadd(1, tile + 16, stride);
        _tile_loadd(2, tile + 16 * kAmxCols, stride);
        _tile_loadd(3, tile + 16 * kAmxCols + 16, stride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    const char* a0_bytes = static_cast<const char*>(a0);
    const char* a1_bytes = static_cast<const char*>(a1);
    for (int64_t q = 0; q < blocks; ++q) {
        const int64_t at = q * 16 * kAmxPairs;  // words: a 1 KiB B tile
        _tile_loadd(4, a0_bytes + q * a_step, a_stride);
        _tile_loadd(6, b0 + at, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + at, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1_bytes + q * a_step, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, tile, stride);
    _tile_stored(1, tile + 16, stride);
    _tile_stored(2, tile + 16 * kAmxCols, stride);
    _tile_stored(3, tile + 16 * kAmxCols + 16, stride);
}

__attribute__((target("amx-tile"))) void amx_load_config() {
    static const AmxTileConfig config;
    _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

// `trips` rounds of 16 tdpbf16ps over the tile registers alone (A = B = bf16 ones, four sums): the
// instruction's throughput on this core, for benchmarks.
__attribute__((target("amx-tile,amx-bf16"), noinline)) float amx_register_loop(int64_t trips) {
    alignas(64) uint16_t ones[16 * 32];  // (16, 32) bf16 1.0
    for (uint16_t& v : ones) v = 0x3f80;
    alignas(64) float sums[16 * 16];
    amx_load_config();
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < trips; ++t) {
        for (int r = 0; r < 4; ++r) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, sums, 64);
    amx_release();
    return sums[0];
}

// The AMX loop nest: all of op(B) packed once and shared (k * n * 2 bytes: it stays in L2 for the
// model's shapes); each task takes 32 rows of op(A) and runs k in chunks of kAmxChunkBlocks tile
// blocks (256 k), each chunk over all its column groups, so the chunk of A stays in L1 while the B
// chunks stream from L2. The partial sums of a group wait in `sums` (f32, exact) between chunks.
// A stored (m, k) is read in place by the tile loads (a tile is 16 rows of 32 neighbouring bf16),
// but for a task of fewer than 32 rows and for a last k block past k, which are packed with zeros;
// A stored (k, m) is packed (transposed into tile rows).
constexpr int64_t kAmxChunkBlocks = 8;

void bgemm_amx(const BGemmArgs& g) {
    const int64_t kp_padded = ((g.k + 1) / 2 + kAmxPairs - 1) / kAmxPairs * kAmxPairs;
    const int64_t blocks = kp_padded / kAmxPairs;
    const int64_t panel_words = kp_padded * kTile;  // one 16-wide packed panel, A's or B's
    const int64_t m_panels = (g.m + kAmxRows - 1) / kAmxRows;
    const int64_t n_groups32 = (g.n + kAmxCols - 1) / kAmxCols;  // 32-column groups: two B panels each
    const int threads = omp_in_parallel() || g.m * g.n * g.k < kThreadedMinWork ? 1 : omp_get_max_threads();
    // At least 4 tasks per thread where the sizes allow, so a small m also splits along n.
    const int64_t want = threads > 1 ? 4 * threads : 1;
    const int64_t n_groups = std::clamp<int64_t>((want + m_panels - 1) / m_panels, 1, n_groups32);
    const int64_t per_group = (n_groups32 + n_groups - 1) / n_groups;
    constexpr int64_t kTileBytes = 16 * kAmxPairs * 4;  // a packed tile: 16 rows of 64 bytes
    thread_local WordBuffer b_buffer;  // the calling thread's, shared with its team
    uint32_t* b_packed = b_buffer.get(panel_words * 2 * n_groups32);  // (2 * n_groups32 panels, kp_padded, 16)
#pragma omp parallel num_threads(threads)
    {
        thread_local WordBuffer a_buffer, sums_buffer;
        uint32_t* a_panels = a_buffer.get(2 * panel_words);  // 2 x (blocks, 16, 16)
        float* sums = reinterpret_cast<float*>(sums_buffer.get(per_group * kAmxRows * kAmxCols));  // (per_group, 32, 32)
        amx_load_config();
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < 2 * n_groups32; ++jp) {  // a panel past n is all zeros
            const int cols = static_cast<int>(std::clamp<int64_t>(g.n - jp * kTile, 0, kTile));
            pack_pairs(b_operand(g), g.k, jp * kTile, cols, kp_padded, b_packed + jp * panel_words);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < m_panels * n_groups; ++task) {
            const int64_t i0 = task / n_groups * kAmxRows, group = task % n_groups;
            const int rows = static_cast<int>(std::min<int64_t>(kAmxRows, g.m - i0));
            // Blocks [0, in_place) come from A itself, blocks [in_place, blocks) from the packed panels.
            const int64_t in_place = !g.trans_a && rows == kAmxRows ? g.k / (2 * kAmxPairs) : 0;
            pack_a_amx(g, i0, std::min(rows, kTile), in_place, blocks, a_panels);
            pack_a_amx(g, i0 + kTile, std::max(rows - kTile, 0), in_place, blocks, a_panels + panel_words);
            const uint16_t* a_rows = g.a + i0 * g.lda;  // A in place: row i0 (stored (m, k))
            const int64_t jg_begin = group * per_group, jg_end = std::min(n_groups32, jg_begin + per_group);
            for (int64_t q = 0; q < blocks; q += kAmxChunkBlocks) {
                const int64_t q_end = std::min(blocks, q + kAmxChunkBlocks), q_mid = std::clamp(in_place, q, q_end);
                for (int64_t jg = jg_begin; jg < jg_end; ++jg) {
                    const uint32_t* b = b_packed + 2 * jg * panel_words;
                    float* tile = sums + (jg - jg_begin) * kAmxRows * kAmxCols;
                    if (q_mid > q) {  // in place: 32 bf16 (64 bytes) a block, rows lda apart
                        kernel_amx_32x32(q_mid - q, a_rows + q * 2 * kAmxPairs, a_rows + kTile * g.lda + q * 2 * kAmxPairs,
                                         64, g.lda * 2, b + q * kTileBytes / 4, b + panel_words + q * kTileBytes / 4, tile,
                                         q > 0);
                    }
                    if (q_end > q_mid) {  // packed
                        const int64_t at = (q_mid - in_place) * kTileBytes / 4;
                        kernel_amx_32x32(q_end - q_mid, a_panels + at, a_panels + panel_words + at, kTileBytes, 64,
                                         b + q_mid * kTileBytes / 4, b + panel_words + q_mid * kTileBytes / 4, tile,
                                         q_mid > 0);
                    }
                }
            }
            for (int64_t jg = jg_begin; jg < jg_end; ++jg)
                store_tile_amx(g, sums + (jg - jg_begin) * kAmxRows * kAmxCols, i0, jg * kAmxCols, rows,
                               static_cast<int>(std::min<int64_t>(kAmxCols, g.n - jg * kAmxCols)));
        }
        amx_release();  // tiles back to their initial state: the kernel's context switches save less
    }
}

#endif  // NL_BGEMM_AMX
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// bf16 rows (rows, cols) at src (row stride ld) widened into dst (rows, cols), packed.
void widen(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16) && !omp_in_parallel())
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = bf16_to_f32(src[i * ld + j]);
}

// The portable engine: A and B widened to f32 (exact) by the packs of normlab's f32 kernel, which also
// round a bf16 C block by block (sgemm_native_bf16: on an AVX2-only CPU too, where f32 gemms stay on
// OpenBLAS); where no normlab kernel runs (or NORMLAB_GEMM=openblas), widened copies, one OpenBLAS
// gemm, then C rounded once in a pass of its own.
void bgemm_widened(const BGemmArgs& g) {
    if (sgemm_bf16_kernel() != nullptr) {
        sgemm_native_bf16(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, g.c, g.c_f32,
                          g.ldc);
        return;
    }
    thread_local std::vector<float> a32, b32, c32;
    float* c = static_cast<float*>(g.c);
    int64_t ldc = g.ldc;
    float beta = g.beta;
    if (!g.c_f32) {  // the f32 sums land in c32 (m, n); C gets alpha * sum + beta * C, rounded once
        c32.resize(static_cast<size_t>(g.m * g.n));
        c = c32.data();
        ldc = g.n;
        beta = 0.0f;
    }
    const float alpha = g.c_f32 ? g.alpha : 1.0f;
    const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    a32.resize(static_cast<size_t>(a_rows * a_cols));  // op(A)'s storage (a_rows, a_cols)
    b32.resize(static_cast<size_t>(b_rows * b_cols));  // op(B)'s storage (b_rows, b_cols)
    widen(g.a, a_rows, a_cols, g.lda, a32.data());
    widen(g.b, b_rows, b_cols, g.ldb, b32.data());
    NL_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && ldc <= INT32_MAX, "gemm sizes exceed int range");
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), alpha, a32.data(),
                static_cast<int>(a_cols), b32.data(), static_cast<int>(b_cols), beta, c, static_cast<int>(ldc));
    if (!g.c_f32) {  // alpha * sum + beta * C, rounded once, row by row
        const float* sums = c32.data();
        uint16_t* out = static_cast<uint16_t*>(g.c);
        const int64_t m = g.m, n = g.n;
#pragma omp parallel for schedule(static) if (m * n >= (int64_t(1) << 16) && !omp_in_parallel())
        for (int64_t i = 0; i < m; ++i) round_sums_to_bf16(sums + i * n, n, out + i * g.ldc, g.ldc, 1, n, g.alpha, g.beta);
    }
}

// Every engine. auto takes the fastest this CPU runs, as measured on this machine: AMX's tdpbf16ps
// (1,024 FLOP per cycle per core, 16x an f32 FMA's 64) where Linux grants its tile data; vdpbf16ps,
// which retires at half the f32 FMA's rate on one CPU measured (a Sapphire Rapids Xeon) and at twice
// it on another (a Zen 4 EPYC: docs/benchmarks.md), so that no rule by CPU picks it right; or bf16
// widened into the f32 engine's packs.
struct BEngine {
    const char* key;  // NORMLAB_GEMM_BF16's name for it
    void (*run)(const BGemmArgs&);
    std::string (*why_not)();  // empty where this CPU runs it, else why not
};

std::string runs_everywhere() { return ""; }

#ifdef NL_BGEMM_AMX
std::string amx_why_not() { return amx_status().usable ? "" : amx_status().why; }
#endif
#ifdef NL_BGEMM_X86
std::string avx512bf16_why_not() {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return "this CPU lacks AVX512-BF16";
    return cpu_has_avx512_bf16() ? "" : "this CPU has AVX512-BF16 but lacks AVX512-BW/VL, which the engine's packs use";
}
#endif

const BEngine kEngines[] = {
#ifdef NL_BGEMM_AMX
    {"amx", bgemm_amx, amx_why_not},
#endif
#ifdef NL_BGEMM_X86
    {"avx512bf16", bgemm_avx512bf16, avx512bf16_why_not},
#endif
    {"f32", bgemm_widened, runs_everywhere},
};

// The engine named `name`, which must run here; throws nl::Error otherwise, naming what `what`
// accepts: NORMLAB_GEMM_BF16 (`environment`) also takes auto, bgemm_with_kernel an engine's name only.
const BEngine& engine_named(const std::string& name, const char* what, bool environment = false) {
    std::string known;
    for (const BEngine& e : kEngines) {
        if (name == e.key) {
            const std::string why_not = e.why_not();
            NL_REQUIRE(why_not.empty(), what, ": normlab's ", name, " bf16 gemm cannot run here: ", why_not);
            return e;
        }
        known += std::string(e.key) + ", ";
    }
    NL_REQUIRE(false, what, environment ? ": expected auto, " : ": expected an engine's name, ",
               known.substr(0, known.size() - 2), ", found '", name, "'");
    return kEngines[0];  // not reached
}

struct Choice {
    const BEngine* engine;
    std::string reason;
    // vdpbf16ps multiplies bf16 at least kEngineMargin times as fast as the widened engine, as
    // measured (or NORMLAB_GEMM_BF16=avx512bf16 asks for it): the fused attention's choice.
    bool vdpbf16ps_beats_widened = false;
};

void run_on(const BEngine& e, const BGemmArgs& g);

// The probe (core/cpu/cpu_engine_choice.h) in bf16: C (m, n) bf16 = A (m, k) B^T, B stored (n, k), a
// Linear's forward under autocast.
struct EngineProbeData {
    const int64_t m = kEngineProbeM, n = kEngineProbeN, k = kEngineProbeK;
    std::vector<uint16_t> a, b, c;
    EngineProbeData() : c(static_cast<size_t>(m * n)) {
        const EngineProbeOperands f32;
        for (float v : f32.a) a.push_back(f32_to_bf16(v));
        for (float v : f32.b) b.push_back(f32_to_bf16(v));
    }
};

Choice choose() {
    const char* env = std::getenv("NORMLAB_GEMM_BF16");
    const std::string want = env == nullptr || *env == '\0' ? "auto" : env;
    if (want != "auto") return {&engine_named(want, "NORMLAB_GEMM_BF16", true), "NORMLAB_GEMM_BF16=" + want, want == "avx512bf16"};
    std::vector<EngineRate> candidates;
    for (const BEngine& e : kEngines) candidates.push_back({e.key, e.why_not()});
    EngineProbeData d;
    const EngineChoice choice = choose_engine_by_rate(
        "bf16", candidates,
        [&d](const std::string& key) {
            run_on(engine_named(key, "NORMLAB_GEMM_BF16"),
                   {false, true, d.m, d.n, d.k, 1.0f, d.a.data(), d.k, d.b.data(), d.k, 0.0f, d.c.data(), false, d.n});
        },
        kEngineProbeFlops);
    std::string absent;
    for (const EngineRate& r : choice.rates)
        if (!r.why_not.empty()) absent += "; " + r.key + " does not run here: " + r.why_not;
    return {&engine_named(choice.key, "NORMLAB_GEMM_BF16"),
            "auto: the fastest measured here, " + choice.rates_text() + absent + "; " + choice.source,
            engine_beats(choice.rates, "avx512bf16", "f32")};
}

const Choice& chosen() {
    static const Choice c = choose();
    return c;
}

void run_on(const BEngine& e, const BGemmArgs& g) {
    NL_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "bgemm: negative size");
    if (g.m == 0 || g.n == 0) return;
    if (g.k == 0) return scale_c(g);
    e.run(g);
}

}  // namespace

#ifdef NL_BGEMM_X86
void pack_bf16_pairs(const uint16_t* data, int64_t ld, bool k_inner, int64_t k, int64_t j0, int lines,
                     int64_t kp_padded, uint32_t* panel) {
    pack_pairs({data, ld, k_inner}, k, j0, lines, kp_padded, panel);
}
#endif

float bgemm_avx512bf16_register_loop(int64_t trips) {
#ifdef NL_BGEMM_X86
    NL_REQUIRE(cpu_has_avx512_bf16(), "the vdpbf16ps register loop cannot run here: this CPU lacks AVX512-BF16");
    return avx512bf16_register_loop(trips);
#else
    NL_REQUIRE(false, "the vdpbf16ps register loop cannot run here: it needs x86-64");
    return 0.0f;
#endif
}

float bgemm_amx_register_loop(int64_t trips) {
#ifdef NL_BGEMM_AMX
    NL_REQUIRE(amx_status().usable, "the AMX register loop cannot run here: ", amx_status().why);
    return amx_register_loop(trips);
#else
    NL_REQUIRE(false, "the AMX register loop cannot run here: AMX needs Linux on x86-64");
    return 0.0f;
#endif
}

const char* bgemm_engine_name() {
    static const std::string name = [] {
        const std::string key = chosen().engine->key;
        if (key == "amx") return std::string("normlab amx 32x32 (tdpbf16ps tiles)");
        if (key == "avx512bf16") return std::string("normlab avx512-bf16 16x16 (vdpbf16ps)");
        if (const char* kernel = sgemm_bf16_kernel(); kernel != nullptr)
            return std::string("bf16 widened to f32 in the packs of normlab's ") + kernel + " kernel";
        return std::string("bf16 widened to f32 copies, then ") + sgemm_engine_name();
    }();
    return name.c_str();
}

std::string bgemm_engine_reason() { return chosen().reason; }

bool bgemm_vdpbf16ps_beats_widened() { return chosen().vdpbf16ps_beats_widened; }

std::vector<std::string> bgemm_kernels_this_cpu_runs() {
    std::vector<std::string> out;
    for (const BEngine& e : kEngines)
        if (e.why_not().empty()) out.emplace_back(e.key);
    return out;
}

void bgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
           int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, bool c_f32, int64_t ldc) {
    run_on(*chosen().engine, {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, c_f32, ldc});
}

void bgemm_with_kernel(const std::string& kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                       void* c, bool c_f32, int64_t ldc) {
    run_on(engine_named(kernel, "bgemm_with_kernel"),
           {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, c_f32, ldc});
}

}  // namespace nl
