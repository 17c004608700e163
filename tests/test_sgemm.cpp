// normlab's own f32 gemm engine (core/cpu/cpu_sgemm.h) against an f64 reference loop: every
// transpose pair, sizes around its tile, block and transpose widths, alpha/beta, padded leading
// dimensions, bits that do not depend on the thread count, and the NORMLAB_GEMM choice.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/cpu/cpu_sgemm.h"
#include "core/ops.h"
#include "core/tensor.h"

using namespace nl;

namespace {

struct Case {
    bool trans_a, trans_b;
    int64_t m, n, k;
};

// Uniform values in [-1, 1) from a fixed linear congruential sequence: the same on every machine.
std::vector<float> values(int64_t count, uint32_t seed) {
    std::vector<float> out(static_cast<size_t>(count));
    uint32_t state = seed * 2654435761u + 1u;
    for (float& x : out) {
        state = state * 1664525u + 1013904223u;
        x = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return out;
}

// C (m x n, row stride ldc) after alpha * op(A) op(B) + beta * C on `kernel`, with A, B and C padded
// (leading dimensions 3 past the minimum) so a read or write past a row would show.
struct Result {
    std::vector<float> c;
    std::vector<double> expected;
    int64_t ldc;
};

// ldb > 0 replaces B's padded leading dimension (it must be at least B's columns).
Result run_case(const std::string& kernel, const Case& t, float alpha, float beta, int64_t ldb_given = 0) {
    const int64_t a_rows = t.trans_a ? t.k : t.m, a_cols = t.trans_a ? t.m : t.k;
    const int64_t b_rows = t.trans_b ? t.n : t.k, b_cols = t.trans_b ? t.k : t.n;
    const int64_t lda = a_cols + 3, ldb = ldb_given > 0 ? ldb_given : b_cols + 3, ldc = t.n + 3;
    const std::vector<float> a = values(a_rows * lda, 1), b_values = values(b_rows * b_cols, 2);
    std::vector<float> b = values(b_rows * ldb, 4);  // B's values do not depend on ldb; the padding does
    for (int64_t r = 0; r < b_rows; ++r)
        std::copy_n(b_values.begin() + r * b_cols, b_cols, b.begin() + r * ldb);
    Result r{values(t.m * ldc, 3), {}, ldc};
    r.expected.resize(r.c.size());
    for (size_t i = 0; i < r.c.size(); ++i) r.expected[i] = r.c[i];  // padding must stay as it is
    for (int64_t i = 0; i < t.m; ++i) {
        for (int64_t j = 0; j < t.n; ++j) {
            double sum = 0;
            for (int64_t p = 0; p < t.k; ++p) {
                const double av = t.trans_a ? a[p * lda + i] : a[i * lda + p];
                const double bv = t.trans_b ? b[j * ldb + p] : b[p * ldb + j];
                sum += av * bv;
            }
            const double old = r.c[i * ldc + j];
            r.expected[i * ldc + j] = alpha * sum + (beta == 0.0f ? 0.0 : beta * old);
        }
    }
    if (beta == 0.0f)  // beta == 0 must not read C: NaN there must not reach the result
        for (int64_t i = 0; i < t.m; ++i)
            for (int64_t j = 0; j < t.n; ++j) r.c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
    sgemm_with_kernel(kernel, t.trans_a, t.trans_b, t.m, t.n, t.k, alpha, a.data(), lda, b.data(), ldb, beta,
                      r.c.data(), ldc);
    return r;
}

void check_case(const std::string& kernel, const Case& t, float alpha, float beta) {
    INFO("kernel " << kernel << ", op(A) " << (t.trans_a ? "T" : "N") << " op(B) " << (t.trans_b ? "T" : "N")
                   << ", m " << t.m << " n " << t.n << " k " << t.k << ", alpha " << alpha << " beta " << beta);
    const Result r = run_case(kernel, t, alpha, beta);
    double worst = 0;
    for (size_t i = 0; i < r.c.size(); ++i) {
        // f32 products summed over k: an error bound that grows with k (values are in [-1, 1)).
        const double tolerance = 1e-6 * (4.0 + static_cast<double>(t.k)) * (std::fabs(alpha) + 1.0) + 1e-6;
        const double err = std::fabs(static_cast<double>(r.c[i]) - r.expected[i]);
        if (!(err <= tolerance)) {
            FAIL_CHECK("element " << i / r.ldc << ", " << i % r.ldc << ": " << r.c[i] << " vs " << r.expected[i]);
            return;
        }
        worst = std::max(worst, err);
    }
    SUCCEED("worst |error| " << worst);
}

}  // namespace

TEST_CASE("sgemm engine: every kernel this CPU runs matches an f64 loop on every transpose pair", "[sgemm]") {
    const std::vector<std::string> kernels = sgemm_kernels_this_cpu_runs();
#if defined(__x86_64__)
    // Every x86-64 machine normlab is built for in CI has at least AVX2: the avx2 kernel is then tested.
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) REQUIRE(!kernels.empty());
#endif
    // Sizes on both sides of the tiles (6 x 16, 16 x 16), the 16-wide transposes and the k block (256):
    // partial tiles, a partial transpose tail, two equal k blocks (300 = 150 + 150), three, and four
    // or more (with B read in place, summed in two halves).
    const std::vector<Case> shapes = {
        {false, false, 1, 1, 1},      {false, true, 5, 7, 3},      {true, false, 13, 33, 17},
        {true, true, 16, 16, 16},     {false, true, 33, 17, 15},   {true, false, 15, 48, 31},
        {true, true, 12, 32, 16},     {false, true, 25, 65, 300},  {true, false, 47, 31, 600},
        {false, false, 24, 96, 64},   {true, true, 7, 100, 257},   {false, true, 130, 40, 129},
        {true, false, 64, 128, 2048}, {true, false, 33, 47, 1030}, {false, false, 17, 40, 900},
        // More than 256 rows: a non-transposed B is packed too (below, it is read in place).
        {false, false, 300, 50, 70},  {true, false, 270, 40, 300},
    };
    for (const std::string& kernel : kernels)
        for (const Case& shape : shapes) check_case(kernel, shape, 1.0f, 0.0f);
    // alpha and beta, on one shape with partial tiles in both directions.
    for (const std::string& kernel : kernels) {
        for (const bool ta : {false, true}) {
            for (const bool tb : {false, true}) {
                check_case(kernel, {ta, tb, 29, 50, 70}, 0.5f, 1.0f);
                check_case(kernel, {ta, tb, 29, 50, 70}, -2.0f, 0.25f);
                check_case(kernel, {ta, tb, 290, 50, 70}, -2.0f, 0.25f);
                check_case(kernel, {ta, tb, 29, 50, 1100}, -2.0f, 0.25f);  // two halves when B is in place
            }
        }
    }
}

TEST_CASE("transpose_pad_f32 transposes, pads with zeros and reads only the given columns", "[sgemm]") {
    for (const int64_t rows : {0, 1, 15, 16, 17, 40})
        for (const int64_t cols : {1, 15, 16, 17, 64})
            for (const int64_t pad : {0, 1, 23}) {
                const int64_t ld = cols + 3, dst_cols = rows + pad, dst_ld = dst_cols + 2;
                // src holds exactly the rows it names, so a read past the last row's `cols` values
                // is out of bounds (the sanitizer build catches it); the gaps hold NaN.
                std::vector<float> src(rows > 0 ? static_cast<size_t>((rows - 1) * ld + cols) : 0,
                                       std::numeric_limits<float>::quiet_NaN());
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t q = 0; q < cols; ++q) src[i * ld + q] = static_cast<float>(i * 1000 + q);
                std::vector<float> dst(static_cast<size_t>(cols * dst_ld), -7.0f);
                transpose_pad_f32(src.data(), ld, rows, cols, dst.data(), dst_ld, dst_cols);
                INFO("rows " << rows << " cols " << cols << " pad " << pad);
                bool ok = true;
                for (int64_t q = 0; q < cols; ++q) {
                    for (int64_t i = 0; i < dst_cols; ++i)
                        ok = ok && dst[q * dst_ld + i] == (i < rows ? static_cast<float>(i * 1000 + q) : 0.0f);
                    for (int64_t i = dst_cols; i < dst_ld; ++i) ok = ok && dst[q * dst_ld + i] == -7.0f;  // untouched
                }
                CHECK(ok);
            }
}

TEST_CASE("sgemm engine: an unknown kernel name is refused by name", "[sgemm]") {
    // The *_with_kernel functions take a kernel's name only, and say so: not auto or openblas, which
    // NORMLAB_GEMM also takes (below).
    float c = 0.0f;
    CHECK_THROWS_WITH(sgemm_with_kernel("avx1024", false, false, 1, 1, 1, 1.0f, &c, 1, &c, 1, 0.0f, &c, 1),
                      Catch::Contains("sgemm_with_kernel: ") && Catch::Contains("found 'avx1024'") &&
                          !Catch::Contains("auto") && !Catch::Contains("openblas"));
    CHECK_THROWS_WITH(sgemm_with_kernel("auto", false, false, 1, 1, 1, 1.0f, &c, 1, &c, 1, 0.0f, &c, 1),
                      Catch::Contains("found 'auto'"));
    uint16_t h = 0;
    CHECK_THROWS_WITH(sgemm_bf16_with_kernel("avx1024", false, false, 1, 1, 1, 1.0f, &h, 1, &h, 1, 0.0f, &c, true, 1),
                      Catch::Contains("sgemm_bf16_with_kernel: ") && Catch::Contains("found 'avx1024'") &&
                          !Catch::Contains("auto") && !Catch::Contains("openblas"));
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs())
        CHECK_THROWS_WITH(sgemm_with_kernel("avx1024", false, false, 1, 1, 1, 1.0f, &c, 1, &c, 1, 0.0f, &c, 1),
                          Catch::Contains(kernel));
}

TEST_CASE("sgemm engine: k == 0 scales C by beta, and beta == 0 writes zeros without reading C", "[sgemm]") {
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs()) {
        std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
        sgemm_with_kernel(kernel, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
        CHECK(c == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
        std::vector<float> nan(4, std::numeric_limits<float>::quiet_NaN());
        sgemm_with_kernel(kernel, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, nan.data(), 2);
        CHECK(nan == std::vector<float>(4, 0.0f));
    }
}

TEST_CASE("sgemm engine: the bits are the same on 1 and 2 threads", "[sgemm][threads]") {
    const int saved = omp_get_max_threads();
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs()) {
        // Big enough to be threaded (m * n * k >= 64^3), with edge tiles and two k blocks.
        // The last two: k of 4 blocks or more, summed in two parts (B read in place).
        for (const Case& t : {Case{false, true, 301, 77, 300}, Case{true, false, 130, 130, 513},
                              Case{false, false, 300, 100, 300}, Case{true, false, 65, 70, 1100},
                              Case{false, false, 40, 50, 2048}}) {
            omp_set_num_threads(1);
            const Result one = run_case(kernel, t, 1.0f, 0.0f);
            omp_set_num_threads(2);
            const Result two = run_case(kernel, t, 1.0f, 0.0f);
            INFO("kernel " << kernel << ", m " << t.m << " n " << t.n << " k " << t.k);
            CHECK(one.c == two.c);
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("sgemm engine: B read in place or packed gives the same bits", "[sgemm]") {
    // 300 rows: B (not transposed) is read in place when its rows are not a multiple of 1 KiB apart
    // (203 floats), packed when they are (256 floats); B's values are the same either way. The sums
    // run in the same k blocks and order, so C must be the same to the bit, on 1 and 2 threads.
    const int saved = omp_get_max_threads();
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs()) {
        for (const bool trans_a : {false, true}) {
            for (const int threads : {1, 2}) {
                omp_set_num_threads(threads);
                const Case t{trans_a, false, 300, 200, 600};
                INFO("kernel " << kernel << ", op(A) " << (trans_a ? "T" : "N") << ", " << threads << " threads");
                const Result spread = run_case(kernel, t, 1.0f, 0.0f, 203);
                const Result packed = run_case(kernel, t, 1.0f, 0.0f, 256);
                CHECK(spread.c == packed.c);
                check_case(kernel, t, 1.0f, 0.0f);  // and right (at B's usual padding)
            }
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("sgemm engine: matmul on the CPU runs on it and agrees with f64", "[sgemm]") {
    // The backend's f32 gemm (a batched matmul, the batch spread over threads when small) against
    // the same product in f64.
    Generator gen(7);
    Tensor a = randn({3, 37, 70}, gen), b = randn({3, 70, 45}, gen);
    Tensor got = matmul(a, b).to(DType::F64);
    Tensor want = matmul(a.to(DType::F64), b.to(DType::F64));
    CHECK(max_abs_diff(got, want) < 1e-4);
    CHECK(std::string(sgemm_engine_name()).size() > 0);
}

TEST_CASE("NORMLAB_GEMM chooses the engine, and a bad value is one line and exit 2", "[sgemm][cli]") {
    const std::string dir = nl_test::make_temp_dir("gemm");
    const nl_test::CliRun bad = nl_test::run_normlab_env(dir, "NORMLAB_GEMM=fastest ", "info");
    INFO(bad.output);
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("NORMLAB_GEMM: expected auto, ") && Catch::Contains("found 'fastest'"));
    const nl_test::CliRun blas = nl_test::run_normlab_env(dir, "NORMLAB_GEMM=openblas ", "info");
    INFO(blas.output);
    CHECK(blas.status == 0);
    CHECK_THAT(blas.output, Catch::Contains("f32 gemm") && Catch::Contains("openblas (NORMLAB_GEMM=openblas"));
    for (const std::string& kernel : sgemm_kernels_this_cpu_runs()) {
        const nl_test::CliRun own = nl_test::run_normlab_env(dir, "NORMLAB_GEMM=" + kernel + " ", "info");
        INFO(own.output);
        CHECK(own.status == 0);
        CHECK_THAT(own.output, Catch::Contains("normlab " + kernel));
    }
    // Training on OpenBLAS and on normlab's engine ends at nearly the same loss: the engines sum in
    // different orders, so the bits differ, not the training.
    const std::string cfg = "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json") +
                            " --set train.steps=30 --set optim.warmup_steps=5 --set train.eval_every=0";
    const nl_test::CliRun theirs = nl_test::run_normlab_env(dir, "NORMLAB_GEMM=openblas ", cfg + " --out openblas");
    const nl_test::CliRun ours = nl_test::run_normlab_env(dir, "", cfg + " --out ours");
    INFO(theirs.output << "\n" << ours.output);
    REQUIRE(theirs.status == 0);
    REQUIRE(ours.status == 0);
    const double loss_theirs = nlohmann::json::parse(nl_test::read_text(dir + "/openblas/summary.json"))["final_train_loss"];
    const double loss_ours = nlohmann::json::parse(nl_test::read_text(dir + "/ours/summary.json"))["final_train_loss"];
    CHECK(loss_ours == Approx(loss_theirs).epsilon(1e-3));
}
