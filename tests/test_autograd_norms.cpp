// Composed RMSNorm and LayerNorm built from primitive Var ops: first- and second-order gradient
// checks, and the graph's saved-bytes report checked against the tensors each node saves by hand.
// Also a fused RMSNorm written through make_result, the extension point the fused norms use.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"

using namespace nl;

namespace {

using Vars = std::vector<Var>;
constexpr double kEps = 1e-5;

Var leaf(const Shape& shape, uint64_t seed) {
    Generator gen(seed);
    return Var(randn(shape, gen, DType::F64), true);
}

// RMSNorm (Zhang & Sennrich 2019; LLaMA): y = x * rsqrt(mean(x^2, -1) + eps) * w.
Var rms_norm(const Var& x, const Var& w) { return x * rsqrt(mean(square(x), {-1}, true) + kEps) * w; }

// LayerNorm (Ba et al. 2016): y = (x - mean) * rsqrt(var_biased + eps) * w + b.
Var layer_norm(const Var& x, const Var& w, const Var& b) {
    return (x - mean(x, {-1}, true)) * rsqrt(var(x, {-1}, 0, true) + kEps) * w + b;
}

// The (op, saved names) of every node, in backward order.
std::vector<std::string> saved_layout(const Var& root) {
    std::vector<std::string> out;
    for (const auto& node : graph_nodes(root)) {
        std::string line = node->name() + ":";
        for (const SavedTensor& s : node->saved()) line += " " + s.name;
        out.push_back(line);
    }
    return out;
}

int64_t per_node_total(const Var& root) {
    int64_t total = 0;
    for (const auto& node : graph_nodes(root)) total += node->saved_bytes();
    return total;
}

}  // namespace

TEST_CASE("autograd norms: composed RMSNorm and LayerNorm pass gradcheck and gradgradcheck", "[autograd]") {
    auto rms = [](const Vars& v) { return rms_norm(v[0], v[1]); };
    auto ln = [](const Vars& v) { return layer_norm(v[0], v[1], v[2]); };
    for (auto check : {gradcheck, gradgradcheck}) {
        GradcheckResult r = check(rms, {leaf({4, 8}, 1), leaf({8}, 2)}, 1e-6, 1e-5, 1e-3);
        INFO(r.message);
        REQUIRE(r.ok);
        r = check(ln, {leaf({4, 8}, 3), leaf({8}, 4), leaf({8}, 5)}, 1e-6, 1e-5, 1e-3);
        INFO(r.message);
        REQUIRE(r.ok);
        // Batched (B, T, C) with a non-contiguous x.
        Generator gen(6);
        Var xt(randn({2, 8, 3}, gen, DType::F64).transpose(1, 2), true);
        r = check(rms, {xt, leaf({8}, 7)}, 1e-6, 1e-5, 1e-3);
        INFO(r.message);
        REQUIRE(r.ok);
        r = check(ln, {xt, leaf({8}, 8), leaf({8}, 9)}, 1e-6, 1e-5, 1e-3);
        INFO(r.message);
        REQUIRE(r.ok);
    }
}

TEST_CASE("autograd norms: composed LayerNorm's backward matches the closed form", "[autograd]") {
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w (llm.c layernorm_backward).
    Var x = leaf({3, 6}, 10), w = leaf({6}, 11), b = leaf({6}, 12);
    Generator gen(13);
    Tensor dy = randn({3, 6}, gen, DType::F64);
    layer_norm(x, w, b).backward(Var(dy));
    Tensor mu = mean(x.data(), {-1}, true);
    Tensor rstd = rsqrt(add(var(x.data(), {-1}, 0, true), kEps));
    Tensor xhat = mul(sub(x.data(), mu), rstd);
    Tensor g = mul(dy, w.data());
    Tensor dx = mul(rstd, sub(sub(g, mean(g, {-1}, true)), mul(xhat, mean(mul(g, xhat), {-1}, true))));
    REQUIRE(max_abs_diff(x.grad().data(), dx) < 1e-12);
    REQUIRE(max_abs_diff(w.grad().data(), sum(mul(dy, xhat), {0})) < 1e-12);
    REQUIRE(max_abs_diff(b.grad().data(), sum(dy, {0})) < 1e-12);
}

TEST_CASE("autograd norms: saved bytes of composed RMSNorm and LayerNorm", "[autograd]") {
    const int64_t B = 4, D = 8, f64 = 8;
    const int64_t BD = B * D * f64, Bb = B * f64, Db = D * f64;  // bytes of an (B, D), (B, 1), (D) tensor
    Var x = leaf({B, D}, 20), w = leaf({D}, 21), b = leaf({D}, 22);

    SECTION("RMSNorm") {
        Var y = rms_norm(x, w);
        // square saves x; rsqrt its output r (B, 1); x * r saves r and x; (x r) * w saves w and x r.
        REQUIRE(saved_layout(y) ==
                std::vector<std::string>{"mul: b a", "mul: b a", "rsqrt: y", "add:", "mean:", "square: x"});
        REQUIRE(per_node_total(y) == BD + Bb + (Bb + BD) + (Db + BD));
        // Distinct storages: x (saved by square and mul), r (by rsqrt and mul), x r, w.
        REQUIRE(graph_saved_bytes(y) == BD + Bb + BD + Db);
        REQUIRE(graph_saved_bytes(y) == 608);

        // A frozen weight: the last mul no longer needs x r, so it is not saved.
        Var frozen(w.data());
        Var y2 = rms_norm(x, frozen);
        REQUIRE(graph_saved_bytes(y2) == BD + Bb + Db);
        // Under no-grad nothing is saved at all.
        NoGradGuard guard;
        REQUIRE(graph_saved_bytes(rms_norm(x, w)) == 0);
    }
    SECTION("LayerNorm") {
        Var y = layer_norm(x, w, b);
        // var saves x; rsqrt r; (x - mu) * r saves r and x - mu; xhat * w saves w and xhat.
        REQUIRE(saved_layout(y) == std::vector<std::string>{"add:", "mul: b a", "mul: b a", "rsqrt: y", "add:",
                                                            "var: x", "sub:", "mean:"});
        REQUIRE(per_node_total(y) == BD + Bb + (Bb + BD) + (Db + BD));
        REQUIRE(graph_saved_bytes(y) == BD + Bb + BD + Db + BD);  // x, r, x - mu, w, xhat
        REQUIRE(graph_saved_bytes(y) == 864);
        // The summary names every node and the total, and says storages count once.
        std::string summary = graph_summary(y);
        REQUIRE_THAT(summary, Catch::Contains("rsqrt") && Catch::Contains("var") && Catch::Contains("864 B") &&
                                  Catch::Contains("counted once") && Catch::Contains("8 nodes"));
        y = Var();
    }
}

TEST_CASE("autograd norms: DOT export names the ops, shapes and saved bytes", "[autograd]") {
    Var x = leaf({4, 8}, 30), w = leaf({8}, 31), b = leaf({8}, 32);
    Var y = sum(layer_norm(x, w, b));
    std::string dot = graph_to_dot(y);
    REQUIRE_THAT(dot, Catch::StartsWith("digraph autograd {"));
    for (const char* op : {"sum", "add", "mul", "rsqrt", "var", "sub", "mean"}) {
        INFO(op);
        REQUIRE_THAT(dot, Catch::Contains(std::string("label=\"") + op));
    }
    REQUIRE_THAT(dot, Catch::Contains("[4, 8] f64") && Catch::Contains("saved 288 B") &&
                          Catch::Contains("shape=ellipse") && Catch::Contains("->"));
    // Three leaves (x, w, b), each drawn once.
    size_t leaves = 0;
    for (size_t at = dot.find("shape=ellipse"); at != std::string::npos; at = dot.find("shape=ellipse", at + 1)) ++leaves;
    REQUIRE(leaves == 3);
}

TEST_CASE("autograd norms: a fused RMSNorm through make_result is one node saving x, w and rstd", "[autograd]") {
    // The extension point as the fused norms use it: forward computes rstd once, the node saves
    // only what the closed-form backward needs.
    auto fused = [](const Vars& v) {
        const Var& x = v[0];
        const Var& w = v[1];
        Tensor rstd = rsqrt(add(mean(square(x.data()), {-1}, true), kEps));  // (rows, 1)
        Tensor y = mul(mul(x.data(), rstd), w.data());
        return make_result(y, "rms_norm", {x, w}, {{"x", x}, {"w", w}, {"rstd", rstd}},
                           [](const Var& dy, const Vars& s) -> Vars {
                               const Var &x = s[0], &w = s[1], &rstd = s[2];
                               Var xhat = x * rstd;
                               Var g = dy * w;
                               Var dx = rstd * (g - xhat * mean(g * xhat, {-1}, true));
                               return {dx, sum_to(dy * xhat, w.shape())};
                           });
    };
    Var x = leaf({4, 8}, 40), w = leaf({8}, 41);
    GradcheckResult r = gradcheck(fused, {x, w});
    INFO(r.message);
    REQUIRE(r.ok);
    Var y = fused({x, w});
    REQUIRE(graph_nodes(y).size() == 1);
    REQUIRE(graph_saved_bytes(y) == (32 + 8 + 4) * 8);  // x, w, rstd: less than composed's 608
    // Same values and grads as the composed one.
    Var yc = rms_norm(x, w);
    REQUIRE(max_abs_diff(y.data(), yc.data()) < 1e-12);
    std::vector<Var> gf = gradients(sum(y * y), {x, w});
    std::vector<Var> gc = gradients(sum(yc * yc), {x, w});
    REQUIRE(max_abs_diff(gf[0].data(), gc[0].data()) < 1e-12);
    REQUIRE(max_abs_diff(gf[1].data(), gc[1].data()) < 1e-12);
}
