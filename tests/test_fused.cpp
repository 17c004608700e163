// Fused kernels (core/fused.h) against plain f64 reference loops: the norm pair for every variant
// (LayerNorm, RMSNorm, with/without weight and bias, pRMSNorm's k < d) in f32/f64/bf16/f16, backward
// against central finite differences, determinism across thread counts, a large-offset LayerNorm;
// DyT's pair the same way; soft-capping's pair against f64, across thread counts;
// cross-entropy with ignore_index and reductions; Adam/AdamW/AMSGrad/SGD trajectories; errors.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_fused_rows.h"
#include "core/fused.h"

using namespace nl;

namespace {

std::vector<double> random_values(int64_t n, uint32_t seed, double mean = 0.0, double std = 1.0) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> dist(mean, std);
    std::vector<double> out(static_cast<size_t>(n));
    for (double& v : out) v = dist(gen);
    return out;
}

// Values rounded through `dtype`, so a reference sees exactly what the kernel sees.
std::vector<double> rounded(const std::vector<double>& values, DType dtype) {
    return from_vector(values, {static_cast<int64_t>(values.size())}, dtype).to_vector();
}

double max_rel_err(const std::vector<double>& got, const std::vector<double>& want, double floor = 1.0) {
    REQUIRE(got.size() == want.size());
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(floor, std::abs(want[i])));
    return worst;
}

struct RefNorm {
    std::vector<double> y, mean, rstd;
};

// f64 reference: statistics over the first k elements of each row of x (rows, d).
RefNorm ref_norm(const std::vector<double>& x, const std::vector<double>* w, const std::vector<double>* b,
                 int64_t rows, int64_t d, int64_t k, double eps, bool subtract_mean) {
    RefNorm out;
    out.y.resize(x.size());
    for (int64_t r = 0; r < rows; ++r) {
        const double* xr = x.data() + r * d;
        double mu = 0.0;
        if (subtract_mean) {
            for (int64_t j = 0; j < k; ++j) mu += xr[j];
            mu /= static_cast<double>(k);
        }
        double var = 0.0;
        for (int64_t j = 0; j < k; ++j) var += (xr[j] - mu) * (xr[j] - mu);
        var /= static_cast<double>(k);
        const double rs = 1.0 / std::sqrt(var + eps);
        for (int64_t j = 0; j < d; ++j)
            out.y[r * d + j] = (xr[j] - mu) * rs * (w ? (*w)[j] : 1.0) + (b ? (*b)[j] : 0.0);
        out.mean.push_back(mu);
        out.rstd.push_back(rs);
    }
    return out;
}

struct NormVariant {
    const char* name;
    bool subtract_mean, weight, bias;
    double p;  // pRMSNorm fraction (1: all elements)
};

const std::vector<NormVariant> kVariants = {
    {"layernorm", true, true, true, 1.0},          {"layernorm no affine", true, false, false, 1.0},
    {"layernorm no bias", true, true, false, 1.0}, {"layernorm partial stats", true, true, true, 0.4},
    {"rmsnorm", false, true, false, 1.0},          {"rmsnorm no weight", false, false, false, 1.0},
    {"rmsnorm with bias", false, true, true, 1.0}, {"prmsnorm", false, true, false, 0.25},
    {"prmsnorm bias", false, true, true, 0.5},     {"prmsnorm one element", false, false, false, 0.01},
};

}  // namespace

TEST_CASE("partial_stat_count rounds p*d up, forgiving float noise", "[fused]") {
    CHECK(partial_stat_count(16, 0.0625) == 1);
    CHECK(partial_stat_count(30, 0.1) == 3);  // 0.1 * 30 = 3.0000000000000004
    CHECK(partial_stat_count(10, 0.25) == 3);
    CHECK(partial_stat_count(10, 1.0) == 10);
    CHECK(partial_stat_count(1000, 1e-6) == 1);
    REQUIRE_THROWS_WITH(partial_stat_count(8, 0.0), Catch::Contains("p must be in (0, 1], found 0"));
    REQUIRE_THROWS_WITH(partial_stat_count(8, 1.5), Catch::Contains("found 1.5"));
}

TEST_CASE("norm_forward matches the f64 reference for every variant in f32 and f64", "[fused]") {
    const Shape shape = {3, 4, 10};
    const int64_t d = 10, rows = 12;
    const double eps = 1e-5;
    const auto xv = random_values(rows * d, 1, 0.5, 2.0);
    const auto wv = random_values(d, 2, 1.0, 0.5);
    const auto bv = random_values(d, 3);
    for (const auto& v : kVariants) {
        for (DType dtype : {DType::F32, DType::F64}) {
            DYNAMIC_SECTION(v.name << " " << dtype_name(dtype)) {
                const int64_t k = partial_stat_count(d, v.p);
                const auto xr = rounded(xv, dtype), wr = rounded(wv, dtype), br = rounded(bv, dtype);
                const Tensor x = from_vector(xv, shape, dtype);
                const Tensor w = v.weight ? from_vector(wv, {d}, dtype) : Tensor();
                const Tensor b = v.bias ? from_vector(bv, {d}, dtype) : Tensor();
                const NormForward out = norm_forward(x, w, b, eps, v.subtract_mean, k);
                const RefNorm ref = ref_norm(xr, v.weight ? &wr : nullptr, v.bias ? &br : nullptr, rows, d, k,
                                             eps, v.subtract_mean);
                const double tol = dtype == DType::F64 ? 1e-13 : 1e-6;
                CHECK(out.y.shape() == shape);
                CHECK(out.y.dtype() == dtype);
                CHECK(out.rstd.shape() == Shape{3, 4});
                CHECK(out.rstd.dtype() == dtype);
                CHECK(max_rel_err(out.y.to_vector(), ref.y) < tol);
                CHECK(max_rel_err(out.rstd.to_vector(), ref.rstd) < tol);
                if (v.subtract_mean) {
                    REQUIRE(out.mean.defined());
                    CHECK(out.mean.dtype() == dtype);
                    CHECK(max_rel_err(out.mean.to_vector(), ref.mean) < tol);
                } else {
                    CHECK_FALSE(out.mean.defined());
                }
            }
        }
    }
}

TEST_CASE("norm_forward reads non-contiguous x, runs multi-threaded shapes and empty batches", "[fused]") {
    SECTION("transposed view") {
        const auto xv = random_values(6 * 5, 4);
        const Tensor base = from_vector(xv, {6, 5}, DType::F64);  // x = base.t(): (5, 6)
        const Tensor x = base.t();
        REQUIRE_FALSE(x.is_contiguous());
        std::vector<double> xt(30);
        for (int64_t i = 0; i < 5; ++i)
            for (int64_t j = 0; j < 6; ++j) xt[i * 6 + j] = xv[j * 5 + i];
        const NormForward out = norm_forward(x, Tensor(), Tensor(), 1e-6, true);
        const RefNorm ref = ref_norm(xt, nullptr, nullptr, 5, 6, 6, 1e-6, true);
        CHECK(max_rel_err(out.y.to_vector(), ref.y) < 1e-13);
    }
    SECTION("large enough for OpenMP, f32") {
        const int64_t rows = 300, d = 128;  // 38400 elements: above the parallel threshold
        const auto xv = rounded(random_values(rows * d, 5), DType::F32);
        const auto wv = rounded(random_values(d, 6), DType::F32);
        const NormForward out =
            norm_forward(from_vector(xv, {rows, d}), from_vector(wv, {d}), Tensor(), 1e-6, false);
        const RefNorm ref = ref_norm(xv, &wv, nullptr, rows, d, d, 1e-6, false);
        CHECK(max_rel_err(out.y.to_vector(), ref.y) < 1e-6);
    }
    SECTION("zero rows") {
        const Tensor x = from_vector(std::vector<double>{}, {0, 4}, DType::F32);
        const NormForward out = norm_forward(x, ones({4}), zeros({4}), 1e-5, true);
        CHECK(out.y.shape() == Shape{0, 4});
        CHECK(out.mean.shape() == Shape{0});
        const Tensor dy = from_vector(std::vector<double>{}, {0, 4}, DType::F32);
        const NormBackward back = norm_backward(dy, x, ones({4}), out.mean, out.rstd, true);
        CHECK(back.dx.shape() == Shape{0, 4});
        CHECK(back.dweight.to_vector() == std::vector<double>(4, 0.0));
        CHECK(back.dbias.to_vector() == std::vector<double>(4, 0.0));
    }
    SECTION("1-D x is one row") {
        const NormForward out = norm_forward(from_vector(std::vector<double>{1, 2, 3}, {3}, DType::F64),
                                             Tensor(), Tensor(), 0.0, true);
        CHECK(out.rstd.shape() == Shape{});
        CHECK(out.mean.item() == Approx(2.0));
        CHECK(out.y.to_vector()[0] == Approx(-std::sqrt(1.5)));
    }
}

TEST_CASE("norm_forward reads and writes bf16/f16, matching the f32 path within half precision", "[fused]") {
    const int64_t rows = 7, d = 24;
    const auto xv = random_values(rows * d, 7, 0.3, 1.5);
    const auto wv = random_values(d, 8, 1.0, 0.3);
    const auto bv = random_values(d, 9, 0.0, 0.3);
    for (DType half : {DType::BF16, DType::F16}) {
        for (bool layer : {true, false}) {
            DYNAMIC_SECTION(dtype_name(half) << (layer ? " layernorm" : " rmsnorm")) {
                const Tensor x = from_vector(xv, {rows, d}, half);
                const Tensor w = from_vector(wv, {d}, half);
                const Tensor b = from_vector(bv, {d}, half);
                const NormForward out = norm_forward(x, w, b, 1e-5, layer);
                // The f32 path on the same (already rounded) values.
                const NormForward ref = norm_forward(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32), 1e-5, layer);
                CHECK(out.y.dtype() == half);
                CHECK(out.rstd.dtype() == DType::F32);
                const double tol = half == DType::BF16 ? 8e-3 : 1e-3;  // one rounding of the output
                CHECK(max_rel_err(out.y.to_vector(), ref.y.to_vector()) < tol);
                CHECK(out.rstd.to_vector() == ref.rstd.to_vector());  // same f32 statistics exactly

                const Tensor dy = from_vector(random_values(rows * d, 10), {rows, d}, half);
                const NormBackward back = norm_backward(dy, x, w, out.mean, out.rstd, layer, -1, true, true);
                const NormBackward back_ref = norm_backward(dy.to(DType::F32), x.to(DType::F32), w.to(DType::F32),
                                                            ref.mean, ref.rstd, layer, -1, true, true);
                CHECK(back.dx.dtype() == half);
                CHECK(back.dweight.dtype() == half);
                CHECK(max_rel_err(back.dx.to_vector(), back_ref.dx.to_vector()) < 2 * tol);
                CHECK(max_rel_err(back.dweight.to_vector(), back_ref.dweight.to_vector()) < 2 * tol);
                CHECK(max_rel_err(back.dbias.to_vector(), back_ref.dbias.to_vector()) < 2 * tol);
            }
        }
    }
}

TEST_CASE("large-offset input (1e4 + N(0,1)) in f32 still gives a correct LayerNorm", "[fused]") {
    // E[x^2] - E[x]^2 in f32 would lose every digit here (1e8 with 7 significant digits), and a mean
    // kept only as a float would cost ~1e-3 relative in y. The CPU forward takes the statistics of 4, 2
    // or 1 rows together depending on the row length (d = 64, 1000, 3000); 7 rows leave a partial group.
    for (const int64_t d : {int64_t{64}, int64_t{1000}, int64_t{3000}}) {
        const int64_t rows = 7;
        const auto xv = rounded(random_values(rows * d, 11, 1e4, 1.0), DType::F32);
        const NormForward out = norm_forward(from_vector(xv, {rows, d}), Tensor(), Tensor(), 1e-5, true);
        const RefNorm ref = ref_norm(xv, nullptr, nullptr, rows, d, d, 1e-5, true);
        CAPTURE(d);
        CHECK(max_rel_err(out.y.to_vector(), ref.y) < 1e-5);
        CHECK(max_rel_err(out.rstd.to_vector(), ref.rstd) < 1e-6);
        CHECK(max_rel_err(out.mean.to_vector(), ref.mean) < 1e-7);
    }
}

TEST_CASE("norm_backward matches central finite differences in f64 for every variant", "[fused]") {
    const int64_t rows = 3, d = 8;
    const Shape shape = {rows, d};
    const double eps = 1e-3, h = 1e-6;
    const auto xv = random_values(rows * d, 12, 0.2, 1.3);
    const auto wv = random_values(d, 13, 1.0, 0.5);
    const auto bv = random_values(d, 14);
    const auto dyv = random_values(rows * d, 15);  // loss = sum(y * dy)
    for (const auto& v : kVariants) {
        DYNAMIC_SECTION(v.name) {
            const int64_t k = partial_stat_count(d, v.p);
            auto loss = [&](const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
                const NormForward out = norm_forward(from_vector(x, shape, DType::F64),
                                                     v.weight ? from_vector(w, {d}, DType::F64) : Tensor(),
                                                     v.bias ? from_vector(b, {d}, DType::F64) : Tensor(), eps,
                                                     v.subtract_mean, k);
                double total = 0.0;
                const auto y = out.y.to_vector();
                for (size_t i = 0; i < y.size(); ++i) total += y[i] * dyv[i];
                return total;
            };
            // Central differences of one input vector, the others fixed.
            auto numeric = [&](int which) {
                std::vector<double> x = xv, w = wv, b = bv;
                std::vector<double>& target = which == 0 ? x : which == 1 ? w : b;
                std::vector<double> grad(target.size());
                for (size_t i = 0; i < target.size(); ++i) {
                    const double saved = target[i];
                    target[i] = saved + h;
                    const double up = loss(x, w, b);
                    target[i] = saved - h;
                    const double down = loss(x, w, b);
                    target[i] = saved;
                    grad[i] = (up - down) / (2 * h);
                }
                return grad;
            };
            const Tensor x = from_vector(xv, shape, DType::F64);
            const Tensor w = v.weight ? from_vector(wv, {d}, DType::F64) : Tensor();
            const Tensor b = v.bias ? from_vector(bv, {d}, DType::F64) : Tensor();
            const NormForward out = norm_forward(x, w, b, eps, v.subtract_mean, k);
            const NormBackward back = norm_backward(from_vector(dyv, shape, DType::F64), x, w, out.mean, out.rstd,
                                                    v.subtract_mean, k, true, v.bias);
            CHECK(max_rel_err(back.dx.to_vector(), numeric(0)) < 1e-7);
            if (v.weight) {
                REQUIRE(back.dweight.defined());
                CHECK(max_rel_err(back.dweight.to_vector(), numeric(1)) < 1e-7);
            } else {
                CHECK_FALSE(back.dweight.defined());
            }
            if (v.bias) {
                REQUIRE(back.dbias.defined());
                CHECK(max_rel_err(back.dbias.to_vector(), numeric(2)) < 1e-7);
            } else {
                CHECK_FALSE(back.dbias.defined());
            }
        }
    }
}

TEST_CASE("pRMSNorm: elements past k get only the direct gradient rstd * w * dy", "[fused]") {
    const int64_t d = 6, k = 2;
    const auto xv = random_values(d, 16);
    const auto dyv = random_values(d, 17);
    const Tensor x = from_vector(xv, {1, d}, DType::F64);
    const NormForward out = norm_forward(x, Tensor(), Tensor(), 1e-6, false, k);
    const NormBackward back = norm_backward(from_vector(dyv, {1, d}, DType::F64), x, Tensor(), Tensor(), out.rstd,
                                            false, k);
    const double rs = out.rstd.item();
    const auto dx = back.dx.to_vector();
    for (int64_t j = k; j < d; ++j) CHECK(dx[j] == Approx(rs * dyv[j]).epsilon(1e-14));
    // ...while the first k also see the statistic's path, so they differ.
    CHECK(std::abs(dx[0] - rs * dyv[0]) > 1e-6);
}

TEST_CASE("norm_backward gives the same bits for 1 and 2 threads", "[fused]") {
    const int64_t rows = 517, d = 96;  // above the parallel threshold; rows not a multiple of the chunks
    const auto xv = random_values(rows * d, 18);
    const auto dyv = random_values(rows * d, 19);
    const auto wv = random_values(d, 20);
    for (DType dtype : {DType::F32, DType::BF16}) {
        for (bool layer : {true, false}) {
            const Tensor x = from_vector(xv, {rows, d}, dtype);
            const Tensor dy = from_vector(dyv, {rows, d}, dtype);
            const Tensor w = from_vector(wv, {d}, dtype);
            const int saved_threads = omp_get_max_threads();
            std::vector<std::vector<double>> results[2];
            for (int threads : {1, 2}) {
                omp_set_num_threads(threads);
                const NormForward out = norm_forward(x, w, w, 1e-5, layer);
                const NormBackward back = norm_backward(dy, x, w, out.mean, out.rstd, layer);
                results[threads - 1] = {out.y.to_vector(), back.dx.to_vector(), back.dweight.to_vector(),
                                        back.dbias.to_vector()};
            }
            omp_set_num_threads(saved_threads);
            for (size_t i = 0; i < 4; ++i) CHECK(results[0][i] == results[1][i]);
        }
    }
}

TEST_CASE("streaming stores give the same bits as plain stores, the cache size is one L3 instance", "[fused]") {
    // Outputs larger than the last-level cache are written with non-temporal stores. A threshold of 0
    // sends these small shapes down that path: d = 4096 rows are 64-byte aligned, d = 1001 rows are not
    // (the plain-copy fallback) and leave a tail; the two paths must not differ in a single bit.
    for (const int64_t d : {int64_t{4096}, int64_t{1001}}) {
        const int64_t rows = 19;
        const auto xv = random_values(rows * d, 21, 0.5, 2.0);
        const auto dyv = random_values(rows * d, 22);
        const auto wv = random_values(d, 23);
        for (DType dtype : {DType::F32, DType::F64}) {
            for (bool layer : {true, false}) {
                const Tensor x = from_vector(xv, {rows, d}, dtype);
                const Tensor dy = from_vector(dyv, {rows, d}, dtype);
                const Tensor w = from_vector(wv, {d}, dtype);
                std::vector<std::vector<double>> results[2];
                for (int streamed : {0, 1}) {
                    cpu_rows::set_stream_threshold_bytes(streamed ? 0 : -1);
                    CHECK(cpu_rows::stream_output(rows * d) == (streamed == 1));  // small: streams only at 0
                    const NormForward out = norm_forward(x, w, w, 1e-5, layer);
                    const NormBackward back = norm_backward(dy, x, w, out.mean, out.rstd, layer);
                    results[streamed] = {out.y.to_vector(), back.dx.to_vector(), back.dweight.to_vector()};
                }
                cpu_rows::set_stream_threshold_bytes(-1);
                CAPTURE(d, dtype_name(dtype), layer);
                for (size_t i = 0; i < 3; ++i) CHECK(results[0][i] == results[1][i]);
            }
        }
    }
    // sysconf may report the sum of a socket's L3 caches (384 MiB on a 12-CCD EPYC), which would keep a
    // 256 MiB output from streaming; the kernels use one instance's size, as Linux's sysfs gives it.
    std::ifstream size_file("/sys/devices/system/cpu/cpu0/cache/index3/size");
    int64_t kib = 0;
    std::string unit;
    if (size_file >> kib >> unit && unit == "K") CHECK(cpu_rows::last_level_cache_bytes() == kib * 1024);
    CHECK(cpu_rows::last_level_cache_bytes() >= (int64_t{256} << 10));
}

TEST_CASE("norm_forward/backward errors name the shapes and dtypes", "[fused]") {
    const Tensor x = zeros({2, 3});
    REQUIRE_THROWS_WITH(norm_forward(x, ones({4}), Tensor(), 1e-5, true),
                        Catch::Contains("norm_forward: weight must have shape [3] for x of shape [2, 3], found [4]"));
    REQUIRE_THROWS_WITH(norm_forward(x, Tensor(), ones({3}, DType::F64), 1e-5, true),
                        Catch::Contains("bias has dtype f64 but x has dtype f32"));
    REQUIRE_THROWS_WITH(norm_forward(x, Tensor(), Tensor(), 1e-5, false, 4),
                        Catch::Contains("stat_count must be -1 or in [1, 3] for x of shape [2, 3], found 4"));
    REQUIRE_THROWS_WITH(norm_forward(zeros({2, 0}), Tensor(), Tensor(), 1e-5, true),
                        Catch::Contains("last dim must be non-empty, found shape [2, 0]"));
    REQUIRE_THROWS_WITH(norm_forward(zeros({2, 3}, DType::I64), Tensor(), Tensor(), 1e-5, true),
                        Catch::Contains("expected a floating dtype for x, found i64"));
    REQUIRE_THROWS_WITH(norm_forward(x, Tensor(), Tensor(), -1.0, true), Catch::Contains("eps must be >= 0"));
    const NormForward out = norm_forward(x, Tensor(), Tensor(), 1e-5, true);
    REQUIRE_THROWS_WITH(norm_backward(zeros({3, 2}), x, Tensor(), out.mean, out.rstd, true),
                        Catch::Contains("norm_backward: dy has shape [3, 2] but x has shape [2, 3]"));
    REQUIRE_THROWS_WITH(norm_backward(zeros({2, 3}), x, Tensor(), Tensor(), out.rstd, true),
                        Catch::Contains("needs the saved mean"));
    REQUIRE_THROWS_WITH(norm_backward(zeros({2, 3}), x, Tensor(), out.mean, zeros({2}, DType::F64), true),
                        Catch::Contains("rstd must have shape [2] and dtype f32 for x of shape [2, 3], found [2] f64"));
}

namespace {

struct RefCrossEntropy {
    std::vector<double> loss, lse, dlogits;  // dlogits for d(sum of loss_row * dloss_row)
};

RefCrossEntropy ref_cross_entropy(const std::vector<double>& z, const std::vector<int64_t>& t, int64_t rows,
                                  int64_t classes, int64_t ignore_index, const std::vector<double>& dloss) {
    RefCrossEntropy out;
    out.dlogits.assign(z.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < classes; ++j) m = std::max(m, z[r * classes + j]);
        double s = 0.0;
        for (int64_t j = 0; j < classes; ++j) s += std::exp(z[r * classes + j] - m);
        const double lse = m + std::log(s);
        out.lse.push_back(lse);
        const bool ignored = t[r] == ignore_index;
        out.loss.push_back(ignored ? 0.0 : lse - z[r * classes + t[r]]);
        if (ignored) continue;
        for (int64_t j = 0; j < classes; ++j)
            out.dlogits[r * classes + j] = (std::exp(z[r * classes + j] - lse) - (j == t[r] ? 1.0 : 0.0)) * dloss[r];
    }
    return out;
}

}  // namespace

// ---- DyT ----

namespace {

struct RefDyt {
    std::vector<double> y, dx, dweight, dbias;
    double dalpha = 0.0;
};

// f64 reference of DyT over x (rows, d): y = tanh(alpha x) w + b and the gradients of sum(y * dy).
RefDyt ref_dyt(const std::vector<double>& x, double alpha, const std::vector<double>& w, const std::vector<double>& b,
               const std::vector<double>& dy, int64_t rows, int64_t d) {
    RefDyt out;
    out.y.resize(x.size());
    out.dx.resize(x.size());
    out.dweight.assign(d, 0.0);
    out.dbias.assign(d, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < d; ++j) {
            const size_t i = static_cast<size_t>(r * d + j);
            const double t = std::tanh(alpha * x[i]);
            out.y[i] = t * w[j] + b[j];
            out.dx[i] = dy[i] * w[j] * alpha * (1 - t * t);
            out.dalpha += dy[i] * w[j] * x[i] * (1 - t * t);
            out.dweight[j] += dy[i] * t;
            out.dbias[j] += dy[i];
        }
    }
    return out;
}

}  // namespace

TEST_CASE("dyt_forward/dyt_backward match the f64 reference in f32, f64, bf16 and f16, with and without "
          "weight and bias", "[fused]") {
    // 300 rows of 80: above the parallel threshold, and chunked for the parameter gradients. x spreads
    // over tanh's linear part and its saturation (alpha x up to ~4).
    const int64_t rows = 300, d = 80;
    const auto xv = random_values(rows * d, 30, 0.3, 3.0);
    const auto wv = random_values(d, 31, 1.0, 0.5);
    const auto bv = random_values(d, 32, 0.0, 0.5);
    const auto dyv = random_values(rows * d, 33);
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        for (bool affine : {true, false}) {
            CAPTURE(dtype_name(dtype), affine);
            // The reference sees the values the kernel sees (rounded to dtype).
            const std::vector<double> x = rounded(xv, dtype), dy = rounded(dyv, dtype);
            const std::vector<double> w = affine ? rounded(wv, dtype) : std::vector<double>(d, 1.0);
            const std::vector<double> b = affine ? rounded(bv, dtype) : std::vector<double>(d, 0.0);
            const double alpha = rounded({0.7}, dtype)[0];
            const RefDyt ref = ref_dyt(x, alpha, w, b, dy, rows, d);
            const Tensor xt = from_vector(x, {rows, d}, dtype), dyt = from_vector(dy, {rows, d}, dtype);
            const Tensor at = from_vector(std::vector<double>{alpha}, {1}, dtype);
            const Tensor wt = affine ? from_vector(w, {d}, dtype) : Tensor();
            const Tensor bt = affine ? from_vector(b, {d}, dtype) : Tensor();
            const Tensor y = dyt_forward(xt, at, wt, bt);
            const DytBackward g = dyt_backward(dyt, xt, at, wt);
            CHECK(y.dtype() == dtype);
            CHECK(g.dx.dtype() == dtype);
            CHECK(g.dalpha.dtype() == dtype);
            CHECK(g.dalpha.shape() == Shape{1});
            CHECK(g.dweight.defined() == affine);
            // f64: rounding only; f32: a few ulp of tanh and of the row sums; halves: one rounding of each output.
            const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-5 : dtype == DType::BF16 ? 8e-3 : 1e-3;
            CHECK(max_rel_err(y.to_vector(), ref.y) < tol);
            CHECK(max_rel_err(g.dx.to_vector(), ref.dx) < tol);
            // Sums over 24000 or 300 terms: relative to the sum of the terms' magnitudes (~rows).
            CHECK(max_rel_err(g.dbias.to_vector(), ref.dbias, 30.0) < tol);
            CHECK(max_rel_err(g.dalpha.to_vector(), {ref.dalpha}, 300.0) < tol);
            if (affine) CHECK(max_rel_err(g.dweight.to_vector(), ref.dweight, 30.0) < tol);
        }
    }
}

TEST_CASE("dyt_backward matches central finite differences in f64", "[fused]") {
    const int64_t rows = 3, d = 5;
    const double h = 1e-6;
    const auto xv = random_values(rows * d, 34, 0.2, 1.5);
    const auto wv = random_values(d, 35, 1.0, 0.5);
    const auto bv = random_values(d, 36);
    const auto dyv = random_values(rows * d, 37);  // loss = sum(y * dy)
    const double alpha = 0.8;
    // inputs[0] = x, [1] = {alpha}, [2] = w, [3] = b.
    auto loss = [&](const std::vector<std::vector<double>>& in) {
        const Tensor y = dyt_forward(from_vector(in[0], {rows, d}, DType::F64), from_vector(in[1], {1}, DType::F64),
                                     from_vector(in[2], {d}, DType::F64), from_vector(in[3], {d}, DType::F64));
        double total = 0.0;
        const auto yv = y.to_vector();
        for (size_t i = 0; i < yv.size(); ++i) total += yv[i] * dyv[i];
        return total;
    };
    const std::vector<std::vector<double>> inputs = {xv, {alpha}, wv, bv};
    const DytBackward g = dyt_backward(from_vector(dyv, {rows, d}, DType::F64), from_vector(xv, {rows, d}, DType::F64),
                                       from_vector(std::vector<double>{alpha}, {1}, DType::F64), from_vector(wv, {d}, DType::F64));
    const std::vector<Tensor> analytic = {g.dx, g.dalpha, g.dweight, g.dbias};
    for (size_t which = 0; which < inputs.size(); ++which) {
        std::vector<std::vector<double>> in = inputs;
        std::vector<double> numeric(in[which].size());
        for (size_t i = 0; i < numeric.size(); ++i) {
            const double saved = in[which][i];
            in[which][i] = saved + h;
            const double up = loss(in);
            in[which][i] = saved - h;
            const double down = loss(in);
            in[which][i] = saved;
            numeric[i] = (up - down) / (2 * h);
        }
        CAPTURE(which);
        CHECK(max_rel_err(analytic[which].to_vector(), numeric) < 1e-7);
    }
    // Without a weight the gradients are those of weight 1, and none is made for the weight.
    const DytBackward bare = dyt_backward(from_vector(dyv, {rows, d}, DType::F64), from_vector(xv, {rows, d}, DType::F64),
                                          from_vector(std::vector<double>{alpha}, {1}, DType::F64), Tensor(), true, true, false);
    const DytBackward with_ones = dyt_backward(from_vector(dyv, {rows, d}, DType::F64),
                                               from_vector(xv, {rows, d}, DType::F64),
                                               from_vector(std::vector<double>{alpha}, {1}, DType::F64), ones({d}, DType::F64));
    CHECK_FALSE(bare.dweight.defined());
    CHECK_FALSE(bare.dbias.defined());
    CHECK(bare.dx.to_vector() == with_ones.dx.to_vector());
    CHECK(bare.dalpha.to_vector() == with_ones.dalpha.to_vector());
}

TEST_CASE("dyt: the same bits for 1 and 2 threads and for streamed outputs, and an empty batch has zero gradients",
          "[fused]") {
    const int64_t rows = 517, d = 96;  // above the parallel threshold; rows not a multiple of the chunks
    const auto xv = random_values(rows * d, 38, 0.0, 2.0);
    const auto dyv = random_values(rows * d, 39);
    const auto wv = random_values(d, 40);
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        const Tensor x = from_vector(xv, {rows, d}, dtype), dy = from_vector(dyv, {rows, d}, dtype);
        const Tensor w = from_vector(wv, {d}, dtype), alpha = from_vector(std::vector<double>{0.6}, {1}, dtype);
        const int saved_threads = omp_get_max_threads();
        std::vector<std::vector<double>> results[3];
        for (int run : {0, 1, 2}) {  // 1 thread, 2 threads, 2 threads streaming
            omp_set_num_threads(run == 0 ? 1 : 2);
            cpu_rows::set_stream_threshold_bytes(run == 2 ? 0 : -1);
            const Tensor y = dyt_forward(x, alpha, w, w);
            const DytBackward g = dyt_backward(dy, x, alpha, w);
            results[run] = {y.to_vector(), g.dx.to_vector(), g.dalpha.to_vector(), g.dweight.to_vector(),
                            g.dbias.to_vector()};
        }
        omp_set_num_threads(saved_threads);
        cpu_rows::set_stream_threshold_bytes(-1);
        CAPTURE(dtype_name(dtype));
        for (size_t i = 0; i < 5; ++i) {
            CHECK(results[0][i] == results[1][i]);
            CHECK(results[0][i] == results[2][i]);
        }
    }
    const Tensor empty = zeros({0, 4}, DType::F32), alpha = ones({1}, DType::F32);
    CHECK(dyt_forward(empty, alpha, Tensor(), Tensor()).shape() == Shape{0, 4});
    const DytBackward g = dyt_backward(empty, empty, alpha, ones({4}, DType::F32));
    CHECK(g.dx.shape() == Shape{0, 4});
    CHECK(g.dalpha.to_vector() == std::vector<double>{0.0});
    CHECK(g.dweight.to_vector() == std::vector<double>(4, 0.0));
    CHECK(g.dbias.to_vector() == std::vector<double>(4, 0.0));
}

TEST_CASE("dyt_forward/dyt_backward errors name the shapes and dtypes", "[fused]") {
    const Tensor x = zeros({2, 3}, DType::F32), alpha = ones({1}, DType::F32);
    REQUIRE_THROWS_WITH(dyt_forward(x, ones({2}, DType::F32), Tensor(), Tensor()),
                        Catch::Contains("dyt_forward: alpha must have shape [1], found [2]"));
    REQUIRE_THROWS_WITH(dyt_forward(x, Tensor(), Tensor(), Tensor()), Catch::Contains("dyt_forward: alpha is undefined"));
    REQUIRE_THROWS_WITH(dyt_forward(x, ones({1}, DType::F64), Tensor(), Tensor()),
                        Catch::Contains("alpha has dtype f64 but x has dtype f32"));
    REQUIRE_THROWS_WITH(dyt_forward(x, alpha, ones({4}, DType::F32), Tensor()),
                        Catch::Contains("dyt_forward: weight must have shape [3] for x of shape [2, 3], found [4]"));
    REQUIRE_THROWS_WITH(dyt_backward(zeros({3, 2}, DType::F32), x, alpha, Tensor()),
                        Catch::Contains("dyt_backward: dy has shape [3, 2] but x has shape [2, 3]"));
}

TEST_CASE("cross_entropy matches the reference with ignore_index and every reduction", "[fused]") {
    // Rows shorter than the kernel's 16 lanes, a whole number of them, and lanes plus a tail.
    const int64_t classes = GENERATE(5, 16, 37, 1000);
    INFO("classes " << classes);
    const int64_t rows = 6;  // logits (2, 3, classes), targets (2, 3)
    const auto zv = random_values(rows * classes, 21, 0.0, 3.0);
    const std::vector<int64_t> tv = {4, -100, 0, 2, -100, 1};
    const Tensor targets = from_vector(tv, {2, 3});
    for (DType dtype : {DType::F32, DType::F64}) {
        DYNAMIC_SECTION(dtype_name(dtype)) {
            const double tol = dtype == DType::F64 ? 1e-12 : 2e-6;
            const auto zr = rounded(zv, dtype);
            const Tensor logits = from_vector(zv, {2, 3, classes}, dtype);

            const auto none = cross_entropy_forward(logits, targets, -100, Reduction::None);
            const auto dloss_rows = random_values(rows, 22);
            const RefCrossEntropy ref = ref_cross_entropy(zr, tv, rows, classes, -100, dloss_rows);
            CHECK(none.count == 4);
            CHECK(none.loss.shape() == Shape{2, 3});
            CHECK(none.loss.dtype() == dtype);
            CHECK(max_rel_err(none.loss.to_vector(), ref.loss) < tol);
            CHECK(max_rel_err(none.lse.to_vector(), ref.lse) < tol);
            const Tensor dz_none = cross_entropy_backward(from_vector(dloss_rows, {2, 3}, dtype), logits, targets,
                                                          none.lse, -100, Reduction::None);
            CHECK(dz_none.shape() == logits.shape());
            CHECK(max_rel_err(dz_none.to_vector(), ref.dlogits) < tol);

            double total = 0.0;
            for (double l : ref.loss) total += l;
            const auto mean = cross_entropy_forward(logits, targets);
            CHECK(mean.loss.shape() == Shape{});
            CHECK(mean.loss.item() == Approx(total / 4).epsilon(tol));
            CHECK(cross_entropy(logits, targets, -100, Reduction::Sum).item() == Approx(total).epsilon(tol));

            // Mean: every non-ignored row's gradient scaled by dloss / count.
            const RefCrossEntropy ref_mean = ref_cross_entropy(zr, tv, rows, classes, -100,
                                                               std::vector<double>(rows, 0.5 / 4));
            const Tensor dz_mean = cross_entropy_backward(scalar_tensor(0.5, dtype), logits, targets, mean.lse);
            CHECK(max_rel_err(dz_mean.to_vector(), ref_mean.dlogits) < tol);
            const auto dz = dz_mean.to_vector();
            for (int64_t j = 0; j < classes; ++j) CHECK(dz[1 * classes + j] == 0.0);  // ignored row
        }
    }
}

TEST_CASE("cross_entropy and norm_backward read non-contiguous logits, targets and dy", "[fused]") {
    const int64_t rows = 4, classes = 3;
    const auto zv = random_values(rows * classes, 29);
    const Tensor logits = from_vector(zv, {classes, rows}, DType::F64).t();  // (rows, classes), strided
    const Tensor targets = from_vector(std::vector<int64_t>{0, 2, 1, 2, 1, 0, 0, 1}, {rows, 2}).select(1, 0);
    REQUIRE_FALSE(logits.is_contiguous());
    REQUIRE_FALSE(targets.is_contiguous());
    std::vector<double> zt(zv.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < classes; ++j) zt[r * classes + j] = zv[j * rows + r];
    const std::vector<int64_t> tv = {0, 1, 1, 0};
    const auto ref = ref_cross_entropy(zt, tv, rows, classes, -100, std::vector<double>(rows, 1.0));
    const auto out = cross_entropy_forward(logits, targets, -100, Reduction::Sum);
    double total = 0.0;
    for (double l : ref.loss) total += l;
    CHECK(out.loss.item() == Approx(total).epsilon(1e-13));
    const Tensor dz = cross_entropy_backward(scalar_tensor(1.0, DType::F64), logits, targets, out.lse, -100,
                                             Reduction::Sum);
    CHECK(max_rel_err(dz.to_vector(), ref.dlogits) < 1e-13);

    // norm_backward with a transposed dy equals the one with its contiguous copy.
    const Tensor x = from_vector(random_values(12, 30), {3, 4}, DType::F64);
    const Tensor dy = from_vector(random_values(12, 31), {4, 3}, DType::F64).t();
    const NormForward f = norm_forward(x, Tensor(), Tensor(), 1e-5, true);
    CHECK(norm_backward(dy, x, Tensor(), f.mean, f.rstd, true).dx.to_vector() ==
          norm_backward(dy.contiguous(), x, Tensor(), f.mean, f.rstd, true).dx.to_vector());
}

TEST_CASE("cross_entropy backward matches finite differences of the mean loss (f64)", "[fused]") {
    const int64_t rows = 4, classes = 3;
    const auto zv = random_values(rows * classes, 23);
    const Tensor targets = from_vector(std::vector<int64_t>{2, 0, 7, 1}, {rows});  // 7 is ignore_index
    auto loss = [&](const std::vector<double>& z) {
        return cross_entropy(from_vector(z, {rows, classes}, DType::F64), targets, 7).item();
    };
    const auto fwd = cross_entropy_forward(from_vector(zv, {rows, classes}, DType::F64), targets, 7);
    const auto dz = cross_entropy_backward(scalar_tensor(1.0, DType::F64), from_vector(zv, {rows, classes}, DType::F64),
                                           targets, fwd.lse, 7)
                        .to_vector();
    for (size_t i = 0; i < zv.size(); ++i) {
        auto up = zv, down = zv;
        up[i] += 1e-6;
        down[i] -= 1e-6;
        CHECK(dz[i] == Approx((loss(up) - loss(down)) / 2e-6).margin(1e-8));
    }
}

TEST_CASE("cross_entropy: all rows ignored gives NaN mean (as PyTorch) and zero gradient", "[fused]") {
    const Tensor logits = from_vector(random_values(6, 24), {2, 3});
    const Tensor targets = from_vector(std::vector<int64_t>{-100, -100}, {2});
    const auto fwd = cross_entropy_forward(logits, targets);
    CHECK(fwd.count == 0);
    CHECK(std::isnan(fwd.loss.item()));
    CHECK(cross_entropy(logits, targets, -100, Reduction::Sum).item() == 0.0);
    const Tensor dz = cross_entropy_backward(scalar_tensor(1.0), logits, targets, fwd.lse);
    CHECK(dz.to_vector() == std::vector<double>(6, 0.0));
}

TEST_CASE("cross_entropy reads bf16/f16 logits like the f32 path, and large logits stay finite", "[fused]") {
    const int64_t rows = 40, classes = 1000;  // 40000 logits: the multi-threaded path
    const auto zv = random_values(rows * classes, 25, 0.0, 4.0);
    std::vector<int64_t> tv(rows);
    for (int64_t r = 0; r < rows; ++r) tv[r] = (r * 37) % classes;
    const Tensor targets = from_vector(tv, {rows});
    for (DType half : {DType::BF16, DType::F16}) {
        const Tensor logits = from_vector(zv, {rows, classes}, half);
        const auto out = cross_entropy_forward(logits, targets, -100, Reduction::None);
        const auto ref = cross_entropy_forward(logits.to(DType::F32), targets, -100, Reduction::None);
        CHECK(out.lse.to_vector() == ref.lse.to_vector());
        CHECK(max_rel_err(out.loss.to_vector(), ref.loss.to_vector()) < 1e-2);
        const Tensor dz = cross_entropy_backward(scalar_tensor(1.0, half), logits, targets, out.lse);
        const Tensor dz_ref = cross_entropy_backward(scalar_tensor(1.0), logits.to(DType::F32), targets, ref.lse);
        CHECK(dz.dtype() == half);
        CHECK(max_rel_err(dz.to_vector(), dz_ref.to_vector(), 1e-3) < 1e-2);
    }
    const Tensor big = from_vector(std::vector<double>{1000.0, 0.0, -1000.0}, {1, 3});
    const auto fwd = cross_entropy_forward(big, from_vector(std::vector<int64_t>{1}, {1}));
    CHECK(fwd.loss.item() == Approx(1000.0));
}

TEST_CASE("cross_entropy errors name the shapes and the bad target", "[fused]") {
    const Tensor logits = zeros({2, 3});
    REQUIRE_THROWS_WITH(cross_entropy(logits, from_vector(std::vector<int64_t>{0, 3}, {2})),
                        Catch::Contains("cross_entropy: target 3 at row 1 is out of range for 3 classes"));
    REQUIRE_THROWS_WITH(cross_entropy(logits, from_vector(std::vector<int64_t>{0, 1, 2}, {3})),
                        Catch::Contains("targets of shape [3] do not match logits of shape [2, 3]"));
    REQUIRE_THROWS_WITH(cross_entropy(logits, zeros({2})), Catch::Contains("targets must be i64 class indices, found f32"));
    const auto fwd = cross_entropy_forward(logits, from_vector(std::vector<int64_t>{0, 1}, {2}));
    REQUIRE_THROWS_WITH(cross_entropy_backward(zeros({2}), logits, from_vector(std::vector<int64_t>{0, 1}, {2}), fwd.lse),
                        Catch::Contains("dloss must have one element, found shape [2]"));
}

namespace {

struct RefAdamState {
    std::vector<double> p, m, v, vmax;
};

// torch/optim/adam.py, _single_tensor_adam, in f64.
void ref_adam(RefAdamState& s, const std::vector<double>& g_in, const AdamParams& a, int64_t step) {
    const double bc1 = 1 - std::pow(a.beta1, step), bc2 = 1 - std::pow(a.beta2, step);
    for (size_t i = 0; i < s.p.size(); ++i) {
        double g = g_in[i];
        if (a.decoupled) s.p[i] *= 1 - a.lr * a.weight_decay;
        else g += a.weight_decay * s.p[i];
        s.m[i] = a.beta1 * s.m[i] + (1 - a.beta1) * g;
        s.v[i] = a.beta2 * s.v[i] + (1 - a.beta2) * g * g;
        s.vmax[i] = std::max(s.vmax[i], s.v[i]);
        const double denom = std::sqrt(a.amsgrad ? s.vmax[i] : s.v[i]) / std::sqrt(bc2) + a.eps;
        s.p[i] -= a.lr / bc1 * s.m[i] / denom;
    }
}

}  // namespace

TEST_CASE("adam_step follows Adam, AdamW and AMSGrad over several steps", "[fused]") {
    const int64_t n = 50;
    struct Case {
        const char* name;
        AdamParams params;
    };
    const std::vector<Case> cases = {
        {"adam", {1e-2, 0.9, 0.999, 1e-8, 0.0, false, false}},
        {"adam l2", {1e-2, 0.8, 0.99, 1e-6, 0.1, false, false}},
        {"adamw", {1e-2, 0.9, 0.999, 1e-8, 0.05, true, false}},
        {"adamw amsgrad", {3e-2, 0.6, 0.9, 1e-8, 0.01, true, true}},  // beta1 < 0.5: lerp's other form
    };
    for (const auto& c : cases) {
        for (DType dtype : {DType::F64, DType::F32}) {
            DYNAMIC_SECTION(c.name << " " << dtype_name(dtype)) {
                RefAdamState ref{rounded(random_values(n, 26), dtype), std::vector<double>(n, 0.0),
                                 std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
                Tensor p = from_vector(ref.p, {5, 10}, dtype);
                Tensor m = zeros({5, 10}, dtype), v = zeros({5, 10}, dtype);
                const Tensor vmax = c.params.amsgrad ? zeros({5, 10}, dtype) : Tensor();
                for (int64_t step = 1; step <= 6; ++step) {
                    // Gradients shrinking over time so AMSGrad's max differs from v.
                    const auto g = rounded(random_values(n, 100 + step, 0.0, 2.0 / step), dtype);
                    // grad arrives as a transposed view: adam_step packs it.
                    std::vector<double> g_t(g.size());
                    for (int64_t i = 0; i < 5; ++i)
                        for (int64_t j = 0; j < 10; ++j) g_t[j * 5 + i] = g[i * 10 + j];
                    adam_step(p, from_vector(g_t, {10, 5}, dtype).t(), m, v, c.params, step, vmax);
                    ref_adam(ref, g, c.params, step);
                }
                const double tol = dtype == DType::F64 ? 1e-13 : 2e-5;
                CHECK(max_rel_err(p.to_vector(), ref.p) < tol);
                CHECK(max_rel_err(m.to_vector(), ref.m, 1e-3) < tol);
                CHECK(max_rel_err(v.to_vector(), ref.v, 1e-3) < tol);
                if (c.params.amsgrad) CHECK(max_rel_err(vmax.to_vector(), ref.vmax, 1e-3) < tol);
            }
        }
    }
}

TEST_CASE("adam_step: AMSGrad's max really differs from v, and a large tensor runs threaded", "[fused]") {
    const int64_t n = 40000;
    AdamParams params;
    params.amsgrad = true;
    Tensor p = from_vector(random_values(n, 27), {n}, DType::F64);
    Tensor m = zeros({n}, DType::F64), v = zeros({n}, DType::F64), vmax = zeros({n}, DType::F64);
    adam_step(p, full({n}, 1.0, DType::F64), m, v, params, 1, vmax);
    adam_step(p, full({n}, 0.0, DType::F64), m, v, params, 2, vmax);
    CHECK(vmax.to_vector()[123] > v.to_vector()[123]);
    CHECK(v.to_vector()[n - 1] == Approx(0.001 * 0.999));
}

namespace {

// torch/optim/sgd.py, _single_tensor_sgd, in f64.
void ref_sgd(std::vector<double>& p, std::vector<double>& buf, const std::vector<double>& g_in, const SgdParams& s,
             bool first) {
    for (size_t i = 0; i < p.size(); ++i) {
        double g = g_in[i] + s.weight_decay * p[i];
        if (s.momentum != 0.0) {
            buf[i] = first ? g : s.momentum * buf[i] + (1 - s.dampening) * g;
            g = s.nesterov ? g + s.momentum * buf[i] : buf[i];
        }
        p[i] -= s.lr * g;
    }
}

}  // namespace

TEST_CASE("sgd_step follows PyTorch's SGD with momentum, dampening, nesterov and weight decay", "[fused]") {
    const int64_t n = 30;
    const std::vector<std::pair<const char*, SgdParams>> cases = {
        {"plain", {0.1, 0.0, 0.0, 0.0, false}},
        {"momentum", {0.1, 0.9, 0.0, 0.0, false}},
        {"dampening + decay", {0.05, 0.8, 0.3, 0.01, false}},
        {"nesterov", {0.1, 0.9, 0.0, 0.001, true}},
    };
    for (const auto& [name, params] : cases) {
        for (DType dtype : {DType::F64, DType::F32}) {
            DYNAMIC_SECTION(name << " " << dtype_name(dtype)) {
                auto ref_p = rounded(random_values(n, 28), dtype);
                std::vector<double> ref_buf(n, 0.0);
                Tensor p = from_vector(ref_p, {n}, dtype);
                // Garbage in the buffer: the first step must overwrite it with the gradient.
                Tensor buf = params.momentum != 0.0 ? full({n}, 123.0, dtype) : Tensor();
                for (int step = 1; step <= 5; ++step) {
                    const auto g = rounded(random_values(n, 200 + step), dtype);
                    sgd_step(p, from_vector(g, {n}, dtype), buf, params, step == 1);
                    ref_sgd(ref_p, ref_buf, g, params, step == 1);
                }
                const double tol = dtype == DType::F64 ? 1e-13 : 1e-5;
                CHECK(max_rel_err(p.to_vector(), ref_p) < tol);
                if (params.momentum != 0.0) CHECK(max_rel_err(buf.to_vector(), ref_buf) < tol);
            }
        }
    }
}

TEST_CASE("optimizer steps reject mismatched state and invalid hyperparameters", "[fused]") {
    Tensor p = zeros({2, 3}), m = zeros({2, 3}), v = zeros({2, 3});
    AdamParams a;
    REQUIRE_THROWS_WITH(adam_step(p, zeros({3, 2}), m, v, a, 1),
                        Catch::Contains("adam_step: grad has shape [3, 2] but param has shape [2, 3]"));
    Tensor v64 = zeros({2, 3}, DType::F64);
    REQUIRE_THROWS_WITH(adam_step(p, zeros({2, 3}), m, v64, a, 1),
                        Catch::Contains("exp_avg_sq has dtype f64 but param has dtype f32"));
    Tensor half = zeros({2, 3}, DType::BF16);
    REQUIRE_THROWS_WITH(adam_step(half, half, m, v, a, 1), Catch::Contains("expected f32 or f64 parameters, found bf16"));
    REQUIRE_THROWS_WITH(adam_step(p, zeros({2, 3}), m, v, a, 0), Catch::Contains("step counts from 1, found 0"));
    a.decoupled = true;
    a.amsgrad = true;
    REQUIRE_THROWS_WITH(adam_step(p, zeros({2, 3}), m, v, a, 1), Catch::Contains("adamw_step: max_exp_avg_sq is undefined"));
    a.amsgrad = false;
    a.beta2 = 1.0;
    REQUIRE_THROWS_WITH(adam_step(p, zeros({2, 3}), m, v, a, 1), Catch::Contains("invalid beta2 1 (expected in [0, 1))"));
    Tensor mt = zeros({3, 2}).t();
    a.beta2 = 0.999;
    REQUIRE_THROWS_WITH(adam_step(p, zeros({2, 3}), mt, v, a, 1), Catch::Contains("exp_avg must be contiguous"));

    Tensor none;
    SgdParams s;
    s.momentum = 0.9;
    REQUIRE_THROWS_WITH(sgd_step(p, zeros({2, 3}), none, s, true), Catch::Contains("sgd_step: momentum_buffer is undefined"));
    s.nesterov = true;
    s.dampening = 0.1;
    Tensor buf = zeros({2, 3});
    REQUIRE_THROWS_WITH(sgd_step(p, zeros({2, 3}), buf, s, true),
                        Catch::Contains("nesterov momentum requires a momentum and zero dampening"));
}

TEST_CASE("rope_rotate matches the f64 complex-product reference, inverse undoes it, errors name shapes",
          "[fused]") {
    // (B, T, H, hd) = (4, 64, 9, 16): 36864 elements, the threaded path; (2, 3, 1, 2): the smallest.
    for (const Shape& shape : {Shape{4, 64, 9, 16}, Shape{2, 3, 1, 2}}) {
        const int64_t B = shape[0], T = shape[1], H = shape[2], hd = shape[3], half = hd / 2;
        const std::vector<double> xv = random_values(B * T * H * hd, 41);
        const std::vector<double> cv = random_values(T * half, 42), sv = random_values(T * half, 43);
        for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
            INFO(dtype_name(dtype) << " " << shape_str(shape));
            const DType table_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
            const Tensor x = from_vector(xv, shape, dtype);
            const Tensor cos = from_vector(cv, {T, half}, table_dtype), sin = from_vector(sv, {T, half}, table_dtype);
            // Reference on exactly the values the kernel sees (x rounded to its dtype, tables to theirs).
            const std::vector<double> xr = rounded(xv, dtype), cr = rounded(cv, table_dtype),
                                      sr = rounded(sv, table_dtype);
            for (bool inverse : {false, true}) {
                std::vector<double> want(xr.size());
                for (int64_t row = 0; row < B * T * H; ++row) {
                    const int64_t t = (row / H) % T;
                    for (int64_t i = 0; i < half; ++i) {
                        const double re = xr[row * hd + 2 * i], im = xr[row * hd + 2 * i + 1];
                        const double c = cr[t * half + i], s = inverse ? -sr[t * half + i] : sr[t * half + i];
                        want[row * hd + 2 * i] = re * c - im * s;
                        want[row * hd + 2 * i + 1] = re * s + im * c;
                    }
                }
                const Tensor got = rope_rotate(x, cos, sin, inverse);
                REQUIRE(got.dtype() == dtype);
                REQUIRE(got.shape() == shape);
                const double tol = dtype == DType::F64 ? 1e-15 : dtype == DType::F32 ? 1e-6 : 1e-2;
                REQUIRE(max_rel_err(got.to_vector(), want) < tol);
            }
            if (dtype != DType::BF16) {
                // Rotations with unit-length (cos, sin) pairs: the inverse brings x back.
                std::vector<double> angles = random_values(T * half, 44), c(angles.size()), s(angles.size());
                for (size_t i = 0; i < angles.size(); ++i) {
                    c[i] = std::cos(angles[i]);
                    s[i] = std::sin(angles[i]);
                }
                const Tensor uc = from_vector(c, {T, half}, table_dtype), us = from_vector(s, {T, half}, table_dtype);
                const Tensor back = rope_rotate(rope_rotate(x, uc, us, false), uc, us, true);
                REQUIRE(max_rel_err(back.to_vector(), x.to_vector()) < (dtype == DType::F64 ? 1e-14 : 1e-6));
            }
        }
    }
    // bf16 on the CPU is rotated as it is stored: the bits of the f32 rotation of the same values, rounded once.
    {
        const Tensor x = from_vector(random_values(4 * 64 * 9 * 16, 48), {4, 64, 9, 16}).to(DType::BF16);
        const Tensor cos = from_vector(random_values(64 * 8, 49), {64, 8}), sin = from_vector(random_values(64 * 8, 50), {64, 8});
        for (bool inverse : {false, true}) {
            const Tensor got = rope_rotate(x, cos, sin, inverse);
            REQUIRE(got.dtype() == DType::BF16);
            REQUIRE(got.to_vector() == rope_rotate(x.to(DType::F32), cos, sin, inverse).to(DType::BF16).to_vector());
        }
    }
    // A non-contiguous x (a transposed view) reads the same values as its contiguous copy.
    const Tensor xt = from_vector(random_values(5 * 2 * 3 * 4, 45), {5, 2, 3, 4}).transpose(0, 1);  // (2, 5, 3, 4)
    const Tensor c = from_vector(random_values(10, 46), {5, 2}), s = from_vector(random_values(10, 47), {5, 2});
    REQUIRE(rope_rotate(xt, c, s).to_vector() == rope_rotate(xt.contiguous(), c, s).to_vector());

    REQUIRE_THROWS_WITH(rope_rotate(zeros({2, 5, 3, 3}), c, s), Catch::Contains("even head_dim, found [2, 5, 3, 3]"));
    REQUIRE_THROWS_WITH(rope_rotate(zeros({2, 5, 3, 4}), zeros({4, 2}), s),
                        Catch::Contains("cos must have shape [5, 2] for x of shape [2, 5, 3, 4], found [4, 2]"));
    REQUIRE_THROWS_WITH(rope_rotate(zeros({2, 5, 3, 4}), c, s.to(DType::F64)),
                        Catch::Contains("sin must be f32 for x of dtype f32, found f64"));
}

// ---- soft-capping ----

TEST_CASE("softcap_forward/softcap_backward match the f64 reference in f32, f64 and bf16, saturation included",
          "[fused][softcap]") {
    // 300 x 257 (above the parallel threshold, a chunk left over); x up to ~6 caps: tanh's polynomial
    // and exp branches and its saturation.
    const int64_t n = 300 * 257;
    const double cap = 15.0;
    const auto xv = random_values(n, 53, 1.0, 30.0);
    const auto dyv = random_values(n, 54);
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        CAPTURE(dtype_name(dtype));
        const std::vector<double> x = rounded(xv, dtype), dy = rounded(dyv, dtype);
        const Tensor y = softcap_forward(from_vector(x, {300, 257}, dtype), cap);
        CHECK(y.dtype() == dtype);
        // dx from the y the kernel saw (the backward's input). The reference is 1 - (y / cap)^2 as
        // (cap - y)(cap + y) / cap^2 in long double: the f64 1 - t * t cancels near saturation.
        const std::vector<double> yv = y.to_vector();
        const Tensor dx = softcap_backward(from_vector(dy, {300, 257}, dtype), y, cap);
        std::vector<double> want_y(x.size()), want_dx(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            want_y[i] = cap * std::tanh(x[i] / cap);
            const long double c = cap, v = yv[i];
            want_dx[i] = static_cast<double>(dy[i] * ((c - v) * (c + v) / (c * c)));
        }
        // f64: rounding only; f32: tanh's 1.33 ulp and a few roundings; bf16: one rounding of each output.
        const double tol = dtype == DType::F64 ? 1e-14 : dtype == DType::F32 ? 1e-6 : 8e-3;
        CHECK(max_rel_err(yv, want_y, 1e-30) < tol);
        CHECK(max_rel_err(dx.to_vector(), want_dx, 1e-30) < tol);
    }
}

TEST_CASE("softcap: the same bits on 1 and 2 threads, empty tensors, errors name what was found",
          "[fused][softcap]") {
    const Tensor x = from_vector(random_values(300 * 257, 51, 0.0, 50.0), {300, 257}, DType::F32);
    const Tensor dy = from_vector(random_values(300 * 257, 52), {300, 257}, DType::F32);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Tensor y1 = softcap_forward(x, 30.0), g1 = softcap_backward(dy, y1, 30.0);
    omp_set_num_threads(2);
    const Tensor y2 = softcap_forward(x, 30.0), g2 = softcap_backward(dy, y2, 30.0);
    omp_set_num_threads(threads);
    CHECK(y1.to_vector() == y2.to_vector());
    CHECK(g1.to_vector() == g2.to_vector());
    // A transposed (strided) x gives the contiguous result of its values.
    CHECK(softcap_forward(x.t(), 30.0).to_vector() == softcap_forward(x.t().contiguous(), 30.0).to_vector());
    const Tensor empty = zeros({0, 5});
    CHECK(softcap_forward(empty, 30.0).shape() == Shape{0, 5});
    CHECK(softcap_backward(empty, empty, 30.0).shape() == Shape{0, 5});
    CHECK_THROWS_WITH(softcap_forward(x, 0.0), Catch::Contains("softcap: cap must be finite and > 0, found 0"));
    CHECK_THROWS_WITH(softcap_forward(x, -2.0), Catch::Contains("softcap: cap must be finite and > 0, found -2"));
    CHECK_THROWS_WITH(softcap_backward(zeros({2, 3}), x, 30.0),
                      Catch::Contains("softcap_backward: dy has shape [2, 3] but y has shape [300, 257]"));
    CHECK_THROWS_WITH(softcap_forward(zeros({2}, DType::I64), 30.0), Catch::Contains("softcap"));
}
