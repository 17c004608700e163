// Norm tests: every norm of the registry, read from its entry (layers/norm_registry.h), against the
// entry's plain f64 reference loop, fused vs composed (forward and every gradient, f32 and f64),
// gradcheck of both forms at the entry's tolerances, saved bytes by the entry's fused form,
// state-dict names and init; then one hand-computed row per norm, the paper's invariances, bf16,
// the factory, the monitor and the LayerNorm -> RMSNorm migration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/fused.h"
#include "layers/linear.h"
#include "layers/migrate.h"
#include "layers/monitor.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "tests/layers_test_util.h"

using namespace nl;
using nl::test::check_close;
using nl::test::randomize_parameters;

namespace {

// The options a test builds `type` with: the entry's gradcheck options (p and alpha away from their
// defaults where the norm reads them), over dim, in the given form and dtype.
NormOptions options_for(const NormType& type, int64_t dim, bool fused, DType dtype) {
    NormOptions o = norm_gradcheck_options(type, dim, fused);
    o.dtype = dtype;
    return o;
}

// The norm's output by its entry's f64 reference loop, from the module's own parameters (an absent
// one at its init, as the reference expects). x: (rows, d) row-major.
std::vector<double> reference_output(const Norm& norm, const std::vector<double>& x, int64_t rows, int64_t d) {
    const NormType& type = norm.norm_type();
    std::vector<std::vector<double>> params;
    const std::vector<Var> vars = norm.norm_parameters();
    for (size_t i = 0; i < vars.size(); ++i)
        params.push_back(vars[i].defined() ? vars[i].data().to_vector()
                                           : norm_parameter_init(type.parameters[i], d, norm.options()));
    std::vector<double> out(x.size());
    for (int64_t r = 0; r < rows; ++r) type.reference(&x[r * d], d, params, norm.options(), &out[r * d]);
    return out;
}

// The entry's functional form over gradcheck inputs {x, parameters...}.
Var apply_functional(const NormType& type, const std::vector<Var>& in, bool fused) {
    const NormOptions options = norm_gradcheck_options(type, in[0].size(-1), fused);
    return type.forward(in[0], std::vector<Var>(in.begin() + 1, in.end()), options, fused);
}

}  // namespace

TEST_CASE("norms: every norm matches a plain f64 reference loop, both forms", "[norms]") {
    Generator gen(11);
    const int64_t rows = 6, d = 16;
    for (const NormType& type : norm_registry()) {
        for (bool fused : {true, false}) {
            INFO(type.name << (fused ? " fused" : " composed"));
            auto norm = make_norm(options_for(type, d, fused, DType::F64));
            randomize_parameters(*norm, gen);
            Tensor x = randn({2, 3, d}, gen, DType::F64) * 2.0 + 0.5;  // (2, 3, d): centering matters
            Var y = norm->forward(Var(x));
            REQUIRE(y.shape() == x.shape());
            Tensor expected = from_vector(reference_output(*norm, x.to_vector(), rows, d), x.shape(), DType::F64);
            check_close(y, expected, 1e-12, 1e-10, "output");
        }
    }
}

TEST_CASE("norms: fused and composed agree on the output and every gradient (f32, f64)", "[norms]") {
    Generator gen(12);
    const int64_t d = 16;
    for (DType dtype : {DType::F32, DType::F64}) {
        const double atol = dtype == DType::F64 ? 1e-12 : 1e-5;
        const double rtol = dtype == DType::F64 ? 1e-10 : 1e-4;
        for (const NormType& type : norm_registry()) {
            INFO(type.name << " " << dtype_name(dtype));
            auto fused = make_norm(options_for(type, d, true, dtype));
            auto composed = make_norm(options_for(type, d, false, dtype));
            randomize_parameters(*fused, gen);
            composed->load_state_dict(fused->state_dict());
            REQUIRE(fused->fused());
            REQUIRE_FALSE(composed->fused());

            Tensor x = (randn({4, 5, d}, gen, DType::F64) * 2.0 + 0.5).to(dtype);  // (4, 5, d)
            Tensor g = randn({4, 5, d}, gen, DType::F64).to(dtype);                // upstream gradient
            Var xf(x.clone(), true), xc(x.clone(), true);
            Var yf = fused->forward(xf), yc = composed->forward(xc);
            check_close(yf, yc.data(), atol, rtol, "output");
            yf.backward(Var(g));
            yc.backward(Var(g));
            check_close(xf.grad(), xc.grad().data(), atol, rtol, "grad x");
            auto pf = fused->named_parameters(), pc = composed->named_parameters();
            REQUIRE(pf.size() == pc.size());
            REQUIRE(!pf.empty());
            for (size_t i = 0; i < pf.size(); ++i) {
                REQUIRE(pf[i].first == pc[i].first);
                check_close(pf[i].second.grad(), pc[i].second.grad().data(), atol, rtol, "grad " + pf[i].first);
            }
        }
    }
}

TEST_CASE("norms: a non-contiguous (transposed) input gives the same result", "[norms]") {
    Generator gen(13);
    for (const NormType& type : norm_registry()) {
        for (bool fused : {true, false}) {
            INFO(type.name << (fused ? " fused" : " composed"));
            auto norm = make_norm(options_for(type, 8, fused, DType::F64));
            randomize_parameters(*norm, gen);
            Tensor base = randn({8, 5}, gen, DType::F64);  // its transpose (5, 8) is the input
            Var xt(base.t(), true), xc(base.t().contiguous(), true);
            Var yt = norm->forward(xt), yc = norm->forward(xc);
            check_close(yt, yc.data(), 1e-13, 1e-12, "output");
            Tensor g = randn({5, 8}, gen, DType::F64);
            yt.backward(Var(g));
            yc.backward(Var(g));
            check_close(xt.grad(), xc.grad().data(), 1e-13, 1e-12, "grad x");
        }
    }
}

TEST_CASE("norms: gradcheck passes for both forms (f64), gradgradcheck for the composed, at the registry's "
          "tolerances", "[norms]") {
    Generator gen(14);
    for (const NormType& type : norm_registry()) {
        std::vector<Var> inputs = norm_gradcheck_inputs(type, {3, 6}, gen);
        const double atol = type.gradcheck.atol, rtol = type.gradcheck.rtol;
        for (bool fused : {true, false}) {
            INFO(type.name << (fused ? " fused" : " composed"));
            GradcheckResult r = gradcheck([&](const std::vector<Var>& in) { return apply_functional(type, in, fused); },
                                          inputs, 1e-6, atol, rtol);
            INFO(r.message);
            CHECK(r.ok);
        }
        for (bool fused : {true, false}) {
            INFO(type.name << (fused ? " fused" : " composed") << ", second order");
            GradcheckResult r2 = gradgradcheck(
                [&](const std::vector<Var>& in) { return apply_functional(type, in, fused); }, inputs, 1e-6, atol, rtol);
            INFO(r2.message);
            CHECK(r2.ok);
        }
    }
}

TEST_CASE("norms: double backward through a fused norm equals the composed form's, and first order is unchanged",
          "[norms]") {
    Generator gen(15);
    for (const NormType& type : norm_registry()) {
        INFO(type.name);
        std::vector<Var> in = norm_gradcheck_inputs(type, {3, 6}, gen);
        std::vector<std::vector<Tensor>> second;  // d(sum(g_x^2))/d(inputs), per form
        for (bool fused : {true, false}) {
            Var y = sum(square(apply_functional(type, in, fused)));
            std::vector<Var> wanted;
            for (const Var& v : in)
                if (v.defined() && v.requires_grad()) wanted.push_back(v);
            std::vector<Var> g = gradients(y, wanted, Var(), false, /*create_graph=*/true);  // no longer throws
            REQUIRE(g[0].requires_grad());
            std::vector<Var> gg = gradients(sum(square(g[0])), wanted);
            std::vector<Tensor> out;
            for (const Var& v : gg) out.push_back(v.defined() ? v.data() : Tensor());
            second.push_back(out);
        }
        for (size_t i = 0; i < second[0].size(); ++i) {
            REQUIRE(second[0][i].defined() == second[1][i].defined());
            if (second[0][i].defined()) check_close(second[0][i], second[1][i], 1e-10, 1e-9, "second derivative");
        }
    }
}

TEST_CASE("norms: a one-node fused form saves exactly x + rstd (+ mean), x alone without a statistic (DyT), any "
          "kernel form less than composed",
          "[norms]") {
    Generator gen(16);
    const int64_t d = 16, rows = 20;
    for (DType dtype : {DType::F32, DType::F64}) {
        const int64_t stat = dtype == DType::F64 ? 8 : 4;  // rstd/mean are f64 for f64 x, else f32
        for (const NormType& type : norm_registry()) {
            INFO(type.name << " " << dtype_name(dtype));
            auto fused = make_norm(options_for(type, d, true, dtype));
            auto composed = make_norm(options_for(type, d, false, dtype));
            Var x(randn({4, 5, d}, gen, dtype), true);  // (4, 5, d): 20 rows
            Var yf = fused->forward(x), yc = composed->forward(x);
            const int64_t bf = graph_saved_bytes(yf), bc = graph_saved_bytes(yc);
            INFO("fused " << bf << " B, composed " << bc << " B\n" << graph_summary(yf) << "\n" << graph_summary(yc));
            if (type.fused == FusedForm::Composed) {  // no kernel: the fused form is the composed form
                CHECK(bf == bc);
                continue;
            }
            CHECK(bf < bc);
            if (type.fused == FusedForm::KernelAndOps) continue;  // the kernel's nodes plus composed ops
            const bool ln = type.statistic == NormStatistic::Variance;  // the node saves the mean too
            const bool none = type.statistic == NormStatistic::Elementwise;  // no statistic to save
            CHECK(bf == x.data().nbytes() + rows * stat * (none ? 0 : ln ? 2 : 1));
            // The graph is one node, and it saved exactly these names.
            auto nodes = graph_nodes(yf);
            REQUIRE(nodes.size() == 1);
            std::vector<std::string> names;
            for (const auto& s : saved_info(*nodes[0])) names.push_back(s.name);
            CHECK(names == (none ? std::vector<std::string>{"x"}
                            : ln ? std::vector<std::string>{"x", "mean", "rstd"}
                                 : std::vector<std::string>{"x", "rstd"}));
        }
    }
}

TEST_CASE("norms: the RMSNorm paper's invariances", "[norms]") {
    Generator gen(17);
    Tensor x = randn({6, 32}, gen, DType::F64) + 0.3;
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        // eps breaks exact invariance by O(eps / mean(x^2)); a tiny eps makes it exact to rounding.
        RMSNorm rms(NormOptions{.type = "rmsnorm", .dim = 32, .eps = 1e-14, .fused = fused, .dtype = DType::F64});
        LayerNorm ln(NormOptions{.type = "layernorm", .dim = 32, .eps = 1e-14, .fused = fused, .dtype = DType::F64});
        randomize_parameters(rms, gen);
        randomize_parameters(ln, gen);
        Tensor y_rms = rms.forward(Var(x)).data(), y_ln = ln.forward(Var(x)).data();
        for (double c : {0.05, 7.0, 1000.0}) {
            INFO("scale " << c);
            check_close(rms.forward(Var(x * c)), y_rms, 1e-10, 1e-10, "RMSNorm(c x) == RMSNorm(x)");
            check_close(ln.forward(Var(x * c)), y_ln, 1e-10, 1e-10, "LayerNorm(c x) == LayerNorm(x)");
        }
        check_close(ln.forward(Var(x + 3.0)), y_ln, 1e-10, 1e-10, "LayerNorm(x + c) == LayerNorm(x)");
        check_close(ln.forward(Var(x * 2.0 - 5.0)), y_ln, 1e-10, 1e-10, "LayerNorm(2x - 5) == LayerNorm(x)");
        // Re-centering is NOT an RMSNorm invariance: the output must change by a lot.
        CHECK(max_abs_diff(rms.forward(Var(x + 3.0)).data(), y_rms) > 0.5);
    }
}

TEST_CASE("norms: bf16 RMSNorm equals the f32 math then a cast (LLaMA's x.float() ... type_as(x))", "[norms]") {
    Generator gen(18);
    const int64_t d = 24;
    Tensor x = (randn({5, d}, gen, DType::F32) * 3.0).to(DType::BF16);
    Tensor w = (randn({d}, gen, DType::F32) * 0.5 + 1.0).to(DType::BF16);
    // Reference: norm(x.float()) in f32, type_as(x) (round to bf16), then the bf16 product with w.
    Tensor xf = x.to(DType::F32);
    Tensor normed = (xf * rsqrt(mean(square(xf), {-1}, true) + 1e-6)).to(DType::BF16);
    Tensor ref = (normed.to(DType::F32) * w.to(DType::F32)).to(DType::BF16);
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        RMSNorm norm(NormOptions{.type = "rmsnorm", .dim = d, .fused = fused, .dtype = DType::BF16});
        norm.weight().data().copy_(w);
        Var xv(x, true);
        Var y = norm.forward(xv);
        CHECK(y.dtype() == DType::BF16);
        // Composed rounds exactly as LLaMA (twice); fused rounds once: both within one bf16 ulp.
        check_close(y.data().to(DType::F64), ref.to(DType::F64), 1e-3, fused ? 8e-3 : 4e-3, "bf16 output");
        y.backward(Var(ones_like(y.data())));
        CHECK(xv.grad().dtype() == DType::BF16);
        CHECK(norm.weight().grad().dtype() == DType::BF16);
    }
}

namespace {

// One row per norm, written by hand rather than read from the registry, so the entry is checked
// against something it did not produce: its state-dict names with the default options, the
// options it reads beyond eps (the Python classes' arguments), and its output on the explainer's x = [1, 2, 3, 4] (d = 4) with its parameters at their init and the
// default options (eps 1e-5, p 0.0625: k = 1, alpha 0.5, g = sqrt(4), DyT's alpha_init 0.5), as a function of each x_j.
struct NormRow {
    std::string type;
    std::vector<std::string> state_names;
    std::vector<std::string> option_names;
    std::function<double(double)> y;
};

const double kRms = std::sqrt(7.5 + 1e-5);   // sqrt(mean(x^2) + eps)
const double kStd = std::sqrt(1.25 + 1e-5);  // sqrt(var(x) + eps), var biased
const double kGate = 1.0 / (1.0 + std::exp(-std::sqrt(5.0 / 3.0)));  // sigmoid(1 * unbiased std)

const std::vector<NormRow> kNormRows = {
    {"layernorm", {"weight", "bias"}, {"elementwise_affine", "bias"}, [](double x) { return (x - 2.5) / kStd; }},
    {"rmsnorm", {"weight"}, {"elementwise_affine"}, [](double x) { return x / kRms; }},
    {"rmsnorm_bias", {"weight", "bias"}, {"elementwise_affine"}, [](double x) { return x / kRms; }},
    {"prmsnorm", {"weight"}, {"elementwise_affine", "p"}, [](double x) { return x / std::sqrt(1.0 + 1e-5); }},
    {"adaptive_rmsnorm", {"weight", "alpha"}, {"elementwise_affine"}, [](double x) { return x / kRms * kGate; }},
    {"hybridnorm", {"rms_norm.weight", "layer_norm.weight", "layer_norm.bias"},
     {"elementwise_affine", "bias", "alpha"},
     [](double x) { return 0.5 * x / kRms + 0.5 * (x - 2.5) / kStd; }},
    {"scalenorm", {"g"}, {}, [](double x) { return 2.0 * x / std::sqrt(30.0); }},
    {"dyt", {"alpha", "weight", "bias"}, {"elementwise_affine", "alpha_init"}, [](double x) { return std::tanh(0.5 * x); }},
};

}  // namespace

TEST_CASE("norms: every registry entry has a hand-written row, and matches it", "[norms]") {
    REQUIRE(kNormRows.size() == norm_registry().size());
    const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4}, DType::F64);
    for (const NormType& type : norm_registry()) {
        INFO(type.name);
        auto row = std::find_if(kNormRows.begin(), kNormRows.end(), [&](const NormRow& r) { return r.type == type.name; });
        REQUIRE(row != kNormRows.end());  // a new norm adds its row to kNormRows
        CHECK(norm_parameter_names(type) == row->state_names);
        CHECK(norm_option_names(type) == row->option_names);
        std::vector<double> expected;
        for (double v : x.to_vector()) expected.push_back(row->y(v));
        for (bool fused : {true, false}) {
            auto norm = make_norm(NormOptions{.type = type.name, .dim = 4, .fused = fused, .dtype = DType::F64});
            check_close(norm->forward(Var(x)), from_vector(expected, {1, 4}, DType::F64), 1e-12, 1e-12, "output");
        }
    }
}

TEST_CASE("norms: factory, defaults, parameter names and errors", "[norms]") {
    for (const NormType& type : norm_registry()) {
        INFO(type.name);
        auto norm = make_norm(NormOptions{.type = type.name, .dim = 8});
        CHECK(norm->type_name() == type.class_name);
        std::vector<std::string> names;
        for (auto& [name, p] : norm->named_parameters()) names.push_back(name);
        CHECK(names == norm_parameter_names(type));
        CHECK(norm->eps() == 1e-5);  // the article's classes' default, for every type
        // Each parameter at its entry's init (weights one, biases zero, alpha one or alpha_init, g sqrt(d)), in f32.
        const NamedVars params = norm->named_parameters();
        for (size_t i = 0; i < params.size(); ++i) {
            const Tensor& value = params[i].second.data();
            const Tensor init =
                from_vector(norm_parameter_init(type.parameters[i], 8, norm->options()), value.shape(), value.dtype());
            CHECK(value.to_vector() == init.to_vector());
        }
    }
    CHECK(make_norm(NormOptions{.type = "layernorm", .dim = 8, .eps = 1e-3})->eps() == 1e-3);
    CHECK(make_norm(NormOptions{.type = "layernorm", .dim = 8, .bias = false})->named_parameters().size() == 1);
    CHECK(make_norm(NormOptions{.type = "rmsnorm", .dim = 8, .elementwise_affine = false})->parameters().empty());
    CHECK(std::dynamic_pointer_cast<RMSNorm>(make_norm(NormOptions{.type = "prmsnorm", .dim = 16}))->stat_count() == 1);
    CHECK(std::dynamic_pointer_cast<RMSNorm>(make_norm(NormOptions{.type = "prmsnorm", .dim = 16, .p = 0.3}))->stat_count() == 5);

    REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "batchnorm", .dim = 8}),
                        Catch::Contains("unknown norm type 'batchnorm'") && Catch::Contains("layernorm, rmsnorm, rmsnorm_bias"));
    REQUIRE_THROWS_WITH(RMSNorm(NormOptions{.type = "swishnorm", .dim = 8}),
                        Catch::Contains("unknown norm type 'swishnorm'") && Catch::Contains("hybridnorm"));
    REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "rmsnorm", .dim = 0}), Catch::Contains("dim > 0"));
    REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "prmsnorm", .dim = 8, .p = 0.0}), Catch::Contains("p in (0, 1]"));
    REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "hybridnorm", .dim = 8, .alpha = 1.5}),
                        Catch::Contains("alpha in [0, 1]"));
    auto norm = make_norm(NormOptions{.type = "rmsnorm", .dim = 8});
    REQUIRE_THROWS_WITH(norm->forward(Var(zeros({2, 7}))), Catch::Contains("expected input (..., 8), found [2, 7]"));
    REQUIRE_THROWS_WITH(norm->forward(Var(zeros({2, 8}, DType::F64))),
                        Catch::Contains("weight has dtype f32 but the input has f64"));
    CHECK(norm->str() == "RMSNorm(8, eps=1e-05, elementwise_affine=true, fused=true)");
}

TEST_CASE("norms: DyT's alpha starts at alpha_init, which must be finite, no weight and bias without "
          "elementwise_affine, and its print", "[norms]") {
    for (double alpha_init : {0.5, 0.2, -1.5}) {
        auto norm = std::dynamic_pointer_cast<DyT>(make_norm(NormOptions{.type = "dyt", .dim = 8, .alpha_init = alpha_init}));
        REQUIRE(norm != nullptr);
        CHECK(norm->alpha().data().to_vector() == std::vector<double>{static_cast<double>(static_cast<float>(alpha_init))});
        CHECK(norm->alpha().shape() == Shape{1});
        CHECK(norm->weight().data().to_vector() == std::vector<double>(8, 1.0));
        CHECK(norm->bias().data().to_vector() == std::vector<double>(8, 0.0));
        CHECK(norm->alpha_init() == alpha_init);
    }
    auto bare = std::dynamic_pointer_cast<DyT>(make_norm(NormOptions{.type = "dyt", .dim = 4, .elementwise_affine = false}));
    CHECK(norm_parameter_names(bare->norm_type()) == std::vector<std::string>{"alpha", "weight", "bias"});
    REQUIRE(bare->named_parameters().size() == 1);
    CHECK_FALSE(bare->weight().defined());
    CHECK_FALSE(bare->bias().defined());
    const Tensor x = from_vector(std::vector<double>{-3, 0.5, 1, 8}, {1, 4});
    check_close(bare->forward(Var(x)), from_vector(std::vector<double>{std::tanh(-1.5), std::tanh(0.25), std::tanh(0.5),
                                                                       std::tanh(4.0)}, {1, 4}).to(DType::F64),
                1e-6, 1e-6, "tanh(alpha x)");
    CHECK(bare->str() == "DyT(4, alpha_init=0.5, elementwise_affine=false, fused=true)");
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
        REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "dyt", .dim = 8, .alpha_init = bad}),
                            Catch::Contains("DyT: expected a finite alpha_init, found"));
    }
    // The functional form's checks name what it expected.
    Var xv(zeros({2, 4}));
    REQUIRE_THROWS_WITH(dyt(xv, Var(zeros({2})), Var(), Var(), true), Catch::Contains("dyt: expected alpha [1] for input [2, 4], found [2]"));
    REQUIRE_THROWS_WITH(dyt(xv, Var(), Var(), Var(), false), Catch::Contains("dyt: expected alpha [1], found an undefined Var"));
}

TEST_CASE("norms: DyT's fused node is twice differentiable (autograd ops under create_graph) and agrees with the "
          "composed form", "[norms]") {
    Generator gen(23);
    const NormType& type = find_norm_type("dyt");
    std::vector<Var> inputs = norm_gradcheck_inputs(type, {3, 6}, gen);
    GradcheckResult r = gradgradcheck([&](const std::vector<Var>& in) { return apply_functional(type, in, true); },
                                      inputs, 1e-6, type.gradcheck.atol, type.gradcheck.rtol);
    INFO(r.message);
    CHECK(r.ok);
    // The first-order gradients under create_graph equal the kernel's.
    Var y = apply_functional(type, inputs, true);
    Var g = Var(randn({3, 6}, gen, DType::F64));
    std::vector<Var> kernel = gradients(y, inputs, g, true, false);
    std::vector<Var> ops = gradients(y, inputs, g, false, true);
    for (size_t i = 0; i < inputs.size(); ++i) {
        INFO("input " << i);
        // dbias = sum_rows(dy) depends on no input: it is the only gradient without a graph.
        CHECK(ops[i].requires_grad() == (i != 3));
        check_close(ops[i], kernel[i].data(), 1e-13, 1e-12, "gradient");
    }
}

TEST_CASE("norms: bf16 DyT in both forms equals the f32 math then a cast, within one bf16 rounding", "[norms]") {
    Generator gen(24);
    const int64_t d = 24;
    Tensor x = (randn({5, d}, gen, DType::F32) * 3.0).to(DType::BF16);
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        auto f32 = make_norm(NormOptions{.type = "dyt", .dim = d, .fused = fused, .alpha_init = 0.8});
        auto bf16 = make_norm(NormOptions{.type = "dyt", .dim = d, .fused = fused, .alpha_init = 0.8, .dtype = DType::BF16});
        randomize_parameters(*bf16, gen);
        {
            NoGradGuard no_grad;
            for (auto& [name, p] : f32->named_parameters()) p.data().copy_(bf16->parameter(name).data().to(DType::F32));
        }
        Var xv(x, true), xf(x.to(DType::F32), true);
        Var y = bf16->forward(xv), ref = f32->forward(xf);
        CHECK(y.dtype() == DType::BF16);
        // tanh * weight + bias rounds up to three times in bf16 (2^-9 relative each) where it cancels.
        check_close(y.data().to(DType::F64), ref.data().to(DType::F64), 3e-2, 2e-2, "bf16 output");
        Tensor g = randn({5, d}, gen, DType::F32);
        y.backward(Var(g.to(DType::BF16)));
        ref.backward(Var(g.to(DType::BF16).to(DType::F32)));
        CHECK(xv.grad().dtype() == DType::BF16);
        check_close(xv.grad().data().to(DType::F64), xf.grad().data().to(DType::F64), 3e-2, 2e-2, "bf16 grad x");
        for (auto& [name, p] : bf16->named_parameters()) {
            CHECK(p.grad().dtype() == DType::BF16);
            check_close(p.grad().data().to(DType::F64), f32->parameter(name).grad().data().to(DType::F64), 5e-2, 3e-2,
                        "bf16 grad " + name);
        }
    }
}

TEST_CASE("norms: set_fused switches the form and keeps the result", "[norms]") {
    Generator gen(19);
    auto norm = make_norm(NormOptions{.type = "layernorm", .dim = 8, .dtype = DType::F64});
    randomize_parameters(*norm, gen);
    Var x(randn({3, 8}, gen, DType::F64));
    Var a = norm->forward(x);
    norm->set_fused(false);
    CHECK_FALSE(norm->fused());
    Var b = norm->forward(x);
    check_close(b, a.data(), 1e-12, 1e-12, "composed vs fused");

    // Model-wide switch: every norm, a monitored one and a HybridNorm (two norms inside) counted once.
    struct Model : Module {
        Model() {
            register_module("a", make_norm(NormOptions{.type = "rmsnorm", .dim = 4}));
            register_module("b", std::make_shared<NormMonitor>(make_norm(NormOptions{.type = "layernorm", .dim = 4})));
            register_module("c", make_norm(NormOptions{.type = "hybridnorm", .dim = 4}));
        }
    };
    Model model;
    auto hybrid = std::dynamic_pointer_cast<HybridNorm>(model.child("c"));
    CHECK(set_norms_fused(model, false) == 3);
    CHECK_FALSE(std::dynamic_pointer_cast<Norm>(model.child("a"))->fused());
    CHECK_FALSE(std::dynamic_pointer_cast<NormMonitor>(model.child("b"))->inner()->fused());
    CHECK_FALSE(hybrid->fused());
    CHECK_FALSE(hybrid->rms_norm()->fused());
    CHECK_FALSE(hybrid->layer_norm()->fused());
    CHECK(set_norms_fused(model, true) == 3);
    CHECK(std::dynamic_pointer_cast<NormMonitor>(model.child("b"))->inner()->fused());
    CHECK(hybrid->layer_norm()->fused());
}

TEST_CASE("norms: empty batch and a single row", "[norms]") {
    for (bool fused : {true, false}) {
        auto norm = make_norm(NormOptions{.type = "layernorm", .dim = 4, .fused = fused, .dtype = DType::F64});
        Var empty(zeros({0, 4}, DType::F64), true);
        Var y = norm->forward(empty);
        CHECK(y.shape() == Shape{0, 4});
        Var one(from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4}, DType::F64), true);
        std::vector<double> out = norm->forward(one).data().to_vector();
        CHECK(out[0] == Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
    }
}

// ---- monitor ----

TEST_CASE("monitor: running RMS from 1 with momentum 0.1 on every forward, no graph", "[norms]") {
    Generator gen(20);
    auto inner = make_norm(NormOptions{.type = "rmsnorm", .dim = 8});
    auto monitor = std::make_shared<NormMonitor>(inner);
    CHECK(monitor->running_rms() == 1.0);  // the article's torch.ones(1)
    Tensor x1 = randn({4, 8}, gen) * 2.0, x2 = randn({4, 8}, gen) * 5.0;
    auto rms = [](const Tensor& t) { return std::sqrt(mean(square(t.to(DType::F64))).item()); };

    Var xv(x1, true);
    Var y = monitor->forward(xv);
    const double after_x1 = 0.9 * 1.0 + 0.1 * rms(x1);
    CHECK(monitor->running_rms() == Approx(after_x1).epsilon(1e-6));
    // The output and its graph are exactly the wrapped norm's.
    check_close(y, inner->forward(Var(x1)).data(), 0, 0, "monitored output");
    CHECK(graph_nodes(y).size() == 1);
    monitor->forward(Var(x2));
    const double after_x2 = 0.9 * after_x1 + 0.1 * rms(x2);
    CHECK(monitor->running_rms() == Approx(after_x2).epsilon(1e-6));

    monitor->eval();
    CHECK_FALSE(inner->is_training());
    monitor->forward(Var(x1 * 100.0));  // the article's module updates in eval mode too
    CHECK(monitor->running_rms() == Approx(0.9 * after_x2 + 0.1 * 100.0 * rms(x1)).epsilon(1e-6));

    // The wrapped norm keeps its names; the buffer joins the state_dict, shape [1].
    std::vector<std::string> names;
    for (auto& [name, t] : monitor->state_dict()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"running_rms", "weight"});
    CHECK(monitor->buffer("running_rms").shape() == Shape{1});
    REQUIRE_THROWS_WITH(NormMonitor(monitor), Catch::Contains("already monitored"));

    // get_debug_info(): the weight's mean and unbiased std.
    {
        NoGradGuard no_grad;
        inner->parameter("weight").data().copy_(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {8}));
    }
    const NormDebugInfo info = monitor->debug_info();
    CHECK(info.running_rms == monitor->running_rms());
    CHECK(info.weight_mean == Approx(4.5));
    CHECK(info.weight_std == Approx(std::sqrt(6.0)));  // sum((w - 4.5)^2) = 42, / (8 - 1)
}

TEST_CASE("monitor: attach to every norm of a model, read after training, names preserved", "[norms]") {
    struct Net : Module {
        std::shared_ptr<Linear> fc1 = register_module("fc1", std::make_shared<Linear>(4, 8));
        std::shared_ptr<Module> ln1 = register_module("ln1", make_norm(NormOptions{.type = "layernorm", .dim = 8}));
        std::shared_ptr<Module> ln2 = register_module("ln2", make_norm(NormOptions{.type = "rmsnorm", .dim = 8}));
        Var forward(const Var& x) {
            Var h = std::dynamic_pointer_cast<Norm>(child("ln1"))->forward(fc1->forward(x));
            return std::dynamic_pointer_cast<Norm>(child("ln2"))->forward(h * 3.0);
        }
    };
    Net net;
    auto before = net.named_parameters();
    CHECK(attach_norm_monitors(net) == 2);
    CHECK(attach_norm_monitors(net) == 0);  // already monitored
    auto after = net.named_parameters();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
        CHECK(after[i].first == before[i].first);
        CHECK(after[i].second.impl() == before[i].second.impl());  // the same Vars
    }
    Generator gen(21);
    net.forward(Var(randn({16, 4}, gen)));
    auto readings = norm_monitor_readings(net);
    REQUIRE(readings.size() == 2);
    CHECK(readings[0].first == "ln1");
    CHECK(readings[1].first == "ln2");
    CHECK(readings[0].second > 0.9);  // 0.9 * 1 + 0.1 * rms(fc1's output)
    CHECK(readings[1].second == Approx(0.9 + 0.1 * 3.0).epsilon(1e-4));  // ln1's output (RMS 1) times 3
    // The state_dict carries the monitors' buffers under the norms' names.
    bool found = false;
    for (auto& [name, t] : net.state_dict()) found = found || name == "ln2.running_rms";
    CHECK(found);
}

// ---- migration ----

TEST_CASE("migrate: LayerNorm -> RMSNorm keeps size, eps, weights and names, drops biases", "[norms]") {
    struct Block : Module {
        Block() {
            register_module("fc", std::make_shared<Linear>(8, 8));
            register_module("norm", std::make_shared<LayerNorm>(8, 1e-4));
        }
    };
    struct Model : Module {
        Model() {
            register_module("fc1", std::make_shared<Linear>(4, 8));
            register_module("ln1", std::make_shared<LayerNorm>(8));
            register_module("block", std::make_shared<Block>());
        }
    };
    Generator gen(22);
    Model model;
    randomize_parameters(model, gen);
    auto ln1_weight = std::dynamic_pointer_cast<LayerNorm>(model.child("ln1"))->weight().data().clone();
    auto inner_weight = model.child("block")->child("norm")->parameter("weight").data().clone();
    model.eval();

    MigrationReport report = migrate_layernorm_to_rmsnorm(model);
    CHECK(report.replaced == std::vector<std::string>{"ln1", "block.norm"});
    CHECK(report.dropped_biases == std::vector<std::string>{"ln1.bias", "block.norm.bias"});

    std::vector<std::string> names;
    for (auto& [name, p] : model.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "ln1.weight", "block.fc.weight", "block.fc.bias",
                                            "block.norm.weight"});
    auto ln1 = std::dynamic_pointer_cast<RMSNorm>(model.child("ln1"));
    auto inner = std::dynamic_pointer_cast<RMSNorm>(model.child("block")->child("norm"));
    REQUIRE(ln1 != nullptr);
    REQUIRE(inner != nullptr);
    CHECK(ln1->dim() == 8);
    CHECK(ln1->eps() == 1e-5);    // LayerNorm's eps, not RMSNorm's default
    CHECK(inner->eps() == 1e-4);
    CHECK(ln1->weight().data().to_vector() == ln1_weight.to_vector());
    CHECK(inner->weight().data().to_vector() == inner_weight.to_vector());
    CHECK_FALSE(ln1->is_training());  // the mode carries over
    CHECK(migrate_layernorm_to_rmsnorm(model).replaced.empty());
}

TEST_CASE("migrate: a monitored LayerNorm is replaced inside its monitor", "[norms]") {
    struct Model : Module {
        Model() { register_module("ln", std::make_shared<LayerNorm>(4)); }
    };
    Model model;
    attach_norm_monitors(model);
    MigrationReport report = migrate_layernorm_to_rmsnorm(model);
    CHECK(report.replaced == std::vector<std::string>{"ln"});
    auto monitor = std::dynamic_pointer_cast<NormMonitor>(model.child("ln"));
    REQUIRE(monitor != nullptr);
    CHECK(monitor->inner()->type_name() == "RMSNorm");
    Var y = monitor->forward(Var(from_vector(std::vector<double>{1, 1, 1, 1}, {1, 4})));
    CHECK(y.data().to_vector()[0] == Approx(1.0 / std::sqrt(1.0 + 1e-5)));  // RMSNorm: no centering
}

TEST_CASE("migrate and monitors treat a HybridNorm as one norm: its layer_norm branch stays", "[norms]") {
    struct Model : Module {
        Model() {
            register_module("ln", std::make_shared<LayerNorm>(4));
            register_module("hybrid", make_norm(NormOptions{.type = "hybridnorm", .dim = 4}));
        }
    };
    Model model;
    CHECK(attach_norm_monitors(model) == 2);  // ln and hybrid, not hybrid's two branches
    MigrationReport report = migrate_layernorm_to_rmsnorm(model);
    CHECK(report.replaced == std::vector<std::string>{"ln"});
    auto hybrid = std::dynamic_pointer_cast<HybridNorm>(std::dynamic_pointer_cast<NormMonitor>(model.child("hybrid"))->inner());
    REQUIRE(hybrid != nullptr);
    CHECK(hybrid->layer_norm()->type_name() == "LayerNorm");
}
