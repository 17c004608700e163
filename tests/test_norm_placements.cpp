// The stability-research knobs of the transformer: each norm placement's block against its formula
// composed by hand from the block's children, the parameter names each placement has, Mix-LN's
// split, DeepNorm's alpha and init, LayerNorm Scaling, QK-norm (head and full, with the KV cache), the
// probes against a direct recomputation, and the config's one-line errors for each new key (read_train_config
// and the normlab program).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "autograd/gradcheck.h"
#include "cli_test_util.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "jobs/probes.h"
#include "jobs/train.h"
#include "jobs/train_config.h"
#include "layers/transformer.h"
#include "layers_test_util.h"
#include "test_util.h"

using namespace nl;
using nl::test::check_close;

namespace {

TransformerBlockOptions block_options(const std::string& placement, Generator& gen) {
    TransformerBlockOptions o;
    o.dim = 8;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.multiple_of = 4;
    o.norm.type = "layernorm";
    o.norm_placement = placement;
    o.dtype = DType::F64;
    o.generator = &gen;
    return o;
}

std::vector<std::string> parameter_names(Module& m) {
    std::vector<std::string> names;
    for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
    return names;
}

bool has_name(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

Var norm_of(TransformerBlock& block, const char* name, const Var& x) {
    return std::dynamic_pointer_cast<UnaryModule>(block.child(name))->forward(x);
}

}  // namespace

TEST_CASE("norm placements: each block is its formula over its children", "[transformer][placement]") {
    const std::string placement = GENERATE(as<std::string>{}, "pre", "post", "peri", "output", "deepnorm", "none");
    INFO("placement " << placement);
    Generator gen(3);
    TransformerBlockOptions o = block_options(placement, gen);
    if (placement == "deepnorm") o.deepnorm_alpha = 1.7;
    TransformerBlock block(o);
    nl::test::randomize_parameters(block, gen);
    const Var x(randn({2, 5, 8}, gen, DType::F64));
    auto f = [&](const Var& in) { return block.attention()->forward(in); };
    auto g = [&](const Var& in) { return block.feed_forward()->forward(in); };
    Var expected;
    if (placement == "pre") {
        const Var h = x + f(norm_of(block, "attention_norm", x));
        expected = h + g(norm_of(block, "ffn_norm", h));
    } else if (placement == "post") {
        const Var h = norm_of(block, "attention_norm", x + f(x));
        expected = norm_of(block, "ffn_norm", h + g(h));
    } else if (placement == "peri") {
        const Var h = x + norm_of(block, "attention_out_norm", f(norm_of(block, "attention_norm", x)));
        expected = h + norm_of(block, "ffn_out_norm", g(norm_of(block, "ffn_norm", h)));
    } else if (placement == "output") {
        const Var h = x + norm_of(block, "attention_out_norm", f(x));
        expected = h + norm_of(block, "ffn_out_norm", g(h));
    } else if (placement == "deepnorm") {
        const Var h = norm_of(block, "attention_norm", x * 1.7 + f(x));
        expected = norm_of(block, "ffn_norm", h * 1.7 + g(h));
    } else {
        const Var h = x + f(x);
        expected = h + g(h);
    }
    CHECK(max_abs_diff(block.forward(x).data(), expected.data()) == 0.0);

    const std::vector<std::string> names = parameter_names(block);
    const bool main_norms = placement != "output" && placement != "none";
    const bool output_norms = placement == "peri" || placement == "output";
    CHECK(has_name(names, "attention_norm.weight") == main_norms);
    CHECK(has_name(names, "ffn_norm.bias") == main_norms);
    CHECK(has_name(names, "attention_out_norm.weight") == output_norms);
    CHECK(has_name(names, "ffn_out_norm.weight") == output_norms);

    // f64 gradients of the block and its parameters against finite differences.
    const Var xg(randn({1, 3, 8}, gen, DType::F64), true);
    const GradcheckResult r = gradcheck([&](const std::vector<Var>& in) { return block.forward(in[0]); }, {xg});
    INFO(r.message);
    CHECK(r.ok);
}

TEST_CASE("norm placements: the model's blocks, final norm, Mix-LN split, DeepNorm and depth scaling",
          "[transformer][placement]") {
    TransformerOptions o;
    o.vocab_size = 11;
    o.dim = 8;
    o.n_layers = 7;
    o.n_heads = 2;
    o.multiple_of = 4;
    o.dtype = DType::F64;

    SECTION("mix: the first ceil(mix_fraction * n_layers) blocks are post, the rest pre") {
        o.norm_placement = "mix";
        o.mix_fraction = 0.25;  // ceil(1.75) = 2
        Transformer model(o);
        for (int64_t i = 0; i < 7; ++i) CHECK(model.layer(i)->options().norm_placement == (i < 2 ? "post" : "pre"));
        o.mix_fraction = 1.0;
        Transformer all_post(o);
        CHECK(all_post.layer(6)->options().norm_placement == "post");
    }
    SECTION("none: no norm in the blocks and no final norm") {
        o.norm_placement = "none";
        Transformer model(o);
        for (const std::string& name : parameter_names(model)) CHECK(name.find("norm") == std::string::npos);
        const Var logits = model.forward(from_vector(std::vector<int64_t>{1, 2, 3}, {1, 3}));
        CHECK(logits.shape() == Shape{1, 3, 11});
    }
    SECTION("deepnorm: alpha (2N)^(1/4), and wv, wo, w1, w2, w3 are the same seed's weights times (8N)^(-1/4)") {
        Transformer pre(o);
        o.norm_placement = "deepnorm";
        Transformer deep(o);
        CHECK(deep.layer(0)->options().deepnorm_alpha == Approx(std::pow(14.0, 0.25)).epsilon(1e-15));
        const double beta = std::pow(56.0, -0.25);
        std::map<std::string, Tensor> reference;
        for (const auto& [name, p] : pre.named_parameters()) reference[name] = p.data();
        for (const auto& [name, p] : deep.named_parameters()) {
            INFO(name);
            const bool scaled = name.find(".wv.") != std::string::npos || name.find(".wo.") != std::string::npos ||
                                name.find(".w1.") != std::string::npos || name.find(".w2.") != std::string::npos ||
                                name.find(".w3.") != std::string::npos;
            const Tensor expected = scaled ? reference[name] * beta : reference[name];
            CHECK(max_abs_diff(p.data(), expected) == 0.0);
        }
    }
    SECTION("depth scaling: the l-th block's pre-norms times 1 / sqrt(l)") {
        o.norm_scaling = "depth";
        o.norm_placement = "peri";
        Transformer model(o);
        for (int64_t i = 0; i < 7; ++i)
            CHECK(model.layer(i)->options().pre_norm_scale == 1.0 / std::sqrt(static_cast<double>(i + 1)));
        Generator gen(5);
        TransformerBlock& block = *model.layer(3);
        const Var x(randn({1, 4, 8}, gen, DType::F64));
        const double s = 0.5;  // 1 / sqrt(4)
        const Var h = x + norm_of(block, "attention_out_norm", block.attention()->forward(norm_of(block, "attention_norm", x) * s));
        const Var expected = h + norm_of(block, "ffn_out_norm", block.feed_forward()->forward(norm_of(block, "ffn_norm", h) * s));
        CHECK(max_abs_diff(block.forward(x).data(), expected.data()) < 1e-15);
    }
    SECTION("choices that do not go together are errors naming the field") {
        o.norm_placement = "sandwich";
        CHECK_THROWS_WITH(Transformer(o), Catch::Contains("norm_placement must be one of pre, post, peri"));
        o.norm_placement = "deepnorm";
        o.n_layers = 0;
        CHECK_THROWS_WITH(Transformer(o), Catch::Contains("needs n_layers > 0"));
        o.n_layers = 2;
        o.norm_placement = "post";
        o.norm_scaling = "depth";
        CHECK_THROWS_WITH(Transformer(o), Catch::Contains("norm_scaling \"depth\" scales pre-norms"));
        o.norm_scaling = "none";
        o.qk_norm = "head";
        o.norm.type = "scalenorm";
        CHECK_THROWS_WITH(Transformer(o), Catch::Contains("needs norm type rmsnorm or layernorm, found \"scalenorm\""));
        o.norm.type = "rmsnorm";
        o.attn_softcap = -1.0;
        CHECK_THROWS_WITH(Transformer(o), Catch::Contains("attn_softcap must be finite and >= 0"));
    }
}

TEST_CASE("QK-norm: head and full norms before RoPE, the same through the KV cache", "[transformer][qk_norm]") {
    const std::string mode = GENERATE(as<std::string>{}, "head", "full");
    const std::string type = GENERATE(as<std::string>{}, "rmsnorm", "layernorm");
    INFO(mode << " " << type);
    Generator gen(9);
    AttentionOptions o;
    o.dim = 16;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.qk_norm = mode;
    o.qk_norm_options.type = type;
    o.dtype = DType::F64;
    o.generator = &gen;
    Attention attention(o);
    nl::test::randomize_parameters(attention, gen);
    const int64_t hd = 4, per_q = mode == "head" ? hd : 16, per_k = mode == "head" ? hd : 8;
    auto q_norm = std::dynamic_pointer_cast<Norm>(attention.child("q_norm"));
    auto k_norm = std::dynamic_pointer_cast<Norm>(attention.child("k_norm"));
    CHECK(q_norm->dim() == per_q);
    CHECK(k_norm->dim() == per_k);
    CHECK(q_norm->options().type == type);

    // By hand: project, normalize (per head after the reshape, or the whole row before it), rotate.
    const int64_t B = 2, T = 5;
    const Var x(randn({B, T, 16}, gen, DType::F64));
    const RopeTables tables = attention.rope(T, DType::F64);
    auto lin = [&](const char* name, const Var& in) {
        return std::dynamic_pointer_cast<UnaryModule>(attention.child(name))->forward(in);
    };
    Var q = lin("wq", x), k = lin("wk", x);
    if (mode == "full") {
        q = q_norm->forward(q);
        k = k_norm->forward(k);
    }
    q = reshape(q, {B, T, 4, hd});
    k = reshape(k, {B, T, 2, hd});
    if (mode == "head") {
        q = q_norm->forward(q);
        k = k_norm->forward(k);
    }
    q = apply_rope(q, tables);
    k = apply_rope(k, tables);
    const Var v = reshape(lin("wv", x), {B, T, 2, hd});
    const Var expected = lin("wo", reshape(causal_attention(q, k, v, false), {B, T, 16}));
    check_close(attention.forward(x).data(), expected.data(), 1e-12, 1e-12, "forward");

    // The KV cache path (generation) normalizes each new position the same way.
    NoGradGuard no_grad;
    KVSlot slot{zeros({B, T, 2, hd}, DType::F64), zeros({B, T, 2, hd}, DType::F64), 0};
    const Var first = attention.forward_cached(Var(x.data().narrow(1, 0, 3).contiguous()), slot);
    slot.start = 3;
    const Var rest = attention.forward_cached(Var(x.data().narrow(1, 3, 2).contiguous()), slot);
    check_close(rest.data(), expected.data().narrow(1, 3, 2).contiguous(), 1e-12, 1e-12, "cached, positions 3..4");
    check_close(first.data(), expected.data().narrow(1, 0, 3).contiguous(), 1e-12, 1e-12, "cached, positions 0..2");
}

TEST_CASE("probes: the attention and residual-stream probes against loops over the model's tensors",
          "[transformer][probes]") {
    const double cap = GENERATE(0.0, 0.7);  // off, and a soft-cap that bends these scores
    TransformerOptions o;
    o.vocab_size = 13;
    o.dim = 8;
    o.n_layers = 2;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.multiple_of = 4;
    o.qk_norm = "head";
    o.attn_softcap = cap;
    o.dtype = DType::F64;
    Transformer model(o);
    Generator gen(4);
    nl::test::randomize_parameters(model, gen);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 5, 2, 7, 3, 11, 0, 4}, {2, 4});
    model.set_probing(true);
    const Var logits = model.forward(ids);
    const Transformer::Probes probes = model.last_probes();
    model.set_probing(false);
    REQUIRE(probes.attention.size() == 2);
    REQUIRE(probes.residual.size() == 2);

    // Block by block: q, k as the attention builds them, then every causal score q_i . k_j / sqrt(hd),
    // the row's softmax of the (capped) scores, its entropy and its weight on key 0, in plain loops;
    // then the residual stream's RMS, max and channel kurtosis.
    Var h = std::dynamic_pointer_cast<Embedding>(model.child("tok_embeddings"))->forward(ids);
    for (int64_t l = 0; l < 2; ++l) {
        INFO("block " << l << ", soft-cap " << cap);
        TransformerBlock& block = *model.layer(l);
        Attention& attention = *block.attention();
        const Var in = block.attention_norm()->forward(h);
        auto lin = [&](const char* name) { return std::dynamic_pointer_cast<UnaryModule>(attention.child(name))->forward(in); };
        const RopeTables tables = attention.rope(4, DType::F64);
        auto norm = [&](const char* name, const Var& x) {
            return std::dynamic_pointer_cast<UnaryModule>(attention.child(name))->forward(x);
        };
        const Tensor q = apply_rope(norm("q_norm", reshape(lin("wq"), {2, 4, 2, 4})), tables).data();
        const Tensor k = apply_rope(norm("k_norm", reshape(lin("wk"), {2, 4, 1, 4})), tables).data();
        double largest = 0.0, entropy = 0.0, sink = 0.0;
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t head = 0; head < 2; ++head)
                for (int64_t i = 0; i < 4; ++i) {
                    std::vector<double> p;
                    for (int64_t j = 0; j <= i; ++j) {
                        double dot = 0.0;
                        for (int64_t d = 0; d < 4; ++d) dot += q.at({b, i, head, d}) * k.at({b, j, 0, d});
                        largest = std::max(largest, std::abs(dot) / 2.0);
                        p.push_back(std::exp(cap > 0.0 ? cap * std::tanh(dot / 2.0 / cap) : dot / 2.0));
                    }
                    double total = 0.0;
                    for (double e : p) total += e;
                    for (double& e : p) e /= total;
                    for (double e : p) entropy -= e * std::log(e);
                    if (i >= 1) sink += p[0];
                }
        CHECK(probes.attention[l].max_score == Approx(largest).epsilon(1e-12));
        CHECK(probes.attention[l].entropy == Approx(entropy / 16.0).epsilon(1e-12));  // 2 x 2 heads x 4 rows
        CHECK(probes.attention[l].sink == Approx(sink / 12.0).epsilon(1e-12));        // rows at positions 1..3
        CHECK(probes.attention[l].entropy > 0.0);
        h = block.forward(h);
        const std::vector<double> values = h.data().to_vector();  // (2, 4, 8)
        double squares = 0.0, largest_abs = 0.0;
        std::vector<double> channel(8, 0.0);  // sum over the 8 rows of h_j^2
        for (size_t e = 0; e < values.size(); ++e) {
            squares += values[e] * values[e];
            largest_abs = std::max(largest_abs, std::abs(values[e]));
            channel[e % 8] += values[e] * values[e];
        }
        double m2 = 0.0, m4 = 0.0;  // mean over channels of s_j^2 and s_j^4
        for (double c : channel) {
            m2 += c / 8.0 / 8.0;
            m4 += (c / 8.0) * (c / 8.0) / 8.0;
        }
        CHECK(probes.residual[l].rms == Approx(std::sqrt(squares / 64.0)).epsilon(1e-12));
        CHECK(probes.residual[l].max_abs == Approx(largest_abs).epsilon(1e-12));
        CHECK(probes.residual[l].kurtosis == Approx(m4 / (m2 * m2)).epsilon(1e-12));
        CHECK(probes.residual[l].kurtosis >= 1.0);  // mean(s^4) >= mean(s^2)^2
    }
    // The output rows' logsumexp.
    double lse_sum = 0.0, lse_max = -1e300;
    const std::vector<double> l = logits.data().to_vector();
    for (size_t row = 0; row < 8; ++row) {
        double m = -1e300, s = 0.0;
        for (size_t c = 0; c < 13; ++c) m = std::max(m, l[row * 13 + c]);
        for (size_t c = 0; c < 13; ++c) s += std::exp(l[row * 13 + c] - m);
        lse_sum += m + std::log(s);
        lse_max = std::max(lse_max, m + std::log(s));
    }
    CHECK(probes.logsumexp_mean == Approx(lse_sum / 8.0).epsilon(1e-12));
    CHECK(probes.logsumexp_max == Approx(lse_max).epsilon(1e-12));
}

namespace {

nlohmann::json probe_config() {
    return {{"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 4}, {"eval_sequences", 32}}},
            {"model", {{"dim", 16}, {"n_layers", 2}, {"n_heads", 2}, {"max_seq_len", 16}, {"qk_norm", "head"}}},
            {"optim", {{"warmup_steps", 1}, {"grad_clip", 0.0}}},
            {"train", {{"steps", 3}, {"batch_size", 8}, {"eval_every", 0}, {"probe_every", 2}}}};
}

std::vector<std::string> csv_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

}  // namespace

TEST_CASE("probes: train writes probes.csv every probe_every steps, and the update ratio is the weights' change",
          "[train][probes]") {
    nl_test::TempDir dir("probes");
    TrainJob job;
    job.config = probe_config();
    job.config_name = "probes";
    job.out = dir / "run";
    TrainSession session(job);
    std::map<std::string, Tensor> before;
    std::vector<TrainStep> steps;
    while (!session.done()) {
        if (session.step() == 1)
            for (const auto& [name, p] : session.model().named_parameters()) before[name] = p.data().clone();
        steps.push_back(session.run_step());
    }
    session.finish();
    CHECK(steps[0].probes.empty());
    CHECK(steps[2].probes.empty());
    REQUIRE(!steps[1].probes.empty());
    const std::vector<std::string> columns = probe_columns(session.model());
    REQUIRE(steps[1].probes.size() == columns.size());
    std::map<std::string, double> row;
    for (size_t i = 0; i < columns.size(); ++i) {
        CHECK(steps[1].probes[i].first == columns[i]);
        row[columns[i]] = steps[1].probes[i].second;
    }
    CHECK(row.count("attn_score_max.block1") == 1);
    CHECK(row.count("grad_rms.layers.0.attention.q_norm.weight") == 1);
    CHECK(row["residual_rms.block0"] > 0.0);
    CHECK(std::isfinite(row["logsumexp_mean"]));
    CHECK(row["logsumexp_max"] >= row["logsumexp_mean"]);
    for (const char* block : {"block0", "block1"}) {
        INFO(block);
        const std::string b = block;
        CHECK(row["act_max." + b] >= row["residual_rms." + b]);
        CHECK(row["act_kurtosis." + b] >= 1.0);
        CHECK(row["attn_entropy." + b] > 0.0);
        CHECK(row["attn_sink." + b] > 0.0);
        CHECK(row["attn_sink." + b] < 1.0);
    }
    // Every norm once, by its module name, in named_modules order: each block's QK-norms (inside its
    // attention), attention and ffn norms, then the final norm.
    std::vector<std::string> norms;
    for (const std::string& c : columns)
        if (c.rfind("norm_input_rms.", 0) == 0) norms.push_back(c.substr(15));
    CHECK(norms == std::vector<std::string>{"layers.0.attention.q_norm", "layers.0.attention.k_norm",
                                            "layers.0.attention_norm", "layers.0.ffn_norm",
                                            "layers.1.attention.q_norm", "layers.1.attention.k_norm",
                                            "layers.1.attention_norm", "layers.1.ffn_norm", "norm"});
    for (const std::string& n : norms) CHECK(row["norm_input_rms." + n] > 0.0);

    // probes.csv: a header and the one probed step's row.
    const std::vector<std::string> lines = csv_lines(dir / "run/probes.csv");
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].rfind("step,attn_score_max.block0,residual_rms.block0,", 0) == 0);
    CHECK(lines[1].rfind("2,", 0) == 0);

    // The update ratio of step 2 from the weights: the checkpoint at step 3 is past it, so recompute
    // from the copy taken before step 2 and the weights after it (the model after step 2 is the
    // checkpoint's after one more step: rerun 2 steps to get them).
    TrainJob two = job;
    two.out = dir / "two";
    two.config["train"]["steps"] = 2;
    TrainSession again(two);
    while (!again.done()) again.run_step();
    for (const auto& [name, p] : again.model().named_parameters()) {
        INFO(name);
        const Tensor old = before[name].to(DType::F64);
        const double change = std::sqrt(sum_of_squares(p.data().to(DType::F64) - old).item());
        const double size = std::sqrt(sum_of_squares(old).item());
        if (size > 0.0) CHECK(row["update_ratio." + name] == Approx(change / size).epsilon(1e-9));
    }
    again.finish();
}

TEST_CASE("config: the stability keys' errors name the key, what was expected and what was found", "[config][placement]") {
    auto fails_with = [](nlohmann::json model, nlohmann::json train, const std::string& expected) {
        nlohmann::json config = probe_config();
        for (auto& [k, v] : model.items()) config["model"][k] = v;
        for (auto& [k, v] : train.items()) config["train"][k] = v;
        INFO(config.dump());
        CHECK_THROWS_WITH(read_train_config(config, "c.json"), Catch::Contains(expected));
    };
    fails_with({{"norm", {{"type", "scalenorm"}}}, {"qk_norm", "head"}}, {},
               "c.json: /model/qk_norm: \"head\" needs /model/norm/type rmsnorm or layernorm, found \"scalenorm\"");
    fails_with({{"qk_norm", "both"}}, {}, "/model/qk_norm");
    fails_with({{"norm_placement", "deepnorm"}, {"n_layers", 0}}, {}, "/model/norm_placement: \"deepnorm\" needs n_layers > 0");
    fails_with({{"norm_placement", "output"}, {"norm_scaling", "depth"}}, {}, "/model/norm_scaling: \"depth\" scales");
    fails_with({{"logit_softcap", -1.0}}, {}, "/model/logit_softcap");
    fails_with({{"attn_softcap", -0.5}}, {}, "/model/attn_softcap");
    fails_with({{"norm_placement", "mix"}, {"mix_fraction", 0.0}}, {}, "/model/mix_fraction");
    fails_with({{"norm_placement", "mix"}, {"mix_fraction", 1.5}}, {}, "/model/mix_fraction");
    fails_with({{"mix_fraction", 0.5}}, {}, "/model/mix_fraction: applies to norm_placement \"mix\" only");
    fails_with({{"pre_norm", false}, {"norm_placement", "pre"}}, {}, "/model/pre_norm: says \"post\", but /model/norm_placement says \"pre\"");
    fails_with({}, {{"z_loss", -1e-4}}, "/train/z_loss");
    fails_with({}, {{"probe_every", -1}}, "/train/probe_every");
    fails_with({{"norm", {{"alpha_init", "half"}}}}, {}, "/model/norm/alpha_init");
    fails_with({{"norm", {{"type", "dyt"}}}, {"qk_norm", "full"}}, {},
               "/model/qk_norm: \"full\" needs /model/norm/type rmsnorm or layernorm, found \"dyt\"");
    // A JSON file cannot hold an infinity, but a config built in code (normlab.train's dict) can.
    const double inf = std::numeric_limits<double>::infinity();
    fails_with({{"norm", {{"type", "dyt"}, {"alpha_init", inf}}}, {"qk_norm", "none"}}, {}, "/model/norm/alpha_init: expected a finite number");
    fails_with({{"norm", {{"type", "dyt"}, {"alpha_init_attention", -inf}}}, {"qk_norm", "none"}}, {},
               "/model/norm/alpha_init_attention: expected a finite number");
    fails_with({{"logit_softcap", inf}}, {}, "/model/logit_softcap: expected a finite number");
    fails_with({{"attn_softcap", inf}}, {}, "/model/attn_softcap: expected a finite number");
    fails_with({}, {{"z_loss", inf}}, "/train/z_loss: expected a finite number");

    // pre_norm still reads, as the older name of pre and post, and resolves to norm_placement.
    nlohmann::json config = probe_config();
    config["model"]["pre_norm"] = false;
    const TrainConfig c = read_train_config(config, "c.json");
    CHECK(c.model.norm_placement == "post");
    CHECK(c.resolved["model"]["norm_placement"] == "post");
}

TEST_CASE("config: normlab train refuses each bad stability key with one line naming it and exit code 2",
          "[config][placement][cli]") {
    // The keys above through the program, as a user meets them: configs/char_text.json with --set.
    const std::string dir = nl_test::make_temp_dir("placement-cli");
    const std::string config = nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/char_text.json");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--set model.qk_norm=head --set model.norm.type=dyt",
         "/model/qk_norm: \"head\" needs /model/norm/type rmsnorm or layernorm, found \"dyt\""},
        {"--set model.norm_placement=deepnorm --set model.n_layers=0",
         "/model/norm_placement: \"deepnorm\" needs n_layers > 0"},
        {"--set model.logit_softcap=-1", "/model/logit_softcap: expected a number >= 0, got -1"},
        {"--set model.attn_softcap=-0.5", "/model/attn_softcap: expected a number >= 0, got -0.5"},
        {"--set train.z_loss=-1e-4", "/train/z_loss: expected a number >= 0, got -0.0001"},
        {"--set train.probe_every=-1", "/train/probe_every: expected an integer >= 0, got -1"},
        {"--set model.norm_placement=mix --set model.mix_fraction=0", "/model/mix_fraction: expected a number in (0, 1], got 0"},
        {"--set model.norm_placement=mix --set model.mix_fraction=1.5", "/model/mix_fraction: expected a number in (0, 1], got 1.5"},
        {"--set model.norm.type=dyt --set model.norm.alpha_init=1e400", "--set model.norm.alpha_init: invalid value '1e400'"},
        {"--set model.norm.type=dyt --set model.norm.alpha_init=NaN", "/model/norm/alpha_init: expected a number, got \"NaN\""},
    };
    for (const auto& [sets, expected] : cases) {
        const nl_test::CliRun run =
            nl_test::run_normlab_in(dir, "train " + config + " " + sets + " --out run --force --quiet");
        INFO(sets << "\n" << run.output);
        CHECK(run.status == 2);
        CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
        CHECK_THAT(run.output, Catch::StartsWith("normlab: error: ") && Catch::Contains(expected));
    }
    std::filesystem::remove_all(dir);
}
