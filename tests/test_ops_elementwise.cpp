// Elementwise ops against plain f64 reference loops: every binary op with broadcasting, views
// (transposed, stepped slices, expanded), size-1 and empty dims, f32/f64/bf16/f16, scalar forms and
// operators, every unary op, where/masked_fill/tril, allclose/max_abs_diff, and the error messages.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu/cpu_math.h"
#include "core/ops.h"

using namespace nl;

namespace {

using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;
using RefFn = std::function<double(double, double)>;

struct BinaryCase {
    std::string name;
    BinaryFn fn;
    RefFn ref;
    bool comparison;
};

std::vector<BinaryCase> binary_cases() {
    return {
        {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double x, double y) { return x + y; }, false},
        {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double x, double y) { return x - y; }, false},
        {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double x, double y) { return x * y; }, false},
        {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double x, double y) { return x / y; }, false},
        {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, [](double x, double y) { return std::pow(x, y); }, false},
        {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, [](double x, double y) { return x > y ? x : y; }, false},
        {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, [](double x, double y) { return x < y ? x : y; }, false},
        {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](double x, double y) { return double(x == y); }, true},
        {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](double x, double y) { return double(x != y); }, true},
        {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](double x, double y) { return double(x < y); }, true},
        {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](double x, double y) { return double(x <= y); }, true},
        {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](double x, double y) { return double(x > y); }, true},
        {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](double x, double y) { return double(x >= y); }, true},
    };
}

// Row-major multi-index of flat position `flat` in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
    std::vector<int64_t> idx(shape.size());
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    return idx;
}

// Flat row-major position in `shape` of the broadcast element at `out_idx` (right-aligned dims).
int64_t broadcast_source(const std::vector<int64_t>& out_idx, const Shape& shape) {
    int64_t pos = 0;
    const size_t skip = out_idx.size() - shape.size();
    for (size_t d = 0; d < shape.size(); ++d) pos = pos * shape[d] + (shape[d] == 1 ? 0 : out_idx[skip + d]);
    return pos;
}

// NumPy broadcasting written out plainly, for the reference.
Shape ref_broadcast(const Shape& a, const Shape& b) {
    Shape out(std::max(a.size(), b.size()), 1);
    for (size_t i = 0; i < a.size(); ++i) out[out.size() - a.size() + i] = a[i];
    for (size_t i = 0; i < b.size(); ++i) {
        int64_t& s = out[out.size() - b.size() + i];
        if (s == 1) s = b[i];
    }
    return out;
}

std::vector<double> ref_binary(const Tensor& a, const Tensor& b, const RefFn& f, Shape* out_shape) {
    const std::vector<double> av = a.to_vector(), bv = b.to_vector();
    *out_shape = ref_broadcast(a.shape(), b.shape());
    std::vector<double> out(shape_numel(*out_shape));
    for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
        const std::vector<int64_t> idx = unravel(i, *out_shape);
        out[i] = f(av[broadcast_source(idx, a.shape())], bv[broadcast_source(idx, b.shape())]);
    }
    return out;
}

// Elementwise |got - want| <= tol * (1 + |want|); NaN must meet NaN.
void check_values(const Tensor& got, const Shape& shape, const std::vector<double>& want, double tol) {
    REQUIRE(got.shape() == shape);
    const std::vector<double> g = got.to_vector();
    REQUIRE(g.size() == want.size());
    for (size_t i = 0; i < g.size(); ++i) {
        const bool ok = std::isnan(want[i]) ? std::isnan(g[i])
                                            : (g[i] == want[i] ||  // infinities
                                               std::abs(g[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
        if (ok) continue;  // one REQUIRE per tensor keeps big comparisons fast
        INFO("index " << i << ": got " << g[i] << ", want " << want[i]);
        REQUIRE(ok);
    }
    SUCCEED("values match");
}

double tol_for(DType dt) {
    switch (dt) {
        case DType::F64: return 1e-12;
        case DType::F32: return 2e-6;
        default: return 1e-2;  // bf16 has 8 bits of mantissa, f16 11
    }
}

// Small integers as floats, so comparisons see many ties.
Tensor rand_ints(const Shape& shape, Generator& gen, DType dt) {
    std::vector<double> v = randn(shape, gen, DType::F64).to_vector();
    for (double& x : v) x = std::round(x * 1.5);
    return from_vector(v, shape, dt);
}

// Positive bases keep pow real-valued.
Tensor inputs_for(const BinaryCase& c, const Shape& shape, Generator& gen, DType dt, bool first) {
    if (c.comparison) return rand_ints(shape, gen, dt);
    if (c.name == "pow" && first) return add(abs(randn(shape, gen, DType::F64)), 0.25).to(dt);
    return randn(shape, gen, dt);
}

void check_binary(const BinaryCase& c, const Tensor& a, const Tensor& b) {
    INFO(c.name << " " << dtype_name(a.dtype()) << " " << shape_str(a.shape()) << " with " << shape_str(b.shape()));
    const Tensor got = c.fn(a, b);
    REQUIRE(got.dtype() == a.dtype());
    Shape shape;
    const std::vector<double> want = ref_binary(a, b, c.ref, &shape);
    check_values(got, shape, want, c.comparison ? 0.0 : tol_for(a.dtype()));
}

}  // namespace

TEST_CASE("binary ops broadcast like NumPy, f32 and f64", "[elementwise]") {
    Generator gen(11);
    const std::vector<std::pair<Shape, Shape>> pairs = {
        {{3, 1, 4}, {2, 1}}, {{2, 3}, {3}},       {{4}, {}},         {{}, {}},
        {{1}, {5, 1}},       {{2, 0, 3}, {1, 3}}, {{2, 3}, {2, 3}},  {{1, 1, 5}, {3, 1, 1}},
    };
    for (const BinaryCase& c : binary_cases())
        for (DType dt : {DType::F32, DType::F64})
            for (const auto& [sa, sb] : pairs)
                check_binary(c, inputs_for(c, sa, gen, dt, true), inputs_for(c, sb, gen, dt, false));
}

TEST_CASE("binary ops read transposed, stepped and expanded views", "[elementwise]") {
    Generator gen(12);
    for (const BinaryCase& c : binary_cases()) {
        for (DType dt : {DType::F32, DType::F64}) {
            const Tensor a = inputs_for(c, {4, 6}, gen, dt, true).t();                     // [6, 4]
            const Tensor b = inputs_for(c, {6, 8}, gen, dt, false).slice(1, 0, 8, 2);    // [6, 4]
            const Tensor e = inputs_for(c, {1, 4}, gen, dt, false).expand({6, 4});       // stride 0
            const Tensor p = inputs_for(c, {4, 2, 6}, gen, dt, false).permute({2, 1, 0});  // [6, 2, 4]
            check_binary(c, a, b);
            check_binary(c, a, e);
            check_binary(c, e, b);
            check_binary(c, p, a.unsqueeze(1));
            check_binary(c, b.slice(0, 1, 6, 2), p.select(1, 1).slice(0, 0, 6, 2));
        }
    }
}

TEST_CASE("binary ops on large tensors take the threaded paths", "[elementwise]") {
    Generator gen(13);
    const BinaryCase c = binary_cases()[2];  // mul
    const Tensor a = randn({300, 257}, gen);
    check_binary(c, a, randn({300, 257}, gen));                 // contiguous fast path
    check_binary(c, a, randn({257}, gen));                      // broadcast row
    check_binary(c, a, randn({257, 300}, gen).t());             // strided n-d path
    check_binary(c, randn({300, 1}, gen), randn({1, 257}, gen));  // outer product
    check_binary(c, a, scalar_tensor(1.5));
}

TEST_CASE("binary ops on bf16 and f16 compute in f32 and round back", "[elementwise]") {
    Generator gen(14);
    for (DType dt : {DType::BF16, DType::F16}) {
        for (const BinaryCase& c : binary_cases()) {
            const Tensor a = inputs_for(c, {3, 1, 4}, gen, dt, true);
            const Tensor b = inputs_for(c, {2, 1}, gen, dt, false);
            const Tensor got = c.fn(a, b);
            REQUIRE(got.dtype() == dt);
            // exactly the f32 result rounded once
            REQUIRE(max_abs_diff(got, c.fn(a.to(DType::F32), b.to(DType::F32)).to(dt)) == 0.0);
            check_binary(c, a, b);  // and close to the f64 reference of the half inputs
        }
    }
}

TEST_CASE("add_ sums in place: broadcast operands, views written through, bf16 rounded once, errors by name",
          "[elementwise]") {
    Generator gen(16);
    for (DType dt : {DType::F32, DType::F64}) {
        Tensor a = randn({300, 257}, gen, dt);  // the threaded path
        const Tensor b = randn({300, 257}, gen, dt);
        const Tensor expected = add(a, b);
        const void* storage = a.storage().get();
        add_(a, b);
        REQUIRE(a.storage().get() == storage);  // the same buffer
        REQUIRE(max_abs_diff(a, expected) == 0.0);
        const Tensor row = randn({257}, gen, dt);
        const Tensor with_row = add(a, row);
        add_(a, row);  // broadcast into a
        REQUIRE(max_abs_diff(a, with_row) == 0.0);
        // A transposed view of a larger tensor: the sum lands in the parent's elements.
        Tensor parent = randn({4, 6}, gen, dt);
        const Tensor before = parent.clone();
        Tensor view = parent.t();  // [6, 4]
        const Tensor c = randn({6, 4}, gen, dt);
        add_(view, c);
        REQUIRE(max_abs_diff(parent, add(before, c.t())) == 0.0);
    }
    Tensor h = randn({3, 5}, gen, DType::BF16);
    const Tensor hb = randn({3, 5}, gen, DType::BF16);
    const Tensor rounded = add(h, hb);  // f32 sum rounded once to bf16
    add_(h, hb);
    REQUIRE(h.dtype() == DType::BF16);
    REQUIRE(max_abs_diff(h, rounded) == 0.0);

    Tensor small = zeros({3});
    REQUIRE_THROWS_WITH(add_(small, zeros({2, 3})), Catch::Contains("add_: cannot add [2, 3] into [3] in place"));
    REQUIRE_THROWS_WITH(add_(small, zeros({3}, DType::F64)), Catch::Contains("add_: dtype mismatch: f32 vs f64"));
    Tensor expanded = zeros({1, 3}).expand({4, 3});
    REQUIRE_THROWS_WITH(add_(expanded, zeros({4, 3})), Catch::Contains("add_: the tensor written is a broadcast view"));
    Tensor ids = from_vector(std::vector<int64_t>{1, 2}, {2});
    REQUIRE_THROWS_WITH(add_(ids, ids), Catch::Contains("add_: expected a floating dtype, found i64"));
}

TEST_CASE("scalar forms and operators", "[elementwise]") {
    Generator gen(15);
    for (DType dt : {DType::F32, DType::F64}) {
        const Tensor a = randn({3, 5}, gen, dt).t();  // non-contiguous [5, 3]
        const Tensor b = randn({5, 3}, gen, dt);
        const Tensor pos = add(abs(a), 0.5);
        const double tol = tol_for(dt);
        const std::vector<double> av = a.to_vector(), bv = b.to_vector(), pv = pos.to_vector();
        auto map = [](const std::vector<double>& v, const std::function<double(double)>& f) {
            std::vector<double> out;
            for (double x : v) out.push_back(f(x));
            return out;
        };
        auto zip = [](const std::vector<double>& x, const std::vector<double>& y, const RefFn& f) {
            std::vector<double> out;
            for (size_t i = 0; i < x.size(); ++i) out.push_back(f(x[i], y[i]));
            return out;
        };
        const Shape s = {5, 3};
        check_values(add(a, 2.5), s, map(av, [](double x) { return x + 2.5; }), tol);
        check_values(sub(a, 2.5), s, map(av, [](double x) { return x - 2.5; }), tol);
        check_values(rsub(2.5, a), s, map(av, [](double x) { return 2.5 - x; }), tol);
        check_values(mul(a, -3.0), s, map(av, [](double x) { return x * -3.0; }), tol);
        check_values(div(a, 4.0), s, map(av, [](double x) { return x / 4.0; }), tol);
        check_values(rdiv(2.0, pos), s, map(pv, [](double x) { return 2.0 / x; }), tol);
        check_values(pow(pos, 2.0), s, map(pv, [](double x) { return x * x; }), tol);
        check_values(pow(pos, 0.5), s, map(pv, [](double x) { return std::sqrt(x); }), tol);
        check_values(maximum(a, 0.1), s, map(av, [](double x) { return std::max(x, 0.1); }), tol);
        check_values(minimum(a, 0.1), s, map(av, [](double x) { return std::min(x, 0.1); }), tol);
        check_values(gt(a, 0.0), s, map(av, [](double x) { return double(x > 0.0); }), 0.0);
        check_values(lt(a, 0.0), s, map(av, [](double x) { return double(x < 0.0); }), 0.0);
        check_values(eq(a, av[4]), s, map(av, [&](double x) { return double(x == av[4]); }), 0.0);
        REQUIRE(eq(a, av[4]).to_vector()[4] == 1.0);

        check_values(a + b, s, zip(av, bv, [](double x, double y) { return x + y; }), tol);
        check_values(a - b, s, zip(av, bv, [](double x, double y) { return x - y; }), tol);
        check_values(a * b, s, zip(av, bv, [](double x, double y) { return x * y; }), tol);
        check_values(a / pos, s, zip(av, pv, [](double x, double y) { return x / y; }), tol);
        check_values(a + 1.0, s, map(av, [](double x) { return x + 1.0; }), tol);
        check_values(a - 1.0, s, map(av, [](double x) { return x - 1.0; }), tol);
        check_values(a * 2.0, s, map(av, [](double x) { return x * 2.0; }), tol);
        check_values(2.0 * a, s, map(av, [](double x) { return x * 2.0; }), tol);
        check_values(a / 2.0, s, map(av, [](double x) { return x / 2.0; }), tol);
        check_values(-a, s, map(av, [](double x) { return -x; }), 0.0);
        REQUIRE((a * 2.0).dtype() == dt);
    }
    const Tensor h = full({2}, 3.0, DType::BF16);
    REQUIRE(mul(h, 0.1).dtype() == DType::BF16);
    REQUIRE(mul(h, 0.1).to_vector()[0] == Approx(0.3).epsilon(1e-2));
    REQUIRE(rsub(1.0, h).to_vector()[1] == -2.0);
}

TEST_CASE("unary ops match the f64 reference", "[elementwise]") {
    Generator gen(16);
    struct UnaryCase {
        const char* name;
        std::function<Tensor(const Tensor&)> fn;
        std::function<double(double)> ref;
        bool positive;  // needs x > 0
    };
    auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
    const std::vector<UnaryCase> cases = {
        {"neg", [](const Tensor& a) { return neg(a); }, [](double x) { return -x; }, false},
        {"exp", [](const Tensor& a) { return exp(a); }, [](double x) { return std::exp(x); }, false},
        {"log", [](const Tensor& a) { return log(a); }, [](double x) { return std::log(x); }, true},
        {"sqrt", [](const Tensor& a) { return sqrt(a); }, [](double x) { return std::sqrt(x); }, true},
        {"rsqrt", [](const Tensor& a) { return rsqrt(a); }, [](double x) { return 1.0 / std::sqrt(x); }, true},
        {"abs", [](const Tensor& a) { return abs(a); }, [](double x) { return std::abs(x); }, false},
        {"relu", [](const Tensor& a) { return relu(a); }, [](double x) { return x > 0 ? x : 0.0; }, false},
        {"silu", [](const Tensor& a) { return silu(a); }, [&](double x) { return x * sig(x); }, false},
        {"sigmoid", [](const Tensor& a) { return sigmoid(a); }, sig, false},
        {"tanh", [](const Tensor& a) { return tanh(a); }, [](double x) { return std::tanh(x); }, false},
        {"gelu", [](const Tensor& a) { return gelu(a); },
         [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, false},
        {"sign", [](const Tensor& a) { return sign(a); }, [](double x) { return double((x > 0) - (x < 0)); }, false},
        {"square", [](const Tensor& a) { return square(a); }, [](double x) { return x * x; }, false},
    };
    for (const UnaryCase& c : cases) {
        for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
            std::vector<Shape> shapes = {{4, 7}, {}, {3, 0}, {1, 5}};
            if (dt == DType::F32) shapes.push_back({200, 180});  // threaded
            for (const Shape& shape : shapes) {
                INFO(c.name << " " << dtype_name(dt) << " " << shape_str(shape));
                Tensor a = randn(shape, gen, DType::F64) * 2.0;
                if (c.positive) a = add(abs(a), 0.1);
                a = a.to(dt);
                const std::vector<double> av = a.to_vector();
                std::vector<double> want;
                for (double x : av) want.push_back(c.ref(x));
                const Tensor got = c.fn(a);
                REQUIRE(got.dtype() == dt);
                check_values(got, shape, want, tol_for(dt) * 2);
                if (a.dim() == 2) {  // transposed input
                    const Tensor at = a.t();
                    std::vector<double> want_t;
                    for (double x : at.to_vector()) want_t.push_back(c.ref(x));
                    check_values(c.fn(at), at.shape(), want_t, tol_for(dt) * 2);
                }
            }
        }
    }
}

TEST_CASE("exp_f32 (the vectorizable f32 exp behind sigmoid and silu) is within 2 ulp of exp", "[elementwise]") {
    // A million evenly spaced inputs over the range where e^x is a normal float, and 200001 in
    // [-1, 1], where the polynomial alone does the work.
    double worst_ulps = 0;
    auto check = [&worst_ulps](float x) {
        const double want = std::exp(static_cast<double>(x));
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);  // spacing of floats near want
        worst_ulps = std::max(worst_ulps, std::abs(static_cast<double>(cpu_math::exp_f32(x)) - want) / ulp);
    };
    for (int i = 0; i <= 1000000; ++i) check(static_cast<float>(-87.3 + 176.0 * i / 1000000));
    for (int i = -100000; i <= 100000; ++i) check(static_cast<float>(i / 100000.0));
    INFO("worst error " << worst_ulps << " ulp");
    REQUIRE(worst_ulps <= 2.0);
    REQUIRE(cpu_math::exp_f32(0.0f) == 1.0f);
    REQUIRE(cpu_math::exp_f32(-100.0f) == 0.0f);
    REQUIRE(cpu_math::exp_f32(-std::numeric_limits<float>::infinity()) == 0.0f);
    REQUIRE(std::isinf(cpu_math::exp_f32(100.0f)));
    REQUIRE(std::isnan(cpu_math::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("tanh_f32 (the vectorizable f32 tanh behind the tanh op and DyT's kernel) is within 3 ulp of tanh",
          "[elementwise]") {
    // Evenly spaced inputs over [-12, 12] (past 9.01, tanh rounds to +-1 in f32), densely around the
    // polynomial/exp switch at |x| = 0.625, and tiny ones, where tanh(x) ~ x.
    double worst_ulps = 0;
    float worst_x = 0.0f;
    auto check = [&](float x) {
        const double want = std::tanh(static_cast<double>(x));
        if (want == 0.0) return;
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);  // spacing of floats near want
        const double err = std::abs(static_cast<double>(cpu_math::tanh_f32(x)) - want) / ulp;
        if (err > worst_ulps) worst_ulps = err, worst_x = x;
    };
    for (int i = -1000000; i <= 1000000; ++i) check(static_cast<float>(12.0 * i / 1000000));
    for (int i = -100000; i <= 100000; ++i) check(static_cast<float>(0.625 + 0.01 * i / 100000));
    for (int i = -100000; i <= 100000; ++i) check(static_cast<float>(-0.625 + 0.01 * i / 100000));
    for (int e = -140; e <= -1; ++e) check(std::ldexp(1.0f, e)), check(-std::ldexp(1.3f, e));
    INFO("worst error " << worst_ulps << " ulp at x = " << worst_x);
    REQUIRE(worst_ulps <= 3.0);
    REQUIRE(cpu_math::tanh_f32(0.0f) == 0.0f);
    REQUIRE(cpu_math::tanh_f32(100.0f) == 1.0f);
    REQUIRE(cpu_math::tanh_f32(-100.0f) == -1.0f);
    REQUIRE(cpu_math::tanh_f32(std::numeric_limits<float>::infinity()) == 1.0f);
    REQUIRE(cpu_math::tanh_f32(-std::numeric_limits<float>::infinity()) == -1.0f);
    REQUIRE(std::isnan(cpu_math::tanh_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("the f32 tanh op is within 2 ulp of the C library's tanhf and 1.5 ulp of tanh over a dense f32 sweep",
          "[elementwise]") {
    // Every 61st f32 bit pattern from the smallest subnormal up to 10 (past 9.01 tanh rounds to 1), both
    // signs: about 36 million inputs through the op itself (tanh_f32 over every f32 input measures
    // 1.33 ulp from the exact tanh and 2 ulp from glibc's tanhf, whose own error reaches 2.19 ulp there).
    std::vector<float> xs;
    for (uint32_t bits = 1;; bits += 61) {
        const float x = std::bit_cast<float>(bits);
        if (!(x < 10.0f)) break;
        xs.push_back(x);
        xs.push_back(-x);
    }
    const Tensor in = from_vector(xs, {static_cast<int64_t>(xs.size())}, DType::F32);
    const Tensor out = tanh(in);
    const float* got = static_cast<const float*>(out.data_ptr());
    double worst_lib = 0, worst_exact = 0;
    float worst_lib_x = 0, worst_exact_x = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
        const double exact = std::tanh(static_cast<double>(xs[i]));
        // The spacing of floats near the result (subnormal results: the smallest spacing).
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(exact), -126) - 23);
        const double lib = std::abs(static_cast<double>(got[i]) - static_cast<double>(std::tanh(xs[i]))) / ulp;
        const double err = std::abs(static_cast<double>(got[i]) - exact) / ulp;
        if (lib > worst_lib) worst_lib = lib, worst_lib_x = xs[i];
        if (err > worst_exact) worst_exact = err, worst_exact_x = xs[i];
    }
    INFO(xs.size() << " inputs; worst " << worst_lib << " ulp from tanhf at x = " << worst_lib_x << ", " << worst_exact
                   << " ulp from tanh at x = " << worst_exact_x);
    CHECK(worst_lib <= 2.0);
    CHECK(worst_exact <= 1.5);
    // The op is the vectorizable tanh (so DyT's composed twin and soft-capping's agree with their kernels).
    for (size_t i = 0; i < xs.size(); i += 1001)
        REQUIRE(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(cpu_math::tanh_f32(xs[i])));
}

#if defined(__AVX512F__) && defined(__FMA__)
TEST_CASE("exp_f32x16 (AVX-512, the attention's softmax) gives exp_f32's bits on every lane", "[elementwise]") {
    // Every 61st of the 2^32 bit patterns (both signs, subnormals, infinities, NaNs), then the range
    // where e^x is a float densely, 16 at a time; exp_f32 one by one is the reference.
    std::vector<float> xs;
    for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 61) xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
    for (int i = 0; i <= 400000; ++i) xs.push_back(static_cast<float>(-104.0 + 194.0 * i / 400000));
    for (float x : {0.0f, -0.0f, -87.33654f, 88.72283f, -87.3365f, 88.7228f, std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
        xs.push_back(x);
    while (xs.size() % 16 != 0) xs.push_back(1.0f);
    int64_t mismatches = 0;
    float first_bad = 0.0f;
    for (size_t i = 0; i < xs.size(); i += 16) {
        alignas(64) float got[16];
        _mm512_store_ps(got, cpu_math::exp_f32x16(_mm512_loadu_ps(xs.data() + i)));
        for (int lane = 0; lane < 16; ++lane) {
            const float want = cpu_math::exp_f32(xs[i + lane]);
            const bool same = std::isnan(want) ? std::isnan(got[lane])
                                               : std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got[lane]);
            if (!same && mismatches++ == 0) first_bad = xs[i + lane];
        }
    }
    INFO(mismatches << " of " << xs.size() << " differ, the first at x = " << first_bad);
    REQUIRE(mismatches == 0);
}
#endif

TEST_CASE("silu_backward is grad * d silu / dx, with broadcasting, in f32, f64 and bf16", "[elementwise]") {
    Generator gen(21);
    auto dsilu = [](double x) {
        const double s = 1.0 / (1.0 + std::exp(-x));
        return s * (1.0 + x * (1.0 - s));
    };
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
        for (const Shape& grad_shape : {Shape{64, 300}, Shape{300}, Shape{0, 300}}) {
            INFO(dtype_name(dt) << " grad " << shape_str(grad_shape));
            const Shape x_shape = grad_shape.size() == 2 ? grad_shape : Shape{64, 300};
            const Tensor x = (randn(x_shape, gen, DType::F64) * 4.0).to(dt);
            const Tensor g = randn(grad_shape, gen, DType::F64).to(dt);
            const Shape out_shape = broadcast_shapes(g.shape(), x.shape(), "test");
            const std::vector<double> gv = g.expand(out_shape).contiguous().to_vector();
            const std::vector<double> xv = x.expand(out_shape).contiguous().to_vector();
            std::vector<double> want;
            for (size_t i = 0; i < xv.size(); ++i) want.push_back(gv[i] * dsilu(xv[i]));
            const Tensor got = silu_backward(g, x);
            REQUIRE(got.dtype() == dt);
            check_values(got, out_shape, want, tol_for(dt) * 4);
        }
    }
    REQUIRE_THROWS_WITH(silu_backward(zeros({2, 3}), zeros({4})), Catch::Contains("silu_backward"));
}

TEST_CASE("unary ops are stable at large |x| and keep NaN", "[elementwise]") {
    const Tensor x = from_vector(std::vector<double>{-1000.0, 1000.0, -50.0, 50.0, 0.0}, {5});
    const std::vector<double> s = sigmoid(x).to_vector();
    REQUIRE(s[0] == 0.0);
    REQUIRE(s[1] == 1.0);
    REQUIRE(s[2] == Approx(std::exp(-50.0)).epsilon(1e-5));
    REQUIRE(s[3] == 1.0);
    REQUIRE(s[4] == 0.5);
    const std::vector<double> si = silu(x).to_vector();
    REQUIRE(si[0] == 0.0);
    REQUIRE(si[1] == 1000.0);
    const std::vector<double> g = gelu(x).to_vector();
    REQUIRE(g[0] == 0.0);
    REQUIRE(g[1] == 1000.0);
    REQUIRE(sign(x).to_vector() == std::vector<double>{-1, 1, -1, 1, 0});
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor n = from_vector(std::vector<double>{nan, 1.0, 2.0}, {3}, DType::F64);
    const Tensor m = from_vector(std::vector<double>{0.0, nan, 1.0}, {3}, DType::F64);
    for (const Tensor& r : {maximum(n, m), minimum(n, m)}) {
        const std::vector<double> v = r.to_vector();
        REQUIRE(std::isnan(v[0]));
        REQUIRE(std::isnan(v[1]));
    }
    REQUIRE(maximum(n, m).to_vector()[2] == 2.0);
    REQUIRE(minimum(n, m).to_vector()[2] == 1.0);
    REQUIRE(std::isnan(relu(n).to_vector()[0]));
    REQUIRE(std::isnan(sign(n).to_vector()[0]));
}

TEST_CASE("comparisons accept i64, other i64 math is an error", "[elementwise]") {
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
    const Tensor other = from_vector(std::vector<int64_t>{1, 0, 3, 5}, {4});
    const Tensor e = eq(ids, other);
    REQUIRE(e.dtype() == DType::I64);
    REQUIRE(e.to_vector() == std::vector<double>{1, 0, 1, 0});
    REQUIRE(lt(ids, other).to_vector() == std::vector<double>{0, 0, 0, 1});
    REQUIRE(eq(ids, 3.0).to_vector() == std::vector<double>{0, 0, 1, 0});
    REQUIRE(gt(ids, 2.0).to_vector() == std::vector<double>{0, 0, 1, 1});
    REQUIRE_THROWS_WITH(add(ids, other), Catch::Contains("add: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(mul(ids, 2.0), Catch::Contains("mul: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(exp(ids), Catch::Contains("exp: expected a floating dtype, found i64"));
}

TEST_CASE("add_widened: f32 plus bf16/f16 has the bits of widening first, in one kernel", "[elementwise]") {
    Generator gen(21);
    for (DType half : {DType::BF16, DType::F16}) {
        INFO(dtype_name(half));
        const Tensor a = randn({3, 4, 40}, gen);
        const Tensor b = randn({3, 4, 40}, gen).to(half);
        const Tensor bt = randn({40, 4}, gen).to(half).t();  // (4, 40), strided, broadcast over dim 0
        const Tensor sum = add_widened(a, b);
        CHECK(sum.dtype() == DType::F32);
        CHECK(sum.to_vector() == add(a, b.to(DType::F32)).to_vector());
        CHECK(add_widened(a, bt).to_vector() == add(a, bt.to(DType::F32)).to_vector());
        Tensor in_place = a.clone();
        add_widened_(in_place, bt);
        CHECK(in_place.to_vector() == add(a, bt.to(DType::F32)).to_vector());
    }
    // NaN and infinities pass through the widening.
    const Tensor specials = from_vector(std::vector<double>{std::nan(""), INFINITY, -INFINITY, 1.0}, {4});
    const std::vector<double> got = add_widened(zeros({4}), specials.to(DType::BF16)).to_vector();
    CHECK(std::isnan(got[0]));
    CHECK(got[1] == INFINITY);
    CHECK(got[2] == -INFINITY);
    CHECK(got[3] == 1.0);
    REQUIRE_THROWS_WITH(add_widened(zeros({2}, DType::BF16), zeros({2})),
                        Catch::Contains("add_widened: expected an f32 a and a bf16 or f16 b, found bf16 and f32"));
    REQUIRE_THROWS_WITH(add_widened(zeros({2}), zeros({2}, DType::F64)),
                        Catch::Contains("found f32 and f64"));
    REQUIRE_THROWS_WITH(add_widened(zeros({2, 3}), zeros({4}, DType::BF16)),
                        Catch::Contains("add_widened: cannot broadcast [2, 3] with [4]"));
    Tensor small = zeros({3});
    REQUIRE_THROWS_WITH(add_widened_(small, zeros({2, 3}, DType::BF16)),
                        Catch::Contains("add_widened_: cannot add [2, 3] into [3] in place"));
}

TEST_CASE("binary op errors name the op, the shapes and the dtypes", "[elementwise]") {
    const Tensor a = zeros({2, 3}), b = zeros({4});
    REQUIRE_THROWS_WITH(add(a, b), Catch::Contains("add: cannot broadcast [2, 3] with [4]"));
    REQUIRE_THROWS_WITH(a * b, Catch::Contains("mul: cannot broadcast [2, 3] with [4]"));
    REQUIRE_THROWS_WITH(add(a, zeros({2, 3}, DType::F64)), Catch::Contains("add: dtype mismatch: f32 vs f64"));
    REQUIRE_THROWS_WITH(maximum(zeros({2}, DType::BF16), zeros({2})),
                        Catch::Contains("maximum: dtype mismatch: bf16 vs f32"));
    REQUIRE_THROWS_WITH(sub(a, Tensor()), Catch::Contains("sub: operand is an undefined tensor"));
    REQUIRE_THROWS_WITH(relu(Tensor()), Catch::Contains("relu: operand is an undefined tensor"));
}

TEST_CASE("where selects with broadcasting on any dtype, masked_fill, tril", "[elementwise]") {
    Generator gen(17);
    const Tensor cond = from_vector(std::vector<double>{1, 0, 0, 2}, {4});   // [4]
    const Tensor a = randn({3, 1}, gen), b = randn({3, 4}, gen).t().t();   // [3, 1], [3, 4]
    const Tensor w = where(cond, a, b);
    REQUIRE(w.shape() == Shape{3, 4});
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j)
            REQUIRE(w.at({i, j}) == (cond.at({j}) != 0 ? a.at({i, 0}) : b.at({i, j})));
    // i64 condition, bf16 and i64 values are selected exactly
    const Tensor ci = from_vector(std::vector<int64_t>{0, 1}, {2, 1});
    const Tensor hb = randn({2, 3}, gen, DType::BF16), hz = zeros({3}, DType::BF16);
    const Tensor wh = where(ci, hb, hz);
    REQUIRE(wh.dtype() == DType::BF16);
    REQUIRE(wh.to_vector() == std::vector<double>{0, 0, 0, hb.at({1, 0}), hb.at({1, 1}), hb.at({1, 2})});
    const Tensor wi = where(ci, from_vector(std::vector<int64_t>{7, 8}, {2}), full({1}, -1.0, DType::I64));
    REQUIRE(wi.to_vector() == std::vector<double>{-1, -1, 7, 8});
    REQUIRE_THROWS_WITH(where(cond, zeros({4}), zeros({4}, DType::F64)),
                        Catch::Contains("where: dtype mismatch: f32 vs f64"));
    REQUIRE_THROWS_WITH(where(zeros({3}), zeros({4}), zeros({4})), Catch::Contains("where: cannot broadcast"));

    // masked_fill: mask [1, 4] over scores [3, 4], as causal attention does with -inf
    const Tensor scores = randn({3, 4}, gen);
    const Tensor filled = masked_fill(scores, from_vector(std::vector<double>{0, 1, 0, 1}, {1, 4}),
                                      -std::numeric_limits<double>::infinity());
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j)
            REQUIRE(filled.at({i, j}) == (j % 2 ? -std::numeric_limits<double>::infinity() : scores.at({i, j})));
    REQUIRE_THROWS_WITH(masked_fill(zeros({1, 4}), zeros({3, 1}), 0.0),
                        Catch::Contains("masked_fill: mask [3, 1] does not broadcast to [1, 4]"));

    // tril: zero above the given diagonal of the last two dims, batched and on views
    const Tensor m = randn({2, 3, 4}, gen);
    for (int64_t diag : {0, 1, -1, 5}) {
        for (const Tensor& src : {m, m.transpose(1, 2)}) {
            const Tensor t = tril(src, diag);
            REQUIRE(t.shape() == src.shape());
            for (int64_t bi = 0; bi < src.size(0); ++bi)
                for (int64_t i = 0; i < src.size(1); ++i)
                    for (int64_t j = 0; j < src.size(2); ++j)
                        REQUIRE(t.at({bi, i, j}) == (j - i <= diag ? src.at({bi, i, j}) : 0.0));
        }
    }
    REQUIRE_THROWS_WITH(tril(zeros({3})), Catch::Contains("tril: expected a tensor with at least 2 dims, found [3]"));
}

TEST_CASE("allclose and max_abs_diff", "[elementwise]") {
    const Tensor a = from_vector(std::vector<double>{1.0, 2.0, 3.0}, {3}, DType::F64);
    const Tensor b = from_vector(std::vector<double>{1.0, 2.0 + 1e-7, 3.5}, {3}, DType::F64);
    REQUIRE(max_abs_diff(a, b) == Approx(0.5));
    REQUIRE_FALSE(allclose(a, b));
    REQUIRE(allclose(a, b, 0.2));
    REQUIRE(allclose(a.narrow(0, 0, 2), b.narrow(0, 0, 2), 1e-5));
    REQUIRE_FALSE(allclose(a.narrow(0, 0, 2), b.narrow(0, 0, 2), 0.0, 0.0));
    REQUIRE(allclose(a, a.to(DType::F32)));  // dtypes may differ
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor i = from_vector(std::vector<double>{inf, -inf}, {2}, DType::F64);
    REQUIRE(allclose(i, i));
    REQUIRE(max_abs_diff(i, i) == 0.0);
    const Tensor n = from_vector(std::vector<double>{nan, 1.0}, {2}, DType::F64);
    REQUIRE_FALSE(allclose(n, n));
    REQUIRE(std::isnan(max_abs_diff(n, n)));
    REQUIRE(max_abs_diff(zeros({0}), zeros({0})) == 0.0);
    REQUIRE_THROWS_WITH(allclose(zeros({3}), zeros({3, 1})), Catch::Contains("allclose: shape mismatch: [3] vs [3, 1]"));
    REQUIRE_THROWS_WITH(max_abs_diff(zeros({3}), zeros({1})), Catch::Contains("max_abs_diff: shape mismatch"));
}
