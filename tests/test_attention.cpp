// Fused causal attention (FlashAttention's tiles and online softmax) against the composed reference
// (LLaMA's attention in autograd ops): forward and backward over odd lengths, odd head sizes, lengths
// past one tile, grouped-query ratios and cached offsets (more keys than queries), in f32 and f64;
// f64 gradchecks of the fused node; bits independent of the thread count; what each form saves for
// backward (graph inspection); bf16 inputs on both bf16 kernels (widened, vdpbf16ps); the transformer
// with either form; bad inputs.
#include <catch2/catch.hpp>

#include <omp.h>

#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/graph.h"
#include "core/cpu_runtime.h"
#include "core/fused.h"
#include "layers/loss.h"
#include "layers/transformer.h"
#include "layers_test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

struct AttnCase {
    int64_t B, T, L, H, KV, hd;
    std::string str() const {
        return "B " + std::to_string(B) + ", T " + std::to_string(T) + ", L " + std::to_string(L) + ", H " +
               std::to_string(H) + ", KV " + std::to_string(KV) + ", hd " + std::to_string(hd);
    }
};

// Odd T and hd, T and L past the 32-row query tile and the 64-key tile, GQA ratios 1, 2, 3, 4, 6,
// and L > T (a KV cache's offset).
const std::vector<AttnCase> kCases = {
    {1, 1, 1, 1, 1, 2},   {2, 7, 7, 4, 2, 6},     {1, 33, 33, 6, 3, 10}, {2, 70, 70, 4, 1, 16},
    {1, 5, 12, 2, 2, 8},  {1, 65, 130, 3, 1, 4},  {3, 1, 9, 6, 1, 12},   {1, 129, 129, 2, 2, 32},
};

struct Inputs {
    Var q, k, v;
};

Inputs random_inputs(const AttnCase& c, DType dtype, uint64_t seed) {
    Generator gen(seed);
    return {Var(randn({c.B, c.T, c.H, c.hd}, gen, dtype), true), Var(randn({c.B, c.L, c.KV, c.hd}, gen, dtype), true),
            Var(randn({c.B, c.L, c.KV, c.hd}, gen, dtype), true)};
}

struct Result {
    Tensor out, dq, dk, dv;
};

// out = attention(q, k, v) and the gradients of sum(out * w) for a fixed random w.
Result run(const Inputs& in, bool fused, uint64_t seed) {
    for (const Var* x : {&in.q, &in.k, &in.v}) const_cast<Var*>(x)->zero_grad();
    Var out = causal_attention(in.q, in.k, in.v, fused);
    Generator gen(seed);
    Var w(randn(out.shape(), gen, out.dtype()));
    sum(out * w).backward();
    return {out.data(), in.q.grad().data(), in.k.grad().data(), in.v.grad().data()};
}

// Runs bf16 attention on one kernel (set_attention_bf16_kernel) for its scope, then back to auto.
struct Bf16Kernel {
    explicit Bf16Kernel(const std::string& kernel) { set_attention_bf16_kernel(kernel); }
    ~Bf16Kernel() { set_attention_bf16_kernel("auto"); }
};

#ifdef __AVX512BF16__
// max |actual - expected| <= tol * max |expected|, with both figures in the report.
void check_near_in_scale(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
    const std::vector<double> a = actual.to(DType::F64).to_vector(), e = expected.to(DType::F64).to_vector();
    REQUIRE(a.size() == e.size());
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::abs(a[i] - e[i]));
        scale = std::max(scale, std::abs(e[i]));
    }
    INFO(what << ": max error " << err << ", max |expected| " << scale);
    CHECK(err <= tol * scale);
}
#endif

}  // namespace

TEST_CASE("attention: the fused form matches the composed one, forward and backward, f32 and f64", "[attention]") {
    for (DType dtype : {DType::F64, DType::F32}) {
        const double tol = dtype == DType::F64 ? 1e-12 : 2e-5;
        for (const AttnCase& c : kCases) {
            INFO(c.str() << ", " << dtype_name(dtype));
            const Inputs in = random_inputs(c, dtype, 7);
            const Result fused = run(in, true, 11);
            const Result composed = run(in, false, 11);
            check_close(fused.out, composed.out, tol, tol, "out");
            check_close(fused.dq, composed.dq, tol, tol, "dq");
            check_close(fused.dk, composed.dk, tol, tol, "dk");
            check_close(fused.dv, composed.dv, tol, tol, "dv");
        }
    }
}

TEST_CASE("attention: the fused node passes gradcheck in f64 (odd sizes, GQA, cached offset)", "[attention]") {
    for (const AttnCase& c : std::vector<AttnCase>{{1, 3, 3, 2, 1, 2}, {2, 5, 5, 3, 3, 4}, {1, 4, 7, 4, 2, 6},
                                                    {1, 9, 9, 2, 1, 3 * 2}}) {
        INFO(c.str());
        const Inputs in = random_inputs(c, DType::F64, 3);
        GradcheckResult r = gradcheck(
            [](const std::vector<Var>& x) { return causal_attention(x[0], x[1], x[2], true); }, {in.q, in.k, in.v});
        INFO(r.message);
        CHECK(r.ok);
    }
}

TEST_CASE("attention: the fused node passes gradgradcheck in f64, with and without GQA", "[attention]") {
    for (const AttnCase& c : std::vector<AttnCase>{{1, 3, 3, 2, 2, 2}, {2, 4, 4, 2, 1, 4}, {1, 3, 5, 4, 2, 2}}) {
        INFO(c.str());
        const Inputs in = random_inputs(c, DType::F64, 4);
        GradcheckResult r = gradgradcheck(
            [](const std::vector<Var>& x) { return causal_attention(x[0], x[1], x[2], true); }, {in.q, in.k, in.v});
        INFO(r.message);
        CHECK(r.ok);
    }
}

TEST_CASE("attention: the fused kernels give the same bits on 1, 2 and 3 threads", "[attention]") {
    // 8 heads in all: the forward hands each thread a head's query tiles together; 2: tile by tile.
    for (const AttnCase c : {AttnCase{2, 100, 100, 4, 2, 16}, AttnCase{1, 100, 100, 2, 1, 16}}) {
        INFO(c.str());
        const Inputs in = random_inputs(c, DType::F32, 5);
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        const Result one = run(in, true, 9);
        for (int team : {2, 3}) {
            omp_set_num_threads(team);
            const Result many = run(in, true, 9);
            CHECK(one.out.to_vector() == many.out.to_vector());
            CHECK(one.dq.to_vector() == many.dq.to_vector());
            CHECK(one.dk.to_vector() == many.dk.to_vector());
            CHECK(one.dv.to_vector() == many.dv.to_vector());
        }
        omp_set_num_threads(threads);
    }
}

TEST_CASE("attention: the fused form saves q, k, v, out and one logsumexp per row, the composed one a T x T matrix",
          "[attention][graph]") {
    const AttnCase c{2, 64, 64, 4, 2, 8};
    const Inputs in = random_inputs(c, DType::F32, 1);
    Var fused = causal_attention(in.q, in.k, in.v, true);
    Var composed = causal_attention(in.q, in.k, in.v, false);

    const std::vector<std::shared_ptr<Node>> nodes = graph_nodes(fused);
    REQUIRE(nodes.size() == 1);
    std::vector<std::string> names;
    for (const SavedInfo& s : saved_info(*nodes.front())) names.push_back(s.name);
    CHECK(names == std::vector<std::string>{"q", "k", "v", "out", "lse"});
    const int64_t f32 = 4;
    const int64_t q_bytes = c.B * c.T * c.H * c.hd * f32, kv_bytes = c.B * c.L * c.KV * c.hd * f32;
    const int64_t lse_bytes = c.B * c.H * c.T * f32;
    CHECK(graph_saved_bytes(fused) == 2 * q_bytes + 2 * kv_bytes + lse_bytes);

    // The composed graph keeps the (B, H, T, L) probabilities (and more): at least one T x L matrix.
    const int64_t probs_bytes = c.B * c.H * c.T * c.L * f32;
    bool saw_square = false;
    for (const auto& node : graph_nodes(composed))
        for (const SavedInfo& s : saved_info(*node))
            if (s.shape.size() == 4 && s.shape[2] == c.T && s.shape[3] == c.L) saw_square = true;
    CHECK(saw_square);
    CHECK(graph_saved_bytes(composed) > graph_saved_bytes(fused) + probs_bytes);
}

TEST_CASE("attention: bf16 inputs are computed in f32 and rounded once", "[attention]") {
    const AttnCase c{1, 20, 20, 4, 2, 8};
    const Inputs in = random_inputs(c, DType::F32, 2);
    NoGradGuard no_grad;
    const AttentionForward f32 = attention_forward(in.q.data(), in.k.data(), in.v.data());
    const AttentionForward b16 =
        attention_forward(in.q.data().to(DType::BF16), in.k.data().to(DType::BF16), in.v.data().to(DType::BF16));
    CHECK(b16.out.dtype() == DType::BF16);
    CHECK(b16.lse.dtype() == DType::F32);
    check_close(b16.out.to(DType::F32), f32.out, 0.05, 0.02, "bf16 out");
}

TEST_CASE("attention: bf16 widened on the CPU is read and written as bf16, with the bits of the f32 kernels rounded once",
          "[attention]") {
    // Every case (GQA, a cached offset, odd sizes), and one threaded over (batch, kv head) slices, on
    // 1 and 2 threads: the bf16 kernels equal the f32 ones on the widened values, then rounded.
    std::vector<AttnCase> cases = kCases;
    cases.push_back({3, 100, 100, 6, 2, 16});
    const Bf16Kernel widened("widened");
    const int threads = omp_get_max_threads();
    for (const AttnCase& c : cases) {
        INFO(c.str());
        Generator gen(21);
        auto bf16_randn = [&](const Shape& shape) { return randn(shape, gen).to(DType::BF16); };
        const Tensor q = bf16_randn({c.B, c.T, c.H, c.hd}), k = bf16_randn({c.B, c.L, c.KV, c.hd});
        const Tensor v = bf16_randn({c.B, c.L, c.KV, c.hd}), dout = bf16_randn({c.B, c.T, c.H, c.hd});
        const Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32), v32 = v.to(DType::F32);
        const AttentionForward f32 = attention_forward(q32, k32, v32);
        // The f32 backward reads the bf16 forward's output, widened, as the bf16 backward does.
        const AttentionBackward g32 =
            attention_backward(dout.to(DType::F32), q32, k32, v32, f32.out.to(DType::BF16).to(DType::F32), f32.lse);
        for (int team : {1, 2}) {
            omp_set_num_threads(team);
            const AttentionForward f = attention_forward(q, k, v);
            REQUIRE(f.out.dtype() == DType::BF16);
            REQUIRE(f.lse.dtype() == DType::F32);
            CHECK(f.out.to_vector() == f32.out.to(DType::BF16).to_vector());
            CHECK(f.lse.to_vector() == f32.lse.to_vector());
            const AttentionBackward g = attention_backward(dout, q, k, v, f.out, f.lse);
            REQUIRE(g.dq.dtype() == DType::BF16);
            CHECK(g.dq.to_vector() == g32.dq.to(DType::BF16).to_vector());
            CHECK(g.dk.to_vector() == g32.dk.to(DType::BF16).to_vector());
            CHECK(g.dv.to_vector() == g32.dv.to(DType::BF16).to_vector());
        }
    }
    omp_set_num_threads(threads);
}

TEST_CASE("attention: bf16 on vdpbf16ps is the f64 result within bf16's rounding of P and dS, on any thread count",
          "[attention]") {
#ifndef __AVX512BF16__
    WARN("SKIPPED: attention: bf16 on vdpbf16ps: this build does not target AVX512-BF16");
    CHECK_THROWS_WITH(set_attention_bf16_kernel("vdpbf16ps"), Catch::Contains("does not target AVX512-BF16"));
#else
    // Head sizes of 16, 32, 48 (a 32- and a 16-column pass), 64, 80 (64 and 16) and 128 (two passes of
    // 64); odd T and L, T and L past the 64-row chunk and the 64-key tile, GQA up to 4 query heads a kv
    // head, a cached offset, one query row, and a softcap.
    struct Bf16Case {
        AttnCase c;
        double softcap;
    };
    const std::vector<Bf16Case> cases = {
        {{2, 70, 70, 4, 1, 16}, 0.0},   {{1, 129, 129, 2, 2, 32}, 0.0}, {{3, 100, 100, 6, 2, 16}, 0.0},
        {{1, 37, 90, 4, 2, 48}, 0.0},   {{2, 131, 131, 6, 3, 64}, 0.0}, {{1, 1, 9, 4, 1, 32}, 0.0},
        {{2, 40, 40, 4, 2, 16}, 3.0},   {{1, 77, 140, 2, 1, 64}, 5.0},  {{1, 70, 70, 8, 2, 128}, 0.0},
        {{1, 33, 33, 2, 1, 80}, 0.0},
    };
    const Bf16Kernel vdpbf16ps("vdpbf16ps");
    CHECK(std::string(attention_bf16_kernel()) == "vdpbf16ps");
    const int threads = omp_get_max_threads();
    for (const Bf16Case& bc : cases) {
        const AttnCase& c = bc.c;
        INFO(c.str() << ", softcap " << bc.softcap);
        Generator gen(23);
        auto bf16_randn = [&](const Shape& shape) { return randn(shape, gen).to(DType::BF16); };
        const Tensor q = bf16_randn({c.B, c.T, c.H, c.hd}), k = bf16_randn({c.B, c.L, c.KV, c.hd});
        const Tensor v = bf16_randn({c.B, c.L, c.KV, c.hd}), dout = bf16_randn({c.B, c.T, c.H, c.hd});
        // The reference: f64 on the bf16 values.
        const Tensor q64 = q.to(DType::F64), k64 = k.to(DType::F64), v64 = v.to(DType::F64);
        const AttentionForward f64 = attention_forward(q64, k64, v64, bc.softcap);
        const AttentionBackward g64 = attention_backward(dout.to(DType::F64), q64, k64, v64, f64.out, f64.lse, bc.softcap);
        omp_set_num_threads(1);
        const AttentionForward f1 = attention_forward(q, k, v, bc.softcap);
        const AttentionBackward g1 = attention_backward(dout, q, k, v, f1.out, f1.lse, bc.softcap);
        REQUIRE(f1.out.dtype() == DType::BF16);
        REQUIRE(g1.dq.dtype() == DType::BF16);
        // P rounded to bf16 (relative error 2^-9) moves each output by about 2^-9 of the values it
        // averages; dS's rounding moves the gradients alike, each then rounded once more.
        check_near_in_scale(f1.out, f64.out, 0.01, "out");
        check_near_in_scale(f1.lse, f64.lse, 1e-5, "lse");
        check_near_in_scale(g1.dq, g64.dq, 0.015, "dq");
        check_near_in_scale(g1.dk, g64.dk, 0.015, "dk");
        check_near_in_scale(g1.dv, g64.dv, 0.015, "dv");
        for (int team : {2, 3}) {
            omp_set_num_threads(team);
            const AttentionForward f = attention_forward(q, k, v, bc.softcap);
            const AttentionBackward g = attention_backward(dout, q, k, v, f1.out, f1.lse, bc.softcap);
            CHECK(f.out.to_vector() == f1.out.to_vector());
            CHECK(f.lse.to_vector() == f1.lse.to_vector());
            CHECK(g.dq.to_vector() == g1.dq.to_vector());
            CHECK(g.dk.to_vector() == g1.dk.to_vector());
            CHECK(g.dv.to_vector() == g1.dv.to_vector());
        }
        omp_set_num_threads(threads);
    }
#endif
}

TEST_CASE("attention: the bf16 kernel follows the bf16 engines' measured rates, and a bad name is refused", "[attention]") {
    // auto multiplies bf16 where this build can and vdpbf16ps measured faster than the widened engine
    // (tests/test_engine_choice.cpp); a head size that is not a multiple of 16 widens (its bits are
    // the f32 kernels', as above).
#ifdef __AVX512BF16__
    CHECK(std::string(attention_bf16_kernel()) == (bgemm_vdpbf16ps_beats_widened() ? "vdpbf16ps" : "widened"));
#else
    CHECK(std::string(attention_bf16_kernel()) == "widened");
#endif
    {
        const Bf16Kernel widened("widened");
        CHECK(std::string(attention_bf16_kernel()) == "widened");
    }
    const AttnCase c{1, 20, 20, 2, 1, 8};
    Generator gen(3);
    const Tensor q = randn({c.B, c.T, c.H, c.hd}, gen).to(DType::BF16), k = randn({c.B, c.L, c.KV, c.hd}, gen).to(DType::BF16);
    const Tensor v = randn({c.B, c.L, c.KV, c.hd}, gen).to(DType::BF16);
    const AttentionForward f = attention_forward(q, k, v);
    const AttentionForward ref = attention_forward(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32));
    CHECK(f.out.to_vector() == ref.out.to(DType::BF16).to_vector());
    CHECK_THROWS_WITH(set_attention_bf16_kernel("fast"), Catch::Contains("expected auto, widened") &&
                                                              Catch::Contains("found 'fast'"));
}

TEST_CASE("attention: a transformer gives the same logits and gradients with either form", "[attention][transformer]") {
    for (int64_t kv_heads : {4, 2}) {
        INFO("n_kv_heads " << kv_heads);
        std::vector<Tensor> logits, grads;
        for (bool fused : {true, false}) {
            TransformerOptions o;
            o.vocab_size = 13;
            o.dim = 32;
            o.n_layers = 2;
            o.n_heads = 4;
            o.n_kv_heads = kv_heads;
            o.multiple_of = 16;
            o.max_seq_len = 80;
            o.fused_attention = fused;
            o.seed = 4;
            Transformer model(o);
            std::vector<int64_t> tokens(3 * 70), next(3 * 70);
            for (size_t i = 0; i < tokens.size(); ++i) {
                tokens[i] = static_cast<int64_t>((i * 7 + 3) % 13);
                next[i] = static_cast<int64_t>((i * 5 + 1) % 13);
            }
            Var out = model.forward(from_vector(tokens, {3, 70}));
            cross_entropy_loss(out, from_vector(next, {3, 70})).backward();
            logits.push_back(out.data());
            grads.push_back(model.named_parameters().at(2).second.grad().data());  // layers.0.attention.wq.weight
        }
        check_close(logits[0], logits[1], 1e-5, 1e-4, "logits");
        check_close(grads[0], grads[1], 1e-6, 1e-3, "wq gradient");
    }
}

TEST_CASE("attention: bad shapes are refused by name", "[attention]") {
    Generator gen(0);
    Var q(randn({1, 4, 4, 8}, gen, DType::F64), true);
    Var k(randn({1, 4, 3, 8}, gen, DType::F64), true);
    CHECK_THROWS_WITH(causal_attention(q, k, k, true), Catch::Contains("KV dividing H") && Catch::Contains("[1, 4, 3, 8]"));
    Var short_k(randn({1, 3, 2, 8}, gen, DType::F64), true);
    CHECK_THROWS_WITH(causal_attention(q, short_k, short_k, true), Catch::Contains("L >= T"));
    CHECK_THROWS_WITH(attention_forward(q.data(), k.data().narrow(2, 0, 2), k.data().narrow(2, 0, 2).to(DType::F32)),
                      Catch::Contains("share a dtype"));

    const AttentionForward f = attention_forward(q.data(), k.data().narrow(2, 0, 2), k.data().narrow(2, 0, 2));
    CHECK_THROWS_WITH(attention_backward(f.out, q.data(), k.data().narrow(2, 0, 2), k.data().narrow(2, 0, 2), f.out,
                                         f.lse.narrow(2, 0, 3)),
                      Catch::Contains("lse must be f64 of shape [1, 4, 4]") && Catch::Contains("[1, 4, 3]"));
}
