// Hessian-vector products (autograd/functional.h) and double backward through whole models built
// from fused nodes (autograd/fused_node.h): partial_gradients and alias, hvp against an explicit Hessian and against central
// differences of the gradient in f64, its argument checks and strict mode, gradgradcheck of a
// Transformer block with the default (fused) options, H v of a whole model's loss against
// differences of its gradient, and the sharpness (top Hessian eigenvalue by power iteration) of a
// small LLaMA model against PyTorch's (tests/reference/fixtures/sharpness.safetensors).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functional.h"
#include "core/safetensors.h"
#include "layers/loss.h"
#include "layers/transformer.h"
#include "layers_test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

double dot_all(const std::vector<Var>& a, const std::vector<Var>& b) {
    double total = 0.0;
    for (size_t i = 0; i < a.size(); ++i) total += sum(a[i].data() * b[i].data()).item();
    return total;
}

// Central differences of the gradient along v: (g(x + eps v) - g(x - eps v)) / (2 eps), the data of
// `params` perturbed in place and restored.
std::vector<Tensor> gradient_difference(const std::function<Var()>& loss, const std::vector<Var>& params,
                                        const std::vector<Var>& v, double eps) {
    auto shifted = [&](double step) {
        std::vector<Tensor> saved;
        for (size_t i = 0; i < params.size(); ++i) {
            saved.push_back(params[i].data().clone());
            Tensor p = params[i].data();
            p.copy_(p + v[i].data() * step);
        }
        std::vector<Var> g = gradients(loss(), params);
        for (size_t i = 0; i < params.size(); ++i) Tensor(params[i].data()).copy_(saved[i]);
        std::vector<Tensor> out;
        for (const Var& x : g) out.push_back(x.data());
        return out;
    };
    std::vector<Tensor> plus = shifted(eps), minus = shifted(-eps), out;
    for (size_t i = 0; i < plus.size(); ++i) out.push_back((plus[i] - minus[i]) / (2.0 * eps));
    return out;
}

}  // namespace

TEST_CASE("partial_gradients: each input an independent variable, the walk ending at the inputs", "[autograd]") {
    Var a(from_vector(std::vector<double>{1.5, -2.0}, {2}, DType::F64), true);
    Var up = a * 3.0;     // a non-leaf the walk must not go below
    Var b = up * up;      // b computed from up
    Var out = sum(up * b);
    // gradients: d/d(up) goes through b too (3 up^2); partial_gradients holds b fixed (d/d(up) = b, d/db = up).
    std::vector<Var> total = gradients(out, {up, b}, Var(), /*retain_graph=*/true);
    std::vector<Var> partial = partial_gradients(out, {up, b}, Var(), false);
    const std::vector<double> u = up.data().to_vector();
    CHECK(total[0].data().to_vector() == std::vector<double>{3 * u[0] * u[0], 3 * u[1] * u[1]});
    CHECK(partial[0].data().to_vector() == b.data().to_vector());
    CHECK(partial[1].data().to_vector() == u);
    // Nothing below the inputs ran or was freed: a backward without retain_graph still works after it.
    out.backward();
    CHECK(a.grad().data().to_vector() == std::vector<double>{9 * u[0] * u[0], 9 * u[1] * u[1]});

    // One Var twice, through alias: each use its own variable.
    Var x(from_vector(std::vector<double>{2.0}, {1}, DType::F64), true);
    Var x1 = alias(x), x2 = alias(x);
    std::vector<Var> g = partial_gradients(x1 * x2 * x2, {x1, x2}, Var(), false);
    CHECK(g[0].item() == 4.0);  // x2^2
    CHECK(g[1].item() == 8.0);  // 2 x1 x2
    CHECK(alias(x).grad_fn()->name() == "alias");
}

TEST_CASE("hvp: a cubic's Hessian times v, against the explicit Hessian", "[autograd][hvp]") {
    // f(x, y) = sum(x^3) + sum(x * y)^2 / 2 + x0 y1:  H_xx = diag(6 x) + y y^T, H_xy = (x.y) I + y x^T + e0 e1^T,
    // H_yy = x x^T.
    const std::vector<double> xv = {0.5, -1.25, 2.0}, yv = {1.5, 0.25, -0.75};
    Var x(from_vector(xv, {3}, DType::F64), true), y(from_vector(yv, {3}, DType::F64), true);
    Var vx(from_vector(std::vector<double>{1.0, -2.0, 0.5}, {3}, DType::F64));
    Var vy(from_vector(std::vector<double>{0.25, 3.0, -1.0}, {3}, DType::F64));
    auto f = [](const std::vector<Var>& in) {
        const Var s = sum(in[0] * in[1]);
        return sum(in[0] * in[0] * in[0]) + s * s / 2.0 + select(in[0], 0, 0) * select(in[1], 0, 1);
    };
    HvpResult r = hvp(f, {x, y}, {vx, vy});
    REQUIRE(r.hvp.size() == 2);
    CHECK_FALSE(r.output.requires_grad());
    CHECK_FALSE(r.hvp[0].requires_grad());

    double xy = 0.0;
    for (int i = 0; i < 3; ++i) xy += xv[i] * yv[i];
    const std::vector<double> a = {1.0, -2.0, 0.5}, b = {0.25, 3.0, -1.0};  // vx, vy
    std::vector<double> hx(3), hy(3);
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            const double hxx = (i == j ? 6.0 * xv[i] : 0.0) + yv[i] * yv[j];
            const double hxy = (i == j ? xy : 0.0) + yv[i] * xv[j] + (i == 0 && j == 1 ? 1.0 : 0.0);  // d2f/dx_i dy_j
            const double hyx = (i == j ? xy : 0.0) + xv[i] * yv[j] + (i == 1 && j == 0 ? 1.0 : 0.0);  // d2f/dy_i dx_j
            const double hyy = xv[i] * xv[j];
            hx[i] += hxx * a[j] + hxy * b[j];
            hy[i] += hyx * a[j] + hyy * b[j];
        }
    }
    check_close(r.hvp[0].data(), from_vector(hx, {3}, DType::F64), 1e-13, 1e-13, "H v, x part");
    check_close(r.hvp[1].data(), from_vector(hy, {3}, DType::F64), 1e-13, 1e-13, "H v, y part");
    double fx = 0.0;
    for (int i = 0; i < 3; ++i) fx += xv[i] * xv[i] * xv[i];
    CHECK(r.output.item() == Approx(fx + xy * xy / 2.0 + xv[0] * yv[1]).epsilon(1e-14));
    CHECK_FALSE(x.grad().defined());  // no .grad is touched
}

TEST_CASE("hvp: a nonlinear function against central differences of its gradient, and create_graph",
          "[autograd][hvp]") {
    Generator gen(3);
    Var x(randn({4, 5}, gen, DType::F64), true), w(randn({5, 3}, gen, DType::F64), true);
    std::vector<Var> v = {Var(randn({4, 5}, gen, DType::F64)), Var(randn({5, 3}, gen, DType::F64))};
    auto f = [](const std::vector<Var>& in) { return sum(log_softmax(tanh(matmul(in[0], in[1])), -1) * 0.5); };
    HvpResult r = hvp(f, {x, w}, v);
    std::vector<Tensor> fd = gradient_difference([&] { return f({x, w}); }, {x, w}, v, 1e-5);
    check_close(r.hvp[0].data(), fd[0], 1e-8, 1e-6, "H v, x part");
    check_close(r.hvp[1].data(), fd[1], 1e-8, 1e-6, "H v, w part");

    // create_graph: H v carries a graph back to the inputs (third derivatives), and equals the detached one.
    HvpResult g = hvp(f, {x, w}, v, /*create_graph=*/true);
    REQUIRE(g.hvp[0].requires_grad());
    REQUIRE(g.output.requires_grad());
    check_close(g.hvp[0].data(), r.hvp[0].data(), 0.0, 0.0, "create_graph H v");
    std::vector<Var> third = gradients(sum(g.hvp[0] * g.hvp[0]), {x});
    REQUIRE(third[0].defined());
}

TEST_CASE("hvp: v defaults to 1 for single-element inputs, and bad v, bad output and strict mode are errors",
          "[autograd][hvp]") {
    Var x(from_vector(std::vector<double>{2.0}, {1}, DType::F64), true);
    HvpResult r = hvp([](const std::vector<Var>& in) { return sum(in[0] * in[0] * in[0]); }, {x}, {});
    CHECK(r.hvp[0].item() == Approx(12.0));  // 6 x

    Var a(from_vector(std::vector<double>{1.0, 2.0}, {2}, DType::F64), true);
    auto square_sum = [](const std::vector<Var>& in) { return sum(in[0] * in[0]); };
    CHECK_THROWS_WITH(hvp(square_sum, {a}, {}), Catch::Contains("single-element inputs") && Catch::Contains("[2]"));
    CHECK_THROWS_WITH(hvp(square_sum, {a}, {Var(zeros({3}, DType::F64))}),
                      Catch::Contains("expected v[0] of shape [2] f64") && Catch::Contains("found [3] f64"));
    CHECK_THROWS_WITH(hvp([](const std::vector<Var>& in) { return in[0] * 2.0; }, {a}, {Var(zeros({2}, DType::F64))}),
                      Catch::Contains("single-element tensor, found [2]"));

    // b unused; a's gradient does not depend on the inputs (f linear in a): zeros, or errors with strict.
    Var b(from_vector(std::vector<double>{3.0}, {1}, DType::F64), true);
    auto linear = [](const std::vector<Var>& in) { return sum(in[0] * 3.0); };
    HvpResult z = hvp(linear, {a, b}, {Var(ones({2}, DType::F64)), Var(ones({1}, DType::F64))});
    CHECK(z.hvp[0].data().to_vector() == std::vector<double>{0.0, 0.0});
    CHECK(z.hvp[1].data().to_vector() == std::vector<double>{0.0});
    CHECK_THROWS_WITH(hvp(square_sum, {a, b}, {Var(ones({2}, DType::F64)), Var(ones({1}, DType::F64))}, false, true),
                      Catch::Contains("independent of input 1"));
    CHECK_THROWS_WITH(hvp(linear, {a}, {Var(ones({2}, DType::F64))}, false, true),
                      Catch::Contains("linear in it"));
}

TEST_CASE("double backward: gradgradcheck of a Transformer block with the default (fused) options in f64",
          "[autograd][transformer]") {
    Generator gen(21);
    for (bool pre_norm : {true, false}) {
        INFO((pre_norm ? "pre-norm" : "post-norm"));
        TransformerBlockOptions o;
        o.dim = 4;
        o.n_heads = 2;
        o.n_kv_heads = 1;
        o.multiple_of = 2;
        o.norm_placement = pre_norm ? "pre" : "post";
        o.dtype = DType::F64;
        o.generator = &gen;
        TransformerBlock block(o);
        REQUIRE(o.fused_attention);
        REQUIRE(o.fused_swiglu);
        REQUIRE(o.norm.fused);
        nl::test::randomize_parameters(block, gen);
        const Var x(randn({2, 3, 4}, gen, DType::F64), true);
        const GradcheckResult r = gradgradcheck([&](const std::vector<Var>& in) { return block.forward(in[0]); }, {x});
        INFO(r.message);
        CHECK(r.ok);
    }
}

namespace {

TransformerOptions tiny_model_options() {
    TransformerOptions o;
    o.vocab_size = 11;
    o.dim = 8;
    o.n_layers = 2;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.multiple_of = 4;
    o.norm.eps = 1e-5;
    o.max_seq_len = 16;
    o.dtype = DType::F64;
    return o;
}

Var model_loss(Transformer& model, const Tensor& ids, const Tensor& targets) {
    const int64_t vocab = model.options().vocab_size;
    return cross_entropy_loss(reshape(model.forward(ids), {-1, vocab}), targets.reshape({-1}));
}

}  // namespace

TEST_CASE("hvp: a whole Transformer's loss (fused norms, attention, SwiGLU, cross-entropy) against differences of "
          "its gradient, and the composed model",
          "[autograd][hvp][transformer]") {
    std::vector<std::vector<Tensor>> results;
    for (bool fused : {true, false}) {
        TransformerOptions o = tiny_model_options();
        o.seed = 5;
        o.fused_attention = o.fused_swiglu = o.norm.fused = fused;
        Transformer model(o);
        Generator gen(8);
        for (auto& [name, p] : model.named_parameters())  // norm weights 1 + 0.5 N(0, 1), not ones
            if (p.dim() == 1) p.data().copy_(randn(p.shape(), gen, DType::F64) * 0.5 + 1.0);
        const Tensor ids = from_vector(std::vector<int64_t>{1, 4, 9, 2, 0, 10, 3, 3, 7, 5}, {2, 5});
        const Tensor targets = from_vector(std::vector<int64_t>{4, 9, 2, 0, 6, 3, 3, 7, 5, 1}, {2, 5});
        std::vector<Var> params = model.parameters(), v;
        for (const Var& p : params) v.emplace_back(randn(p.shape(), gen, DType::F64));
        HvpResult r = hvp([&](const std::vector<Var>&) { return model_loss(model, ids, targets); }, params, v);
        std::vector<Tensor> fd = gradient_difference([&] { return model_loss(model, ids, targets); }, params, v, 1e-5);
        std::vector<Tensor> hv;
        for (size_t i = 0; i < params.size(); ++i) {
            INFO(model.named_parameters()[i].first);
            check_close(r.hvp[i].data(), fd[i], 1e-7, 1e-5, "H v against differences of the gradient");
            hv.push_back(r.hvp[i].data());
        }
        results.push_back(hv);
    }
    for (size_t i = 0; i < results[0].size(); ++i) check_close(results[0][i], results[1][i], 1e-11, 1e-9, "fused vs composed");
}

TEST_CASE("hvp: the sharpness of a small LLaMA model by power iteration matches PyTorch's", "[autograd][hvp][reference]") {
    const SafeTensorsFile f =
        load_safetensors(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/fixtures/sharpness.safetensors");
    TransformerOptions o = tiny_model_options();
    REQUIRE(f.metadata.at("vocab_size") == std::to_string(o.vocab_size));
    REQUIRE(f.metadata.at("n_layers") == std::to_string(o.n_layers));
    REQUIRE(f.metadata.at("n_kv_heads") == std::to_string(o.n_kv_heads));
    Transformer model(o);
    NamedTensors weights;
    for (const auto& [name, param] : model.named_parameters()) weights.emplace_back(name, f.at(name));
    model.load_state_dict(weights);
    const Tensor ids = f.at("ids"), targets = f.at("targets");
    CHECK(model_loss(model, ids, targets).item() == Approx(f.at("loss").item()).epsilon(1e-12));

    std::vector<Var> params = model.parameters(), v;
    for (const auto& [name, param] : model.named_parameters()) v.emplace_back(f.at("v0." + name));
    const std::vector<double> expected = f.at("eigenvalue").to_vector();
    REQUIRE(expected.size() == std::stoul(f.metadata.at("iterations")));
    for (size_t it = 0; it < expected.size(); ++it) {
        HvpResult r = hvp([&](const std::vector<Var>&) { return model_loss(model, ids, targets); }, params, v);
        const double eigenvalue = dot_all(v, r.hvp);
        INFO("iteration " << it);
        // Both sides run the same f64 sequence; they differ by rounding only (about 2e-14 here), which
        // power iteration does not amplify. 1e-10 leaves room for other CPUs and BLAS kernels.
        CHECK(eigenvalue == Approx(expected[it]).epsilon(1e-10));
        const double norm = std::sqrt(dot_all(r.hvp, r.hvp));
        for (size_t i = 0; i < v.size(); ++i) v[i] = Var(r.hvp[i].data() / norm);
    }
}
