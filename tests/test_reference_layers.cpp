// PyTorch reference tests for the single layers: Linear, LayerNorm,
// RMSNorm (f32 and bf16), DyT (f64), CrossEntropy and MSE, against fixtures written by
// tests/reference/make_fixtures.py (see tests/reference/README.md). Each fixture holds the input,
// the parameters, the output, a random upstream gradient and every gradient. Tolerance:
// |a - b| <= atol + rtol * |ref| with f32 atol 1e-5, rtol 1e-4 (f32 rounding of a few ops); bf16
// uses a few bf16 ulps (rtol 2e-2), as the fixtures' README advises, because PyTorch rounds every
// bf16 op of its autograd while the fused kernel computes in f32 and rounds once.
#include <catch2/catch.hpp>

#include <string>

#include "autograd/autograd.h"
#include "core/safetensors.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norms.h"
#include "tests/layers_test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

SafeTensorsFile fixture(const std::string& name) {
    return load_safetensors(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/fixtures/" + name + ".safetensors");
}

// Loads the fixture's parameters (every tensor named like a module parameter) into `module` strictly,
// runs forward on `input` and backward with `grad_output`, and compares output and every gradient.
void check_module_against_fixture(UnaryModule& module, const SafeTensorsFile& f, double atol, double rtol) {
    NamedTensors params;
    for (auto& [name, p] : module.named_parameters()) params.emplace_back(name, f.at(name));
    module.load_state_dict(params);
    Var x(f.at("input").clone(), true);
    Var y = module.forward(x);
    check_close(y.data().to(DType::F64), f.at("output").to(DType::F64), atol, rtol, "output");
    y.backward(Var(f.at("grad_output")));
    check_close(x.grad().data().to(DType::F64), f.at("grad_input").to(DType::F64), atol, rtol, "grad_input");
    for (auto& [name, p] : module.named_parameters())
        check_close(p.grad().data().to(DType::F64), f.at("grad." + name).to(DType::F64), atol, rtol, "grad." + name);
}

}  // namespace

TEST_CASE("reference: Linear matches PyTorch", "[layers][reference]") {
    SafeTensorsFile f = fixture("linear");
    Linear fc(std::stoll(f.metadata.at("in_features")), std::stoll(f.metadata.at("out_features")));
    check_module_against_fixture(fc, f, kAtol, kRtol);
}

TEST_CASE("reference: LayerNorm matches PyTorch, fused and composed", "[norms][reference]") {
    SafeTensorsFile f = fixture("layernorm");
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        LayerNorm ln(NormOptions{.type = "layernorm",
                                 .dim = std::stoll(f.metadata.at("normalized_shape")),
                                 .eps = std::stod(f.metadata.at("eps")),
                                 .fused = fused});
        check_module_against_fixture(ln, f, kAtol, kRtol);
    }
}

TEST_CASE("reference: RMSNorm (LLaMA) matches PyTorch, fused and composed", "[norms][reference]") {
    SafeTensorsFile f = fixture("rmsnorm");
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        RMSNorm rms(NormOptions{.type = "rmsnorm",
                                .dim = std::stoll(f.metadata.at("dim")),
                                .eps = std::stod(f.metadata.at("eps")),
                                .fused = fused});
        check_module_against_fixture(rms, f, kAtol, kRtol);
    }
}

TEST_CASE("reference: bf16 RMSNorm matches PyTorch to bf16 precision", "[norms][reference]") {
    SafeTensorsFile f = fixture("rmsnorm_bf16");
    REQUIRE(f.at("input").dtype() == DType::BF16);
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        RMSNorm rms(NormOptions{.type = "rmsnorm",
                                .dim = std::stoll(f.metadata.at("dim")),
                                .eps = std::stod(f.metadata.at("eps")),
                                .fused = fused,
                                .dtype = DType::BF16});
        check_module_against_fixture(rms, f, 1e-2, 2e-2);
    }
}

TEST_CASE("reference: DyT matches the paper's module in PyTorch in f64, fused and composed", "[norms][reference]") {
    SafeTensorsFile f = fixture("dyt");
    REQUIRE(f.at("input").dtype() == DType::F64);
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        DyT dyt(NormOptions{.type = "dyt",
                            .dim = std::stoll(f.metadata.at("dim")),
                            .fused = fused,
                            .alpha_init = std::stod(f.metadata.at("alpha_init")),
                            .dtype = DType::F64});
        check_module_against_fixture(dyt, f, 1e-14, 1e-12);
    }
}

TEST_CASE("reference: CrossEntropy with ignore_index matches PyTorch, fused and composed", "[layers][reference]") {
    SafeTensorsFile f = fixture("cross_entropy");
    const int64_t ignore_index = std::stoll(f.metadata.at("ignore_index"));
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        CrossEntropyLoss loss_fn(CrossEntropyOptions{.ignore_index = ignore_index, .fused = fused});
        Var logits(f.at("input").clone(), true);
        Var loss = loss_fn.forward(logits, f.at("target"));
        check_close(loss, f.at("output"), kAtol, kRtol, "loss");
        loss.backward(Var(f.at("grad_output")));
        check_close(logits.grad(), f.at("grad_input"), kAtol, kRtol, "grad_input");
    }
}

TEST_CASE("reference: MSE matches PyTorch", "[layers][reference]") {
    SafeTensorsFile f = fixture("mse");
    Var input(f.at("input").clone(), true);
    Var loss = MSELoss().forward(input, Var(f.at("target")));
    check_close(loss, f.at("output"), kAtol, kRtol, "loss");
    loss.backward(Var(f.at("grad_output")));
    check_close(input.grad(), f.at("grad_input"), kAtol, kRtol, "grad_input");
}
