// The article's modules (tests/reference/article.py, copied from its code) against normlab's: each
// fixture's state dict, as the article's class writes it, loads strictly into the normlab norm, and
// forward and backward agree, fused and composed, in f32 (atol 1e-5, rtol 1e-4) and in f64 (1e-10).
// Also: the article's defaults, the registry's consistency, DebuggableRMSNorm's running RMS, the
// LayerNorm -> RMSNorm migration, the LLaMA feed-forward's hidden size, strict-load errors that name
// every missing and unexpected key, and `normlab norms` (the explainer's worked example).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/safetensors.h"
#include "layers/migrate.h"
#include "layers/monitor.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "layers/transformer.h"
#include "tests/cli_test_util.h"
#include "tests/layers_test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

SafeTensorsFile fixture(const std::string& name) {
    return load_safetensors(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/fixtures/" + name + ".safetensors");
}

struct Tolerance {
    double atol, rtol;
};

Tolerance tolerance(DType dtype) { return dtype == DType::F64 ? Tolerance{1e-10, 1e-10} : Tolerance{1e-5, 1e-4}; }

// The tensors named "<prefix><name>", with the prefix dropped.
NamedTensors with_prefix(const SafeTensorsFile& f, const std::string& prefix) {
    NamedTensors out;
    for (const auto& [name, t] : f.tensors)
        if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
    return out;
}

// Loads "<d>.state.*" strictly into `norm`, runs "<d>.input" forward and "<d>.grad_output" backward,
// and compares the output, the input gradient and every parameter gradient with the fixture's.
void check_against_fixture(Norm& norm, const SafeTensorsFile& f, DType dtype) {
    const std::string d = dtype == DType::F64 ? "f64." : "f32.";
    const Tolerance tol = tolerance(dtype);
    norm.load_state_dict(with_prefix(f, d + "state."));  // strict: the article's names and shapes
    Var x(f.at(d + "input").clone(), true);
    REQUIRE(x.dtype() == dtype);
    Var y = norm.forward(x);
    check_close(y.data(), f.at(d + "output"), tol.atol, tol.rtol, d + "output");
    y.backward(Var(f.at(d + "grad_output")));
    check_close(x.grad(), f.at(d + "grad_input"), tol.atol, tol.rtol, d + "grad_input");
    NamedVars params = norm.named_parameters();
    REQUIRE(params.size() == with_prefix(f, d + "grad.").size());  // every parameter of the article's module
    for (auto& [name, p] : params) check_close(p.grad(), f.at(d + "grad." + name), tol.atol, tol.rtol, d + "grad." + name);
}

// A norm of `type` sized and configured as the fixture says, with the type's default eps (the
// fixture's eps is the article class's default, so a wrong default fails here).
std::shared_ptr<Norm> make_for(const SafeTensorsFile& f, const std::string& type, DType dtype, bool fused) {
    NormOptions options;
    options.type = type;
    options.dim = std::stoll(f.metadata.at("dim"));
    options.dtype = dtype;
    options.fused = fused;
    if (f.metadata.count("alpha")) options.alpha = std::stod(f.metadata.at("alpha"));
    std::shared_ptr<Norm> norm = make_norm(options);
    REQUIRE(norm->eps() == std::stod(f.metadata.at("eps")));
    return norm;
}

void check_article_norm(const std::string& fixture_name, const std::string& type) {
    const SafeTensorsFile f = fixture(fixture_name);
    for (DType dtype : {DType::F32, DType::F64}) {
        for (bool fused : {true, false}) {
            INFO(fixture_name << " as normlab's " << type << ", " << dtype_name(dtype) << ", "
                              << (fused ? "fused" : "composed"));
            std::shared_ptr<Norm> norm = make_for(f, type, dtype, fused);
            check_against_fixture(*norm, f, dtype);
        }
    }
}

}  // namespace

TEST_CASE("article: RMSNorm (4.2, eps 1e-5) loads and matches, f32 and f64, fused and composed", "[article][norms]") {
    check_article_norm("article_rmsnorm", "rmsnorm");
}

TEST_CASE("article: StableRMSNorm (7.1) is normlab's rmsnorm for f32 and f64", "[article][norms]") {
    check_article_norm("article_stable_rmsnorm", "rmsnorm");
}

TEST_CASE("article: RMSNormWithBias (8.2) loads and matches as rmsnorm_bias", "[article][norms]") {
    check_article_norm("article_rmsnorm_with_bias", "rmsnorm_bias");
}

TEST_CASE("article: AdaptiveRMSNorm (8.2: unbiased std, alpha [1]) loads and matches", "[article][norms]") {
    check_article_norm("article_adaptive_rmsnorm", "adaptive_rmsnorm");
}

TEST_CASE("article: HybridNorm (6.3: rms_norm and layer_norm children, float alpha) loads and matches",
          "[article][norms]") {
    check_article_norm("article_hybridnorm", "hybridnorm");
}

TEST_CASE("article: DebuggableRMSNorm (7.3) is a monitored rmsnorm: state, output, running_rms, debug info",
          "[article][norms]") {
    const SafeTensorsFile f = fixture("article_debuggable_rmsnorm");
    for (DType dtype : {DType::F32, DType::F64}) {
        for (bool fused : {true, false}) {
            INFO(dtype_name(dtype) << (fused ? " fused" : " composed"));
            const std::string d = dtype == DType::F64 ? "f64." : "f32.";
            const Tolerance tol = tolerance(dtype);
            auto monitor = std::make_shared<NormMonitor>(make_for(f, "rmsnorm", dtype, fused),
                                                         std::stod(f.metadata.at("momentum")));
            // The state holds the running_rms the article's module reached after its warm-up forwards.
            REQUIRE(f.at(d + "state.running_rms").shape() == Shape{1});
            check_against_fixture(*monitor, f, dtype);
            check_close(monitor->buffer("running_rms"), f.at(d + "after.running_rms"), tol.atol, tol.rtol,
                        "running_rms after the forward");
            const std::vector<double> info = f.at(d + "debug_info").to_vector();
            const NormDebugInfo ours = monitor->debug_info();
            CHECK(ours.running_rms == Approx(info[0]).epsilon(tol.rtol).margin(tol.atol));
            CHECK(ours.weight_mean == Approx(info[1]).epsilon(tol.rtol).margin(tol.atol));
            CHECK(ours.weight_std == Approx(info[2]).epsilon(tol.rtol).margin(tol.atol));
        }
    }
}

TEST_CASE("article: a new DebuggableRMSNorm's running_rms is [1] at 1 and moves on every forward, eval too",
          "[article][norms]") {
    auto monitor = std::make_shared<NormMonitor>(make_norm(NormOptions{.type = "rmsnorm", .dim = 4}));
    CHECK(monitor->buffer("running_rms").shape() == Shape{1});
    CHECK(monitor->running_rms() == 1.0);
    std::vector<std::string> names;
    for (const auto& [name, t] : monitor->state_dict()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"running_rms", "weight"});  // the article's, in any order
    Var x(from_vector(std::vector<double>{1, 2, 3, 4, -1, -2, -3, -4}, {2, 4}));
    monitor->forward(x);
    const double rms = std::sqrt(7.5);  // sqrt(mean(x^2)) over the whole tensor
    CHECK(monitor->running_rms() == Approx(0.9 + 0.1 * rms).epsilon(1e-6));
    monitor->eval();
    monitor->forward(x);
    CHECK(monitor->running_rms() == Approx(0.9 * (0.9 + 0.1 * rms) + 0.1 * rms).epsilon(1e-6));
}

TEST_CASE("article: migrate_layernorm_to_rmsnorm (6.3) keeps the eps, copies the weight, matches the output",
          "[article][norms]") {
    const SafeTensorsFile f = fixture("article_migrate");
    struct Model : Module {
        explicit Model(double eps) { register_module("ln", std::make_shared<LayerNorm>(8, eps)); }
    } model(1e-4);
    model.load_state_dict(with_prefix(f, "before."));
    MigrationReport report = migrate_layernorm_to_rmsnorm(model);
    CHECK(report.replaced == std::vector<std::string>{f.metadata.at("replaced")});
    auto rms = std::dynamic_pointer_cast<RMSNorm>(model.child("ln"));
    REQUIRE(rms != nullptr);
    CHECK(rms->eps() == std::stod(f.metadata.at("eps")));
    NamedTensors after = model.state_dict();
    NamedTensors expected = with_prefix(f, "after.");
    REQUIRE(after.size() == expected.size());
    check_close(after[0].second, f.at("after.ln.weight"), 0.0, 0.0, "the copied weight");
    check_close(rms->forward(Var(f.at("input"))), f.at("output"), 1e-5, 1e-4, "output");
}

TEST_CASE("article: LLaMAFeedForward(dim, 4 * dim) with the default multiple_of 256 matches", "[article][transformer]") {
    const SafeTensorsFile f = fixture("article_llama_feedforward");
    FeedForwardOptions o;  // multiple_of left at its default: the article's 256
    o.dim = std::stoll(f.metadata.at("dim"));
    o.hidden_dim = std::stoll(f.metadata.at("hidden_dim_arg"));
    FeedForward ff(o);
    REQUIRE(ff.hidden() == std::stoll(f.metadata.at("hidden")));
    NamedTensors params;
    for (auto& [name, p] : ff.named_parameters()) params.emplace_back(name, f.at(name));
    ff.load_state_dict(params);
    Var x(f.at("input").clone(), true);
    Var y = ff.forward(x);
    check_close(y, f.at("output"), 1e-5, 1e-4, "output");
    y.backward(Var(f.at("grad_output")));
    check_close(x.grad(), f.at("grad_input"), 1e-5, 1e-4, "grad_input");
    for (auto& [name, p] : ff.named_parameters()) check_close(p.grad(), f.at("grad." + name), 1e-5, 1e-4, "grad." + name);
}

TEST_CASE("article: defaults are the article's (eps 1e-5, multiple_of 256, HybridNorm alpha 0.5, alpha [1])",
          "[article][norms]") {
    for (const std::string& type : norm_types()) {
        INFO(type);
        CHECK(make_norm(NormOptions{.type = type, .dim = 8})->eps() == 1e-5);
    }
    CHECK(RMSNorm(8).eps() == 1e-5);
    CHECK(HybridNorm(NormOptions{.type = "hybridnorm", .dim = 8}).alpha() == 0.5);
    CHECK(AdaptiveRMSNorm(NormOptions{.type = "adaptive_rmsnorm", .dim = 8}).alpha().shape() == Shape{1});
    CHECK(FeedForwardOptions{}.multiple_of == 256);
    CHECK(TransformerBlockOptions{}.multiple_of == 256);
    CHECK(TransformerOptions{}.multiple_of == 256);
    CHECK(NormOptions{}.resolved_eps() == 1e-5);
    // The block's norms: RMSNorm(dim, eps=norm_eps) named attention_norm and ffn_norm, as the article's.
    TransformerBlockOptions block;
    block.dim = 8;
    block.n_heads = 2;
    TransformerBlock b(block);
    CHECK(std::dynamic_pointer_cast<Norm>(b.attention_norm())->eps() == 1e-5);
    CHECK(b.feed_forward()->hidden() == 256);  // LLaMAFeedForward(dim, 4 * dim, 256)
}

TEST_CASE("norm registry: every entry builds its class with the listed parameters and names its class",
          "[article][norms]") {
    for (const NormType& type : norm_registry()) {
        INFO(type.name);
        std::shared_ptr<Norm> norm = make_norm(NormOptions{.type = type.name, .dim = 8});
        CHECK(norm->type_name() == type.class_name);
        CHECK(norm->eps() == type.default_eps);
        std::vector<std::string> names;
        for (const auto& [name, p] : norm->named_parameters()) names.push_back(name);
        CHECK(names == norm_parameter_names(type));
        CHECK(type.forward);
        CHECK(type.reference);
        CHECK(type.make);
        CHECK_FALSE(type.help.formula.empty());
        CHECK_FALSE(type.help.reference.empty());
        CHECK_FALSE(type.help.fused_form.empty());
        CHECK(&find_norm_type(type.name) == &type);
    }
    REQUIRE_THROWS_WITH(find_norm_type("batchnorm"), Catch::Contains("unknown norm type 'batchnorm'") &&
                                                         Catch::Contains("hybridnorm"));
    REQUIRE_THROWS_WITH(make_norm(NormOptions{.type = "batchnorm", .dim = 8}), Catch::Contains("choices: layernorm"));
}

TEST_CASE("article: a state dict of another norm's layout names every missing and unexpected key",
          "[article][norms]") {
    // The article's RMSNormWithBias state loaded into an AdaptiveRMSNorm: bias unexpected, alpha missing.
    const SafeTensorsFile f = fixture("article_rmsnorm_with_bias");
    std::shared_ptr<Norm> adaptive = make_norm(NormOptions{.type = "adaptive_rmsnorm", .dim = 8});
    REQUIRE_THROWS_WITH(adaptive->load_state_dict(with_prefix(f, "f32.state.")),
                        Catch::Contains("missing key(s) 'alpha' ([1] f32)") &&
                            Catch::Contains("unexpected key(s) 'bias' ([8])"));
    // The layout of the shared-weight HybridNorm (weight, bias) is not the article's.
    std::shared_ptr<Norm> hybrid = make_norm(NormOptions{.type = "hybridnorm", .dim = 8});
    NamedTensors shared{{"weight", ones({8})}, {"bias", zeros({8})}};
    REQUIRE_THROWS_WITH(hybrid->load_state_dict(shared),
                        Catch::Contains("missing key(s) 'rms_norm.weight' ([8] f32), 'layer_norm.weight' ([8] f32), "
                                        "'layer_norm.bias' ([8] f32)") &&
                            Catch::Contains("unexpected key(s) 'weight' ([8]), 'bias' ([8])"));
}

TEST_CASE("normlab stability: init_from of the article's state dicts loads unchanged, another layout exits 2 "
          "naming the keys",
          "[article][stability]") {
    const std::string source = NORMLAB_SOURCE_DIR;
    const std::string fixtures = source + "/tests/reference/fixtures/";
    const std::string dir = nl_test::make_temp_dir("article-init");
    const std::string config = nl_test::shell_arg(source + "/configs/stability.json");
    const std::string common = " --set epochs=1 --set perturb=0 --set plots=false --quiet";
    nl_test::CliRun ok = nl_test::run_normlab_in(
        dir, "stability " + config + common + " --out ok --set " +
                 nl_test::shell_arg("norms=[\"layernorm\", \"rmsnorm\", \"rmsnorm_bias\", \"adaptive_rmsnorm\", \"hybridnorm\"]") +
                 " --set " + nl_test::shell_arg("init_from=" + fixtures + "stability_init_{norm}.safetensors"));
    INFO(ok.output);
    CHECK(ok.status == 0);
    nl_test::CliRun bad = nl_test::run_normlab_in(
        dir, "stability " + config + common + " --out bad --set norms=hybridnorm --set " +
                 nl_test::shell_arg("init_from=" + fixtures + "stability_init_layernorm.safetensors"));
    INFO(bad.output);
    CHECK(bad.status == 2);
    CHECK(std::count(bad.output.begin(), bad.output.end(), '\n') == 1);
    CHECK_THAT(bad.output, Catch::StartsWith("normlab: error: init_from ") &&
                               Catch::Contains("missing key(s) 'norm1.rms_norm.weight'") &&
                               Catch::Contains("'norm2.layer_norm.bias'") &&
                               Catch::Contains("unexpected key(s) 'norm1.bias' ([256]), 'norm1.weight' ([256])") &&
                               Catch::Contains("'norm2.weight'"));
}

TEST_CASE("normlab norms --example prints the explainer's worked example", "[article][cli-tools]") {
    nl_test::CliRun run = nl_test::run_normlab_in(nl_test::make_temp_dir("norms"), "norms --example");
    INFO(run.output);
    REQUIRE(run.status == 0);
    // Ours to 4 decimals; the explainer rounds these to [-1.34, -0.45, 0.45, 1.34] and [0.37, 0.73, 1.10, 1.46].
    CHECK_THAT(run.output, Catch::Contains("mean     = 2.5") && Catch::Contains("variance = 1.25"));
    CHECK_THAT(run.output, Catch::Contains("y = (x - mean) / sqrt(variance + eps) = [-1.3416, -0.4472, 0.4472, 1.3416]"));
    CHECK_THAT(run.output, Catch::Contains("mean(x^2) = 7.5"));
    CHECK_THAT(run.output, Catch::Contains("y = x / sqrt(mean(x^2) + eps) = [0.3651, 0.7303, 1.0954, 1.4606]"));
}

TEST_CASE("normlab norms lists every registered norm with its class, eps and parameters", "[article][cli-tools]") {
    nl_test::CliRun run = nl_test::run_normlab_in(nl_test::make_temp_dir("norms"), "norms");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const NormType& type : norm_registry())
        CHECK(std::regex_search(run.output, std::regex("\\n" + type.name + " +" + type.class_name + " +1e-05  ")));
    CHECK_THAT(run.output, Catch::Contains("rms_norm.weight, layer_norm.weight, layer_norm.bias"));
    for (const NormType& type : norm_registry()) CHECK_THAT(run.output, Catch::Contains("fused form: " + type.help.fused_form));
}
