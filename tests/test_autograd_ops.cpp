// gradcheck (central differences in f64) for every differentiable Var op, with broadcasting, views,
// non-contiguous inputs and size-0 dims; gradgradcheck for every op with a second derivative that training or the composed norms use.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "autograd/autograd.h"
#include "core/profiler.h"

using namespace nl;

namespace {

using Vars = std::vector<Var>;

Var leaf(const Shape& shape, uint64_t seed) {
    Generator gen(seed);
    return Var(randn(shape, gen, DType::F64), true);
}

Var positive(const Shape& shape, uint64_t seed) {  // in [0.5, 1.5), for log/sqrt/pow/div
    Generator gen(seed);
    return Var(add(rand(shape, gen, DType::F64), 0.5), true);
}

// A non-contiguous (transposed) 2-D leaf of shape (rows, cols).
Var leaf_t(int64_t rows, int64_t cols, uint64_t seed) {
    Generator gen(seed);
    Tensor base = randn({cols, rows}, gen, DType::F64);
    Var v(base.t(), true);
    REQUIRE_FALSE(v.data().is_contiguous());
    return v;
}

Tensor ids(const std::vector<int64_t>& values, const Shape& shape) { return from_vector(values, shape); }

void check(const VarFn& fn, const Vars& inputs) {
    GradcheckResult r = gradcheck(fn, inputs);
    INFO(r.message);
    REQUIRE(r.ok);
}

void check2(const VarFn& fn, const Vars& inputs) {
    GradcheckResult r = gradgradcheck(fn, inputs);
    INFO(r.message);
    REQUIRE(r.ok);
}

}  // namespace

TEST_CASE("autograd ops: binary ops with broadcasting and non-contiguous inputs", "[autograd]") {
    using BinaryFn = std::function<Var(const Var&, const Var&)>;
    const std::vector<std::pair<std::string, BinaryFn>> ops = {
        {"add", [](const Var& a, const Var& b) { return a + b; }},
        {"sub", [](const Var& a, const Var& b) { return a - b; }},
        {"mul", [](const Var& a, const Var& b) { return a * b; }},
        {"div", [](const Var& a, const Var& b) { return a / b; }},
        {"pow", [](const Var& a, const Var& b) { return pow(a, b); }},
        {"maximum", [](const Var& a, const Var& b) { return maximum(a, b); }},
        {"minimum", [](const Var& a, const Var& b) { return minimum(a, b); }},
    };
    for (const auto& [name, op_binding] : ops) {
        const auto& op = op_binding;  // a variable, not a binding: clang before 16 cannot capture bindings
        INFO(name);
        // pow and div want positive operands; the rest take any sign.
        const bool pos = name == "pow" || name == "div";
        auto make = [&](const Shape& s, uint64_t seed) { return pos ? positive(s, seed) : leaf(s, seed); };
        check([&](const Vars& v) { return op(v[0], v[1]); }, {make({3, 4}, 1), make({3, 4}, 2)});
        check([&](const Vars& v) { return op(v[0], v[1]); }, {make({3, 4}, 3), make({4}, 4)});        // row
        check([&](const Vars& v) { return op(v[0], v[1]); }, {make({2, 1, 4}, 5), make({3, 1}, 6)});  // both
        check([&](const Vars& v) { return op(v[0], v[1]); }, {make({}, 7), make({2, 3}, 8)});        // scalar
        Var t = leaf_t(3, 4, 9);
        if (pos) t = Var(add(abs(t.data()), 0.5).t().contiguous().t(), true);
        check([&](const Vars& v) { return op(v[0], v[1]); }, {t, make({3, 1}, 10)});
        // Views inside fn: a transposed and a sliced operand.
        check([&](const Vars& v) { return op(transpose(v[0], 0, 1), slice(v[1], 1, 0, 8, 2)); },
              {make({4, 3}, 11), make({3, 8}, 12)});
    }
}

TEST_CASE("autograd ops: tensor-scalar ops and operators", "[autograd]") {
    Var a = positive({3, 4}, 20);
    check([](const Vars& v) { return v[0] + 2.0; }, {a});
    check([](const Vars& v) { return v[0] - 2.0; }, {a});
    check([](const Vars& v) { return 2.0 - v[0]; }, {a});
    check([](const Vars& v) { return v[0] * 3.0; }, {a});
    check([](const Vars& v) { return 3.0 * v[0]; }, {a});
    check([](const Vars& v) { return v[0] / 3.0; }, {a});
    check([](const Vars& v) { return 3.0 / v[0]; }, {a});
    check([](const Vars& v) { return 2.0 + v[0]; }, {a});
    check([](const Vars& v) { return -v[0]; }, {a});
    check([](const Vars& v) { return pow(v[0], 3.0); }, {a});
    check([](const Vars& v) { return pow(v[0], -0.5); }, {a});
    check([](const Vars& v) { return pow(v[0], 0.0); }, {a});
    check([](const Vars& v) { return maximum(v[0], 1.0); }, {a});
    check([](const Vars& v) { return minimum(v[0], 1.0); }, {a});
}

TEST_CASE("autograd ops: unary ops", "[autograd]") {
    using UnaryFn = std::function<Var(const Var&)>;
    const std::vector<std::tuple<std::string, UnaryFn, bool>> ops = {
        {"neg", [](const Var& a) { return neg(a); }, false},
        {"exp", [](const Var& a) { return exp(a); }, false},
        {"log", [](const Var& a) { return log(a); }, true},
        {"sqrt", [](const Var& a) { return sqrt(a); }, true},
        {"rsqrt", [](const Var& a) { return rsqrt(a); }, true},
        {"abs", [](const Var& a) { return abs(a); }, false},
        {"relu", [](const Var& a) { return relu(a); }, false},
        {"silu", [](const Var& a) { return silu(a); }, false},
        {"sigmoid", [](const Var& a) { return sigmoid(a); }, false},
        {"tanh", [](const Var& a) { return tanh(a); }, false},
        {"gelu", [](const Var& a) { return gelu(a); }, false},
        {"square", [](const Var& a) { return square(a); }, false},
    };
    for (const auto& [name, op_binding, pos_binding] : ops) {
        const auto& op = op_binding;  // variables, not bindings: clang before 16 cannot capture bindings
        const auto& pos = pos_binding;
        INFO(name);
        check([&](const Vars& v) { return op(v[0]); }, {pos ? positive({4, 5}, 30) : leaf({4, 5}, 30)});
        // Non-contiguous input.
        Var t = leaf_t(4, 5, 31);
        if (pos) t = Var(add(abs(t.data()), 0.5).t().contiguous().t(), true);
        check([&](const Vars& v) { return op(v[0]); }, {t});
        // An expanded view inside fn (stride 0): its gradient sums over the broadcast dim.
        check([&](const Vars& v) { return op(expand(v[0], {3, 5})); }, {pos ? positive({1, 5}, 32) : leaf({1, 5}, 32)});
    }
    // gelu at exactly 0 (its derivative uses gelu(x)/x away from 0).
    Var z(from_vector(std::vector<double>{0.0, 1e-9, -3.0, 7.0}, {4}, DType::F64), true);
    check([](const Vars& v) { return gelu(v[0]); }, {z});
}

TEST_CASE("autograd ops: reductions over dims, keepdim, all dims", "[autograd]") {
    const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {-1}, {0, 2}, {1}};
    for (const auto& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
            INFO("dims " << shape_str(dims) << " keepdim " << keepdim);
            Var a = leaf({2, 3, 4}, 40);
            check([&](const Vars& v) { return sum(v[0], dims, keepdim); }, {a});
            check([&](const Vars& v) { return mean(v[0], dims, keepdim); }, {a});
            check([&](const Vars& v) { return max(v[0], dims, keepdim); }, {a});
            check([&](const Vars& v) { return min(v[0], dims, keepdim); }, {a});
            check([&](const Vars& v) { return var(v[0], dims, 1, keepdim); }, {a});
            check([&](const Vars& v) { return var(v[0], dims, 0, keepdim); }, {a});
            // On a permuted (non-contiguous) view.
            check([&](const Vars& v) { return sum(permute(v[0], {2, 0, 1}), dims, keepdim); }, {leaf({3, 4, 2}, 41)});
        }
    }
    check([](const Vars& v) { return sum_to(v[0], {3, 1}); }, {leaf({2, 3, 4}, 42)});
}

TEST_CASE("autograd ops: max with ties shares the gradient evenly", "[autograd]") {
    Var a(from_vector(std::vector<double>{1, 3, 3, 2}, {4}, DType::F64), true);
    max(a).backward();
    REQUIRE(a.grad().data().to_vector() == std::vector<double>{0, 0.5, 0.5, 0});
    Var b(from_vector(std::vector<double>{1, 2}, {2}, DType::F64), true);
    Var c(from_vector(std::vector<double>{1, 5}, {2}, DType::F64), true);
    sum(maximum(b, c)).backward();
    REQUIRE(b.grad().data().to_vector() == std::vector<double>{0.5, 0});
    REQUIRE(c.grad().data().to_vector() == std::vector<double>{0.5, 1});
}

TEST_CASE("autograd ops: softmax and log_softmax", "[autograd]") {
    for (int64_t dim : {0, 1, -1}) {
        INFO("dim " << dim);
        check([&](const Vars& v) { return softmax(v[0], dim); }, {leaf({3, 5}, 50)});
        check([&](const Vars& v) { return log_softmax(v[0], dim); }, {leaf({3, 5}, 51)});
        check([&](const Vars& v) { return softmax(v[0], dim); }, {leaf_t(3, 5, 52)});
        check([&](const Vars& v) { return log_softmax(v[0], dim); }, {leaf_t(3, 5, 53)});
    }
    check([](const Vars& v) { return softmax(v[0], 1); }, {leaf({2, 3, 4}, 54)});
}

TEST_CASE("autograd ops: matmul 1-D, 2-D, batched and broadcast", "[autograd]") {
    auto mm = [](const Vars& v) { return matmul(v[0], v[1]); };
    check(mm, {leaf({3, 4}, 60), leaf({4, 5}, 61)});
    check(mm, {leaf({4}, 62), leaf({4, 5}, 63)});
    check(mm, {leaf({3, 4}, 64), leaf({4}, 65)});
    check(mm, {leaf({4}, 66), leaf({4}, 67)});
    check(mm, {leaf({2, 3, 4}, 68), leaf({4, 5}, 69)});
    check(mm, {leaf({3, 4}, 70), leaf({2, 4, 5}, 71)});
    check(mm, {leaf({2, 1, 3, 4}, 72), leaf({3, 4, 2}, 73)});
    check(mm, {leaf({4}, 74), leaf({2, 4, 3}, 75)});
    check(mm, {leaf({2, 3, 4}, 76), leaf({4}, 77)});
    check(mm, {leaf_t(3, 4, 78), leaf_t(4, 2, 79)});
    check([](const Vars& v) { return matmul(v[0], transpose(v[1], -1, -2)); }, {leaf({2, 3, 4}, 80), leaf({2, 5, 4}, 81)});
    // Only one side requires grad.
    Var constant(leaf({4, 5}, 82).data());
    check([&](const Vars& v) { return matmul(v[0], constant); }, {leaf({3, 4}, 83)});
}

TEST_CASE("autograd ops: linear is matmul(x, t(W)), with W's gradient made contiguous and no copy", "[autograd]") {
    auto lin = [](const Vars& v) { return linear(v[0], v[1]); };
    check(lin, {leaf({3, 4}, 100), leaf({5, 4}, 101)});
    check(lin, {leaf({4}, 102), leaf({5, 4}, 103)});
    check(lin, {leaf({2, 3, 4}, 104), leaf({5, 4}, 105)});
    check(lin, {leaf_t(3, 4, 106), leaf_t(5, 4, 107)});  // transposed views of both
    check(lin, {leaf({0, 4}, 108), leaf({5, 4}, 109)});  // no rows: dW is zeros
    Var constant_w(leaf({5, 4}, 110).data());
    check([&](const Vars& v) { return linear(v[0], constant_w); }, {leaf({3, 4}, 111)});
    Var constant_x(leaf({2, 3, 4}, 112).data());
    check([&](const Vars& v) { return linear(constant_x, v[0]); }, {leaf({5, 4}, 113)});
    check2(lin, {leaf({3, 4}, 114), leaf({5, 4}, 115)});

    // The same values and gradients as the composed form; .grad is contiguous (out, in).
    Generator gen(116);
    const Tensor x0 = randn({2, 3, 4}, gen, DType::F32), w0 = randn({5, 4}, gen, DType::F32);
    Var x(x0.clone(), true), w(w0.clone(), true), xr(x0.clone(), true), wr(w0.clone(), true);
    const Var y = linear(x, w), yr = matmul(xr, t(wr));
    CHECK(y.shape() == Shape{2, 3, 5});
    CHECK(allclose(y.data(), yr.data(), 1e-6, 1e-6));
    profiler::reset();
    {
        profiler::EnableGuard on(true);
        sum(y * y).backward();
    }
    sum(yr * yr).backward();
    CHECK(allclose(x.grad().data(), xr.grad().data(), 1e-5, 1e-5));
    CHECK(allclose(w.grad().data(), wr.grad().data(), 1e-5, 1e-5));
    CHECK(w.grad().data().is_contiguous());
    bool copied = false;  // the composed form's t backward copies; linear's must not
    for (const profiler::OpStats& row : profiler::collected())
        if (row.kind == "copy" && row.phase == profiler::Phase::Backward && row.calls > 0) copied = true;
    CHECK_FALSE(copied);

    CHECK_THROWS_WITH(linear(leaf({3, 4}, 117), leaf({5, 3}, 118)),
                      Catch::Contains("linear: expected input (..., 3) for weight [5, 3], found [3, 4]"));
    CHECK_THROWS_WITH(linear(leaf({3, 4}, 119), leaf({4}, 120)),
                      Catch::Contains("linear: expected weight (out_features, in_features), found [4]"));
}

TEST_CASE("autograd ops: views and copies", "[autograd]") {
    Var a = leaf({2, 3, 4}, 90);
    check([](const Vars& v) { return reshape(v[0], {6, 4}); }, {a});
    check([](const Vars& v) { return reshape(v[0], {4, -1}); }, {a});
    check([](const Vars& v) { return view(v[0], {2, 12}); }, {a});
    check([](const Vars& v) { return transpose(v[0], 0, 2); }, {a});
    check([](const Vars& v) { return t(v[0]); }, {leaf({3, 4}, 91)});
    check([](const Vars& v) { return permute(v[0], {1, 2, 0}); }, {a});
    check([](const Vars& v) { return narrow(v[0], 2, 1, 2); }, {a});
    check([](const Vars& v) { return slice(v[0], 1, 0, 3, 2); }, {a});
    check([](const Vars& v) { return slice(v[0], -1, 1, 100); }, {a});
    check([](const Vars& v) { return select(v[0], 1, -1); }, {a});
    check([](const Vars& v) { return select(v[0], 0, 1); }, {a});
    check([](const Vars& v) { return expand(v[0], {2, 3, 4}); }, {leaf({3, 1}, 92)});
    check([](const Vars& v) { return expand(v[0], {5, -1}); }, {leaf({1, 4}, 93)});
    check([](const Vars& v) { return squeeze(v[0]); }, {leaf({1, 3, 1}, 94)});
    check([](const Vars& v) { return squeeze(v[0], 0); }, {leaf({1, 3, 1}, 95)});
    check([](const Vars& v) { return unsqueeze(v[0], 1); }, {leaf({3, 2}, 96)});
    check([](const Vars& v) { return flatten(v[0]); }, {a});
    check([](const Vars& v) { return contiguous(transpose(v[0], 0, 1)); }, {a});
    check([](const Vars& v) { return clone(v[0]); }, {a});
    check([](const Vars& v) { return reshape(transpose(v[0], 1, 2), {2, 12}); }, {a});  // copy-reshape
    // Member forms record the same ops.
    check([](const Vars& v) { return v[0].transpose(0, 1).reshape({3, 8}).slice(1, 2, 6).unsqueeze(0).squeeze(0); }, {a});
    check([](const Vars& v) { return v[0].narrow(0, 1, 1).select(0, 0).t().contiguous().flatten(); }, {a});
    check([](const Vars& v) { return v[0].expand({3, 3, 4}).permute({2, 0, 1}).reshape({4, 9}); }, {leaf({3, 1, 4}, 97)});
}

TEST_CASE("autograd ops: casts", "[autograd]") {
    // f64 -> f32 -> f64 is the identity up to f32 rounding: a coarse eps keeps the rounding small.
    GradcheckResult r = gradcheck([](const Vars& v) { return to(to(v[0], DType::F32), DType::F64) * 2.0; },
                                  {leaf({3, 4}, 100)}, 1e-2, 1e-4, 1e-3);
    INFO(r.message);
    REQUIRE(r.ok);
}

TEST_CASE("autograd ops: indexing, embedding, where, masked_fill, cat, tril", "[autograd]") {
    Tensor idx = ids({2, 0, 2, 1}, {4});  // repeats accumulate
    check([&](const Vars& v) { return index_select(v[0], 0, idx); }, {leaf({3, 4}, 110)});
    check([&](const Vars& v) { return index_select(v[0], 1, idx); }, {leaf({2, 3}, 111)});
    check([&](const Vars& v) { return index_add(v[0], 0, idx, v[1]); }, {leaf({3, 2}, 112), leaf({4, 2}, 113)});
    Tensor gidx = ids({0, 2, 2, 1, 0, 0}, {2, 3});
    check([&](const Vars& v) { return gather(v[0], 1, gidx); }, {leaf({2, 4}, 114)});
    check([&](const Vars& v) { return scatter_add(v[0], 1, gidx, v[1]); }, {leaf({2, 4}, 115), leaf({2, 3}, 116)});
    Tensor tokens = ids({1, 4, 1, 0, 3, 1}, {2, 3});
    check([&](const Vars& v) { return embedding(v[0], tokens); }, {leaf({5, 3}, 117)});
    Tensor cond = from_vector(std::vector<double>{1, 0, 0, 1}, {4}, DType::F64);
    check([&](const Vars& v) { return where(cond, v[0], v[1]); }, {leaf({3, 4}, 118), leaf({3, 1}, 119)});
    check([&](const Vars& v) { return where(cond, v[0], v[1]); }, {leaf({4}, 120), leaf({2, 4}, 121)});
    Tensor mask = from_vector(std::vector<double>{0, 1, 1}, {3, 1}, DType::F64);
    check([&](const Vars& v) { return masked_fill(v[0], mask, -5.0); }, {leaf({3, 4}, 122)});
    check([](const Vars& v) { return cat({v[0], v[1], v[2]}, 1); }, {leaf({2, 1}, 123), leaf({2, 3}, 124), leaf({2, 2}, 125)});
    check([](const Vars& v) { return cat({v[0], v[1]}, -2); }, {leaf({1, 3}, 126), leaf_t(2, 3, 127)});
    check([](const Vars& v) { return tril(v[0], 0); }, {leaf({2, 3, 3}, 128)});
    check([](const Vars& v) { return tril(v[0], -1); }, {leaf({4, 3}, 129)});
    // cat with one input that does not require grad.
    Var constant(leaf({2, 2}, 130).data());
    check([&](const Vars& v) { return cat({constant, v[0]}, 0); }, {leaf({1, 2}, 131)});
}

TEST_CASE("autograd ops: size-0 dims give size-0 gradients", "[autograd]") {
    Var a = leaf({0, 3}, 140);
    Var w = leaf({3, 2}, 141);
    sum(matmul(a, w)).backward();
    REQUIRE(a.grad().shape() == Shape{0, 3});
    REQUIRE(w.grad().data().to_vector() == std::vector<double>(6, 0.0));
    Var b = leaf({2, 0}, 142);
    sum(softmax(b, -1) * 2.0).backward();
    REQUIRE(b.grad().shape() == Shape{2, 0});
    Var c = leaf({3, 4}, 143);
    sum(narrow(c, 1, 2, 0)).backward();
    REQUIRE(c.grad().data().to_vector() == std::vector<double>(12, 0.0));
}

TEST_CASE("autograd ops: gradgradcheck (second order, create_graph)", "[autograd]") {
    auto both = [](uint64_t s) { return Vars{leaf({3, 4}, s), leaf({3, 4}, s + 1)}; };
    check2([](const Vars& v) { return v[0] * v[1]; }, both(150));
    check2([](const Vars& v) { return v[0] * v[1]; }, {leaf({3, 4}, 152), leaf({4}, 153)});
    check2([](const Vars& v) { return v[0] / v[1]; }, {leaf({3, 4}, 154), positive({3, 4}, 155)});
    check2([](const Vars& v) { return matmul(v[0], v[1]); }, {leaf({3, 4}, 156), leaf({4, 2}, 157)});
    check2([](const Vars& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}, 158), leaf({4}, 159)});
    check2([](const Vars& v) { return exp(v[0]); }, {leaf({3, 4}, 160)});
    check2([](const Vars& v) { return sum(v[0] * v[0], {1}); }, {leaf({3, 4}, 161)});
    check2([](const Vars& v) { return square(mean(v[0], {0}, true)) * v[0]; }, {leaf({3, 4}, 162)});
    check2([](const Vars& v) { return softmax(v[0], -1); }, {leaf({3, 4}, 163)});
    check2([](const Vars& v) { return softmax(v[0], 0); }, {leaf_t(3, 4, 164)});
    // More ops whose backward is differentiable.
    check2([](const Vars& v) { return log_softmax(v[0], -1); }, {leaf({3, 4}, 165)});
    check2([](const Vars& v) { return log(v[0]) + sqrt(v[0]) + rsqrt(v[0]) + 1.0 / v[0]; }, {positive({3, 4}, 166)});
    check2([](const Vars& v) { return tanh(v[0]) + sigmoid(v[0]) + silu(v[0]) + gelu(v[0]); }, {leaf({3, 4}, 167)});
    check2([](const Vars& v) { return pow(v[0], v[1]) + pow(v[0], 2.5); }, {positive({3, 4}, 168), leaf({3, 4}, 169)});
    check2([](const Vars& v) { return var(v[0], {-1}, 1, true) * v[0]; }, {leaf({3, 4}, 170)});
    check2([](const Vars& v) { return square(index_select(v[0], 0, ids({1, 1, 0}, {3}))); }, {leaf({2, 3}, 171)});
    check2([](const Vars& v) { return square(gather(v[0], 1, ids({1, 0, 0, 2}, {2, 2}))); }, {leaf({2, 3}, 172)});
    check2([](const Vars& v) { return square(embedding(v[0], ids({1, 0, 1}, {3}))); }, {leaf({2, 3}, 173)});
    check2([](const Vars& v) { return square(slice(v[0], 1, 0, 4, 2)) * select(v[0], 1, 1).unsqueeze(1); }, {leaf({2, 4}, 174)});
    check2([](const Vars& v) { return square(expand(v[0], {3, 4})) * transpose(v[1], 0, 1); }, {leaf({1, 4}, 175), leaf({4, 3}, 176)});
    check2([](const Vars& v) { return square(cat({v[0], v[1]}, 0)); }, {leaf({1, 3}, 177), leaf({2, 3}, 178)});
    check2([](const Vars& v) { return square(max(v[0], {1}, true)) + square(maximum(v[0], v[1])); }, {leaf({2, 3}, 179), leaf({2, 3}, 180)});
    check2([](const Vars& v) {
        Tensor cond = from_vector(std::vector<double>{1, 0, 1}, {3}, DType::F64);
        return square(where(cond, v[0], v[1]));
    }, {leaf({2, 3}, 181), leaf({2, 3}, 182)});
}

TEST_CASE("autograd ops: gradcheck reports the worst element on failure", "[autograd]") {
    // A deliberately wrong backward: d/dx x^2 claimed to be 3x.
    auto wrong = [](const Vars& v) {
        const Var& x = v[0];
        return make_result(square(x.data()), "wrong_square", {x}, {{"x", x}},
                           [](const Var& g, const Vars& s) -> Vars { return {g * s[0] * 3.0}; });
    };
    Var x(from_vector(std::vector<double>{0.1, -2.0, 0.5}, {3}, DType::F64), true);
    GradcheckResult r = gradcheck(wrong, {x});
    REQUIRE_FALSE(r.ok);
    REQUIRE(r.input == 0);
    REQUIRE(r.element == 1);  // |x| largest: the largest error
    REQUIRE(r.abs_error > 0.1);
    REQUIRE_THAT(r.message, Catch::Contains("FAILED") && Catch::Contains("element 1"));
    REQUIRE_THROWS_WITH(require_gradcheck(wrong, {x}), Catch::Contains("analytic") && Catch::Contains("numeric"));
    REQUIRE_FALSE(x.grad().defined());  // gradcheck leaves the caller's .grad alone
    Var f32(ones({2}), true);
    REQUIRE_THROWS_WITH(gradcheck(wrong, {f32}), Catch::Contains("must be f64"));
    Var expanded(ones({1}, DType::F64).expand({3}), true);
    REQUIRE_THROWS_WITH(gradcheck(wrong, {expanded}), Catch::Contains("overlapping"));
}

TEST_CASE("autograd ops: gradgradcheck fails a wrong double backward at the worst element", "[autograd]") {
    // x^3 with a backward that is right to first order (3x^2 g) but built as g * (3x, detached) * x:
    // its own derivative is 3x g instead of 6x g, half the true second derivative.
    auto wrong_second_order = [](const Vars& v) {
        const Var& x = v[0];
        return make_result(mul(square(x.data()), x.data()), "cube_wrong_double_backward", {x}, {{"x", x}},
                           [](const Var& g, const Vars& s) -> Vars {
                               const Var three_x(mul(s[0].data(), 3.0));  // a constant: no graph behind it
                               return {g * three_x * s[0]};
                           });
    };
    Var x(from_vector(std::vector<double>{0.01, -3.0, 0.02}, {3}, DType::F64), true);
    // The first order is right, so gradcheck passes: the failure below is the second order's.
    REQUIRE(gradcheck(wrong_second_order, {x}).ok);
    GradcheckResult r = gradgradcheck(wrong_second_order, {x});
    INFO(r.message);
    REQUIRE_FALSE(r.ok);
    REQUIRE(r.input == 0);
    REQUIRE(r.element == 1);  // |x| largest by far: the largest error
    // The analytic second-order term is half the numeric one.
    CHECK(r.analytic == Approx(0.5 * r.numeric).epsilon(1e-3));
    REQUIRE_THAT(r.message, Catch::Contains("FAILED") && Catch::Contains("element 1"));
    REQUIRE_THROWS_WITH(require_gradgradcheck(wrong_second_order, {x}), Catch::Contains("analytic"));
    // The same function with a differentiable backward passes (the positive control).
    auto right = [](const Vars& v) { return v[0] * v[0] * v[0]; };
    CHECK(gradgradcheck(right, {x}).ok);
}
