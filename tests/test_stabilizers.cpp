// The training stabilizers: PaLM's z-loss in the fused cross-entropy and Gemma 2's soft-capping of the
// attention scores (fused kernels) and of any tensor (softcap). Each fused form against its composed
// twin (f64 to 1e-12, f32, bf16), f64 gradchecks of both and gradgradchecks of the composed ones (and of
// the fused softcap, whose create_graph backward is its composed twin),
// PyTorch's values from the committed fixtures, the off settings giving the plain kernels' bits,
// the cached-offset (L > T) rows matching the full attention's, and bad coefficients refused by name.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/cpu/cpu_math.h"
#include "core/cpu_runtime.h"
#include "core/fused.h"
#include "core/safetensors.h"
#include "layers/activation.h"
#include "layers/loss.h"
#include "layers/transformer.h"
#include "layers_test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

SafeTensorsFile fixture(const std::string& name) {
    return load_safetensors(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/fixtures/" + name + ".safetensors");
}

// logits (2, 3, classes) of N(0,1) * 3 + 2 (lse well away from 0, so the z term matters), with rows 1
// and 4 ignored.
struct CeInputs {
    Tensor logits, targets;
};

CeInputs ce_inputs(int64_t classes, DType dtype, uint64_t seed) {
    Generator gen(seed);
    Tensor logits = (randn({2, 3, classes}, gen, DType::F64) * 3.0 + 2.0).to(dtype);
    std::vector<int64_t> t = {0, -100, classes - 1, 1 % classes, -100, 2 % classes};
    return {logits, from_vector(t, {2, 3})};
}

const char* reduction_str(Reduction r) {
    return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none";
}

struct CeResult {
    Tensor loss, z_loss, dlogits;
};

// The terms and the gradient of sum(loss * w) (w fixed random, the loss's shape).
CeResult run_ce(const Tensor& logits, const Tensor& targets, double z, Reduction red, bool fused) {
    Var x(logits, true);
    const CrossEntropyTerms terms = fused ? cross_entropy_z_loss(x, targets, z, -100, red)
                                          : cross_entropy_z_loss_composed(x, targets, z, -100, red);
    Generator gen(77);
    const Var w(randn(terms.loss.shape(), gen, terms.loss.dtype()));
    sum(terms.loss * w).backward();
    return {terms.loss.data(), terms.z_loss, x.grad().data()};
}

struct AttnCase {
    int64_t B, T, L, H, KV, hd;
    std::string str() const {
        return "B " + std::to_string(B) + ", T " + std::to_string(T) + ", L " + std::to_string(L) + ", H " +
               std::to_string(H) + ", KV " + std::to_string(KV) + ", hd " + std::to_string(hd);
    }
};

// Odd sizes, past one key tile (64) and one query tile, GQA, and L > T (a KV cache's offset).
const std::vector<AttnCase> kAttnCases = {
    {1, 1, 1, 1, 1, 2}, {2, 7, 7, 4, 2, 6}, {1, 33, 33, 6, 3, 10}, {2, 70, 70, 4, 1, 16}, {1, 5, 12, 2, 2, 8},
    {1, 65, 130, 3, 1, 4}, {3, 1, 9, 6, 1, 12},
};

struct AttnInputs {
    Var q, k, v;
};

// q and k of N(0,1) * 2, so the scores reach the small caps the tests use.
AttnInputs attn_inputs(const AttnCase& c, DType dtype, uint64_t seed) {
    Generator gen(seed);
    return {Var((randn({c.B, c.T, c.H, c.hd}, gen, DType::F64) * 2.0).to(dtype), true),
            Var((randn({c.B, c.L, c.KV, c.hd}, gen, DType::F64) * 2.0).to(dtype), true),
            Var(randn({c.B, c.L, c.KV, c.hd}, gen, DType::F64).to(dtype), true)};
}

struct AttnResult {
    Tensor out, dq, dk, dv;
};

// out = causal_attention(q, k, v) and the gradients of sum(out * w) for a fixed random w.
AttnResult run_attention(const AttnInputs& in, bool fused, double softcap) {
    for (const Var* x : {&in.q, &in.k, &in.v}) const_cast<Var*>(x)->zero_grad();
    Var out = causal_attention(in.q, in.k, in.v, fused, softcap);
    Generator gen(11);
    Var w(randn(out.shape(), gen, out.dtype()));
    sum(out * w).backward();
    return {out.data(), in.q.grad().data(), in.k.grad().data(), in.v.grad().data()};
}

bool same_bits(const Tensor& a, const Tensor& b) { return a.to_vector() == b.to_vector(); }

// n targets in [0, classes), spread evenly (timing only).
Tensor random_indices_for_timing(int64_t n, int64_t classes) {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 7919) % classes;
    return from_vector(t, {n});
}

}  // namespace

// ---------------------------------------------------------------- z-loss

TEST_CASE("z-loss: the fused cross-entropy matches the composed one, every reduction, f64 and f32", "[stabilizers]") {
    for (int64_t classes : {int64_t(5), int64_t(37), int64_t(1000)}) {
        for (DType dtype : {DType::F64, DType::F32}) {
            const double tol = dtype == DType::F64 ? 1e-12 : 2e-5;
            const CeInputs in = ce_inputs(classes, dtype, 3);
            for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
                INFO("classes " << classes << ", " << dtype_name(dtype) << ", " << reduction_str(red));
                const CeResult fused = run_ce(in.logits, in.targets, 0.01, red, true);
                const CeResult composed = run_ce(in.logits, in.targets, 0.01, red, false);
                check_close(fused.loss, composed.loss, tol, tol, "loss");
                check_close(fused.z_loss, composed.z_loss, tol, tol, "z_loss");
                check_close(fused.dlogits, composed.dlogits, tol, tol, "dlogits");
                // The z term is there: the loss minus it is the plain cross-entropy.
                const Tensor ce = cross_entropy(in.logits, in.targets, -100, red);
                check_close(fused.loss - fused.z_loss, ce, tol, tol, "loss - z_loss");
                CHECK(max(abs(fused.z_loss)).item() > 0.01);
            }
        }
    }
}

TEST_CASE("z-loss: the term is z_loss * mean(lse^2) over the scored rows, by hand", "[stabilizers]") {
    const CeInputs in = ce_inputs(7, DType::F64, 4);
    const CrossEntropyForward f = cross_entropy_forward(in.logits, in.targets, -100, Reduction::Mean, std::nullopt, 0.5);
    const std::vector<double> lse = f.lse.to_vector();
    const std::vector<int64_t> t = in.targets.to_vector_as<int64_t>();
    double sum_sq = 0.0;
    for (size_t r = 0; r < lse.size(); ++r)
        if (t[r] != -100) sum_sq += lse[r] * lse[r];
    CHECK(f.count == 4);
    CHECK(f.z_loss.item() == Approx(0.5 * sum_sq / 4).epsilon(1e-14));
    CHECK(f.loss.item() == Approx(cross_entropy(in.logits, in.targets).item() + 0.5 * sum_sq / 4).epsilon(1e-14));
}

TEST_CASE("z-loss: z_loss = 0 gives the plain cross-entropy's bits, fused and composed", "[stabilizers]") {
    for (DType dtype : {DType::F32, DType::BF16}) {
        const CeInputs in = ce_inputs(37, dtype, 5);
        for (Reduction red : {Reduction::Mean, Reduction::None}) {
            Var a(in.logits, true), b(in.logits, true);
            const Var plain = cross_entropy_loss(a, in.targets, -100, red);
            const CrossEntropyTerms terms = cross_entropy_z_loss(b, in.targets, 0.0, -100, red);
            CHECK(same_bits(plain.data(), terms.loss.data()));
            CHECK(max(abs(terms.z_loss)).item() == 0.0);
            sum(plain).backward();
            sum(terms.loss).backward();
            CHECK(same_bits(a.grad().data(), b.grad().data()));
            // The core op: no z term asked, none computed.
            CHECK_FALSE(cross_entropy_forward(in.logits, in.targets, -100, red).z_loss.defined());
        }
        Var c(in.logits, true), d(in.logits, true);
        CHECK(same_bits(cross_entropy_loss_composed(c, in.targets).data(),
                        cross_entropy_z_loss_composed(d, in.targets, 0.0).loss.data()));
    }
}

TEST_CASE("z-loss: gradcheck of both forms and gradgradcheck of the composed one (f64)", "[stabilizers]") {
    const CeInputs in = ce_inputs(6, DType::F64, 6);
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        INFO(reduction_str(red));
        const Var x(in.logits, true);
        const Tensor targets = in.targets;
        GradcheckResult fused = gradcheck(
            [&](const std::vector<Var>& v) { return cross_entropy_z_loss(v[0], targets, 0.1, -100, red).loss; }, {x});
        INFO(fused.message);
        CHECK(fused.ok);
        auto composed = [&](const std::vector<Var>& v) {
            return cross_entropy_z_loss_composed(v[0], targets, 0.1, -100, red).loss;
        };
        GradcheckResult first = gradcheck(composed, {x});
        INFO(first.message);
        CHECK(first.ok);
        GradcheckResult second = gradgradcheck(composed, {x});
        INFO(second.message);
        CHECK(second.ok);
    }
}

TEST_CASE("z-loss: bf16 logits give the f32 composed loss within bf16's rounding", "[stabilizers]") {
    const CeInputs in = ce_inputs(50, DType::BF16, 7);
    const Tensor widened = in.logits.to(DType::F32);
    const CeResult low = run_ce(in.logits, in.targets, 0.01, Reduction::Mean, true);
    const CeResult ref = run_ce(widened, in.targets, 0.01, Reduction::Mean, false);
    CHECK(low.loss.dtype() == DType::BF16);
    CHECK(low.dlogits.dtype() == DType::BF16);
    // The kernel reads the bf16 values exactly and computes in f32; the loss, its z term and dlogits
    // are rounded to bf16 once (half a bf16 ulp: 2^-9 relative).
    check_close(low.loss.to(DType::F32), ref.loss, 1e-5, 2e-3, "bf16 loss");
    check_close(low.z_loss.to(DType::F32), ref.z_loss, 1e-5, 2e-3, "bf16 z_loss");
    check_close(low.dlogits.to(DType::F32), ref.dlogits, 1e-4, 1e-2, "bf16 dlogits");
}

TEST_CASE("z-loss: matches PyTorch's cross_entropy + z * logsumexp^2 (f64 fixture)", "[stabilizers][reference]") {
    const SafeTensorsFile f = fixture("cross_entropy_z_loss_f64");
    const double z = std::stod(f.metadata.at("z_loss"));
    const Tensor& logits = f.at("input");
    const Tensor& targets = f.at("target");
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
            const std::string p = red == Reduction::Sum ? "sum." : "";
            Var x(logits, true);
            const CrossEntropyTerms terms = fused ? cross_entropy_z_loss(x, targets, z, -100, red)
                                                  : cross_entropy_z_loss_composed(x, targets, z, -100, red);
            const Tensor dloss = red == Reduction::Sum ? scalar_tensor(1.0, DType::F64) : f.at("grad_output");
            terms.loss.backward(Var(dloss));
            check_close(terms.loss.data(), f.at(p + "output"), 0.0, 1e-12, p + "output");
            check_close(terms.z_loss, f.at(p + "z_term"), 0.0, 1e-12, p + "z_term");
            check_close(x.grad().data(), f.at(p + "grad_input"), 1e-15, 1e-12, p + "grad_input");
        }
    }
}

TEST_CASE("z-loss: a negative or non-finite z_loss is refused by name", "[stabilizers]") {
    const CeInputs in = ce_inputs(5, DType::F32, 8);
    const Var x(in.logits, true);
    for (double bad : {-0.1, std::nan(""), std::numeric_limits<double>::infinity()}) {
        INFO(bad);
        CHECK_THROWS_WITH(cross_entropy_z_loss(x, in.targets, bad), Catch::Contains("z_loss must be finite and >= 0"));
        CHECK_THROWS_WITH(cross_entropy_z_loss_composed(x, in.targets, bad), Catch::Contains("z_loss"));
        CHECK_THROWS_WITH(cross_entropy_forward(in.logits, in.targets, -100, Reduction::Mean, std::nullopt, bad),
                          Catch::Contains("z_loss"));
        const Tensor lse = cross_entropy_forward(in.logits, in.targets).lse;
        CHECK_THROWS_WITH(cross_entropy_backward(scalar_tensor(1.0, DType::F32), in.logits, in.targets, lse, -100,
                                                 Reduction::Mean, bad),
                          Catch::Contains("z_loss"));
        CrossEntropyOptions options;
        options.z_loss = bad;
        CrossEntropyLoss module(options);
        CHECK_THROWS_WITH(module.forward(x, in.targets), Catch::Contains("z_loss"));
    }
}

TEST_CASE("z-loss: the CrossEntropyLoss module adds the term and reports it apart", "[stabilizers]") {
    const CeInputs in = ce_inputs(9, DType::F64, 9);
    for (bool fused : {true, false}) {
        CrossEntropyLoss module(CrossEntropyOptions{.ignore_index = -100, .reduction = Reduction::Mean, .fused = fused,
                                                    .z_loss = 0.02});
        const Var x(in.logits, true);
        const CrossEntropyTerms terms = module.forward_terms(x, in.targets);
        CHECK(module.forward(x, in.targets).item() == Approx(terms.loss.item()).epsilon(1e-14));
        CHECK(terms.loss.item() - terms.z_loss.item() ==
              Approx(cross_entropy(in.logits, in.targets).item()).epsilon(1e-12));
        CHECK_THAT(module.extra_repr(), Catch::Contains("z_loss=0.02"));
    }
}

// ---------------------------------------------------------------- attention soft-capping

TEST_CASE("softcap attention: the CPU kernels' f32 tanh is within 4 ulp of tanh", "[stabilizers][attention]") {
    // Both sides of the polynomial's bound 0.625, tiny values, saturation, and a sweep.
    std::vector<float> xs = {0.0f, -0.0f, 1e-30f, 1e-6f, 0.1f, 0.6249f, 0.625f, 0.6251f, 1.0f, 3.0f, 9.0f, 20.0f,
                             44.0f, 100.0f, 1e30f};
    for (int i = -4000; i <= 4000; ++i) xs.push_back(static_cast<float>(i) * 2.5e-3f);
    double worst = 0.0;
    for (float x : xs) {
        for (float s : {x, -x}) {
            const double ref = std::tanh(static_cast<double>(s));
            const double ulp = std::max(std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref), 1e-38)) - 23), 1e-45);
            worst = std::max(worst, std::fabs(static_cast<double>(cpu_math::tanh_f32(s)) - ref) / ulp);
        }
    }
    INFO("worst error " << worst << " ulp");
    CHECK(worst <= 4.0);
    CHECK(std::isnan(cpu_math::tanh_f32(std::nanf(""))));
    CHECK(cpu_math::tanh_f32(std::numeric_limits<float>::infinity()) == 1.0f);
    CHECK(cpu_math::tanh_f32(-std::numeric_limits<float>::infinity()) == -1.0f);
}

TEST_CASE("softcap attention: the fused kernels match the composed form, f64 and f32", "[stabilizers][attention]") {
    for (DType dtype : {DType::F64, DType::F32}) {
        const double tol = dtype == DType::F64 ? 1e-12 : 3e-5;
        for (const AttnCase& c : kAttnCases) {
            for (double cap : {1.5, 30.0}) {
                INFO(c.str() << ", " << dtype_name(dtype) << ", softcap " << cap);
                const AttnInputs in = attn_inputs(c, dtype, 7);
                const AttnResult fused = run_attention(in, true, cap);
                const AttnResult composed = run_attention(in, false, cap);
                check_close(fused.out, composed.out, tol, tol, "out");
                check_close(fused.dq, composed.dq, tol, tol, "dq");
                check_close(fused.dk, composed.dk, tol, tol, "dk");
                check_close(fused.dv, composed.dv, tol, tol, "dv");
            }
        }
    }
}

TEST_CASE("softcap attention: the cap changes the result, softcap = 0 is the plain kernels' bits", "[stabilizers][attention]") {
    const AttnCase c{2, 70, 70, 4, 2, 16};
    for (DType dtype : {DType::F32, DType::BF16}) {
        const AttnInputs in = attn_inputs(c, dtype, 8);
        NoGradGuard no_grad;
        const AttentionForward plain = attention_forward(in.q.data(), in.k.data(), in.v.data());
        const AttentionForward off = attention_forward(in.q.data(), in.k.data(), in.v.data(), 0.0);
        CHECK(same_bits(plain.out, off.out));
        CHECK(same_bits(plain.lse, off.lse));
        const Tensor dout = ones_like(plain.out);
        const AttentionBackward gp = attention_backward(dout, in.q.data(), in.k.data(), in.v.data(), plain.out, plain.lse);
        const AttentionBackward go =
            attention_backward(dout, in.q.data(), in.k.data(), in.v.data(), plain.out, plain.lse, 0.0);
        CHECK(same_bits(gp.dq, go.dq));
        CHECK(same_bits(gp.dk, go.dk));
        CHECK(same_bits(gp.dv, go.dv));
        // A cap of 1 squeezes scores of size ~4 hard: the output moves.
        const AttentionForward capped = attention_forward(in.q.data(), in.k.data(), in.v.data(), 1.0);
        CHECK(max(abs(capped.out.to(DType::F32) - plain.out.to(DType::F32))).item() > 0.05);
    }
}

TEST_CASE("softcap attention: gradcheck of both forms and gradgradcheck of the composed one (f64)",
          "[stabilizers][attention]") {
    for (const AttnCase& c : std::vector<AttnCase>{{1, 3, 3, 2, 1, 2}, {1, 4, 7, 4, 2, 6}, {2, 5, 5, 3, 3, 4}}) {
        INFO(c.str());
        const AttnInputs in = attn_inputs(c, DType::F64, 3);
        for (bool fused : {true, false}) {
            INFO((fused ? "fused" : "composed"));
            auto fn = [fused](const std::vector<Var>& x) { return causal_attention(x[0], x[1], x[2], fused, 1.5); };
            GradcheckResult r = gradcheck(fn, {in.q, in.k, in.v});
            INFO(r.message);
            CHECK(r.ok);
            if (!fused) {
                GradcheckResult r2 = gradgradcheck(fn, {in.q, in.k, in.v});
                INFO(r2.message);
                CHECK(r2.ok);
            }
        }
    }
}

TEST_CASE("softcap attention: matches PyTorch (f64 fixture, GQA, L > T)", "[stabilizers][attention][reference]") {
    const SafeTensorsFile f = fixture("attention_softcap_f64");
    const double cap = std::stod(f.metadata.at("softcap"));
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        const Var q(f.at("q"), true), k(f.at("k"), true), v(f.at("v"), true);
        const Var out = causal_attention(q, k, v, fused, cap);
        out.backward(Var(f.at("grad_output")));
        check_close(out.data(), f.at("output"), 1e-15, 1e-12, "output");
        check_close(q.grad().data(), f.at("grad.q"), 1e-15, 1e-12, "grad.q");
        check_close(k.grad().data(), f.at("grad.k"), 1e-15, 1e-12, "grad.k");
        check_close(v.grad().data(), f.at("grad.v"), 1e-15, 1e-12, "grad.v");
    }
}

TEST_CASE("softcap attention: the cached rows (L > T) are the full attention's last rows", "[stabilizers][attention]") {
    // A KV cache's step: the last T queries over all L keys give the last T rows of the full attention.
    const AttnCase c{2, 20, 20, 4, 2, 8};
    const AttnInputs in = attn_inputs(c, DType::F64, 9);
    NoGradGuard no_grad;
    for (bool fused : {true, false}) {
        const Tensor full = causal_attention(in.q, in.k, in.v, fused, 2.0).data();
        for (int64_t t : {int64_t(1), int64_t(7)}) {
            const Var q_last(in.q.data().narrow(1, c.T - t, t));
            const Tensor step = causal_attention(q_last, in.k, in.v, fused, 2.0).data();
            check_close(step, full.narrow(1, c.T - t, t), 1e-14, 1e-12, "cached rows");
        }
    }
}

TEST_CASE("softcap attention: bf16 is the f32 result within bf16's rounding, the same bits on 1 and 3 threads",
          "[stabilizers][attention]") {
    const AttnCase c{2, 40, 40, 4, 2, 16};
    const AttnInputs in = attn_inputs(c, DType::F32, 10);
    NoGradGuard no_grad;
    set_attention_bf16_kernel("widened");  // vdpbf16ps's softcap: tests/test_attention.cpp
    const Tensor q16 = in.q.data().to(DType::BF16), k16 = in.k.data().to(DType::BF16), v16 = in.v.data().to(DType::BF16);
    const AttentionForward low = attention_forward(q16, k16, v16, 3.0);
    const AttentionForward ref = attention_forward(q16.to(DType::F32), k16.to(DType::F32), v16.to(DType::F32), 3.0);
    CHECK(low.out.dtype() == DType::BF16);
    // The widened bf16 kernel runs the f32 kernel on the widened values: the f32 output rounded once.
    CHECK(same_bits(low.out, ref.out.to(DType::BF16)));
    set_attention_bf16_kernel("auto");
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const AttentionForward one = attention_forward(in.q.data(), in.k.data(), in.v.data(), 3.0);
    const AttentionBackward g1 =
        attention_backward(ones_like(one.out), in.q.data(), in.k.data(), in.v.data(), one.out, one.lse, 3.0);
    omp_set_num_threads(3);
    const AttentionForward three = attention_forward(in.q.data(), in.k.data(), in.v.data(), 3.0);
    const AttentionBackward g3 =
        attention_backward(ones_like(one.out), in.q.data(), in.k.data(), in.v.data(), one.out, one.lse, 3.0);
    omp_set_num_threads(threads);
    CHECK(same_bits(one.out, three.out));
    CHECK(same_bits(g1.dq, g3.dq));
    CHECK(same_bits(g1.dk, g3.dk));
    CHECK(same_bits(g1.dv, g3.dv));
}

TEST_CASE("softcap attention: a negative or non-finite softcap is refused by name", "[stabilizers][attention]") {
    const AttnInputs in = attn_inputs({1, 3, 3, 2, 1, 4}, DType::F32, 12);
    const AttentionForward f = attention_forward(in.q.data(), in.k.data(), in.v.data());
    for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        INFO(bad);
        CHECK_THROWS_WITH(attention_forward(in.q.data(), in.k.data(), in.v.data(), bad),
                          Catch::Contains("softcap must be finite and >= 0"));
        CHECK_THROWS_WITH(attention_backward(f.out, in.q.data(), in.k.data(), in.v.data(), f.out, f.lse, bad),
                          Catch::Contains("softcap"));
        for (bool fused : {true, false})
            CHECK_THROWS_WITH(causal_attention(in.q, in.k, in.v, fused, bad), Catch::Contains("softcap"));
    }
}

// ---------------------------------------------------------------- softcap on a tensor (logits)

TEST_CASE("softcap: cap * tanh(x / cap), twice differentiable, 0 is off, bad caps refused", "[stabilizers][softcap]") {
    Generator gen(13);
    const Var x(randn({3, 17}, gen, DType::F64) * 40.0, true);
    for (bool fused : {true, false}) {
        INFO((fused ? "fused" : "composed"));
        const Tensor y = softcap(x, 30.0, fused).data();
        const std::vector<double> xv = x.data().to_vector(), yv = y.to_vector();
        for (size_t i = 0; i < xv.size(); ++i) {
            CHECK(yv[i] == Approx(30.0 * std::tanh(xv[i] / 30.0)).epsilon(1e-15));
            CHECK(std::fabs(yv[i]) < 30.0);
        }
        CHECK(same_bits(softcap(x, 0.0, fused).data(), x.data()));
        auto fn = [fused](const std::vector<Var>& v) { return softcap(v[0], 30.0, fused); };
        GradcheckResult r = gradcheck(fn, {x});
        INFO(r.message);
        CHECK(r.ok);
        GradcheckResult r2 = gradgradcheck(fn, {x});
        INFO(r2.message);
        CHECK(r2.ok);
        for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()})
            CHECK_THROWS_WITH(softcap(x, bad, fused), Catch::Contains("softcap: cap must be finite and >= 0"));
    }
}

TEST_CASE("softcap: the fused pair matches the composed form (f64, f32, bf16) and keeps saturated gradients",
          "[stabilizers][softcap][fused]") {
    Generator gen(21);
    // x up to about +-12 caps: the polynomial and exp branches of tanh and deep saturation. 4099 x 33
    // elements: above the kernels' threaded size, with a chunk left over.
    const Tensor x64 = randn({4099, 33}, gen, DType::F64) * 100.0, dy64 = randn({4099, 33}, gen, DType::F64);
    const double cap = 30.0;
    auto run = [&](DType dtype, bool fused) {
        const Var x(x64.to(dtype), true);
        const Var y = softcap(x, cap, fused);
        y.backward(Var(dy64.to(dtype)));
        return std::pair<Tensor, Tensor>{y.data(), x.grad().data()};
    };
    const auto [yf, gf] = run(DType::F64, true);
    const auto [yc, gc] = run(DType::F64, false);
    check_close(yf, yc, 1e-15, 1e-15, "f64 y");
    check_close(gf, gc, 1e-15, 1e-14, "f64 dx");
    // f32: the forward is the composed form's arithmetic with the same tanh, so the same bits; the
    // backward within a few ulp where the slope is not tiny.
    const auto [yf32, gf32] = run(DType::F32, true);
    const auto [yc32, gc32] = run(DType::F32, false);
    CHECK(same_bits(yf32, yc32));
    check_close(gf32, gc32, 1e-6, 4e-7, "f32 dx");
    // Every element, saturated ones included: the fused dx against dy * (1 - (y / cap)^2) evaluated
    // exactly (in f64 from the f32 y and dy) is within 5 f32 roundings of the result itself (relative:
    // cap + y, two products, 1 / cap^2 and dy's product; cap - y is exact), however small the slope.
    // The composed form's 1 - t * t in f32 is not, once 1 - t^2 nears 2^-24.
    {
        const std::vector<double> yv = yf32.to_vector(), dv = dy64.to(DType::F32).to_vector();
        auto worst_relative = [&](const Tensor& g) {
            const std::vector<double> gv = g.to_vector();
            double worst = 0.0;
            for (size_t i = 0; i < yv.size(); ++i) {
                const double t = yv[i] / cap, want = dv[i] * (1.0 - t * t);
                if (want != 0.0) worst = std::max(worst, std::fabs(gv[i] - want) / std::fabs(want));
            }
            return worst;
        };
        int64_t saturated = 0;
        for (double y : yv) saturated += std::fabs(y / cap) > 0.999;
        const double fused_worst = worst_relative(gf32), composed_worst = worst_relative(gc32);
        INFO("worst relative error: fused " << fused_worst << ", composed " << composed_worst << ", over "
                                            << saturated << " elements with |y| > 0.999 cap");
        CHECK(saturated > 1000);
        CHECK(fused_worst <= 5.0 * std::ldexp(1.0, -24));
        CHECK(composed_worst > 100.0 * std::ldexp(1.0, -24));
    }
    // bf16 (the CPU kernel reads and writes bf16, f32 math) against f32 of the same bf16 inputs.
    const Tensor xb = x64.to(DType::BF16), dyb = dy64.to(DType::BF16);
    check_close(softcap_forward(xb, cap).to(DType::F32),
                softcap_forward(xb.to(DType::F32), cap).to(DType::BF16).to(DType::F32), 0.0, 0.0,
                "bf16 y: the f32 result rounded once");
    const Tensor yb = softcap_forward(xb, cap);
    check_close(softcap_backward(dyb, yb, cap).to(DType::F32),
                softcap_backward(dyb.to(DType::F32), yb.to(DType::F32), cap).to(DType::BF16).to(DType::F32), 0.0,
                0.0, "bf16 dx: the f32 result rounded once");
}

// ---------------------------------------------------------------- timing (hidden: run by name)

namespace {

// Median of 3 timings of fn, in milliseconds, after one warm-up call.
template <typename Fn>
double median_ms(Fn&& fn) {
    fn();
    std::vector<double> ms;
    for (int i = 0; i < 3; ++i) {
        const double t0 = omp_get_wtime();
        fn();
        ms.push_back((omp_get_wtime() - t0) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    return ms[1];
}

}  // namespace

// nanoGPT's shapes (B 8, T 256, H 6, hd 64; a vocabulary of 50304 over the 2048 rows): the fused
// attention forward + backward with softcap 0 and 30, the fused cross-entropy forward + backward
// with z_loss 0 and 1e-4, and softcap(logits, 30) fused and composed against a copy, f32. Prints
// the medians; `normlab_tests "[.stabilizers_timing]"`.
TEST_CASE("stabilizers: timing of the fused kernels with the stabilizers off and on", "[.stabilizers_timing]") {
    Generator gen(1);
    const Tensor q = randn({8, 256, 6, 64}, gen), k = randn({8, 256, 6, 64}, gen), v = randn({8, 256, 6, 64}, gen);
    for (double cap : {0.0, 30.0}) {
        const double ms = median_ms([&] {
            const AttentionForward f = attention_forward(q, k, v, cap);
            attention_backward(f.out, q, k, v, f.out, f.lse, cap);
        });
        WARN("attention fwd+bwd softcap " << cap << ": " << ms << " ms");
    }
    const Tensor logits = randn({2048, 50304}, gen);
    const Tensor targets = random_indices_for_timing(2048, 50304);
    for (double z : {0.0, 1e-4}) {
        const double ms = median_ms([&] {
            const CrossEntropyForward f = cross_entropy_forward(logits, targets, -100, Reduction::Mean, std::nullopt, z);
            cross_entropy_backward(scalar_tensor(1.0, DType::F32), logits, targets, f.lse, -100, Reduction::Mean, z);
        });
        WARN("cross-entropy fwd+bwd z_loss " << z << ": " << ms << " ms");
    }
    // softcap(logits, 30), fused and composed: the forward alone (no graph) and forward + backward with
    // a given dy (so the timing is softcap's own, not a loss's), against a copy of the logits.
    const Tensor dy = randn({2048, 50304}, gen);
    for (bool fused : {true, false}) {
        const double fwd = median_ms([&] { (void)softcap(Var(logits), 30.0, fused); });
        Var x(logits, true);
        const double both = median_ms([&] {
            x.zero_grad();
            softcap(x, 30.0, fused).backward(Var(dy));
        });
        WARN("softcap(logits, 30) " << (fused ? "fused" : "composed") << " on " << omp_get_max_threads()
                                    << " threads: forward " << fwd << " ms, forward + backward " << both << " ms");
    }
    WARN("a copy of the logits: " << median_ms([&] { (void)logits.clone(); }) << " ms");
}
