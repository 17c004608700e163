// matmul against a plain f64 reference loop: 2-D, transposed views (no copies), broadcast batches,
// 1-D operands, empty and size-1 dims, f32/f64/bf16, sliced operands, and the error messages.
#include <catch2/catch.hpp>

#include <cblas.h>

#include <cmath>
#include <vector>

#include "core/ops.h"

using namespace nl;

namespace {

// Row-major multi-index of flat position `flat` in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
    std::vector<int64_t> idx(shape.size());
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
        flat = shape[d] == 0 ? 0 : flat / shape[d];
    }
    return idx;
}

// Flat row-major position in `shape` of the trailing dims of `batch_idx` (broadcasting size-1 dims).
int64_t broadcast_batch_offset(const std::vector<int64_t>& batch_idx, const Shape& batch) {
    int64_t pos = 0;
    const size_t skip = batch_idx.size() - batch.size();
    for (size_t d = 0; d < batch.size(); ++d) pos = pos * batch[d] + (batch[d] == 1 ? 0 : batch_idx[skip + d]);
    return pos;
}

// torch.matmul in f64 from the logical values, written out loop by loop.
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b, Shape* out_shape) {
    const std::vector<double> av = a.to_vector(), bv = b.to_vector();
    Shape as = a.shape(), bs = b.shape();
    if (a.dim() == 1) as.insert(as.begin(), 1);
    if (b.dim() == 1) bs.push_back(1);
    const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    Shape batch(std::max(ab.size(), bb.size()), 1);
    for (size_t i = 0; i < ab.size(); ++i) batch[batch.size() - ab.size() + i] = ab[i];
    for (size_t i = 0; i < bb.size(); ++i) {
        int64_t& s = batch[batch.size() - bb.size() + i];
        if (s == 1) s = bb[i];
    }
    const int64_t nb = shape_numel(batch);
    std::vector<double> out(nb * m * n, 0.0);
    for (int64_t p = 0; p < nb; ++p) {
        const std::vector<int64_t> bi = unravel(p, batch);
        const int64_t pa = broadcast_batch_offset(bi, ab), pb = broadcast_batch_offset(bi, bb);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (int64_t l = 0; l < k; ++l) acc += av[(pa * m + i) * k + l] * bv[(pb * k + l) * n + j];
                out[(p * m + i) * n + j] = acc;
            }
    }
    *out_shape = batch;
    if (a.dim() != 1) out_shape->push_back(m);
    if (b.dim() != 1) out_shape->push_back(n);
    return out;
}

// Checks matmul(a, b) against the reference with a tolerance relative to sqrt(k).
void check_matmul(const Tensor& a, const Tensor& b, double tol) {
    Shape expected_shape;
    const std::vector<double> expected = ref_matmul(a, b, &expected_shape);
    const Tensor c = matmul(a, b);
    REQUIRE(c.shape() == expected_shape);
    REQUIRE(c.dtype() == a.dtype());
    REQUIRE(c.is_contiguous());
    const std::vector<double> got = c.to_vector();
    REQUIRE(got.size() == expected.size());
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
    INFO("a " << shape_str(a.shape()) << " b " << shape_str(b.shape()) << " worst " << worst);
    CHECK(worst <= tol);
}

}  // namespace

TEST_CASE("the OpenBLAS loaded at run time is the build CMake linked", "[matmul]") {
    // openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP. The OpenMP build is found through
    // the link's RPATH; were the loader to pick Debian's default (pthreads) build instead, gemms would
    // run on a second thread pool (see CMakeLists.txt).
#ifdef NORMLAB_OPENBLAS_OPENMP
    REQUIRE(openblas_get_parallel() == 2);
#else
    REQUIRE(openblas_get_parallel() != 2);
#endif
}

TEST_CASE("matmul 2-D matches the reference in f32 and f64", "[matmul]") {
    Generator gen(1);
    for (DType dt : {DType::F32, DType::F64}) {
        const double tol = dt == DType::F64 ? 1e-12 : 1e-4;
        check_matmul(randn({5, 7}, gen, dt), randn({7, 3}, gen, dt), tol);
        check_matmul(randn({64, 33}, gen, dt), randn({33, 70}, gen, dt), tol * 10);
    }
}

TEST_CASE("matmul reads transposed views through BLAS flags without copying", "[matmul]") {
    Generator gen(2);
    const int64_t m = 6, k = 9, n = 4;
    const Tensor a = randn({m, k}, gen, DType::F64), at = randn({k, m}, gen, DType::F64).t();
    const Tensor b = randn({k, n}, gen, DType::F64), bt = randn({n, k}, gen, DType::F64).t();
    REQUIRE_FALSE(at.is_contiguous());
    for (const Tensor& lhs : {a, at}) {
        for (const Tensor& rhs : {b, bt}) {
            check_matmul(lhs, rhs, 1e-12);
            const int64_t before = memory_stats(Device::cpu()).allocations;
            const Tensor c = matmul(lhs, rhs);
            // Only the output is allocated: no packed copy of either operand.
            CHECK(memory_stats(Device::cpu()).allocations - before == 1);
        }
    }
}

TEST_CASE("matmul batched with broadcast batch dims", "[matmul]") {
    Generator gen(3);
    check_matmul(randn({2, 1, 3, 4}, gen, DType::F64), randn({5, 4, 6}, gen, DType::F64), 1e-12);
    check_matmul(randn({3, 2, 5}, gen, DType::F64), randn({3, 5, 4}, gen, DType::F64), 1e-12);
    check_matmul(randn({1, 2, 5}, gen, DType::F64), randn({3, 5, 4}, gen, DType::F64), 1e-12);
    check_matmul(randn({4, 2, 5}, gen, DType::F32), randn({5, 3}, gen, DType::F32), 1e-4);
    check_matmul(randn({4, 5}, gen, DType::F32), randn({2, 5, 3}, gen, DType::F32), 1e-4);
    // Batch of transposed matrices (permuted views) and a broadcast transposed right operand.
    check_matmul(randn({3, 5, 2}, gen, DType::F64).transpose(1, 2), randn({4, 5}, gen, DType::F64).t(), 1e-12);
    check_matmul(randn({2, 3, 4, 5}, gen, DType::F64).permute({1, 0, 2, 3}), randn({3, 1, 5, 2}, gen, DType::F64),
                 1e-12);
}

TEST_CASE("matmul [B, T, C] @ [C, D] runs as one gemm on the operands in place", "[matmul]") {
    Generator gen(4);
    const Tensor x = randn({4, 8, 16}, gen, DType::F64);
    for (const Tensor& w : {randn({16, 12}, gen, DType::F64), randn({12, 16}, gen, DType::F64).t()}) {
        check_matmul(x, w, 1e-12);
        const int64_t before = memory_stats(Device::cpu()).allocations;
        const Tensor y = matmul(x, w);
        CHECK(memory_stats(Device::cpu()).allocations - before == 1);
        CHECK(y.shape() == Shape{4, 8, 12});
    }
}

TEST_CASE("matmul with 1-D operands", "[matmul]") {
    Generator gen(5);
    const Tensor v = randn({6}, gen, DType::F64), w = randn({6}, gen, DType::F64);
    const Tensor dot = matmul(v, w);
    REQUIRE(dot.shape() == Shape{});
    check_matmul(v, w, 1e-12);
    check_matmul(v, randn({6, 3}, gen, DType::F64), 1e-12);          // [6] @ [6, 3] -> [3]
    check_matmul(randn({4, 6}, gen, DType::F64), w, 1e-12);          // [4, 6] @ [6] -> [4]
    check_matmul(v, randn({2, 6, 3}, gen, DType::F64), 1e-12);       // -> [2, 3]
    check_matmul(randn({2, 4, 6}, gen, DType::F64), w, 1e-12);       // -> [2, 4]
    check_matmul(randn({12}, gen, DType::F64).slice(0, 0, 12, 2), w, 1e-12);  // strided vector
}

TEST_CASE("matmul with empty and size-1 dims", "[matmul]") {
    Generator gen(6);
    check_matmul(randn({0, 3}, gen, DType::F32), randn({3, 4}, gen, DType::F32), 0.0);
    check_matmul(randn({3, 4}, gen, DType::F32), randn({4, 0}, gen, DType::F32), 0.0);
    check_matmul(randn({0, 3, 4}, gen, DType::F32), randn({4, 2}, gen, DType::F32), 0.0);
    // k = 0: an empty sum gives zeros, not uninitialized memory.
    const Tensor z = matmul(randn({3, 0}, gen, DType::F32), randn({0, 4}, gen, DType::F32));
    REQUIRE(z.shape() == Shape{3, 4});
    for (double x : z.to_vector()) CHECK(x == 0.0);
    check_matmul(randn({1, 1}, gen, DType::F64), randn({1, 5}, gen, DType::F64), 1e-12);
    check_matmul(randn({5, 1}, gen, DType::F64), randn({1, 1}, gen, DType::F64), 1e-12);
    check_matmul(randn({1, 5}, gen, DType::F64), randn({5, 1}, gen, DType::F64), 1e-12);
    check_matmul(randn({3, 1, 5}, gen, DType::F64), randn({5, 1}, gen, DType::F64), 1e-12);
    check_matmul(randn({5, 1}, gen, DType::F64).t(), randn({1, 5}, gen, DType::F64).t(), 1e-12);
}

TEST_CASE("matmul on non-contiguous sliced operands", "[matmul]") {
    Generator gen(7);
    const Tensor big = randn({10, 12}, gen, DType::F64);
    check_matmul(big.narrow(0, 2, 5).narrow(1, 3, 7), randn({7, 4}, gen, DType::F64), 1e-12);  // ld > cols
    check_matmul(big.slice(1, 0, 12, 2), randn({6, 3}, gen, DType::F64), 1e-12);              // col stride 2
    check_matmul(randn({4, 3}, gen, DType::F64), big.slice(0, 1, 10, 3).t().t().narrow(1, 0, 5), 1e-12);
    check_matmul(randn({3, 4, 6}, gen, DType::F64).slice(1, 0, 4, 2), big.narrow(0, 0, 6).narrow(1, 0, 5), 1e-12);
    // A column stride of 2 is no BLAS layout: that operand is packed (so the counter above can fail).
    const Tensor strided = big.slice(1, 0, 12, 2), rhs = randn({6, 3}, gen, DType::F64);
    const int64_t before = memory_stats(Device::cpu()).allocations;
    const Tensor c = matmul(strided, rhs);
    CHECK(memory_stats(Device::cpu()).allocations - before == 2);
    // An expanded (stride-0) row dim cannot go to BLAS directly.
    check_matmul(randn({1, 5}, gen, DType::F64).expand({3, 5}), randn({5, 2}, gen, DType::F64), 1e-12);
}

TEST_CASE("matmul in bf16 and f16 computes in f32 and rounds once", "[matmul]") {
    Generator gen(8);
    for (DType dt : {DType::BF16, DType::F16}) {
        const Tensor a = randn({2, 5, 16}, gen, dt), b = randn({16, 3}, gen, dt).t().contiguous().t();
        Shape shape;
        const std::vector<double> expected = ref_matmul(a, b, &shape);  // from the rounded inputs
        const Tensor c = matmul(a, b);
        REQUIRE(c.dtype() == dt);
        REQUIRE(c.shape() == shape);
        const std::vector<double> got = c.to_vector();
        const double rel = dt == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
        for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - expected[i]) <= rel * (std::abs(expected[i]) + 0.05));
    }
}

TEST_CASE("matmul errors name the shapes", "[matmul]") {
    Generator gen(9);
    const Tensor a = randn({2, 3}, gen), b = randn({4, 5}, gen);
    REQUIRE_THROWS_WITH(matmul(a, b), "matmul: cannot multiply [2, 3] by [4, 5] (3 != 4)");
    REQUIRE_THROWS_WITH(matmul(randn({3}, gen), randn({4}, gen)),
                        Catch::Contains("cannot multiply [3] by [4] (3 != 4)"));
    REQUIRE_THROWS_WITH(matmul(randn({2, 2, 3}, gen), randn({3, 3, 4}, gen)),
                        Catch::Contains("matmul: batch dims [2] of [2, 2, 3] and [3] of [3, 3, 4]"));
    REQUIRE_THROWS_WITH(matmul(scalar_tensor(2.0), a), Catch::Contains("at least 1 dim, found [] and [2, 3]"));
    REQUIRE_THROWS_WITH(matmul(a, randn({3, 2}, gen, DType::F64)), Catch::Contains("f32 and f64"));
    REQUIRE_THROWS_WITH(matmul(from_vector(std::vector<int64_t>{1, 2}, {2}), from_vector(std::vector<int64_t>{1, 2}, {2})),
                        Catch::Contains("matmul: expected a floating dtype, found i64"));
}
