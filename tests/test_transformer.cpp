// Transformer parts: SwiGLU sizes, RoPE against an f64 loop and its relative-position property,
// attention against an f64 reference loop, grouped-query heads, causality, gradchecks of a tiny
// attention and of pre-/post-norm blocks, and the language model's names, sizes and training.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "layers/loss.h"
#include "layers/transformer.h"
#include "layers_test_util.h"
#include "optim/adam.h"

using namespace nl;
using nl::test::check_close;

namespace {

std::shared_ptr<Linear> linear_child(const Module& m, const std::string& name) {
    auto l = std::dynamic_pointer_cast<Linear>(m.child(name));
    REQUIRE(l != nullptr);
    return l;
}

// Plain f64 loops of LLaMA's attention for one batch element: x (T, dim) -> (T, dim).
std::vector<double> reference_attention(const std::vector<double>& x, int64_t T, int64_t dim, int64_t H, int64_t KV,
                                        const std::vector<double>& wq, const std::vector<double>& wk,
                                        const std::vector<double>& wv, const std::vector<double>& wo, double theta) {
    const int64_t hd = dim / H;
    auto project = [&](const std::vector<double>& w, int64_t out) {  // x W^T: (T, out)
        std::vector<double> y(T * out, 0.0);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < out; ++o)
                for (int64_t i = 0; i < dim; ++i) y[t * out + o] += x[t * dim + i] * w[o * dim + i];
        return y;
    };
    std::vector<double> q = project(wq, H * hd), k = project(wk, KV * hd), v = project(wv, KV * hd);
    auto rope = [&](std::vector<double>& a, int64_t heads) {
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t p = 0; p < hd / 2; ++p) {
                    const double angle = t * std::pow(theta, -2.0 * p / hd);
                    double& re = a[(t * heads + h) * hd + 2 * p];
                    double& im = a[(t * heads + h) * hd + 2 * p + 1];
                    const double r = re * std::cos(angle) - im * std::sin(angle);
                    const double i = re * std::sin(angle) + im * std::cos(angle);
                    re = r;
                    im = i;
                }
    };
    rope(q, H);
    rope(k, KV);
    std::vector<double> heads(T * H * hd, 0.0);  // (T, H * hd)
    for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / KV);
        for (int64_t t = 0; t < T; ++t) {
            std::vector<double> s(t + 1);
            double mx = -1e300;
            for (int64_t u = 0; u <= t; ++u) {
                double dot = 0;
                for (int64_t d = 0; d < hd; ++d) dot += q[(t * H + h) * hd + d] * k[(u * KV + g) * hd + d];
                s[u] = dot / std::sqrt(static_cast<double>(hd));
                mx = std::max(mx, s[u]);
            }
            double z = 0;
            for (auto& e : s) z += (e = std::exp(e - mx));
            for (int64_t u = 0; u <= t; ++u)
                for (int64_t d = 0; d < hd; ++d) heads[t * H * hd + h * hd + d] += s[u] / z * v[(u * KV + g) * hd + d];
        }
    }
    std::vector<double> out(T * dim, 0.0);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < dim; ++o)
            for (int64_t i = 0; i < H * hd; ++i) out[t * dim + o] += heads[t * H * hd + i] * wo[o * H * hd + i];
    return out;
}

AttentionOptions attention_options(int64_t dim, int64_t heads, int64_t kv, uint64_t seed, Generator& gen,
                                   DType dtype = DType::F32) {
    (void)seed;
    AttentionOptions o;
    o.dim = dim;
    o.n_heads = heads;
    o.n_kv_heads = kv;
    o.dtype = dtype;
    o.generator = &gen;
    return o;
}

// gradcheck makes fresh leaves for its inputs, which a module's own parameter Vars cannot be
// swapped for; so the input goes through gradcheck and the parameters are checked here the same
// way: d sum(y * v) / d p against central differences, |a - n| <= atol + rtol |n|.
void check_parameter_grads(const std::function<Var()>& fn, const NamedVars& params, double eps = 1e-6,
                           double atol = 1e-5, double rtol = 1e-3) {
    Generator gen(99);
    const Var y = fn();
    const Tensor v = randn(y.shape(), gen, DType::F64);
    for (const auto& [name, p] : params) Var(p).zero_grad();
    sum(y * Var(v)).backward();
    NoGradGuard no_grad;
    for (const auto& [name, p] : params) {
        REQUIRE(p.data().is_contiguous());
        REQUIRE(p.grad().defined());
        const std::vector<double> analytic = p.grad().data().to_vector();
        double* data = p.data().data<double>();
        for (int64_t k = 0; k < p.numel(); ++k) {
            const double saved = data[k];
            data[k] = saved + eps;
            const double plus = sum(fn().data() * v).item();
            data[k] = saved - eps;
            const double minus = sum(fn().data() * v).item();
            data[k] = saved;
            const double numeric = (plus - minus) / (2 * eps);
            INFO(name << "[" << k << "]: analytic " << analytic[k] << " vs numeric " << numeric);
            REQUIRE(std::fabs(analytic[k] - numeric) <= atol + rtol * std::fabs(numeric));
        }
    }
}

TransformerOptions lm_options() {
    TransformerOptions o;
    o.vocab_size = 13;
    o.dim = 16;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.multiple_of = 8;
    o.max_seq_len = 16;
    o.seed = 42;
    return o;
}

}  // namespace

TEST_CASE("SwiGLU hidden size follows LLaMA's rule", "[transformer]") {
    CHECK(swiglu_hidden_dim(64, 8) == 48);          // int(128 / 3) = 42 -> 48
    CHECK(swiglu_hidden_dim(4 * 4096, 256) == 11008);  // LLaMA-7B
    CHECK(swiglu_hidden_dim(12, 1) == 8);
    CHECK(swiglu_hidden_dim(3, 4) == 4);
    REQUIRE_THROWS_WITH(swiglu_hidden_dim(8, 0), Catch::Contains("multiple_of must be > 0"));

    Generator gen(1);
    FeedForwardOptions o;
    o.dim = 6;
    o.hidden_dim = 24;
    o.multiple_of = 4;
    o.generator = &gen;
    FeedForward ff(o);
    std::vector<std::string> names;
    for (const auto& [name, p] : ff.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"w1.weight", "w2.weight", "w3.weight"});
    CHECK_FALSE(ff.has_parameter("w1.weight"));  // own params: none; they live in the children
}

TEST_CASE("FeedForward computes w2(silu(w1 x) * w3 x)", "[transformer]") {
    Generator gen(2);
    FeedForwardOptions o;
    o.dim = 5;
    o.hidden_dim = 12;
    o.multiple_of = 3;
    o.dtype = DType::F64;
    o.generator = &gen;
    FeedForward ff(o);
    REQUIRE(ff.hidden() == 9);
    const Tensor x = randn({2, 3, 5}, gen, DType::F64).transpose(0, 1);  // non-contiguous (3, 2, 5)
    const Var y = ff.forward(Var(x));
    REQUIRE(y.shape() == Shape{3, 2, 5});
    const std::vector<double> w1 = linear_child(ff, "w1")->weight().data().to_vector();
    const std::vector<double> w2 = linear_child(ff, "w2")->weight().data().to_vector();
    const std::vector<double> w3 = linear_child(ff, "w3")->weight().data().to_vector();
    std::vector<double> expected;
    for (int64_t r = 0; r < 6; ++r) {
        std::vector<double> row;
        for (int64_t i = 0; i < 5; ++i) row.push_back(x.at({r / 2, r % 2, i}));
        std::vector<double> g(9);
        for (int64_t h = 0; h < 9; ++h) {
            double a = 0, b = 0;
            for (int64_t i = 0; i < 5; ++i) {
                a += w1[h * 5 + i] * row[i];
                b += w3[h * 5 + i] * row[i];
            }
            g[h] = a / (1 + std::exp(-a)) * b;
        }
        for (int64_t o2 = 0; o2 < 5; ++o2) {
            double s = 0;
            for (int64_t h = 0; h < 9; ++h) s += w2[o2 * 9 + h] * g[h];
            expected.push_back(s);
        }
    }
    check_close(y, from_vector(expected, {3, 2, 5}, DType::F64), 1e-12, 1e-12, "swiglu");
}

TEST_CASE("RoPE rotates interleaved pairs, scores depend only on relative position", "[transformer]") {
    Generator gen(3);
    const int64_t B = 2, T = 5, H = 3, hd = 6;
    SECTION("against an f64 loop, on a non-contiguous input") {
        const Tensor x = randn({T, B, H, hd}, gen, DType::F64).transpose(0, 1);  // (B, T, H, hd) view
        const RopeTables tables = rope_tables(hd, T + 3, 500.0, DType::F64);     // extra rows are ignored
        const Var y = apply_rope(Var(x), tables);
        std::vector<double> expected;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < H; ++h)
                    for (int64_t i = 0; i < hd; ++i) {
                        const int64_t p = i / 2;
                        const double angle = t * std::pow(500.0, -2.0 * p / hd);
                        const double re = x.at({b, t, h, 2 * p}), im = x.at({b, t, h, 2 * p + 1});
                        expected.push_back(i % 2 == 0 ? re * std::cos(angle) - im * std::sin(angle)
                                                      : re * std::sin(angle) + im * std::cos(angle));
                    }
        check_close(y, from_vector(expected, {B, T, H, hd}, DType::F64), 1e-13, 1e-12, "rope");
    }
    SECTION("q.k after RoPE is invariant to shifting both positions") {
        const int64_t len = 12;
        const RopeTables tables = rope_tables(hd, len, 10000.0, DType::F64);
        const Tensor q = randn({hd}, gen, DType::F64), k = randn({hd}, gen, DType::F64);
        // Place q at position 2 and k at 5, then q at 6 and k at 9 (same offset).
        auto score = [&](int64_t tq, int64_t tk) {
            Tensor xq = zeros({1, len, 1, hd}, DType::F64), xk = zeros({1, len, 1, hd}, DType::F64);
            xq.select(1, tq).select(1, 0).copy_(q);
            xk.select(1, tk).select(1, 0).copy_(k);
            const Tensor rq = apply_rope(Var(xq), tables).data().select(1, tq).select(1, 0);
            const Tensor rk = apply_rope(Var(xk), tables).data().select(1, tk).select(1, 0);
            return sum(rq * rk).item();
        };
        CHECK(score(2, 5) == Approx(score(6, 9)).epsilon(1e-12));
        CHECK(score(0, 0) == Approx(sum(q * k).item()).epsilon(1e-12));  // position 0: identity
        CHECK(std::fabs(score(2, 5) - score(2, 7)) > 1e-6);
    }
    SECTION("tables: f32 as LLaMA, errors") {
        const RopeTables t32 = rope_tables(8, 4, 10000.0);
        CHECK(t32.cos.dtype() == DType::F32);
        CHECK(t32.cos.shape() == Shape{4, 4});
        CHECK(t32.cos.at({0, 3}) == 1.0);
        CHECK(t32.sin.at({3, 0}) == Approx(std::sin(3.0)));
        REQUIRE_THROWS_WITH(rope_tables(7, 4, 10000.0), Catch::Contains("head_dim must be even"));
        REQUIRE_THROWS_WITH(apply_rope(Var(zeros({1, 5, 1, 8})), t32), Catch::Contains("tables must be (>= 5, 4)"));
        REQUIRE_THROWS_WITH(apply_rope(Var(zeros({1, 2, 1, 8}, DType::F64)), t32), Catch::Contains("needs f64 tables"));
    }
}

TEST_CASE("attention matches an f64 reference loop (MHA, GQA, MQA)", "[transformer]") {
    const int64_t kv = GENERATE(4, 2, 1);
    INFO("n_kv_heads " << kv);
    Generator gen(4);
    const int64_t dim = 16, H = 4, T = 6;
    AttentionOptions o = attention_options(dim, H, kv, 4, gen, DType::F64);
    o.rope_theta = 100.0;
    Attention attn(o);
    CHECK(linear_child(attn, "wk")->weight().shape() == Shape{kv * 4, dim});
    CHECK(linear_child(attn, "wv")->weight().shape() == Shape{kv * 4, dim});
    CHECK(linear_child(attn, "wq")->weight().shape() == Shape{dim, dim});
    CHECK(linear_child(attn, "wo")->weight().shape() == Shape{dim, dim});
    const Tensor x = randn({2, T, dim}, gen, DType::F64);
    const Var y = attn.forward(Var(x));
    REQUIRE(y.shape() == Shape{2, T, dim});
    auto w = [&](const char* name) { return linear_child(attn, name)->weight().data().to_vector(); };
    for (int64_t b = 0; b < 2; ++b) {
        const std::vector<double> ref =
            reference_attention(x.select(0, b).to_vector(), T, dim, H, kv, w("wq"), w("wk"), w("wv"), w("wo"), 100.0);
        check_close(y.data().select(0, b), from_vector(ref, {T, dim}, DType::F64), 1e-12, 1e-10, "attention");
    }
}

TEST_CASE("grouped-query attention equals MHA with each kv head repeated", "[transformer]") {
    Generator gen(5);
    const int64_t dim = 12, H = 6, KV = 2, hd = 2, rep = H / KV;
    Attention gqa(attention_options(dim, H, KV, 5, gen));
    Attention mha(attention_options(dim, H, 0, 5, gen));
    CHECK(mha.n_kv_heads() == H);
    for (const char* name : {"wq", "wo"})
        linear_child(mha, name)->weight().data().copy_(linear_child(gqa, name)->weight().data());
    for (const char* name : {"wk", "wv"}) {
        const Tensor small = linear_child(gqa, name)->weight().data();  // (KV * hd, dim)
        Tensor big = linear_child(mha, name)->weight().data();          // (H * hd, dim)
        for (int64_t h = 0; h < H; ++h) big.narrow(0, h * hd, hd).copy_(small.narrow(0, (h / rep) * hd, hd));
    }
    const Var x(randn({3, 4, dim}, gen));
    check_close(gqa.forward(x), mha.forward(x).data(), 1e-6, 1e-5, "gqa vs repeated mha");
    AttentionOptions bad = attention_options(dim, H, 4, 5, gen);
    REQUIRE_THROWS_WITH(Attention(bad), Catch::Contains("n_kv_heads (4) must be > 0 and divide n_heads (6)"));
    bad = attention_options(dim, 4, 0, 5, gen);  // head dim 3: odd
    REQUIRE_THROWS_WITH(Attention(bad), Catch::Contains("must be even for RoPE"));
    REQUIRE_THROWS_WITH(gqa.forward(Var(zeros({2, 3, 5}))), Catch::Contains("expected x of shape (B, T, 12)"));
}

TEST_CASE("attention alone has no context bound unless given one, and a Transformer passes its own", "[transformer]") {
    Generator gen(3);
    AttentionOptions o = attention_options(8, 2, 0, 6, gen);
    const AttentionOptions attention_defaults;
    const TransformerBlockOptions block_defaults;
    CHECK(attention_defaults.max_seq_len == 0);
    CHECK(block_defaults.max_seq_len == 0);
    o.max_seq_len = 0;
    Attention unbounded(o);
    CHECK(unbounded.forward(Var(randn({1, 300, 8}, gen))).data().size(1) == 300);
    o.max_seq_len = 5;
    Attention bounded(o);
    REQUIRE_THROWS_WITH(bounded.forward(Var(randn({1, 6, 8}, gen))), Catch::Contains("sequence length 6 exceeds max_seq_len 5"));
    o.max_seq_len = -1;
    REQUIRE_THROWS_WITH(Attention(o), Catch::Contains("max_seq_len must be >= 0 (0: no bound), found -1"));
}

TEST_CASE("attention is causal: a future token never changes earlier outputs", "[transformer]") {
    Generator gen(6);
    Attention attn(attention_options(8, 2, 1, 6, gen));
    const int64_t T = 7, cut = 4;
    Tensor x = randn({2, T, 8}, gen);
    const Tensor y1 = attn.forward(Var(x)).data();
    Tensor x2 = x.clone();
    x2.narrow(1, cut, T - cut).copy_(randn({2, T - cut, 8}, gen) * 5.0);
    const Tensor y2 = attn.forward(Var(x2)).data();
    CHECK(max_abs_diff(y1.narrow(1, 0, cut), y2.narrow(1, 0, cut)) == 0.0);
    CHECK(max_abs_diff(y1.narrow(1, cut, T - cut), y2.narrow(1, cut, T - cut)) > 1e-3);
    // And the language model: logits before the changed token are unchanged.
    TransformerOptions o = lm_options();
    Transformer lm(o);
    NoGradGuard no_grad;
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
    const Tensor ids2 = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 12, 0, 11}, {1, 8});
    const Tensor l1 = lm.forward(ids).data(), l2 = lm.forward(ids2).data();
    CHECK(max_abs_diff(l1.narrow(1, 0, 5), l2.narrow(1, 0, 5)) == 0.0);
    CHECK(max_abs_diff(l1.narrow(1, 5, 3), l2.narrow(1, 5, 3)) > 1e-4);
}

TEST_CASE("gradcheck: tiny attention and pre-/post-norm blocks in f64", "[transformer]") {
    Generator gen(7);
    SECTION("attention, grouped-query") {
        Attention attn(attention_options(4, 2, 1, 7, gen, DType::F64));
        const Var x(randn({1, 3, 4}, gen, DType::F64), true);
        const GradcheckResult r = gradcheck([&](const std::vector<Var>& in) { return attn.forward(in[0]); }, {x});
        INFO(r.message);
        CHECK(r.ok);
        check_parameter_grads([&] { return attn.forward(x); }, attn.named_parameters());
    }
    SECTION("blocks") {
        const bool pre = GENERATE(true, false);
        const std::string norm = GENERATE(std::string("rmsnorm"), std::string("layernorm"));
        const bool fused = GENERATE(true, false);
        INFO((pre ? "pre-norm " : "post-norm ") << norm << (fused ? " fused" : " composed"));
        TransformerBlockOptions o;
        o.dim = 4;
        o.n_heads = 2;
        o.n_kv_heads = 1;
        o.multiple_of = 2;
        o.norm.type = norm;
        o.norm.fused = fused;
        o.norm_placement = pre ? "pre" : "post";
        o.dtype = DType::F64;
        o.generator = &gen;
        TransformerBlock block(o);
        nl::test::randomize_parameters(block, gen);
        const Var x(randn({2, 3, 4}, gen, DType::F64), true);
        const GradcheckResult r = gradcheck([&](const std::vector<Var>& in) { return block.forward(in[0]); }, {x});
        INFO(r.message);
        CHECK(r.ok);
        check_parameter_grads([&] { return block.forward(x); }, block.named_parameters());
    }
}

TEST_CASE("post-norm block: norm after each residual", "[transformer]") {
    Generator gen(8);
    TransformerBlockOptions o;
    o.dim = 8;
    o.n_heads = 2;
    o.multiple_of = 4;
    o.norm.type = "layernorm";
    o.norm_placement = "post";
    o.generator = &gen;
    TransformerBlock block(o);
    nl::test::randomize_parameters(block, gen);
    const Var x(randn({2, 5, 8}, gen));
    const Var h = block.attention_norm()->forward(x + block.attention()->forward(x));
    const Var expected = block.ffn_norm()->forward(h + block.feed_forward()->forward(h));
    CHECK(max_abs_diff(block.forward(x).data(), expected.data()) == 0.0);
    // Post-norm output rows are normalized (LayerNorm with weight w, bias b): not so for pre-norm.
    CHECK(block.attention_norm()->type_name() == "LayerNorm");
    std::vector<std::string> names;
    for (const auto& [name, p] : block.named_parameters()) names.push_back(name);
    CHECK(names.front() == "attention.wq.weight");
    CHECK(names.back() == "ffn_norm.bias");
}

TEST_CASE("Transformer LM: LLaMA names, parameter count, shapes, seeds and errors", "[transformer]") {
    TransformerOptions o = lm_options();
    Transformer lm(o);
    const NamedVars params = lm.named_parameters();
    std::vector<std::string> names;
    for (const auto& [name, p] : params) names.push_back(name);
    const std::vector<std::string> first = {"tok_embeddings.weight",         "layers.0.attention.wq.weight",
                                            "layers.0.attention.wk.weight",  "layers.0.attention.wv.weight",
                                            "layers.0.attention.wo.weight",  "layers.0.feed_forward.w1.weight",
                                            "layers.0.feed_forward.w2.weight", "layers.0.feed_forward.w3.weight",
                                            "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight"};
    REQUIRE(names.size() == 1 + 9 * 2 + 2);
    CHECK(std::vector<std::string>(names.begin(), names.begin() + 10) == first);
    CHECK(names[names.size() - 2] == "norm.weight");
    CHECK(names.back() == "output.weight");
    CHECK_FALSE(lm.has_parameter("output.weight"));  // lives in the child

    const int64_t V = 13, d = 16, hd = 4, H = 4, KV = 2, hidden = swiglu_hidden_dim(4 * d, 8);
    CHECK(hidden == 48);
    const int64_t per_layer = d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * hidden + 2 * d;
    CHECK(count_parameters(lm) == V * d + 2 * per_layer + d + V * d);
    CHECK(count_parameters(lm, false) == 2 * per_layer + d + V * d);
    CHECK(count_parameters(lm) == lm.num_parameters());

    const Tensor ids = from_vector(std::vector<int64_t>{0, 5, 12, 3, 3, 7, 1, 2}, {2, 4});
    const Var logits = lm.forward(ids);
    CHECK(logits.shape() == Shape{2, 4, V});

    Transformer same(o);
    CHECK(max_abs_diff(same.forward(ids).data(), logits.data()) == 0.0);  // same seed, same model
    o.seed = 43;
    Transformer other(o);
    CHECK(max_abs_diff(other.forward(ids).data(), logits.data()) > 1e-3);

    REQUIRE_THROWS_WITH(lm.forward(ids.to(DType::F32)), Catch::Contains("expected i64 ids, found f32"));
    REQUIRE_THROWS_WITH(lm.forward(zeros({1, 17}, DType::I64)), Catch::Contains("exceeds max_seq_len 16"));
    REQUIRE_THROWS_WITH(lm.forward(zeros({4}, DType::I64)), Catch::Contains("expected ids of shape (B, T)"));
    REQUIRE_THROWS_WITH(lm.forward(from_vector(std::vector<int64_t>{13}, {1, 1})),
                        Catch::Contains("embedding: id 13 is out of range for 13 embeddings"));
    TransformerOptions bad = lm_options();
    bad.n_kv_heads = 3;
    REQUIRE_THROWS_WITH(Transformer(bad), Catch::Contains("n_kv_heads (3)"));
    bad = lm_options();
    bad.vocab_size = 0;
    REQUIRE_THROWS_WITH(Transformer(bad), Catch::Contains("vocab_size must be > 0"));
}

TEST_CASE("Transformer LM learns a tiny sequence (pre-norm RMSNorm and post-norm LayerNorm)", "[transformer]") {
    const bool pre = GENERATE(true, false);
    INFO((pre ? "pre-norm rmsnorm" : "post-norm layernorm"));
    TransformerOptions o = lm_options();
    o.norm_placement = pre ? "pre" : "post";
    o.norm.type = pre ? "rmsnorm" : "layernorm";
    Transformer lm(o);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
    const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9}, {1, 8});
    AdamOptions ao;
    ao.lr = 1e-2;
    Adam opt(lm.named_parameters(), ao);
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
        opt.zero_grad();
        Var loss = cross_entropy_loss(lm.forward(ids), targets);
        if (step == 0) first = loss.item();
        last = loss.item();
        loss.backward();
        opt.step();
    }
    CHECK(last < 0.2 * first);
}

TEST_CASE("Transformer LM runs in bf16 (softmax and RoPE in f32) close to f32", "[transformer]") {
    TransformerOptions o = lm_options();
    Transformer f32(o);
    Transformer bf16(o);
    bf16.to(DType::BF16);
    const Tensor ids = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
    NoGradGuard no_grad;
    const Var a = f32.forward(ids), b = bf16.forward(ids);
    REQUIRE(b.dtype() == DType::BF16);
    // bf16 keeps 8 bits of mantissa: ~0.4% per rounding, a few dozen roundings deep. The logits here
    // differ by at most ~7e-3; 2e-2 leaves room for that, not for a wrong op.
    check_close(b.data().to(DType::F32), a.data(), 0.02, 0.0, "bf16 logits");
}

TEST_CASE("Transformer with QK-norm moved to f64 and bf16 with to() runs its QK-norms in the new dtype", "[transformer]") {
    for (const std::string qk : {"head", "full"}) {
        INFO("qk_norm " << qk);
        TransformerOptions o = lm_options();
        o.qk_norm = qk;
        Transformer f32(o), f64(o), bf16(o);
        f64.to(DType::F64);
        bf16.to(DType::BF16);
        const Tensor ids = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
        NoGradGuard no_grad;
        const Var a = f32.forward(ids), b = f64.forward(ids), c = bf16.forward(ids);
        REQUIRE(b.dtype() == DType::F64);
        REQUIRE(c.dtype() == DType::BF16);
        check_close(b.data().to(DType::F32), a.data(), 1e-5, 1e-5, "f64 logits");
        check_close(c.data().to(DType::F32), a.data(), 0.05, 0.0, "bf16 logits");
    }
}
