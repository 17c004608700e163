// normlab's bf16 gemm (declared in core/cpu_runtime.h): C = alpha * op(A) op(B) + beta * C with A and B
// in bf16, every sum in f32, and C in f32 or bf16 (rounded once, to nearest even). Two engines, chosen
// at run time (so the portable build has both): bf16 widened to f32 and run on the f32 engine, and
// AVX512-BF16's vdpbf16ps where the CPU has it. The AVX512-BF16 engine is the loop nest of BLIS (Van Zee
// & van de Geijn, TOMS 2015) without the k blocking:
//
//   for jc in n, step NC:
//     pack op(B)[:, jc:jc+nc] into 16-wide panels of k pairs (kp, 16), shared by the threads
//     for each task (one 16-row panel of A x a group of B panels), over the threads:
//       pack op(A) rows [i, i+16) into a panel of k pairs (kp, 16)
//       for each B panel: the micro-kernel sums the whole k into a 16 x 16 f32 tile, then C is written
//
// vdpbf16ps (Intel SDM, "VDPBF16PS") multiplies 16 pairs of bf16 and adds both products to an f32
// lane: lane j += x[2j] y[2j] + x[2j+1] y[2j+1]. So the packed panels hold k in pairs: an A word is
// (op(A)[r][2p], op(A)[r][2p+1]), broadcast to all lanes; a B vector the 16 words
// (op(B)[2p][j], op(B)[2p+1][j]). An odd k's last pair has a zero second half. Products of two bf16
// are exact in f32, so the only rounding is the f32 sums' (and bf16 C's one final rounding); the
// instruction takes denormal inputs as zero and flushes denormal results, below 1.2e-38.
//
// Each tile's whole sum runs in one kernel call (no k blocks, so a bf16 C is rounded once and never
// re-read): the A and B panels (k * 64 bytes each) then stream from L2 for large k, which vdpbf16ps's
// two 64-byte loads per 16 instructions allow. The bits do not depend on the thread count: a tile's
// sum is always the same kernel over the same pairs in the same order.
#include "core/cpu_runtime.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NL_BGEMM_X86 1
#endif

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
constexpr int64_t kBBlockBytes = int64_t(1) << 20;  // a packed B block of about 1 MiB stays in L2

// The 32-bit word of bf16 values (lo, hi): lo in the low half, as vdpbf16ps reads element 2j.
inline uint32_t pair_word(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

// op(A)[i0:i0+rows, :] as a panel of k pairs (kp, 16) of words; rows past `rows` are zero.
void pack_a_pairs(const BGemmArgs& g, int64_t i0, int rows, uint32_t* panel) {
    const int64_t k = g.k, kp = (k + 1) / 2, lda = g.lda;
    if (!g.trans_a) {  // A stored (m, k): row r's pair p is two neighbours a[r][2p], a[r][2p+1]
        for (int r = 0; r < kTile; ++r) {
            if (r >= rows) {
                for (int64_t p = 0; p < kp; ++p) panel[p * kTile + r] = 0u;
                continue;
            }
            const uint16_t* row = g.a + (i0 + r) * lda;  // (k)
            for (int64_t p = 0; p < k / 2; ++p) panel[p * kTile + r] = pair_word(row[2 * p], row[2 * p + 1]);
            if (k % 2 != 0) panel[(kp - 1) * kTile + r] = pair_word(row[k - 1], 0);
        }
        return;
    }
    // A stored (k, m): a pair is the same column of two neighbouring rows.
    for (int64_t p = 0; p < kp; ++p) {
        const uint16_t* lo = g.a + (2 * p) * lda + i0;                              // (rows)
        const uint16_t* hi = 2 * p + 1 < k ? g.a + (2 * p + 1) * lda + i0 : nullptr;  // (rows) or none
        for (int r = 0; r < kTile; ++r)
            panel[p * kTile + r] = r < rows ? pair_word(lo[r], hi != nullptr ? hi[r] : uint16_t(0)) : 0u;
    }
}

// Columns [j0, j0 + cols) of op(B) as a panel of k pairs (kp, 16) of words; columns past `cols` are zero.
void pack_b_pairs(const BGemmArgs& g, int64_t j0, int cols, uint32_t* panel) {
    const int64_t k = g.k, kp = (k + 1) / 2, ldb = g.ldb;
    if (!g.trans_b) {  // B stored (k, n): a pair is the same column of two neighbouring rows
        for (int64_t p = 0; p < kp; ++p) {
            const uint16_t* lo = g.b + (2 * p) * ldb + j0;
            const uint16_t* hi = 2 * p + 1 < k ? g.b + (2 * p + 1) * ldb + j0 : nullptr;
            for (int j = 0; j < kTile; ++j)
                panel[p * kTile + j] = j < cols ? pair_word(lo[j], hi != nullptr ? hi[j] : uint16_t(0)) : 0u;
        }
        return;
    }
    // B stored (n, k): column j of op(B) is row j of the storage, its pairs neighbours.
    for (int j = 0; j < kTile; ++j) {
        if (j >= cols) {
            for (int64_t p = 0; p < kp; ++p) panel[p * kTile + j] = 0u;
            continue;
        }
        const uint16_t* row = g.b + (j0 + j) * ldb;  // (k)
        for (int64_t p = 0; p < k / 2; ++p) panel[p * kTile + j] = pair_word(row[2 * p], row[2 * p + 1]);
        if (k % 2 != 0) panel[(kp - 1) * kTile + j] = pair_word(row[k - 1], 0);
    }
}

// C[i0:i0+rows, j0:j0+cols] from a finished f32 tile (16, 16): alpha * sum (+ beta * C), then
// rounded once to bf16 for a bf16 C. The same scalar arithmetic for every tile, whole or partial.
void store_tile(const BGemmArgs& g, const float* tile, int64_t i0, int64_t j0, int rows, int cols) {
    const bool read_c = g.beta != 0.0f;
    for (int r = 0; r < rows; ++r) {
        const float* sum = tile + r * kTile;  // (16)
        if (g.c_f32) {
            float* row = static_cast<float*>(g.c) + (i0 + r) * g.ldc + j0;
            for (int j = 0; j < cols; ++j) row[j] = read_c ? g.alpha * sum[j] + g.beta * row[j] : g.alpha * sum[j];
        } else {
            uint16_t* row = static_cast<uint16_t*>(g.c) + (i0 + r) * g.ldc + j0;
            for (int j = 0; j < cols; ++j) {
                const float v = read_c ? g.alpha * sum[j] + g.beta * bf16_to_f32(row[j]) : g.alpha * sum[j];
                row[j] = f32_to_bf16(v);
            }
        }
    }
}

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

// A 64-byte-aligned buffer of 32-bit words that only grows, one per thread.
class WordBuffer {
public:
    uint32_t* get(int64_t words) {
        if (words > capacity_) {
            const int64_t rounded = (words + 15) / 16 * 16;
            data_.reset(static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>(rounded) * 4)));
            NL_CHECK(data_ != nullptr, "bf16 gemm pack buffer: out of memory for ", rounded, " words");
            capacity_ = rounded;
        }
        return data_.get();
    }

private:
    struct Free {
        void operator()(uint32_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint32_t, Free> data_;
    int64_t capacity_ = 0;
};

#ifdef NL_BGEMM_X86

bool cpu_has_avx512_bf16() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

// The micro-kernel: tile (16, 16) = sum over kp pairs of A panel (kp, 16) (x) B panel (kp, 16).
// 16 accumulators and one B vector; each A word is broadcast from memory into its vdpbf16ps.
__attribute__((target("avx512f,avx512bf16"))) void kernel_avx512bf16_16x16(int64_t kp, const uint32_t* a,
                                                                          const uint32_t* b, float* tile) {
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
    for (int r = 0; r < 16; ++r) _mm512_store_ps(tile + r * 16, acc[r]);
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
        alignas(64) float tile[kTile * kTile];         // (16, 16)
        for (int64_t jc = 0; jc < g.n; jc += nc_max) {
            const int64_t nc = std::min(nc_max, g.n - jc);
            const int64_t n_panels = (nc + kTile - 1) / kTile;
            // At least 4 tasks per thread where the sizes allow, so a small m also splits along n.
            const int64_t want = threads > 1 ? 4 * threads : 1;
            const int64_t n_groups = std::clamp<int64_t>((want + m_panels - 1) / m_panels, 1, n_panels);
            const int64_t per_group = (n_panels + n_groups - 1) / n_groups;
#pragma omp for schedule(static)
            for (int64_t jp = 0; jp < n_panels; ++jp)
                pack_b_pairs(g, jc + jp * kTile, static_cast<int>(std::min<int64_t>(kTile, nc - jp * kTile)),
                             b_packed + jp * kp * kTile);
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < m_panels * n_groups; ++task) {
                const int64_t i0 = task / n_groups * kTile, group = task % n_groups;
                const int rows = static_cast<int>(std::min<int64_t>(kTile, g.m - i0));
                pack_a_pairs(g, i0, rows, a_panel);
                const int64_t jp_end = std::min(n_panels, (group + 1) * per_group);
                for (int64_t jp = group * per_group; jp < jp_end; ++jp) {
                    kernel_avx512bf16_16x16(kp, a_panel, b_packed + jp * kp * kTile, tile);
                    store_tile(g, tile, i0, jc + jp * kTile, rows,
                               static_cast<int>(std::min<int64_t>(kTile, nc - jp * kTile)));
                }
            }
        }
    }
}

#endif  // NL_BGEMM_X86

// bf16 rows (rows, cols) at src (row stride ld) widened into dst (rows, cols), packed.
void widen(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16) && !omp_in_parallel())
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = bf16_to_f32(src[i * ld + j]);
}

// The portable engine: A and B widened to f32 (exact), one f32 gemm, C rounded once.
void bgemm_widened(const BGemmArgs& g) {
    thread_local std::vector<float> a32, b32, c32;
    const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    a32.resize(static_cast<size_t>(a_rows * a_cols));  // op(A)'s storage (a_rows, a_cols)
    b32.resize(static_cast<size_t>(b_rows * b_cols));  // op(B)'s storage (b_rows, b_cols)
    widen(g.a, a_rows, a_cols, g.lda, a32.data());
    widen(g.b, b_rows, b_cols, g.ldb, b32.data());
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
    if (sgemm_engine_is_native()) {
        sgemm_native(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc);
    } else {
        NL_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && ldc <= INT32_MAX, "gemm sizes exceed int range");
        cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), alpha, a32.data(),
                    static_cast<int>(a_cols), b32.data(), static_cast<int>(b_cols), beta, c, static_cast<int>(ldc));
    }
    if (!g.c_f32) {  // alpha * sum + beta * C, rounded once: store_tile's arithmetic, row by row
        const float* sums = c32.data();
        uint16_t* out = static_cast<uint16_t*>(g.c);
        const float a = g.alpha, b = g.beta;
        const int64_t m = g.m, n = g.n, ldc_out = g.ldc;
#pragma omp parallel for schedule(static) if (m * n >= (int64_t(1) << 16) && !omp_in_parallel())
        for (int64_t i = 0; i < m; ++i) {
            const float* sum = sums + i * n;  // (n)
            uint16_t* row = out + i * ldc_out;  // (n)
            if (b != 0.0f) {
                for (int64_t j = 0; j < n; ++j) row[j] = f32_to_bf16(a * sum[j] + b * bf16_to_f32(row[j]));
            } else {
                for (int64_t j = 0; j < n; ++j) row[j] = f32_to_bf16(a * sum[j]);
            }
        }
    }
}

// Every engine, best first. auto takes the f32 one: on the AVX512-BF16 CPU measured (a virtualized
// Sapphire Rapids Xeon, AMX not exposed) vdpbf16ps retires at half the rate of an f32 FMA per core
// (its 64 FLOP per instruction against the FMA's two 32-FLOP instructions per cycle:
// docs/benchmarks.md), so widening bf16 and running the f32 engine is the faster; NORMLAB_GEMM_BF16=
// avx512bf16 asks for the vdpbf16ps engine.
struct BEngine {
    const char* key;  // NORMLAB_GEMM_BF16's name for it
    void (*run)(const BGemmArgs&);
    bool (*cpu_runs)();
    bool automatic;   // auto may take it
};

bool always() { return true; }

const BEngine kEngines[] = {
#ifdef NL_BGEMM_X86
    {"avx512bf16", bgemm_avx512bf16, cpu_has_avx512_bf16, false},
#endif
    {"f32", bgemm_widened, always, true},
};

const BEngine& engine_named(const std::string& name, const char* what) {
    std::string known;
    for (const BEngine& e : kEngines) {
        if (name == e.key) {
            NL_REQUIRE(e.cpu_runs(), what, ": this CPU cannot run normlab's ", name, " bf16 gemm (it lacks AVX512-BF16)");
            return e;
        }
        known += std::string(e.key) + ", ";
    }
    NL_REQUIRE(false, what, ": expected auto, ", known.substr(0, known.size() - 2), ", found '", name, "'");
    return kEngines[0];  // not reached
}

struct Choice {
    const BEngine* engine;
    std::string reason;
};

Choice choose() {
    const char* env = std::getenv("NORMLAB_GEMM_BF16");
    const std::string want = env == nullptr || *env == '\0' ? "auto" : env;
    if (want != "auto") return {&engine_named(want, "NORMLAB_GEMM_BF16"), "NORMLAB_GEMM_BF16=" + want};
    for (const BEngine& e : kEngines) {
        if (!e.automatic || !e.cpu_runs()) continue;
#ifdef NL_BGEMM_X86
        if (cpu_has_avx512_bf16())
            return {&e, "auto: this CPU has AVX512-BF16, but vdpbf16ps runs at half the f32 FMA rate on the CPUs "
                        "measured (NORMLAB_GEMM_BF16=avx512bf16 asks for it); AMX is not used"};
#endif
        return {&e, "auto: this CPU lacks AVX512-BF16; AMX is not used"};
    }
    return {&kEngines[0], ""};  // not reached: f32 runs everywhere
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

const char* bgemm_engine_name() {
    static const std::string name = chosen().engine->run == bgemm_widened
                                        ? std::string("bf16 widened to f32, then ") + sgemm_engine_name()
                                        : std::string("normlab avx512-bf16 16x16 (vdpbf16ps)");
    return name.c_str();
}

std::string bgemm_engine_reason() { return chosen().reason; }

std::vector<std::string> bgemm_kernels_this_cpu_runs() {
    std::vector<std::string> out;
    for (const BEngine& e : kEngines)
        if (e.cpu_runs()) out.emplace_back(e.key);
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
