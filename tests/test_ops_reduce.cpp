// Reductions and softmax against plain f64 reference loops: every single dim, adjacent and
// non-adjacent dim pairs, all dims, keepdim, negative dims, views, large (threaded, chunked) inputs,
// accuracy of long f32 sums and of the variance of large-offset data, argmax ties, empty dims,
// sum_to, the softmax family with its backward kernels, and the error messages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "core/ops.h"

using namespace nl;

namespace {

enum class Ref { Sum, Mean, Max, Min, Var0, Var1, ArgMax, SumSquares };

// Groups the row-major values of `a` by their index in the kept dims; within a group the values
// stay in row-major order (so "first" means what argmax means by it).
std::vector<std::vector<double>> groups(const Tensor& a, const std::set<int64_t>& dims, Shape* kept_shape) {
    const Shape& s = a.shape();
    kept_shape->clear();
    for (int64_t d = 0; d < a.dim(); ++d)
        if (!dims.count(d)) kept_shape->push_back(s[d]);
    std::vector<std::vector<double>> out(shape_numel(*kept_shape));
    const std::vector<double> v = a.to_vector();
    for (int64_t flat = 0; flat < static_cast<int64_t>(v.size()); ++flat) {
        int64_t rest = flat, key = 0, scale = 1;
        for (int64_t d = a.dim() - 1; d >= 0; --d) {
            const int64_t i = rest % s[d];
            rest /= s[d];
            if (!dims.count(d)) {
                key += i * scale;
                scale *= s[d];
            }
        }
        out[key].push_back(v[flat]);
    }
    return out;
}

double ref_reduce(Ref op, const std::vector<double>& g) {
    const double n = static_cast<double>(g.size());
    double sum = 0.0;
    for (double x : g) sum += x;
    switch (op) {
        case Ref::Sum: return sum;
        case Ref::Mean: return sum / n;
        case Ref::SumSquares: {
            double ss = 0.0;
            for (double x : g) ss += x * x;
            return ss;
        }
        case Ref::Max: return *std::max_element(g.begin(), g.end());
        case Ref::Min: return *std::min_element(g.begin(), g.end());
        case Ref::ArgMax: return static_cast<double>(std::max_element(g.begin(), g.end()) - g.begin());
        case Ref::Var0:
        case Ref::Var1: {
            const double mean = sum / n;
            double ss = 0.0;
            for (double x : g) ss += (x - mean) * (x - mean);
            return ss / (n - (op == Ref::Var1 ? 1.0 : 0.0));
        }
    }
    return 0.0;
}

Tensor run(Ref op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
    switch (op) {
        case Ref::Sum: return sum(a, dims, keepdim);
        case Ref::Mean: return mean(a, dims, keepdim);
        case Ref::SumSquares: return sum_of_squares(a, dims, keepdim);
        case Ref::Max: return max(a, dims, keepdim);
        case Ref::Min: return min(a, dims, keepdim);
        case Ref::Var0: return var(a, dims, 0, keepdim);
        case Ref::Var1: return var(a, dims, 1, keepdim);
        case Ref::ArgMax: return argmax(a, dims.at(0), keepdim);
    }
    return Tensor();
}

// Runs op over `dims` and compares shape and values with the reference.
void check_reduce(Ref op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, double tol) {
    INFO("op " << int(op) << " on " << shape_str(a.shape()) << " " << dtype_name(a.dtype()) << " keepdim "
               << keepdim << " dims " << shape_str(dims));
    std::set<int64_t> wrapped;
    for (int64_t d : dims) wrapped.insert(d < 0 ? d + a.dim() : d);
    if (dims.empty())
        for (int64_t d = 0; d < a.dim(); ++d) wrapped.insert(d);
    Shape kept;
    const std::vector<std::vector<double>> g = groups(a, wrapped, &kept);
    Shape want_shape;
    for (int64_t d = 0; d < a.dim(); ++d) {
        if (!wrapped.count(d)) want_shape.push_back(a.shape()[d]);
        else if (keepdim) want_shape.push_back(1);
    }
    const Tensor got = run(op, a, dims, keepdim);
    REQUIRE(got.shape() == want_shape);
    REQUIRE(got.dtype() == (op == Ref::ArgMax ? DType::I64 : a.dtype()));
    const std::vector<double> gv = got.to_vector();
    for (size_t i = 0; i < g.size(); ++i) {
        const double want = ref_reduce(op, g[i]);
        if (std::abs(gv[i] - want) <= tol * (1.0 + std::abs(want))) continue;
        INFO("output " << i << ": got " << gv[i] << ", want " << want);
        REQUIRE(std::abs(gv[i] - want) <= tol * (1.0 + std::abs(want)));
    }
}

double tol_for(DType dt) { return dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 2e-6 : 2e-2); }

const std::vector<Ref> kValueOps = {Ref::Sum, Ref::Mean, Ref::Max, Ref::Min, Ref::Var0, Ref::Var1, Ref::SumSquares};

}  // namespace

TEST_CASE("reductions over single dims, dim pairs and all dims", "[reduce]") {
    Generator gen(21);
    const std::vector<std::vector<int64_t>> dim_sets = {{0},    {1},    {2},     {-1},      {-3},
                                                        {0, 1}, {0, 2}, {1, 2},  {2, 0},    {},
                                                        {0, 1, 2}, {-1, 0}};
    for (DType dt : {DType::F32, DType::F64}) {
        const Tensor base = randn({3, 4, 5}, gen, dt);
        const Tensor permuted = randn({5, 3, 4}, gen, dt).permute({1, 2, 0});    // [3, 4, 5]
        const Tensor stepped = randn({3, 8, 6}, gen, dt).slice(1, 0, 8, 2).narrow(2, 1, 5);  // [3, 4, 5]
        const Tensor expanded = randn({3, 1, 5}, gen, dt).expand({3, 4, 5});
        for (const Tensor& a : {base, permuted, stepped, expanded})
            for (const auto& dims : dim_sets)
                for (bool keepdim : {false, true})
                    for (Ref op : kValueOps) check_reduce(op, a, dims, keepdim, tol_for(dt));
    }
}

TEST_CASE("reductions over size-1 dims, scalars and bf16/f16", "[reduce]") {
    Generator gen(22);
    for (Ref op : {Ref::Sum, Ref::Mean, Ref::Max, Ref::Min, Ref::Var0, Ref::SumSquares}) {
        check_reduce(op, randn({1, 6, 1}, gen), {0}, false, 2e-6);
        check_reduce(op, randn({1, 6, 1}, gen), {1}, true, 2e-6);
        check_reduce(op, randn({1, 6, 1}, gen), {0, 2}, false, 2e-6);
        check_reduce(op, randn({4, 1, 3}, gen), {1}, false, 2e-6);
        for (DType dt : {DType::BF16, DType::F16}) {
            const Tensor h = randn({6, 7}, gen, dt);
            check_reduce(op, h, {1}, false, 2e-2);
            check_reduce(op, h.t(), {}, false, 2e-2);
            // computed in f32 and rounded once
            REQUIRE(max_abs_diff(run(op, h, {0}, true), run(op, h.to(DType::F32), {0}, true).to(dt)) == 0.0);
        }
    }
    const Tensor s = scalar_tensor(2.5, DType::F64);
    REQUIRE(sum(s).item() == 2.5);
    REQUIRE(sum(s).dim() == 0);
    REQUIRE(mean(s, {0}).item() == 2.5);
    REQUIRE(max(s, {-1}, true).item() == 2.5);
    REQUIRE(std::isnan(var(s).item()));  // one element, unbiased: 0 / 0 like PyTorch
    REQUIRE(var(s, {}, 0).item() == 0.0);
}

TEST_CASE("reductions on large inputs use the threaded and chunked paths", "[reduce]") {
    Generator gen(23);
    const Tensor rows2 = randn({2, 70000}, gen), all = randn({70001}, gen, DType::F64);
    const Tensor many = randn({2000, 40}, gen), cols = randn({40, 2000}, gen), mid = randn({6, 300, 30}, gen);
    for (Ref op : {Ref::Sum, Ref::Mean, Ref::Max, Ref::Min, Ref::Var1, Ref::SumSquares}) {
        check_reduce(op, rows2, {1}, false, 1e-5);        // few long rows: chunks, in parallel
        check_reduce(op, all, {}, false, 1e-12);          // one row
        check_reduce(op, many, {1}, false, 1e-5);         // many rows, one per thread
        check_reduce(op, cols, {0}, true, 1e-5);          // columns, inner > 1
        check_reduce(op, mid, {0, 2}, false, 1e-5);       // non-adjacent: permuted to the end
    }
    check_reduce(Ref::ArgMax, rows2, {1}, false, 0.0);
    check_reduce(Ref::ArgMax, cols, {0}, false, 0.0);
}

TEST_CASE("long f32 sums and the variance of large-offset data stay accurate", "[reduce]") {
    // 2^20 copies of 0.1f: float accumulation would drift by percents, double stays exact to rounding.
    const int64_t n = 1 << 20;
    const Tensor tenth = full({n}, 0.1, DType::F32);
    const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
    REQUIRE(sum(tenth).item() == Approx(exact).epsilon(1e-7));
    REQUIRE(mean(tenth.view({1024, 1024}), {0}).to_vector()[17] == Approx(0.1f).epsilon(1e-7));
    const double tenth_sq = static_cast<double>(0.1f) * static_cast<double>(0.1f);
    REQUIRE(sum_of_squares(tenth).item() == Approx(static_cast<double>(n) * tenth_sq).epsilon(1e-7));
    REQUIRE(sum_of_squares(tenth.view({1024, 1024}), {0}).to_vector()[5] == Approx(1024.0 * tenth_sq).epsilon(1e-7));

    // var of 1e4 + 1e-2 noise: E[x^2] - E[x]^2 in f32 would lose every digit.
    Generator gen(24);
    const Tensor x = add(mul(randn({20000}, gen, DType::F64), 1e-2), 1e4).to(DType::F32);
    const std::vector<double> xv = x.to_vector();
    const double want = ref_reduce(Ref::Var1, xv);
    REQUIRE(var(x).item() == Approx(want).epsilon(1e-4));
    REQUIRE(var(x.view({100, 200}), {1}, 0).to_vector()[3] ==
            Approx(ref_reduce(Ref::Var0, std::vector<double>(xv.begin() + 600, xv.begin() + 800))).epsilon(1e-4));
    std::vector<double> column;  // column 5 of the (200, 100) view: the inner > 1 path
    for (int64_t i = 0; i < 200; ++i) column.push_back(xv[i * 100 + 5]);
    REQUIRE(var(x.view({200, 100}), {0}, 1).to_vector()[5] == Approx(ref_reduce(Ref::Var1, column)).epsilon(1e-4));
}

TEST_CASE("argmax: first max wins, every dim, keepdim, NaN counts as max", "[reduce]") {
    const Tensor t = from_vector(std::vector<double>{1, 3, 3, 2, 5, 5, 0, 5}, {2, 4});
    REQUIRE(argmax(t, 1).to_vector() == std::vector<double>{1, 0});
    REQUIRE(argmax(t, -1, true).shape() == Shape{2, 1});
    REQUIRE(argmax(t, 0).to_vector() == std::vector<double>{1, 1, 0, 1});
    REQUIRE(argmax(t.t(), 0).to_vector() == std::vector<double>{1, 0});
    const double nan = std::numeric_limits<double>::quiet_NaN();
    REQUIRE(argmax(from_vector(std::vector<double>{1, nan, 5, nan}, {4}), 0).item() == 1.0);
    REQUIRE(std::isnan(max(from_vector(std::vector<double>{1, nan, 5}, {3})).item()));
    REQUIRE(std::isnan(min(from_vector(std::vector<double>{1, nan, 5}, {3})).item()));
    Generator gen(25);
    const Tensor r = randn({3, 4, 5}, gen);
    for (int64_t d : {0, 1, 2, -1})
        for (bool keepdim : {false, true}) check_reduce(Ref::ArgMax, r, {d}, keepdim, 0.0);
    check_reduce(Ref::ArgMax, r.permute({2, 0, 1}), {1}, false, 0.0);
    REQUIRE(argmax(scalar_tensor(3.0), 0).item() == 0.0);
}

TEST_CASE("reductions over empty dims", "[reduce]") {
    const Tensor e = zeros({2, 0, 3});
    const Tensor s = sum(e, {1});
    REQUIRE(s.shape() == Shape{2, 3});
    REQUIRE(s.to_vector() == std::vector<double>(6, 0.0));
    REQUIRE(sum(e).item() == 0.0);
    REQUIRE(sum_of_squares(e, {1}).to_vector() == std::vector<double>(6, 0.0));  // an empty sum is 0
    REQUIRE(sum(e, {1}, true).shape() == Shape{2, 1, 3});
    for (double v : mean(e, {1}).to_vector()) REQUIRE(std::isnan(v));
    REQUIRE(sum(e, {0}).shape() == Shape{0, 3});
    REQUIRE(max(e, {0, 2}).shape() == Shape{0});
    REQUIRE_THROWS_WITH(max(e, {1}), Catch::Contains("max: cannot reduce over an empty dim (input [2, 0, 3])"));
    REQUIRE_THROWS_WITH(min(e), Catch::Contains("min: cannot reduce over an empty dim"));
    REQUIRE_THROWS_WITH(argmax(e, 1), Catch::Contains("argmax: cannot reduce over an empty dim"));
}

TEST_CASE("sum_to reverses broadcasting", "[reduce]") {
    Generator gen(26);
    const Tensor a = randn({2, 3, 4}, gen, DType::F64);
    const std::vector<double> av = a.to_vector();
    auto at = [&](int64_t i, int64_t j, int64_t k) { return av[(i * 3 + j) * 4 + k]; };

    const Tensor r1 = sum_to(a, {3, 1});
    REQUIRE(r1.shape() == Shape{3, 1});
    for (int64_t j = 0; j < 3; ++j) {
        double want = 0.0;
        for (int64_t i = 0; i < 2; ++i)
            for (int64_t k = 0; k < 4; ++k) want += at(i, j, k);
        REQUIRE(r1.at({j, 0}) == Approx(want).epsilon(1e-12));
    }
    const Tensor r2 = sum_to(a, {4});
    REQUIRE(r2.shape() == Shape{4});
    for (int64_t k = 0; k < 4; ++k) {
        double want = 0.0;
        for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 3; ++j) want += at(i, j, k);
        REQUIRE(r2.at({k}) == Approx(want).epsilon(1e-12));
    }
    REQUIRE(sum_to(a, {1, 1}).item() == Approx(sum(a).item()).epsilon(1e-12));
    REQUIRE(sum_to(a, {}).shape() == Shape{});
    REQUIRE(sum_to(a, {2, 1, 4}).shape() == Shape{2, 1, 4});
    REQUIRE(max_abs_diff(sum_to(a, {2, 3, 4}), a) == 0.0);
    REQUIRE(max_abs_diff(sum_to(a.transpose(0, 2), {4, 1, 1}), sum(a, {0, 1}).view({4, 1, 1})) < 1e-12);
    REQUIRE_THROWS_WITH(sum_to(zeros({2, 3}), {4}), Catch::Contains("sum_to: cannot sum [2, 3] to [4]"));
    REQUIRE_THROWS_WITH(sum_to(zeros({3}), {2, 3}), Catch::Contains("sum_to: cannot sum [3] to [2, 3]"));
}

namespace {

// softmax of each row along `dim` in f64, written out plainly.
std::vector<double> ref_softmax(const Tensor& a, int64_t dim, bool log) {
    const Shape& s = a.shape();
    const std::vector<double> v = a.to_vector();
    const std::vector<int64_t> st = contiguous_strides(s);
    std::vector<double> out(v.size());
    for (int64_t flat = 0; flat < static_cast<int64_t>(v.size()); ++flat) {
        if ((flat / st[dim]) % s[dim] != 0) continue;  // start of a row along dim
        double m = -std::numeric_limits<double>::infinity(), z = 0.0;
        for (int64_t j = 0; j < s[dim]; ++j) m = std::max(m, v[flat + j * st[dim]]);
        for (int64_t j = 0; j < s[dim]; ++j) z += std::exp(v[flat + j * st[dim]] - m);
        for (int64_t j = 0; j < s[dim]; ++j) {
            const double x = v[flat + j * st[dim]];
            out[flat + j * st[dim]] = log ? x - m - std::log(z) : std::exp(x - m) / z;
        }
    }
    return out;
}

void require_near(const Tensor& got, const std::vector<double>& want, double tol) {
    const std::vector<double> g = got.to_vector();
    REQUIRE(g.size() == want.size());
    for (size_t i = 0; i < g.size(); ++i) {
        if (std::abs(g[i] - want[i]) <= tol * (1.0 + std::abs(want[i]))) continue;
        INFO("index " << i << ": got " << g[i] << ", want " << want[i]);
        REQUIRE(std::abs(g[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
    }
}

}  // namespace

TEST_CASE("softmax and log_softmax along every dim match the reference", "[reduce]") {
    Generator gen(27);
    for (DType dt : {DType::F32, DType::F64}) {
        const double tol = tol_for(dt) * 4;
        const Tensor base = mul(randn({3, 4, 5}, gen, dt), 3.0);
        for (const Tensor& a : {base, base.permute({2, 0, 1}), base.slice(2, 0, 5, 2)}) {
            for (int64_t dim = -a.dim(); dim < a.dim(); ++dim) {
                INFO(shape_str(a.shape()) << " dim " << dim);
                const int64_t d = dim < 0 ? dim + a.dim() : dim;
                const Tensor y = softmax(a, dim);
                REQUIRE(y.shape() == a.shape());
                REQUIRE(y.dtype() == dt);
                require_near(y, ref_softmax(a, d, false), tol);
                require_near(sum(y, {dim}), std::vector<double>(a.numel() / a.size(d), 1.0), tol);
                require_near(log_softmax(a, dim), ref_softmax(a, d, true), tol);
                REQUIRE(max_abs_diff(log_softmax(a, dim), log(softmax(a, dim))) < tol * 10);
            }
        }
    }
    // large rows (threaded), bf16 computed in f32
    const Tensor big = randn({200, 300}, gen);
    require_near(softmax(big, 1), ref_softmax(big, 1, false), 1e-5);
    require_near(log_softmax(big, 0), ref_softmax(big, 0, true), 1e-5);
    const Tensor h = randn({4, 6}, gen, DType::BF16);
    REQUIRE(softmax(h, 1).dtype() == DType::BF16);
    REQUIRE(max_abs_diff(softmax(h, 1), softmax(h.to(DType::F32), 1).to(DType::BF16)) == 0.0);
}

TEST_CASE("softmax is stable for large inputs and masked entries", "[reduce]") {
    const double inf = std::numeric_limits<double>::infinity();
    const Tensor x = from_vector(std::vector<double>{1000, 1000, 999, -inf, 0, 1e4, -1e4, 0}, {2, 4});
    const std::vector<double> y = softmax(x, 1).to_vector();
    const double e1 = std::exp(-1.0);
    REQUIRE(y[0] == Approx(1.0 / (2.0 + e1)));
    REQUIRE(y[2] == Approx(e1 / (2.0 + e1)));
    REQUIRE(y[3] == 0.0);
    REQUIRE(y[5] == 1.0);
    REQUIRE(y[4] == 0.0);
    const std::vector<double> ly = log_softmax(x, 1).to_vector();
    REQUIRE(ly[0] == Approx(-std::log(2.0 + e1)));
    REQUIRE(ly[3] == -inf);
    REQUIRE(ly[6] == Approx(-2e4));
    for (double v : ly) REQUIRE(!std::isnan(v));
    REQUIRE(softmax(scalar_tensor(7.0), 0).item() == 1.0);
    REQUIRE(softmax(zeros({3, 0}), 1).shape() == Shape{3, 0});
    REQUIRE(softmax(zeros({0, 3}), 1).shape() == Shape{0, 3});
}

TEST_CASE("softmax backward kernels match central differences", "[reduce]") {
    Generator gen(28);
    const Tensor x = randn({2, 3, 4}, gen, DType::F64);
    const Tensor dy = randn({2, 3, 4}, gen, DType::F64);
    const std::vector<double> xv = x.to_vector(), dyv = dy.to_vector();
    const double h = 1e-6;
    for (bool log : {false, true}) {
        for (int64_t dim : {0, 1, -1}) {
            INFO("log " << log << " dim " << dim);
            auto f = [&](const std::vector<double>& v) {  // sum(dy * softmax(v))
                const Tensor t = from_vector(v, x.shape(), DType::F64);
                const std::vector<double> y = (log ? log_softmax(t, dim) : softmax(t, dim)).to_vector();
                double s = 0.0;
                for (size_t i = 0; i < y.size(); ++i) s += dyv[i] * y[i];
                return s;
            };
            std::vector<double> want(xv.size());
            for (size_t i = 0; i < xv.size(); ++i) {
                std::vector<double> plus = xv, minus = xv;
                plus[i] += h;
                minus[i] -= h;
                want[i] = (f(plus) - f(minus)) / (2 * h);
            }
            const Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
            const Tensor dx = log ? log_softmax_backward(y, dy, dim) : softmax_backward(y, dy, dim);
            REQUIRE(dx.shape() == x.shape());
            require_near(dx, want, 1e-7);
            // non-contiguous y/dy give the same result
            const Tensor dxt = log ? log_softmax_backward(y.transpose(0, 2).contiguous().transpose(0, 2), dy, dim)
                                   : softmax_backward(y, dy.transpose(0, 2).contiguous().transpose(0, 2), dim);
            REQUIRE(max_abs_diff(dxt, dx) < 1e-14);
        }
    }
    // f32, large: against the f64 closed form
    const Tensor y32 = softmax(randn({100, 400}, gen), 1);
    const Tensor dy32 = randn({100, 400}, gen);
    const Tensor y64 = y32.to(DType::F64), dy64 = dy32.to(DType::F64);
    const Tensor want = mul(y64, sub(dy64, sum(mul(dy64, y64), {1}, true)));
    REQUIRE(max_abs_diff(softmax_backward(y32, dy32, 1).to(DType::F64), want) < 1e-6);
    const Tensor want_log = sub(dy64, mul(exp(y64), sum(dy64, {1}, true)));
    REQUIRE(max_abs_diff(log_softmax_backward(y32, dy32, 1).to(DType::F64), want_log) < 1e-4);
    REQUIRE_THROWS_WITH(softmax_backward(y32, zeros({100, 3}), 1),
                        Catch::Contains("softmax_backward: shape mismatch: y [100, 400] vs dy [100, 3]"));
}

TEST_CASE("reduction and softmax errors", "[reduce]") {
    const Tensor a = zeros({2, 3});
    REQUIRE_THROWS_WITH(sum(a, {2}), Catch::Contains("sum: dim 2 is out of range"));
    REQUIRE_THROWS_WITH(mean(a, {-3}), Catch::Contains("mean: dim -3 is out of range"));
    REQUIRE_THROWS_WITH(sum(a, {1, -1}), Catch::Contains("sum: dim -1 appears more than once"));
    REQUIRE_THROWS_WITH(argmax(a, 5), Catch::Contains("argmax: dim 5 is out of range"));
    REQUIRE_THROWS_WITH(softmax(a, 2), Catch::Contains("softmax: dim 2 is out of range"));
    REQUIRE_THROWS_WITH(log_softmax(a, -3), Catch::Contains("log_softmax: dim -3 is out of range"));
    const Tensor ids = zeros({3}, DType::I64);
    REQUIRE_THROWS_WITH(sum(ids), Catch::Contains("sum: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(sum_of_squares(ids), Catch::Contains("sum_of_squares: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(sum_of_squares(a, {2}), Catch::Contains("sum_of_squares: dim 2 is out of range"));
    REQUIRE_THROWS_WITH(sum_of_squares(a, {0, 0}), Catch::Contains("sum_of_squares: dim 0 appears more than once"));
    REQUIRE_THROWS_WITH(softmax(ids, 0), Catch::Contains("softmax: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(var(a, {}, -1), Catch::Contains("var: expected correction >= 0, found -1"));
    REQUIRE_THROWS_WITH(softmax_backward(a, zeros({2, 3}, DType::F64), 1),
                        Catch::Contains("softmax_backward: dtype mismatch: f32 vs f64"));
}
