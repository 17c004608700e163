// Optimizers (SGD, Adam, AdamW) against plain f64 reference loops of torch.optim's update rules,
// state save/load giving bit-identical resumes, gradient clipping and LR schedules.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <numbers>

#include "core/profiler.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers_test_util.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/sgd.h"

using namespace nl;

namespace {

// Two parameters of awkward shapes, f64 so the reference loops can be compared tightly.
NamedVars make_params(uint64_t seed, DType dtype = DType::F64) {
    Generator gen(seed);
    NamedVars params;
    params.emplace_back("a.weight", Var(randn({3, 4}, gen, dtype), true));
    params.emplace_back("b", Var(randn({5}, gen, dtype), true));
    return params;
}

// The grads of step `step` for parameter `index`: deterministic, a fresh draw each step.
Tensor grad_for(int64_t step, size_t index, const Shape& shape, DType dtype) {
    Generator gen(1000 + 17 * static_cast<uint64_t>(step) + index);
    return randn(shape, gen, dtype);
}

void set_grads(NamedVars& params, int64_t step) {
    for (size_t i = 0; i < params.size(); ++i)
        params[i].second.set_grad(Var(grad_for(step, i, params[i].second.shape(), params[i].second.dtype())));
}

struct RefSgd {
    double lr, momentum, dampening, wd;
    bool nesterov;
    std::vector<std::vector<double>> buf;

    // torch.optim.SGD (_single_tensor_sgd).
    void step(std::vector<std::vector<double>>& params, const std::vector<std::vector<double>>& grads) {
        bool first = buf.empty();
        if (first) buf.resize(params.size());
        for (size_t i = 0; i < params.size(); ++i) {
            for (size_t j = 0; j < params[i].size(); ++j) {
                double g = grads[i][j] + wd * params[i][j];
                if (momentum != 0.0) {
                    if (first) buf[i].push_back(g);
                    else buf[i][j] = momentum * buf[i][j] + (1 - dampening) * g;
                    g = nesterov ? g + momentum * buf[i][j] : buf[i][j];
                }
                params[i][j] -= lr * g;
            }
        }
    }
};

struct RefAdam {
    double lr, b1, b2, eps, wd;
    bool decoupled, amsgrad;
    std::vector<std::vector<double>> m, v, vmax;
    int64_t t = 0;

    // torch.optim.Adam / AdamW (_single_tensor_adam).
    void step(std::vector<std::vector<double>>& params, const std::vector<std::vector<double>>& grads) {
        if (t == 0) {
            for (const auto& p : params) {
                m.emplace_back(p.size(), 0.0);
                v.emplace_back(p.size(), 0.0);
                vmax.emplace_back(p.size(), 0.0);
            }
        }
        ++t;
        const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
        const double bc2 = 1 - std::pow(b2, static_cast<double>(t));
        for (size_t i = 0; i < params.size(); ++i) {
            for (size_t j = 0; j < params[i].size(); ++j) {
                double& p = params[i][j];
                double g = grads[i][j];
                if (decoupled) p *= 1 - lr * wd;
                else g += wd * p;
                m[i][j] = b1 * m[i][j] + (1 - b1) * g;
                v[i][j] = b2 * v[i][j] + (1 - b2) * g * g;
                vmax[i][j] = std::max(vmax[i][j], v[i][j]);
                const double second = amsgrad ? vmax[i][j] : v[i][j];
                const double denom = std::sqrt(second) / std::sqrt(bc2) + eps;
                p -= lr / bc1 * m[i][j] / denom;
            }
        }
    }
};

std::vector<std::vector<double>> values_of(const NamedVars& params) {
    std::vector<std::vector<double>> out;
    for (const auto& [name, p] : params) out.push_back(p.data().to_vector());
    return out;
}

std::vector<std::vector<double>> grads_of(const NamedVars& params) {
    std::vector<std::vector<double>> out;
    for (const auto& [name, p] : params) out.push_back(p.grad().data().to_vector());
    return out;
}

void require_params_close(const NamedVars& params, const std::vector<std::vector<double>>& ref, double tol) {
    for (size_t i = 0; i < params.size(); ++i) {
        const std::vector<double> got = params[i].second.data().to_vector();
        REQUIRE(got.size() == ref[i].size());
        for (size_t j = 0; j < got.size(); ++j) {
            INFO(params[i].first << "[" << j << "]: " << got[j] << " vs reference " << ref[i][j]);
            REQUIRE(std::fabs(got[j] - ref[i][j]) <= tol * (1 + std::fabs(ref[i][j])));
        }
    }
}

}  // namespace

TEST_CASE("SGD matches torch.optim.SGD's update rule", "[optim]") {
    struct Case {
        double momentum, dampening, wd;
        bool nesterov;
    };
    const Case c = GENERATE(Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.0, 0.0, false}, Case{0.9, 0.1, 0.01, false},
                            Case{0.9, 0.0, 0.05, true}, Case{0.0, 0.0, 0.1, false});
    INFO("momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.wd << " nesterov " << c.nesterov);
    NamedVars params = make_params(1);
    SGDOptions o;
    o.lr = 0.1;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.weight_decay = c.wd;
    o.nesterov = c.nesterov;
    SGD opt(params, o);
    RefSgd ref{0.1, c.momentum, c.dampening, c.wd, c.nesterov, {}};
    std::vector<std::vector<double>> expected = values_of(params);
    for (int64_t step = 0; step < 5; ++step) {
        set_grads(params, step);
        ref.step(expected, grads_of(params));
        opt.step();
        require_params_close(params, expected, 1e-13);
    }
    CHECK(opt.step_count() == 5);
    CHECK(opt.state_dict().tensors.size() == (c.momentum != 0.0 ? 2u : 0u));
}

TEST_CASE("Adam and AdamW match torch.optim's update rule (bias correction, eps outside the sqrt)", "[optim]") {
    const bool decoupled = GENERATE(false, true);
    const bool amsgrad = GENERATE(false, true);
    const double wd = GENERATE(0.0, 0.1);
    INFO("decoupled " << decoupled << " amsgrad " << amsgrad << " wd " << wd);
    NamedVars params = make_params(2);
    AdamOptions o;
    o.lr = 0.05;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-3;  // large, so eps inside vs outside the sqrt would show
    o.weight_decay = wd;
    o.amsgrad = amsgrad;
    std::unique_ptr<Adam> opt = decoupled ? std::make_unique<AdamW>(params, o) : std::make_unique<Adam>(params, o);
    CHECK(opt->type_name() == (decoupled ? "AdamW" : "Adam"));
    RefAdam ref{0.05, 0.8, 0.95, 1e-3, wd, decoupled, amsgrad, {}, {}, {}};
    std::vector<std::vector<double>> expected = values_of(params);
    for (int64_t step = 0; step < 6; ++step) {
        set_grads(params, step);
        ref.step(expected, grads_of(params));
        opt->step();
        require_params_close(params, expected, 1e-12);
    }
}

TEST_CASE("Adam in f32 follows the f64 reference within f32 rounding", "[optim]") {
    NamedVars params = make_params(3, DType::F32);
    AdamOptions o;
    o.lr = 0.01;
    Adam opt(params, o);
    RefAdam ref{0.01, 0.9, 0.999, 1e-8, 0.0, false, false, {}, {}, {}};
    std::vector<std::vector<double>> expected = values_of(params);
    for (int64_t step = 0; step < 5; ++step) {
        set_grads(params, step);
        ref.step(expected, grads_of(params));
        opt.step();
    }
    require_params_close(params, expected, 1e-5);
}

TEST_CASE("optimizers skip parameters without a grad, keeping per-parameter step counts", "[optim]") {
    NamedVars params = make_params(4);
    AdamOptions o;
    o.lr = 0.1;
    Adam opt(params, o);
    const Tensor b_before = params[1].second.data().clone();
    // Two steps where only "a.weight" has a grad.
    for (int64_t step = 0; step < 2; ++step) {
        params[0].second.set_grad(Var(grad_for(step, 0, {3, 4}, DType::F64)));
        params[1].second.zero_grad();
        opt.step();
    }
    CHECK(max_abs_diff(params[1].second.data(), b_before) == 0.0);
    OptimizerState state = opt.state_dict();
    CHECK(state.tensors.size() == 3);  // a.weight's exp_avg, exp_avg_sq, step; nothing for b
    // Now "b" gets its first grad: its bias correction is that of step 1, as a fresh Adam's.
    NamedVars fresh_params = {{"b", Var(b_before.clone(), true)}};
    Adam fresh(fresh_params, o);
    const Tensor g = grad_for(7, 1, {5}, DType::F64);
    params[0].second.zero_grad();
    params[1].second.set_grad(Var(g));
    fresh_params[0].second.set_grad(Var(g));
    opt.step();
    fresh.step();
    CHECK(max_abs_diff(params[1].second.data(), fresh_params[0].second.data()) == 0.0);
    CHECK(opt.step_count() == 3);
    for (const auto& [key, t] : opt.state_dict().tensors) {
        if (key == "a.weight.step") CHECK(t.item() == 2);
        if (key == "b.step") CHECK(t.item() == 1);
    }
}

TEST_CASE("optimizer state save/load resumes bit-identically", "[optim]") {
    const int kind = GENERATE(0, 1, 2);  // SGD with momentum, Adam (amsgrad), AdamW
    INFO("optimizer kind " << kind);
    auto make = [&](const NamedVars& params) -> std::unique_ptr<Optimizer> {
        if (kind == 0) {
            SGDOptions o;
            o.lr = 0.05;
            o.momentum = 0.9;
            o.nesterov = true;
            return std::make_unique<SGD>(params, o);
        }
        AdamOptions o;
        o.lr = 0.02;
        o.weight_decay = 0.05;
        o.amsgrad = kind == 1;
        if (kind == 1) return std::make_unique<Adam>(params, o);
        return std::make_unique<AdamW>(params, o);
    };
    // Uninterrupted: 6 steps.
    NamedVars full = make_params(5, DType::F32);
    auto opt_full = make(full);
    for (int64_t s = 0; s < 6; ++s) {
        set_grads(full, s);
        opt_full->step();
        opt_full->set_lr(opt_full->lr() * 0.9);  // a schedule: the lr must travel with the state
    }
    // Interrupted after 3 steps: fresh params and a fresh optimizer, loaded from the saved state.
    NamedVars first = make_params(5, DType::F32);
    auto opt_first = make(first);
    for (int64_t s = 0; s < 3; ++s) {
        set_grads(first, s);
        opt_first->step();
        opt_first->set_lr(opt_first->lr() * 0.9);
    }
    const OptimizerState saved = opt_first->state_dict();
    NamedVars resumed = make_params(99, DType::F32);  // different values, then overwritten
    for (size_t i = 0; i < resumed.size(); ++i) resumed[i].second.data().copy_(first[i].second.data());
    auto opt_resumed = make(resumed);
    opt_resumed->load_state_dict(saved);
    CHECK(opt_resumed->step_count() == 3);
    CHECK(opt_resumed->lr() == opt_first->lr());
    for (int64_t s = 3; s < 6; ++s) {
        set_grads(resumed, s);
        opt_resumed->step();
        opt_resumed->set_lr(opt_resumed->lr() * 0.9);
    }
    for (size_t i = 0; i < full.size(); ++i)
        CHECK(max_abs_diff(full[i].second.data(), resumed[i].second.data()) == 0.0);
    // The saved state is a copy: later steps of the source did not change it.
    set_grads(first, 3);
    opt_first->step();
    for (const auto& [key, t] : saved.tensors)
        if (key.ends_with(".step")) CHECK(t.item() == 3);
}

TEST_CASE("optimizer load_state_dict rejects mismatched state and changes nothing", "[optim]") {
    NamedVars params = make_params(6);
    AdamOptions o;
    Adam adam(params, o);
    set_grads(params, 0);
    adam.step();
    const OptimizerState good = adam.state_dict();

    NamedVars other = make_params(6);
    Adam target(other, o);
    SECTION("another optimizer type") {
        OptimizerState s = good;
        s.type = "SGD";
        REQUIRE_THROWS_WITH(target.load_state_dict(s), Catch::Contains("from a SGD optimizer, expected Adam"));
    }
    SECTION("an unknown parameter") {
        OptimizerState s = good;
        s.tensors.emplace_back("c.weight.exp_avg", zeros({2}, DType::F64));
        REQUIRE_THROWS_WITH(target.load_state_dict(s), Catch::Contains("unexpected key 'c.weight.exp_avg'"));
    }
    SECTION("an unknown buffer") {
        OptimizerState s = good;
        s.tensors.emplace_back("b.momentum_buffer", zeros({5}, DType::F64));
        REQUIRE_THROWS_WITH(target.load_state_dict(s), Catch::Contains("unexpected key 'b.momentum_buffer'") &&
                                                           Catch::Contains("exp_avg_sq"));
    }
    SECTION("a shape mismatch") {
        OptimizerState s = good;
        for (auto& [key, t] : s.tensors)
            if (key == "b.exp_avg") t = zeros({6}, DType::F64);
        REQUIRE_THROWS_WITH(target.load_state_dict(s),
                            Catch::Contains("'b.exp_avg' has shape [6], expected [5]"));
    }
    SECTION("an incomplete state") {
        OptimizerState s = good;
        s.tensors.erase(s.tensors.begin());
        REQUIRE_THROWS_WITH(target.load_state_dict(s), Catch::Contains("missing key(s) a.weight.exp_avg"));
    }
    SECTION("a structural hyperparameter that differs") {
        SGDOptions so;
        so.momentum = 0.9;
        SGD sgd(other, so);
        OptimizerState s = SGD(params, SGDOptions{}).state_dict();  // momentum 0
        REQUIRE_THROWS_WITH(sgd.load_state_dict(s), Catch::Contains("momentum"));
        CHECK(sgd.options().momentum == 0.9);
    }
    // Nothing was loaded: the target has no state and its settings are untouched.
    CHECK(target.state_dict().tensors.empty());
    CHECK(target.step_count() == 0);
    CHECK(target.lr() == o.lr);
}

TEST_CASE("optimizer construction checks and zero_grad", "[optim]") {
    NamedVars params = make_params(7);
    SECTION("bad hyperparameters") {
        AdamOptions o;
        o.lr = -1;
        REQUIRE_THROWS_WITH(Adam(params, o), Catch::Contains("invalid learning rate -1"));
        o.lr = 0.1;
        o.beta1 = 1.0;
        REQUIRE_THROWS_WITH(AdamW(params, o), Catch::Contains("AdamW: invalid beta1 1"));
        SGDOptions s;
        s.nesterov = true;
        REQUIRE_THROWS_WITH(SGD(params, s), Catch::Contains("nesterov"));
    }
    SECTION("duplicate names and tied weights") {
        NamedVars dup = {params[0], params[0]};
        REQUIRE_THROWS_WITH(SGD(dup, SGDOptions{}), Catch::Contains("'a.weight' appears twice"));
        NamedVars tied = {params[0], {"tied.weight", params[0].second}};
        SGDOptions s;
        s.lr = 1.0;
        SGD sgd(tied, s);
        CHECK(sgd.params().size() == 1);
        const Tensor before = params[0].second.data().clone();
        params[0].second.set_grad(Var(ones({3, 4}, DType::F64)));
        sgd.step();  // updated once: -1, not -2
        CHECK(max_abs_diff(params[0].second.data(), before - 1.0) == 0.0);
    }
    SECTION("zero_grad clears every grad") {
        SGD sgd(params, SGDOptions{});
        set_grads(params, 0);
        sgd.zero_grad();
        for (const auto& [name, p] : params) CHECK_FALSE(p.grad().defined());
        sgd.step();  // nothing to do
        CHECK(sgd.state_dict().tensors.empty());
    }
    SECTION("lr get/set") {
        SGD sgd(params, SGDOptions{});
        sgd.set_lr(0.25);
        CHECK(sgd.lr() == 0.25);
        REQUIRE_THROWS_WITH(sgd.set_lr(-0.5), Catch::Contains("invalid learning rate -0.5"));
    }
}

TEST_CASE("clip_grad_norm_ scales all grads by one global factor", "[optim]") {
    NamedVars params = make_params(8);
    Var no_grad_param(ones({2}, DType::F64), true);
    set_grads(params, 0);
    double sq = 0.0;
    for (const auto& [name, p] : params)
        for (double g : p.grad().data().to_vector()) sq += g * g;
    const double total = std::sqrt(sq);
    std::vector<Var> vars = {params[0].second, params[1].second, no_grad_param};
    const std::vector<std::vector<double>> before = grads_of(params);

    SECTION("above max_norm: scaled to max_norm") {
        const double max_norm = total / 4;
        CHECK(clip_grad_norm_(vars, max_norm) == Approx(total).epsilon(1e-14));
        const double scale = max_norm / (total + 1e-6);
        for (size_t i = 0; i < params.size(); ++i) {
            const std::vector<double> after = params[i].second.grad().data().to_vector();
            for (size_t j = 0; j < after.size(); ++j) CHECK(after[j] == Approx(before[i][j] * scale).epsilon(1e-14));
        }
        CHECK(grad_norm(vars) == Approx(max_norm).epsilon(1e-6));
        CHECK_FALSE(no_grad_param.grad().defined());
    }
    SECTION("below max_norm: unchanged") {
        CHECK(clip_grad_norm_(params, total * 2) == Approx(total).epsilon(1e-14));
        CHECK(grads_of(params) == before);
    }
    SECTION("f32 grads and a negative max_norm") {
        Var p(zeros({3}), true);
        p.set_grad(Var(from_vector(std::vector<double>{3, 4, 0}, {3})));
        CHECK(clip_grad_norm_(std::vector<Var>{p}, 1.0) == Approx(5.0));
        nl::test::check_close(p.grad(), from_vector(std::vector<double>{0.6, 0.8, 0}, {3}), 1e-6, 1e-6, "clipped");
        REQUIRE_THROWS_WITH(clip_grad_norm_(std::vector<Var>{p}, -1.0), Catch::Contains("max_norm must be >= 0"));
    }
    SECTION("one sum_of_squares kernel per grad, no f64 copy or squared tensor") {
        Var a(zeros({1000}), true), b(zeros({30, 40}), true);
        Generator gen(9);
        a.set_grad(Var(randn({1000}, gen)));
        b.set_grad(Var(randn({30, 40}, gen)));
        double want = 0.0;
        for (const Var* p : {&a, &b})
            for (double g : p->grad().data().to_vector()) want += g * g;
        profiler::reset();
        double got = 0.0;
        {
            profiler::EnableGuard on(true);
            got = grad_norm(std::vector<Var>{a, b});
        }
        CHECK(got == Approx(std::sqrt(want)).epsilon(1e-7));
        int64_t sums = 0;
        double other_bytes = 0.0;  // item()'s copies of the two f32 results, nothing else
        for (const profiler::OpStats& row : profiler::collected()) {
            INFO(row.kind << ": " << row.calls << " calls, " << row.bytes << " bytes");
            CHECK((row.kind == "sum_of_squares" || row.kind == "copy"));
            if (row.kind == "sum_of_squares") sums += row.calls;
            else other_bytes += row.bytes;
        }
        CHECK(sums == 2);
        CHECK(other_bytes <= 2 * 2 * 8.0);
    }
}

TEST_CASE("LR schedules: constant and linear warmup + cosine decay", "[optim]") {
    SECTION("constant") {
        const LrSchedule s = LrSchedule::constant(0.3);
        CHECK(s.lr_at(0) == 0.3);
        CHECK(s.lr_at(123456) == 0.3);
        const LrSchedule w = LrSchedule::constant(0.4, 4);
        CHECK(w.lr_at(0) == Approx(0.1));
        CHECK(w.lr_at(3) == Approx(0.4));
        CHECK(w.lr_at(100) == 0.4);
    }
    SECTION("warmup + cosine") {
        const LrSchedule s = LrSchedule::warmup_cosine(1.0, 10, 110, 0.1);
        CHECK(s.lr_at(0) == Approx(0.1));     // (0 + 1) / 10
        CHECK(s.lr_at(4) == Approx(0.5));
        CHECK(s.lr_at(9) == Approx(1.0));     // warmup ends at the peak
        CHECK(s.lr_at(10) == Approx(1.0));    // cosine starts at base_lr
        CHECK(s.lr_at(60) == Approx(0.55));   // halfway: min + 0.5 (base - min)
        CHECK(s.lr_at(35) == Approx(0.1 + 0.5 * (1 + std::cos(std::numbers::pi / 4)) * 0.9));
        CHECK(s.lr_at(109) > 0.1);
        CHECK(s.lr_at(110) == 0.1);
        CHECK(s.lr_at(5000) == 0.1);
        for (int64_t i = 10; i < 110; ++i) CHECK(s.lr_at(i + 1) <= s.lr_at(i));  // monotone decay
        const LrSchedule no_warmup = LrSchedule::warmup_cosine(2.0, 0, 4, 0.0);
        CHECK(no_warmup.lr_at(0) == 2.0);
        CHECK(no_warmup.lr_at(2) == Approx(1.0));
    }
    SECTION("bad settings") {
        REQUIRE_THROWS_WITH(LrSchedule::warmup_cosine(1.0, 10, 10, 0.0),
                            Catch::Contains("total_steps must be > warmup_steps"));
        REQUIRE_THROWS_WITH(LrSchedule::warmup_cosine(1.0, 0, 10, 2.0), Catch::Contains("min_lr must be in [0"));
        REQUIRE_THROWS_WITH(LrSchedule::constant(-1.0), Catch::Contains("base_lr must be >= 0"));
        REQUIRE_THROWS_WITH(LrSchedule::constant(1.0).lr_at(-1), Catch::Contains("step must be >= 0"));
    }
}

TEST_CASE("training a Linear with Adam and a schedule lowers the loss", "[optim]") {
    Generator gen(11);
    LinearOptions lo;
    lo.in_features = 4;
    lo.out_features = 2;
    lo.generator = &gen;
    Linear model(lo);
    const Var x(randn({16, 4}, gen));
    const Var y(randn({16, 2}, gen));
    Adam opt(model.named_parameters(), AdamOptions{});
    const LrSchedule schedule = LrSchedule::warmup_cosine(0.05, 5, 100, 0.005);
    double first = 0, last = 0;
    for (int64_t step = 0; step < 100; ++step) {
        opt.set_lr(schedule.lr_at(step));
        opt.zero_grad();
        Var loss = mse_loss(model.forward(x), y);
        if (step == 0) first = loss.item();
        last = loss.item();
        loss.backward();
        clip_grad_norm_(model.parameters(), 1.0);
        opt.step();
    }
    CHECK(last < 0.8 * first);
}
