// normlab's bf16 gemm (core/cpu/cpu_bgemm.cpp, declared in core/cpu_runtime.h) against an f64 reference on the same bf16 values: every
// engine this CPU runs (an engine it cannot run is reported skipped by name), every transpose pair,
// odd k (a half-empty last pair), partial tiles, padded leading dimensions, alpha/beta, f32 and
// bf16 C, bits that do not depend on the thread count, and matmul's bf16 path.
#include <catch2/catch.hpp>
#include <cblas.h>
#include <omp.h>

#if defined(__linux__) && defined(__x86_64__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#define NL_TEST_SECCOMP 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/cpu/cpu_sgemm.h"  // sgemm_bf16_with_kernel, sgemm_bf16_kernel
#include "core/cpu_runtime.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/tensor.h"

using namespace nl;

namespace {

struct Case {
    bool trans_a, trans_b;
    int64_t m, n, k;
};

// bf16 values in [-1, 1) from a fixed linear congruential sequence: the same on every machine.
std::vector<uint16_t> bf16_values(int64_t count, uint32_t seed) {
    std::vector<uint16_t> out(static_cast<size_t>(count));
    uint32_t s = seed;
    for (uint16_t& v : out) {
        s = s * 1664525u + 1013904223u;
        v = f32_to_bf16(static_cast<float>(s >> 8) / 8388608.0f - 1.0f);
    }
    return out;
}

struct Result {
    std::vector<float> c32;      // (m, ldc) when f32 C
    std::vector<uint16_t> c16;   // (m, ldc) when bf16 C
    std::vector<uint16_t> a, b;  // the operands' storage
    std::vector<float> c0;       // C before, as f32 values
    int64_t lda, ldb, ldc;
};

// One engine's C for `t`, with leading dimensions 3 wider than the rows they hold.
Result run_case(const std::string& engine, const Case& t, float alpha, float beta, bool c_f32) {
    Result r;
    const int64_t a_rows = t.trans_a ? t.k : t.m, a_cols = t.trans_a ? t.m : t.k;
    const int64_t b_rows = t.trans_b ? t.n : t.k, b_cols = t.trans_b ? t.k : t.n;
    r.lda = a_cols + 3;
    r.ldb = b_cols + 3;
    r.ldc = t.n + 3;
    r.a = bf16_values(a_rows * r.lda, 1);
    r.b = bf16_values(b_rows * r.ldb, 2);
    const std::vector<uint16_t> c_init = bf16_values(t.m * r.ldc, 3);
    r.c0.resize(c_init.size());
    for (size_t i = 0; i < c_init.size(); ++i) r.c0[i] = bf16_to_f32(c_init[i]);
    void* c = nullptr;
    if (c_f32) {
        r.c32 = r.c0;
        c = r.c32.data();
    } else {
        r.c16 = c_init;
        c = r.c16.data();
    }
    bgemm_with_kernel(engine, t.trans_a, t.trans_b, t.m, t.n, t.k, alpha, r.a.data(), r.lda, r.b.data(), r.ldb, beta,
                      c, c_f32, r.ldc);
    return r;
}

// Every element within the bound that bf16 inputs and f32 sums allow: the products of two bf16 are
// exact in f32, so the error is the f32 sum's, at most gamma_k = k u / (1 - k u) (u = 2^-24) of
// sum |a b| (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1), plus the roundings of
// alpha * sum and beta * C (2u), plus, for bf16 C, half a bf16 ulp of the result (2^-8 relative).
// Columns past n in the padding must be untouched.
void check_case(const std::string& engine, const Case& t, float alpha, float beta, bool c_f32) {
    const Result r = run_case(engine, t, alpha, beta, c_f32);
    const double u = std::ldexp(1.0, -24);
    const double gamma = (t.k + 2) * u / (1.0 - (t.k + 2) * u);
    double worst = 0;
    for (int64_t i = 0; i < t.m; ++i) {
        for (int64_t j = 0; j < r.ldc; ++j) {
            const size_t at = static_cast<size_t>(i * r.ldc + j);
            const double got = c_f32 ? r.c32[at] : bf16_to_f32(r.c16[at]);
            if (j >= t.n) {  // padding
                REQUIRE(got == static_cast<double>(r.c0[at]));
                continue;
            }
            double sum = 0, abs_sum = 0;
            for (int64_t p = 0; p < t.k; ++p) {
                const uint16_t av = t.trans_a ? r.a[static_cast<size_t>(p * r.lda + i)] : r.a[static_cast<size_t>(i * r.lda + p)];
                const uint16_t bv = t.trans_b ? r.b[static_cast<size_t>(j * r.ldb + p)] : r.b[static_cast<size_t>(p * r.ldb + j)];
                const double prod = static_cast<double>(bf16_to_f32(av)) * bf16_to_f32(bv);
                sum += prod;
                abs_sum += std::fabs(prod);
            }
            const double c_before = beta == 0.0f ? 0.0 : r.c0[at];
            const double want = alpha * sum + beta * c_before;
            double bound = gamma * (std::fabs(alpha) * abs_sum + std::fabs(beta * c_before));
            if (!c_f32) bound += std::ldexp(std::fabs(want) + bound, -8);
            const double err = std::fabs(got - want);
            worst = std::max(worst, err / (bound + 1e-300));
            if (err > bound) {
                INFO("engine " << engine << ", trans " << t.trans_a << t.trans_b << ", m " << t.m << " n " << t.n
                               << " k " << t.k << ", alpha " << alpha << " beta " << beta << (c_f32 ? ", f32 C" : ", bf16 C")
                               << ": C[" << i << "][" << j << "] = " << got << ", f64 " << want << ", bound " << bound);
                REQUIRE(err <= bound);
            }
        }
    }
    SUCCEED("worst error / bound " << worst);
}

// The engines to test: every engine normlab has, those this CPU cannot run reported skipped by name.
std::vector<std::string> engines_to_test() {
    const std::vector<std::string> runs = bgemm_kernels_this_cpu_runs();
    for (const char* engine : {"amx", "avx512bf16", "f32"}) {
        if (std::find(runs.begin(), runs.end(), engine) == runs.end())
            WARN("skipped: the " << engine << " bf16 gemm engine (this CPU cannot run it)");
    }
    return runs;
}

#ifdef NL_TEST_SECCOMP
// `normlab info` in a child process in which Linux answers EPERM to arch_prctl(ARCH_REQ_XCOMP_PERM, ...),
// as a kernel that refuses AMX's tile data would (a seccomp filter, kept across exec), with
// NORMLAB_GEMM_BF16 set to `engine` (or unset for nullptr); its exit status and output.
nl_test::CliRun info_with_amx_refused(const char* engine) {
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        dup2(pipe_fds[1], 1);
        dup2(pipe_fds[1], 2);
        close(pipe_fds[0]);
        constexpr unsigned kArchReqXcompPerm = 0x1023;
        sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_arch_prctl, 0, 3),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArchReqXcompPerm, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
            _exit(111);
        if (engine != nullptr) setenv("NORMLAB_GEMM_BF16", engine, 1);
        else unsetenv("NORMLAB_GEMM_BF16");
        execl(NORMLAB_BINARY, NORMLAB_BINARY, "info", static_cast<char*>(nullptr));
        _exit(112);
    }
    close(pipe_fds[1]);
    std::string output;
    char buffer[4096];
    ssize_t n = 0;
    while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) output.append(buffer, static_cast<size_t>(n));
    close(pipe_fds[0]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    INFO(output);
    REQUIRE(WIFEXITED(status));
    return {WEXITSTATUS(status), output};
}
#endif

}  // namespace

TEST_CASE("bf16 gemm: every engine this CPU runs is within the f32-sum bound of f64, on every transpose pair",
          "[bgemm]") {
    const std::vector<std::string> engines = engines_to_test();
    REQUIRE(std::find(engines.begin(), engines.end(), "f32") != engines.end());  // the portable engine runs everywhere
    // Sizes around the 16 x 16 tile, odd k (the last pair half empty), k of 1, and a k long enough that
    // a wrong pair in the packs could not hide in the bound.
    const std::vector<Case> shapes = {
        {false, false, 1, 1, 1},    {false, true, 5, 7, 3},     {true, false, 13, 33, 17},  {true, true, 16, 16, 16},
        {false, true, 33, 17, 15},  {true, false, 15, 48, 31},  {false, false, 24, 96, 64}, {true, true, 7, 100, 257},
        {false, true, 130, 40, 129}, {true, false, 64, 128, 1000}, {false, false, 40, 17, 2049},
        {false, false, 48, 80, 40},  {true, true, 70, 33, 65},
    };
    for (const std::string& engine : engines) {
        for (const Case& shape : shapes) {
            check_case(engine, shape, 1.0f, 0.0f, true);
            check_case(engine, shape, 1.0f, 0.0f, false);
        }
        for (const bool ta : {false, true}) {
            for (const bool tb : {false, true}) {
                check_case(engine, {ta, tb, 29, 50, 71}, -2.0f, 0.25f, true);
                check_case(engine, {ta, tb, 29, 50, 71}, 0.5f, 1.0f, false);
            }
        }
    }
}

TEST_CASE("bf16 gemm: the widened engine gives its f32 kernel's bits on the widened operands", "[bgemm]") {
    // Its packs widen A and B, and where the f32 plan reads B in place (a few rows: a weight
    // gradient, here with its k in two parts and a partial last panel) its kernel widens B's rows as
    // it loads them: either way the f32 kernel's sums, in its order. Every normlab kernel this CPU
    // runs, and the one the widened engine takes (on an AVX2-only CPU, AVX2's while f32 stays on OpenBLAS).
    const char* chosen = sgemm_bf16_kernel();
    if (sgemm_engine_is_native()) {
        REQUIRE(chosen != nullptr);  // the f32 engine's own kernel
        CHECK(std::string(sgemm_engine_name()).find(chosen) != std::string::npos);
    } else if (std::getenv("NORMLAB_GEMM") == nullptr && !sgemm_kernels_this_cpu_runs().empty()) {
        REQUIRE(chosen != nullptr);  // auto left f32 on OpenBLAS, but bf16 takes the best normlab kernel
        CHECK(std::string(chosen) == sgemm_kernels_this_cpu_runs().front());
    }
    if (chosen == nullptr) WARN("no normlab kernel runs bf16 here: the widened engine copies for OpenBLAS");
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs()) {
        for (const Case& t : {Case{false, false, 40, 50, 1100}, Case{true, false, 128, 64, 2048},
                              Case{false, true, 70, 33, 300}, Case{false, false, 600, 64, 128},
                              Case{true, true, 17, 5, 9}}) {
            for (const float beta : {0.0f, 0.5f}) {
                INFO("kernel " << kernel << ", trans " << t.trans_a << t.trans_b << ", m " << t.m << " n " << t.n
                               << " k " << t.k << ", beta " << beta);
                const Result r = run_case("f32", t, 1.5f, beta, true);
                std::vector<float> a32(r.a.size()), b32(r.b.size());
                for (size_t i = 0; i < r.a.size(); ++i) a32[i] = bf16_to_f32(r.a[i]);
                for (size_t i = 0; i < r.b.size(); ++i) b32[i] = bf16_to_f32(r.b[i]);
                std::vector<float> want = r.c0, got = r.c0;
                sgemm_with_kernel(kernel, t.trans_a, t.trans_b, t.m, t.n, t.k, 1.5f, a32.data(), r.lda, b32.data(),
                                  r.ldb, beta, want.data(), r.ldc);
                sgemm_bf16_with_kernel(kernel, t.trans_a, t.trans_b, t.m, t.n, t.k, 1.5f, r.a.data(), r.lda,
                                       r.b.data(), r.ldb, beta, got.data(), true, r.ldc);
                CHECK(got == want);
                if (chosen != nullptr && kernel == chosen) CHECK(r.c32 == want);  // the engine runs this kernel
            }
        }
    }
    if (chosen == nullptr) {  // widened copies for OpenBLAS: cblas_sgemm's bits
        const Case t{false, true, 70, 33, 300};
        const Result r = run_case("f32", t, 1.5f, 0.5f, true);
        std::vector<float> a32(r.a.size()), b32(r.b.size());
        for (size_t i = 0; i < r.a.size(); ++i) a32[i] = bf16_to_f32(r.a[i]);
        for (size_t i = 0; i < r.b.size(); ++i) b32[i] = bf16_to_f32(r.b[i]);
        std::vector<float> want = r.c0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t.m), static_cast<int>(t.n),
                    static_cast<int>(t.k), 1.5f, a32.data(), static_cast<int>(r.lda), b32.data(),
                    static_cast<int>(r.ldb), 0.5f, want.data(), static_cast<int>(r.ldc));
        CHECK(r.c32 == want);
    }
}

TEST_CASE("bf16 gemm: every engine's C is alpha * its f32 sums (+ beta * C), rounded once by f32_to_bf16", "[bgemm]") {
    // The epilogue, bit for bit: the engine's own sums (alpha 1, beta 0, f32 C) against what the same
    // call writes with alpha and beta, into a bf16 C and (for the two engines on bf16 instructions; the
    // widened engine's f32 C is its f32 kernel's, tested above) an f32 C. A NaN in A makes its row NaN, which a
    // bf16 C keeps a quiet NaN; the tile edges (m, n not multiples of 16 or 32) are partial tiles.
    for (const std::string& engine : engines_to_test()) {
        for (const Case& t : {Case{false, true, 37, 45, 70}, Case{true, false, 33, 17, 129}}) {
            INFO("engine " << engine << ", trans " << t.trans_a << t.trans_b << ", m " << t.m << " n " << t.n);
            const Result sums = run_case(engine, t, 1.0f, 0.0f, true);
            for (const float beta : {0.0f, 0.75f}) {
                const float alpha = -1.5f;
                const Result f32 = run_case(engine, t, alpha, beta, true);
                const Result b16 = run_case(engine, t, alpha, beta, false);
                for (int64_t i = 0; i < t.m; ++i) {
                    for (int64_t j = 0; j < t.n; ++j) {
                        const size_t at = static_cast<size_t>(i * sums.ldc + j);
                        const float scaled = alpha * sums.c32[at];
                        const float want = beta != 0.0f ? scaled + beta * sums.c0[at] : scaled;
                        if (engine != "f32") REQUIRE(f32_bits(f32.c32[at]) == f32_bits(want));
                        REQUIRE(b16.c16[at] == f32_to_bf16(want));
                    }
                }
            }
        }
        // Exact ties: every sum is 1 and alpha = 1 + 2^-7 + 2^-8 sits halfway between two bf16 values
        // with an odd last kept bit, so to nearest even rounds it up (to 1 + 2^-6, 0x3f82), where
        // truncation or rounding half down would not.
        const float tie = 1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -8);
        const std::vector<uint16_t> ones(static_cast<size_t>(20 * 18), f32_to_bf16(1.0f));
        for (const float alpha : {tie, -tie}) {
            std::vector<uint16_t> c16(static_cast<size_t>(20 * 18), 0);
            bgemm_with_kernel(engine, false, false, 20, 18, 1, alpha, ones.data(), 1, ones.data(), 18, 0.0f, c16.data(),
                              false, 18);
            for (const uint16_t v : c16) REQUIRE(v == (alpha > 0 ? 0x3f82 : 0xbf82));
        }
        Result nan_row = run_case(engine, {false, false, 20, 18, 9}, 1.0f, 0.0f, false);
        nan_row.a[static_cast<size_t>(3 * nan_row.lda + 4)] = 0x7fc1;  // a quiet NaN with a payload
        std::vector<uint16_t> c16(nan_row.c16.size(), 0);
        bgemm_with_kernel(engine, false, false, 20, 18, 9, 1.0f, nan_row.a.data(), nan_row.lda, nan_row.b.data(),
                          nan_row.ldb, 0.0f, c16.data(), false, nan_row.ldc);
        for (int64_t j = 0; j < 18; ++j) {
            const uint16_t v = c16[static_cast<size_t>(3 * nan_row.ldc + j)];
            CHECK((v & 0x7f80u) == 0x7f80u);  // exponent all ones
            CHECK((v & 0x0040u) != 0);        // quiet
        }
        CHECK(std::isfinite(bf16_to_f32(c16[static_cast<size_t>(2 * nan_row.ldc)])));
    }
}

TEST_CASE("bf16 gemm: k == 0 scales C by beta, and beta == 0 writes zeros without reading C", "[bgemm]") {
    for (const std::string& engine : engines_to_test()) {
        std::vector<float> c = {1.0f, NAN, -2.0f, 4.0f};
        bgemm_with_kernel(engine, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), true, 2);
        CHECK(c == std::vector<float>{0, 0, 0, 0});
        std::vector<uint16_t> c16 = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f)};
        bgemm_with_kernel(engine, false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c16.data(), false, 2);
        CHECK(bf16_to_f32(c16[0]) == 0.5f);
        CHECK(bf16_to_f32(c16[1]) == -1.0f);
    }
}

TEST_CASE("bf16 gemm: the bits are the same on 1 and 2 threads", "[bgemm][threads]") {
    const int saved = omp_get_max_threads();
    for (const std::string& engine : engines_to_test()) {
        for (const Case& t : {Case{false, true, 301, 77, 300}, Case{true, false, 130, 130, 513},
                              Case{false, false, 40, 50, 2048}}) {
            for (const bool c_f32 : {true, false}) {
                omp_set_num_threads(1);
                const Result one = run_case(engine, t, 1.0f, 0.0f, c_f32);
                omp_set_num_threads(2);
                const Result two = run_case(engine, t, 1.0f, 0.0f, c_f32);
                INFO("engine " << engine << ", m " << t.m << " n " << t.n << " k " << t.k);
                CHECK(one.c32 == two.c32);
                CHECK(one.c16 == two.c16);
            }
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("bf16 gemm: an unknown engine name is refused by name", "[bgemm]") {
    uint16_t x = 0;
    CHECK_THROWS_WITH(bgemm_with_kernel("amx512", false, false, 1, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &x, false, 1),
                      Catch::Contains("bgemm_with_kernel: expected an engine's name, ") && Catch::Contains("f32") &&
                          !Catch::Contains("auto") && Catch::Contains("'amx512'"));
    CHECK(!std::string(bgemm_engine_name()).empty());
    // auto's reason names AMX's rate where it runs, or why it does not.
    if (std::getenv("NORMLAB_GEMM_BF16") == nullptr)
        CHECK_THAT(bgemm_engine_reason(), Catch::Contains("amx", Catch::CaseSensitive::No));
}

TEST_CASE("bf16 gemm: where Linux refuses AMX's tile data, auto falls back to the widened engine and says why",
          "[bgemm][cli]") {
#ifdef NL_TEST_SECCOMP
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
    if ((edx >> 22 & 1u) == 0) {
        WARN("skipped: the AMX refusal test (this CPU lacks AMX-BF16, so nothing is requested)");
        return;
    }
    const nl_test::CliRun automatic = info_with_amx_refused(nullptr);
    INFO(automatic.output);
    CHECK(automatic.status == 0);
    CHECK_THAT(automatic.output, Catch::Contains("amx does not run here: this CPU has AMX-BF16 but Linux refused its "
                                                 "tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") &&
                                     !Catch::Contains("normlab amx 32x32"));
    // Asking for amx there is a user mistake: one line naming the variable and why, exit 2.
    const nl_test::CliRun asked = info_with_amx_refused("amx");
    INFO(asked.output);
    CHECK(asked.status == 2);
    CHECK_THAT(asked.output, Catch::Contains("NORMLAB_GEMM_BF16: normlab's amx bf16 gemm cannot run here: this CPU has "
                                             "AMX-BF16 but Linux refused its tile data"));
#else
    WARN("skipped: the AMX refusal test (needs Linux on x86-64)");
#endif
}

TEST_CASE("bf16 matmul on the CPU runs on the bf16 gemm: batched, transposed views, the engine's bits", "[bgemm]") {
    // (2, 20, 37) @ (37, 9)^T-view: the matmul's bf16 result is the engine's C on the same operands.
    const std::vector<uint16_t> av = bf16_values(2 * 20 * 37, 5), bv = bf16_values(9 * 37, 6);
    std::vector<float> af(av.size()), bf(bv.size());
    for (size_t i = 0; i < av.size(); ++i) af[i] = bf16_to_f32(av[i]);
    for (size_t i = 0; i < bv.size(); ++i) bf[i] = bf16_to_f32(bv[i]);
    const Tensor a = from_vector(af, {2, 20, 37}).to(DType::BF16);
    const Tensor b = from_vector(bf, {9, 37}).to(DType::BF16);
    const Tensor c = matmul(a, b.transpose(0, 1));
    REQUIRE(c.dtype() == DType::BF16);
    REQUIRE(c.shape() == Shape{2, 20, 9});
    std::vector<uint16_t> want(2 * 20 * 9);
    bgemm(false, true, 40, 9, 37, 1.0f, av.data(), 37, bv.data(), 37, 0.0f, want.data(), false, 9);
    const Tensor got = c.contiguous();
    const auto* bits = static_cast<const uint16_t*>(got.data_ptr());
    CHECK(std::vector<uint16_t>(bits, bits + want.size()) == want);
}

TEST_CASE("NORMLAB_GEMM_BF16 chooses the bf16 engine, info names it, and a bad value is one line and exit 2",
          "[bgemm][cli]") {
    const std::string dir = nl_test::make_temp_dir("bgemm");
    const nl_test::CliRun bad = nl_test::run_normlab_env(dir, "NORMLAB_GEMM_BF16=tiles ", "info");
    INFO(bad.output);
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("NORMLAB_GEMM_BF16: expected auto, ") && Catch::Contains("found 'tiles'"));
    const nl_test::CliRun plain = nl_test::run_normlab_env(dir, "", "info");
    INFO(plain.output);
    CHECK(plain.status == 0);
    // auto takes the fastest engine measured on this machine (tests/test_engine_choice.cpp), with the
    // rate of every engine this CPU runs.
    CHECK_THAT(plain.output, Catch::Contains("bf16 gemm") && Catch::Contains("auto: the fastest measured here"));
    for (const std::string& engine : bgemm_kernels_this_cpu_runs())
        CHECK_THAT(plain.output, Catch::Contains(engine + " ") && Catch::Contains("GFLOP/s"));
    // The widened engine widens bf16 in the packs of a normlab kernel wherever one runs, even where
    // f32 stays on OpenBLAS; NORMLAB_GEMM=openblas keeps bf16 on OpenBLAS too, through widened copies.
    if (!sgemm_kernels_this_cpu_runs().empty()) {
        const nl_test::CliRun widened = nl_test::run_normlab_env(dir, "NORMLAB_GEMM_BF16=f32 ", "info");
        CHECK_THAT(widened.output, Catch::Contains("bf16 widened to f32 in the packs of normlab's "));
    }
    const nl_test::CliRun copies = nl_test::run_normlab_env(dir, "NORMLAB_GEMM=openblas NORMLAB_GEMM_BF16=f32 ", "info");
    INFO(copies.output);
    CHECK_THAT(copies.output, Catch::Contains("bf16 widened to f32 copies, then openblas"));
    // Attention on bf16 widens under NORMLAB_GEMM_BF16=f32, and takes vdpbf16ps where the build targets
    // AVX512-BF16 and vdpbf16ps measured faster than the widened engine.
    CHECK_THAT(copies.output, Catch::Contains("attention  bf16 widened to f32 per (batch, kv head)"));
#ifdef __AVX512BF16__
    const bool vdpbf16ps = bgemm_vdpbf16ps_beats_widened();
#else
    const bool vdpbf16ps = false;
#endif
    CHECK_THAT(plain.output, Catch::Contains(vdpbf16ps ? "attention  bf16 on vdpbf16ps" : "attention  bf16 widened to f32"));
    // Training under bf16 autocast on every engine this CPU runs ends near the f32 run's loss.
    const std::string cfg = "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json") +
                            " --set train.steps=30 --set optim.warmup_steps=5 --set train.eval_every=0";
    const nl_test::CliRun f32 = nl_test::run_normlab_env(dir, "", cfg + " --out f32");
    INFO(f32.output);
    REQUIRE(f32.status == 0);
    const double loss_f32 = nlohmann::json::parse(nl_test::read_text(dir + "/f32/summary.json"))["final_train_loss"];
    const std::vector<double> curve_f32 = nl_test::train_losses(dir + "/f32/metrics.csv");
    for (const std::string& engine : bgemm_kernels_this_cpu_runs()) {
        const nl_test::CliRun named = nl_test::run_normlab_env(dir, "NORMLAB_GEMM_BF16=" + engine + " ", "info");
        CHECK_THAT(named.output, Catch::Contains("NORMLAB_GEMM_BF16=" + engine));
        const nl_test::CliRun run = nl_test::run_normlab_env(dir, "NORMLAB_GEMM_BF16=" + engine + " ",
                                                             cfg + " --set train.autocast=bf16 --out bf16_" + engine);
        INFO(run.output);
        REQUIRE(run.status == 0);
        const double loss =
            nlohmann::json::parse(nl_test::read_text(dir + "/bf16_" + engine + "/summary.json"))["final_train_loss"];
        CHECK(loss == Approx(loss_f32).epsilon(2e-2));
        // The whole curve, step by step, within the same 2% of the f32 one.
        const std::vector<double> curve = nl_test::train_losses(dir + "/bf16_" + engine + "/metrics.csv");
        REQUIRE(curve.size() == curve_f32.size());
        for (size_t step = 0; step < curve.size(); ++step) {
            INFO("engine " << engine << ", step " << step + 1);
            CHECK(curve[step] == Approx(curve_f32[step]).epsilon(2e-2));
        }
    }
}
