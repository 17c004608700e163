// SwiGLU's fused gate, silu(a) * b, against the composed silu and mul: forward and both gradients in
// f32 and f64, an f64 gradcheck of the fused node, bf16 inputs, large |a| (the stable sigmoid), the
// FeedForward with either form, double backward (gradgradcheck) through the fused node, and the
// kernel's bits element by element against the scalar formula (its 16-lane and tail paths alike).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "autograd/autograd.h"
#include "core/cpu/cpu_math.h"
#include "core/fused.h"
#include "layers/transformer.h"
#include "layers_test_util.h"

using namespace nl;
using nl::test::check_close;

TEST_CASE("swiglu: the fused gate matches silu(a) * b, forward and backward, f32 and f64", "[swiglu]") {
    for (DType dtype : {DType::F64, DType::F32}) {
        INFO(dtype_name(dtype));
        const double tol = dtype == DType::F64 ? 1e-13 : 1e-6;
        Generator gen(3);
        // (3, 40000) crosses the kernel's threading threshold; |a| up to ~90 checks the stable sigmoid.
        Tensor a_data = randn({3, 40000}, gen, dtype) * 4.0;
        a_data.narrow(1, 0, 4).copy_(from_vector(std::vector<double>{-90, -30, 30, 90}, {1, 4}, dtype).expand({3, 4}));
        Var a(a_data, true), b(randn({3, 40000}, gen, dtype), true);
        Var w(randn({3, 40000}, gen, dtype));
        std::vector<Tensor> out, da, db;
        for (bool fused : {true, false}) {
            a.zero_grad();
            b.zero_grad();
            Var y = swiglu(a, b, fused);
            sum(y * w).backward();
            out.push_back(y.data());
            da.push_back(a.grad().data());
            db.push_back(b.grad().data());
        }
        check_close(out[0], out[1], tol, tol, "out");
        check_close(da[0], da[1], tol, tol, "da");
        check_close(db[0], db[1], tol, tol, "db");
    }
}

TEST_CASE("swiglu: the fused node passes gradcheck in f64, and bf16 is computed in f32", "[swiglu]") {
    Generator gen(5);
    Var a(randn({4, 7}, gen, DType::F64), true), b(randn({4, 7}, gen, DType::F64), true);
    GradcheckResult r = gradcheck([](const std::vector<Var>& x) { return swiglu(x[0], x[1], true); }, {a, b});
    INFO(r.message);
    CHECK(r.ok);
    GradcheckResult r2 = gradgradcheck([](const std::vector<Var>& x) { return swiglu(x[0], x[1], true); }, {a, b});
    INFO(r2.message);
    CHECK(r2.ok);
    // One Var as both inputs (silu(a) * a): each input gets its own part of the second derivative.
    GradcheckResult same = gradgradcheck([](const std::vector<Var>& x) { return swiglu(x[0], x[0], true); }, {a});
    INFO(same.message);
    CHECK(same.ok);

    const Tensor a32 = randn({64}, gen), b32 = randn({64}, gen);
    const Tensor half = swiglu_forward(a32.to(DType::BF16), b32.to(DType::BF16));
    CHECK(half.dtype() == DType::BF16);
    check_close(half.to(DType::F32), swiglu_forward(a32.to(DType::BF16).to(DType::F32), b32.to(DType::BF16).to(DType::F32)),
                0.02, 0.01, "bf16");
    CHECK_THROWS_WITH(swiglu_forward(a32, randn({63}, gen)), Catch::Contains("b has shape [63] but a has shape [64]"));
}

TEST_CASE("swiglu: bf16 on the CPU is read and written as bf16, with the bits of f32 math rounded once",
          "[swiglu]") {
    // 70001 elements: threaded, and a last block shorter than the kernel's scratch blocks.
    Generator gen(9);
    const Tensor a = (randn({70001}, gen) * 3.0).to(DType::BF16), b = randn({70001}, gen).to(DType::BF16);
    const Tensor dout = randn({70001}, gen).to(DType::BF16);
    const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32), d32 = dout.to(DType::F32);
    const Tensor out = swiglu_forward(a, b);
    REQUIRE(out.dtype() == DType::BF16);
    CHECK(out.to_vector() == swiglu_forward(a32, b32).to(DType::BF16).to_vector());
    const SwigluBackward g = swiglu_backward(dout, a, b), g32 = swiglu_backward(d32, a32, b32);
    REQUIRE(g.da.dtype() == DType::BF16);
    REQUIRE(g.db.dtype() == DType::BF16);
    CHECK(g.da.to_vector() == g32.da.to(DType::BF16).to_vector());
    CHECK(g.db.to_vector() == g32.db.to(DType::BF16).to_vector());
}

TEST_CASE("swiglu: every element has the scalar formula's bits, 16 lanes at a time or in the tail", "[swiglu]") {
    // 37 elements: two 16-lane vectors and a tail of 5; the specials fall in both.
    Generator gen(13);
    std::vector<float> a = (randn({37}, gen) * 20.0).to_vector_as<float>(), b = randn({37}, gen).to_vector_as<float>();
    const std::vector<float> dout = randn({37}, gen).to_vector_as<float>();
    const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 88.5f, -88.5f, 104.0f, -104.0f,
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
    for (int i = 0; i < 10; ++i) a[static_cast<size_t>(i * 4 + (i % 3))] = specials[i];
    const Tensor ta = from_vector(a, {37}), tb = from_vector(b, {37}), td = from_vector(dout, {37});
    const std::vector<float> out = swiglu_forward(ta, tb).to_vector_as<float>();
    const SwigluBackward g = swiglu_backward(td, ta, tb);
    const std::vector<float> da = g.da.to_vector_as<float>(), db = g.db.to_vector_as<float>();
    auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
    for (size_t i = 0; i < a.size(); ++i) {
        INFO("element " << i << ", a " << a[i]);
        const float x = a[i], s = cpu_math::stable_sigmoid(x);
        CHECK(bits(out[i]) == bits(x * s * b[i]));
        CHECK(bits(da[i]) == bits(dout[i] * b[i] * (s * (1.0f + x * (1.0f - s)))));
        CHECK(bits(db[i]) == bits(dout[i] * (x * s)));
    }
}

TEST_CASE("swiglu: FeedForward gives the same output and gradients with either form", "[swiglu][transformer]") {
    std::vector<Tensor> outs, grads;
    for (bool fused : {true, false}) {
        FeedForwardOptions o;
        o.dim = 16;
        o.hidden_dim = 64;
        o.multiple_of = 8;
        o.dtype = DType::F64;
        o.fused = fused;
        Generator init(2);
        o.generator = &init;
        FeedForward ffn(o);
        Generator gen(9);
        Var x(randn({2, 5, 16}, gen, DType::F64), true);
        Var y = ffn.forward(x);
        sum(y * y).backward();
        outs.push_back(y.data());
        grads.push_back(x.grad().data());
        if (fused) {
            Var x2(randn({2, 5, 16}, gen, DType::F64), true);
            GradcheckResult r = gradgradcheck([&](const std::vector<Var>& in) { return ffn.forward(in[0]); }, {x2});
            INFO(r.message);
            CHECK(r.ok);
        }
    }
    check_close(outs[0], outs[1], 1e-12, 1e-12, "FeedForward output");
    check_close(grads[0], grads[1], 1e-12, 1e-12, "FeedForward input gradient");
}
