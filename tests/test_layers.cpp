// Layer tests: Module (names, state_dict, strict loading, modes, moves, containers), Linear and
// Embedding (forward against f64 loops, PyTorch's init statistics), activations, Dropout, losses.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/autograd.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "layers/norms.h"
#include "tests/layers_test_util.h"

using namespace nl;
using nl::test::check_close;
using nl::test::randomize_parameters;

namespace {

// fc1 -> ln -> relu -> block.fc -> block.norm, with nested names.
struct Block : Module {
    std::shared_ptr<Linear> fc;
    std::shared_ptr<LayerNorm> norm;
    Block(int64_t d, Generator& gen) {
        fc = register_module("fc", std::make_shared<Linear>(LinearOptions{d, d, true, DType::F32, &gen}));
        norm = register_module("norm", std::make_shared<LayerNorm>(d));
    }
    std::string type_name() const override { return "Block"; }
};

struct Net : Module {
    std::shared_ptr<Linear> fc1;
    std::shared_ptr<ModuleList> layers;
    Net(Generator& gen) {
        fc1 = register_module("fc1", std::make_shared<Linear>(LinearOptions{4, 8, true, DType::F32, &gen}));
        layers = register_module("layers", std::make_shared<ModuleList>());
        layers->push_back(std::make_shared<Block>(8, gen));
        layers->push_back(std::make_shared<Block>(8, gen));
    }
    std::string type_name() const override { return "Net"; }
    Var forward(const Var& x) {
        Var h = relu(fc1->forward(x));
        for (int64_t i = 0; i < layers->size(); ++i) {
            auto block = layers->at<Block>(i);
            h = block->norm->forward(block->fc->forward(h));
        }
        return h;
    }
};

std::vector<std::string> names_of(const NamedVars& entries) {
    std::vector<std::string> out;
    for (auto& [name, v] : entries) out.push_back(name);
    return out;
}

}  // namespace

// ---- Module ----

TEST_CASE("module: named_parameters uses PyTorch's dotted names in registration order", "[layers]") {
    Generator gen(1);
    Net net(gen);
    CHECK(names_of(net.named_parameters()) ==
          std::vector<std::string>{"fc1.weight", "fc1.bias", "layers.0.fc.weight", "layers.0.fc.bias",
                                   "layers.0.norm.weight", "layers.0.norm.bias", "layers.1.fc.weight",
                                   "layers.1.fc.bias", "layers.1.norm.weight", "layers.1.norm.bias"});
    CHECK(names_of(net.named_parameters(false)).empty());
    CHECK(net.parameters().size() == 10);
    CHECK(net.num_parameters() == (8 * 4 + 8) + 2 * (64 + 8 + 8 + 8));
    for (const Var& p : net.parameters()) {
        CHECK(p.requires_grad());
        CHECK(p.is_leaf());
    }
    std::vector<std::string> modules;
    for (auto& [name, m] : net.named_modules()) modules.push_back(name + ":" + m->type_name());
    CHECK(modules == std::vector<std::string>{":Net", "fc1:Linear", "layers:ModuleList", "layers.0:Block",
                                              "layers.0.fc:Linear", "layers.0.norm:LayerNorm", "layers.1:Block",
                                              "layers.1.fc:Linear", "layers.1.norm:LayerNorm"});
    CHECK(net.str().find("(fc1): Linear(in_features=4, out_features=8, bias=true)") != std::string::npos);
    CHECK(net.str().find("(0): Block(") != std::string::npos);
}

TEST_CASE("module: registration errors", "[layers]") {
    Module m;
    m.register_parameter("w", Var(zeros({2})));
    REQUIRE_THROWS_WITH(m.register_parameter("w", Var(zeros({2}))), Catch::Contains("'w': the name is already taken"));
    REQUIRE_THROWS_WITH(m.register_buffer("w", zeros({2})), Catch::Contains("already taken"));
    REQUIRE_THROWS_WITH(m.register_parameter("a.b", Var(zeros({2}))), Catch::Contains("must not contain '.'"));
    REQUIRE_THROWS_WITH(m.parameter("nope"), Catch::Contains("no parameter named 'nope' (parameters: 'w')"));
    REQUIRE_THROWS_WITH(m.replace_module("x", std::make_shared<ReLU>()), Catch::Contains("no submodule named 'x'"));
    Var nonleaf = Var(zeros({2}), true) * 2.0;
    REQUIRE_THROWS_WITH(m.register_parameter("n", nonleaf), Catch::Contains("must be a leaf"));
    ModuleList list;
    REQUIRE_THROWS_WITH(list[0], Catch::Contains("index 0 is out of range for 0 modules"));
    list.push_back(std::make_shared<ReLU>());
    REQUIRE_THROWS_WITH(list.at<Linear>(0), Catch::Contains("module 0 is a ReLU"));
}

TEST_CASE("module: state_dict round trip copies into the existing Vars", "[layers]") {
    Generator g1(1), g2(2);
    Net a(g1), b(g2);
    randomize_parameters(a, g1);
    Tensor x = randn({3, 4}, g1);
    Var ya = a.forward(Var(x));
    Var held = b.fc1->weight();  // e.g. an optimizer's handle
    CHECK(max_abs_diff(b.forward(Var(x)).data(), ya.data()) > 1e-3);

    b.load_state_dict(a.state_dict());
    check_close(b.forward(Var(x)), ya.data(), 0, 0, "output after load");
    CHECK(held.impl() == b.fc1->weight().impl());
    CHECK(held.data().to_vector() == a.fc1->weight().data().to_vector());
    // Loaded values are copies, not aliases of the source module's storage.
    {
        NoGradGuard no_grad;
        a.fc1->weight().data().fill_(0.0);
    }
    CHECK(held.data().to_vector() != a.fc1->weight().data().to_vector());

    auto sd = a.state_dict();
    REQUIRE(sd.size() == 10);
    CHECK(sd[0].first == "fc1.weight");
    CHECK(sd[0].second.shape() == Shape{8, 4});
}

TEST_CASE("module: strict load_state_dict errors name the key and the shapes", "[layers]") {
    Generator gen(3);
    Net net(gen);
    NamedTensors sd = net.state_dict();
    NamedTensors missing(sd.begin(), sd.end() - 1);
    REQUIRE_THROWS_WITH(net.load_state_dict(missing),
                        Catch::Contains("missing key(s) 'layers.1.norm.bias'") && Catch::Contains("[8] f32"));
    NamedTensors unexpected = sd;
    unexpected.emplace_back("layers.2.fc.weight", zeros({8, 8}));
    REQUIRE_THROWS_WITH(net.load_state_dict(unexpected),
                        Catch::Contains("unexpected key(s) 'layers.2.fc.weight'") && Catch::Contains("[8, 8]"));
    NamedTensors wrong_shape = sd;
    wrong_shape[0].second = zeros({4, 8});
    REQUIRE_THROWS_WITH(net.load_state_dict(wrong_shape),
                        Catch::Contains("shape mismatch for 'fc1.weight': the module has [8, 4], the state has [4, 8]"));
    NamedTensors wrong_dtype = sd;
    wrong_dtype[1].second = zeros({8}, DType::F64);
    REQUIRE_THROWS_WITH(net.load_state_dict(wrong_dtype),
                        Catch::Contains("dtype mismatch for 'fc1.bias'") && Catch::Contains("f64"));
    // A failed load leaves the module untouched (checks run before any copy).
    NamedTensors half_bad;
    for (auto& [name, t] : sd) half_bad.emplace_back(name, full(t.shape(), 5.0));
    half_bad.back().second = zeros({3});
    std::vector<double> before = net.fc1->weight().data().to_vector();
    REQUIRE_THROWS_WITH(net.load_state_dict(half_bad),
                        Catch::Contains("shape mismatch for '" + half_bad.back().first + "'") &&
                            Catch::Contains("the state has [3]"));
    CHECK(net.fc1->weight().data().to_vector() == before);
    // Non-strict: missing keys are skipped, unexpected ones ignored.
    NamedTensors partial = {{"fc1.bias", full({8}, 2.0)}, {"extra", zeros({1})}};
    net.load_state_dict(partial, false);
    CHECK(net.fc1->bias().data().to_vector() == std::vector<double>(8, 2.0));
    CHECK(net.fc1->weight().data().to_vector() == before);
}

TEST_CASE("module: train/eval recurse, zero_grad clears, to(dtype) keeps the Vars", "[layers]") {
    Generator gen(4);
    Net net(gen);
    CHECK(net.is_training());
    net.eval();
    for (auto& [name, m] : net.named_modules()) CHECK_FALSE(m->is_training());
    net.train();
    for (auto& [name, m] : net.named_modules()) CHECK(m->is_training());

    Var y = net.forward(Var(randn({2, 4}, gen)));
    sum(y).backward();
    CHECK(net.fc1->weight().grad().defined());
    net.zero_grad();
    for (const Var& p : net.parameters()) CHECK_FALSE(p.grad().defined());

    Var held = net.fc1->weight();
    std::vector<double> values = held.data().to_vector();
    net.to(DType::F64);
    CHECK(held.dtype() == DType::F64);
    CHECK(held.data().to_vector() == values);
    for (const Var& p : net.parameters()) {
        CHECK(p.dtype() == DType::F64);
        CHECK(p.requires_grad());
    }
    Var y64 = net.forward(Var(randn({2, 4}, gen, DType::F64)));
    CHECK(y64.dtype() == DType::F64);
    net.to(Device::cpu());
    CHECK(held.device().is_cpu());
    REQUIRE_THROWS_WITH(net.to(DType::I64), Catch::Contains("expected a floating dtype, found i64"));
}

TEST_CASE("module: buffers are in state_dict, converted by to(dtype) when floating", "[layers]") {
    Module m;
    m.register_parameter("w", Var(ones({2})));
    m.register_buffer("running", full({2}, 3.0));
    m.register_buffer("count", zeros({}, DType::I64));
    auto sd = m.state_dict();
    REQUIRE(sd.size() == 3);
    CHECK(sd[1].first == "running");
    CHECK(m.named_buffers().size() == 2);
    m.to(DType::F64);
    CHECK(m.buffer("running").dtype() == DType::F64);
    CHECK(m.buffer("count").dtype() == DType::I64);
    m.load_state_dict({{"w", full({2}, 2.0, DType::F64)}, {"running", full({2}, 7.0, DType::F64)},
                       {"count", full({}, 4.0, DType::I64)}});
    CHECK(m.buffer("running").to_vector() == std::vector<double>{7.0, 7.0});
    CHECK(m.buffer("count").item() == 4.0);
}

TEST_CASE("module: Sequential chains unary modules with names 0, 1, ...", "[layers]") {
    Generator gen(5);
    auto fc = std::make_shared<Linear>(LinearOptions{3, 2, false, DType::F32, &gen});
    Sequential seq({fc, std::make_shared<ReLU>()});
    CHECK(names_of(seq.named_parameters()) == std::vector<std::string>{"0.weight"});
    Tensor x = randn({4, 3}, gen);
    check_close(seq.forward(Var(x)), relu(fc->forward(Var(x))).data(), 0, 0, "sequential");
    CHECK(seq.size() == 2);
}

// ---- Linear, Embedding ----

TEST_CASE("linear: forward and gradients against f64 loops, any leading dims", "[layers]") {
    Generator gen(6);
    Linear fc(LinearOptions{5, 3, true, DType::F64, &gen});
    Tensor x = randn({2, 4, 5}, gen, DType::F64);  // (B, T, in)
    Var xv(x, true);
    Var y = fc.forward(xv);
    REQUIRE(y.shape() == Shape{2, 4, 3});
    std::vector<double> w = fc.weight().data().to_vector(), b = fc.bias().data().to_vector(), xs = x.to_vector();
    std::vector<double> ref(2 * 4 * 3);
    for (int r = 0; r < 8; ++r)
        for (int o = 0; o < 3; ++o) {
            double acc = b[o];
            for (int i = 0; i < 5; ++i) acc += xs[r * 5 + i] * w[o * 5 + i];
            ref[r * 3 + o] = acc;
        }
    check_close(y, from_vector(ref, {2, 4, 3}, DType::F64), 1e-12, 1e-12, "linear output");
    Tensor g = randn({2, 4, 3}, gen, DType::F64);
    y.backward(Var(g));
    std::vector<double> gs = g.to_vector(), dw(15, 0.0), db(3, 0.0), dx(40, 0.0);
    for (int r = 0; r < 8; ++r)
        for (int o = 0; o < 3; ++o) {
            db[o] += gs[r * 3 + o];
            for (int i = 0; i < 5; ++i) {
                dw[o * 5 + i] += gs[r * 3 + o] * xs[r * 5 + i];
                dx[r * 5 + i] += gs[r * 3 + o] * w[o * 5 + i];
            }
        }
    check_close(fc.weight().grad(), from_vector(dw, {3, 5}, DType::F64), 1e-12, 1e-12, "dweight");
    check_close(fc.bias().grad(), from_vector(db, {3}, DType::F64), 1e-12, 1e-12, "dbias");
    check_close(xv.grad(), from_vector(dx, {2, 4, 5}, DType::F64), 1e-12, 1e-12, "dx");

    Linear nobias(LinearOptions{5, 3, false});
    CHECK_FALSE(nobias.bias().defined());
    CHECK(names_of(nobias.named_parameters()) == std::vector<std::string>{"weight"});
    REQUIRE_THROWS_WITH(fc.forward(Var(zeros({2, 4}, DType::F64))), Catch::Contains("expected input (..., 5), found [2, 4]"));
    REQUIRE_THROWS_WITH(Linear(0, 3), Catch::Contains("positive in_features"));
}

TEST_CASE("linear: PyTorch's init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias", "[layers]") {
    const int64_t fan_in = 256, fan_out = 512;
    Generator gen(7);
    Linear fc(LinearOptions{fan_in, fan_out, true, DType::F32, &gen});
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));  // 1/16
    for (const char* name : {"weight", "bias"}) {
        INFO(name);
        std::vector<double> v = fc.parameter(name).data().to_vector();
        double lo = 1e9, hi = -1e9, mean = 0, sq = 0;
        for (double e : v) {
            lo = std::min(lo, e);
            hi = std::max(hi, e);
            mean += e / v.size();
            sq += e * e / v.size();
        }
        CHECK(lo >= -bound);
        CHECK(hi <= bound);
        const double n = static_cast<double>(v.size());
        const double var_expected = bound * bound / 3.0;  // variance of U(-b, b)
        CHECK(std::fabs(mean) < 5 * std::sqrt(var_expected / n));
        CHECK(sq - mean * mean == Approx(var_expected).epsilon(std::string(name) == "weight" ? 0.02 : 0.2));
        if (std::string(name) == "weight") {
            CHECK(lo < -0.99 * bound);  // the whole range is used
            CHECK(hi > 0.99 * bound);
        }
    }
    // The same seed gives the same weights; the default generator follows manual_seed.
    Generator again(7);
    Linear fc2(LinearOptions{fan_in, fan_out, true, DType::F32, &again});
    CHECK(fc2.weight().data().to_vector() == fc.weight().data().to_vector());
    manual_seed(99);
    Linear d1(8, 4);
    manual_seed(99);
    Linear d2(8, 4);
    CHECK(d1.weight().data().to_vector() == d2.weight().data().to_vector());
    CHECK(d1.bias().data().to_vector() == d2.bias().data().to_vector());
}

TEST_CASE("embedding: lookup, N(0,1) init, gradient accumulates over repeated ids", "[layers]") {
    Generator gen(8);
    Embedding emb(EmbeddingOptions{100, 64, DType::F32, &gen});
    std::vector<double> w = emb.weight().data().to_vector();
    double mean = 0, sq = 0;
    for (double e : w) {
        mean += e / w.size();
        sq += e * e / w.size();
    }
    CHECK(std::fabs(mean) < 0.05);
    CHECK(sq == Approx(1.0).epsilon(0.05));

    Tensor ids = from_vector(std::vector<int64_t>{3, 7, 3, 0, 99, 3}, {2, 3});
    Var y = emb.forward(ids);
    REQUIRE(y.shape() == Shape{2, 3, 64});
    CHECK(y.data().select(0, 1).select(0, 1).to_vector() ==
          std::vector<double>(w.begin() + 99 * 64, w.begin() + 100 * 64));
    sum(y).backward();
    Tensor grad = emb.weight().grad().data();
    CHECK(grad.select(0, 3).to_vector() == std::vector<double>(64, 3.0));
    CHECK(grad.select(0, 5).to_vector() == std::vector<double>(64, 0.0));
    REQUIRE_THROWS_WITH(emb.forward(zeros({2})), Catch::Contains("expected i64 token ids, found f32"));
}

// ---- activations, dropout ----

TEST_CASE("activations: ReLU, SiLU, GELU modules against their formulas", "[layers]") {
    Tensor x = from_vector(std::vector<double>{-3, -0.5, 0, 0.7, 2.5}, {5}, DType::F64);
    std::vector<double> xs = x.to_vector(), relu_ref, silu_ref, gelu_ref;
    for (double v : xs) {
        relu_ref.push_back(v > 0 ? v : 0);
        silu_ref.push_back(v / (1 + std::exp(-v)));
        gelu_ref.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    }
    check_close(ReLU().forward(Var(x)), from_vector(relu_ref, {5}, DType::F64), 1e-15, 1e-14, "relu");
    check_close(SiLU().forward(Var(x)), from_vector(silu_ref, {5}, DType::F64), 1e-15, 1e-14, "silu");
    check_close(GELU().forward(Var(x)), from_vector(gelu_ref, {5}, DType::F64), 1e-15, 1e-14, "gelu");
}

TEST_CASE("dropout: seeded, inverted scaling, identity in eval", "[layers]") {
    Tensor x = ones({200, 50});
    Dropout a(0.3, 42), b(0.3, 42), c(0.3, 43);
    Var xa(x, true);
    Var ya = a.forward(xa);
    Var yb = b.forward(Var(x));
    CHECK(ya.data().to_vector() == yb.data().to_vector());             // same seed, same mask
    CHECK(ya.data().to_vector() != c.forward(Var(x)).data().to_vector());
    CHECK(ya.data().to_vector() != a.forward(Var(x)).data().to_vector());  // the generator advances
    std::vector<double> v = ya.data().to_vector();
    int64_t zeros_count = 0;
    for (double e : v) {
        if (e == 0.0) ++zeros_count;
        else CHECK(e == Approx(1.0 / 0.7));
    }
    const double frac = static_cast<double>(zeros_count) / v.size();
    CHECK(frac == Approx(0.3).margin(0.02));  // 10000 draws: sd ~0.005
    sum(ya).backward();
    CHECK(xa.grad().data().to_vector() == v);  // the gradient is the mask (x is ones)

    a.eval();
    Var xe(x, true);
    CHECK(a.forward(xe).impl() == xe.impl());  // eval: x as is
    CHECK(Dropout(0.0).forward(xe).impl() == xe.impl());
    CHECK(Dropout(1.0).forward(Var(x)).data().to_vector() == std::vector<double>(x.numel(), 0.0));
    REQUIRE_THROWS_WITH(Dropout(1.5), Catch::Contains("expected p in [0, 1], found 1.5"));
    // Reproducible across a reset generator state (e.g. after resuming a checkpoint).
    Dropout d(0.5, 7);
    uint64_t seed = d.generator().seed(), offset = d.generator().offset();
    std::vector<double> first = d.forward(Var(x)).data().to_vector();
    d.generator().set_state(seed, offset);
    CHECK(d.forward(Var(x)).data().to_vector() == first);
}

// ---- losses ----

TEST_CASE("loss: MSE mean against a loop, its gradient, and shape errors", "[layers]") {
    Generator gen(9);
    Tensor p = randn({4, 5}, gen, DType::F64), t = randn({4, 5}, gen, DType::F64);
    Var pv(p, true);
    Var loss = MSELoss().forward(pv, Var(t));
    std::vector<double> ps = p.to_vector(), ts = t.to_vector(), grad(20);
    double ref = 0;
    for (int i = 0; i < 20; ++i) {
        ref += (ps[i] - ts[i]) * (ps[i] - ts[i]) / 20;
        grad[i] = 2 * (ps[i] - ts[i]) / 20;
    }
    CHECK(loss.item() == Approx(ref).epsilon(1e-13));
    loss.backward();
    check_close(pv.grad(), from_vector(grad, {4, 5}, DType::F64), 1e-15, 1e-12, "mse grad");
    REQUIRE_THROWS_WITH(mse_loss(Var(zeros({4, 5})), Var(zeros({5}))),
                        Catch::Contains("input [4, 5] and target [5] must have the same shape"));
}

TEST_CASE("loss: cross-entropy fused and composed agree with a loop, with ignore_index", "[layers]") {
    Generator gen(10);
    for (DType dtype : {DType::F32, DType::F64}) {
        const double tol = dtype == DType::F64 ? 1e-12 : 1e-5;
        Tensor logits = (randn({3, 4, 7}, gen, DType::F64) * 2.0).to(dtype);  // (B, T, C)
        Tensor targets = from_vector(std::vector<int64_t>{0, 6, -100, 3, 2, 2, 5, -100, 1, 4, 0, 6}, {3, 4});
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            INFO(dtype_name(dtype) << " reduction " << static_cast<int>(red));
            Var lf(logits.clone(), true), lc(logits.clone(), true);
            Var f = cross_entropy_loss(lf, targets, -100, red);
            Var c = cross_entropy_loss_composed(lc, targets, -100, red);
            check_close(f, c.data(), tol, tol, "loss");
            // loop reference for the mean
            if (red == Reduction::Mean) {
                std::vector<double> ls = logits.to_vector();
                std::vector<int64_t> ts = targets.to_vector_as<int64_t>();
                double total = 0;
                int count = 0;
                for (int r = 0; r < 12; ++r) {
                    if (ts[r] == -100) continue;
                    double m = -1e300, s = 0;
                    for (int k = 0; k < 7; ++k) m = std::max(m, ls[r * 7 + k]);
                    for (int k = 0; k < 7; ++k) s += std::exp(ls[r * 7 + k] - m);
                    total += m + std::log(s) - ls[r * 7 + ts[r]];
                    ++count;
                }
                CHECK(f.item() == Approx(total / count).epsilon(tol));
            }
            Tensor g = randn(f.shape(), gen, DType::F64).to(dtype);
            f.backward(Var(g));
            c.backward(Var(g));
            check_close(lf.grad(), lc.grad().data(), tol, tol * 10, "dlogits");
            // ignored rows get exactly zero gradient
            CHECK(lf.grad().data().select(0, 0).select(0, 2).to_vector() == std::vector<double>(7, 0.0));
        }
    }
    CrossEntropyLoss module(CrossEntropyOptions{.ignore_index = 1});
    Tensor l = randn({2, 3}, gen), t = from_vector(std::vector<int64_t>{1, 2}, {2});
    CHECK(module.forward(Var(l), t).item() == Approx(cross_entropy_loss_composed(Var(l), t, 1).item()));
    module.set_fused(false);
    CHECK_FALSE(module.options().fused);
}

TEST_CASE("loss: cross-entropy gradcheck and gradgradcheck (both forms), errors", "[layers]") {
    Generator gen(11);
    Var logits(randn({5, 4}, gen, DType::F64), true);
    Tensor targets = from_vector(std::vector<int64_t>{1, -100, 3, 0, 3}, {5});
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        GradcheckResult r = gradcheck(
            [&](const std::vector<Var>& in) {
                return fused ? cross_entropy_loss(in[0], targets) : cross_entropy_loss_composed(in[0], targets);
            },
            {logits});
        INFO(r.message);
        CHECK(r.ok);
        for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            GradcheckResult r2 = gradgradcheck(
                [&](const std::vector<Var>& in) {
                    return fused ? cross_entropy_loss(in[0], targets, -100, reduction)
                                 : cross_entropy_loss_composed(in[0], targets, -100, reduction);
                },
                {logits});
            INFO(r2.message);
            CHECK(r2.ok);
        }
    }
    REQUIRE_THROWS_WITH(cross_entropy_loss(logits, from_vector(std::vector<int64_t>{1, 2}, {2})),
                        Catch::Contains("logits [5, 4] need targets of shape [5], found [2]"));
    REQUIRE_THROWS_WITH(cross_entropy_loss_composed(logits, from_vector(std::vector<int64_t>{1, 2, 9, 0, 0}, {5})),
                        Catch::Contains("target 9 at row 2 is out of range for 4 classes"));
    REQUIRE_THROWS_WITH(cross_entropy_loss(logits, zeros({5})), Catch::Contains("expected i64 targets, found f32"));
}
