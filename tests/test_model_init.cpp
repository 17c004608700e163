// model.init as a control: "normal" and "xavier" draw the embedding and every Linear with the
// distribution they name (moments and bounds checked on matrices large enough to tell), with GPT-2's
// scaled residual projections and DeepNet's beta on top; "pytorch" stays PyTorch's default init; the
// config's bad values are one-line errors naming the key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "layers/transformer.h"

using namespace nl;

namespace {

TransformerOptions options_with(const std::string& init, bool scaled = false) {
    TransformerOptions o;
    o.vocab_size = 300;
    o.dim = 128;
    o.n_layers = 4;
    o.n_heads = 4;
    o.multiple_of = 32;
    o.max_seq_len = 16;
    o.seed = 5;
    o.init = init;
    o.init_scaled_residual = scaled;
    return o;
}

struct Moments {
    double std = 0.0;
    double max_abs = 0.0;
};
Moments moments(const Var& p) {
    const Tensor t = p.data().contiguous();
    double sum = 0.0, sq = 0.0, m = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) {
        const double x = t.data<float>()[i];
        sum += x;
        sq += x * x;
        m = std::max(m, std::abs(x));
    }
    const double n = static_cast<double>(t.numel()), mean = sum / n;
    return {std::sqrt(sq / n - mean * mean), m};
}

Var param(const Transformer& model, const std::string& name) {
    for (const auto& [n, p] : model.named_parameters())
        if (n == name) return p;
    FAIL("no parameter " << name);
    return Var();
}

}  // namespace

TEST_CASE("model.init normal draws every matrix N(0, init_std^2), wo and w2 / sqrt(2 n_layers) when scaled", "[init]") {
    for (const bool scaled : {false, true}) {
        INFO("scaled residual " << scaled);
        Transformer model(options_with("normal", scaled));
        const double residual = scaled ? 0.02 / std::sqrt(8.0) : 0.02;
        // 128 x 128 and larger: the sample std is within 3% of the true one.
        CHECK(moments(param(model, "tok_embeddings.weight")).std == Approx(0.02).epsilon(0.03));
        CHECK(moments(param(model, "layers.0.attention.wq.weight")).std == Approx(0.02).epsilon(0.03));
        CHECK(moments(param(model, "layers.3.feed_forward.w1.weight")).std == Approx(0.02).epsilon(0.03));
        CHECK(moments(param(model, "output.weight")).std == Approx(0.02).epsilon(0.03));
        CHECK(moments(param(model, "layers.2.attention.wo.weight")).std == Approx(residual).epsilon(0.03));
        CHECK(moments(param(model, "layers.1.feed_forward.w2.weight")).std == Approx(residual).epsilon(0.03));
        // Norm gains keep their registry init.
        CHECK(moments(param(model, "layers.0.attention_norm.weight")).max_abs == 1.0);
    }
}

TEST_CASE("model.init xavier draws Linear weights U(-b, b), b = sqrt(6 / (fan_in + fan_out)), and the embedding N(0, 1)",
          "[init]") {
    Transformer model(options_with("xavier"));
    const double b = std::sqrt(6.0 / (128.0 + 128.0));
    const Moments wq = moments(param(model, "layers.0.attention.wq.weight"));
    CHECK(wq.max_abs <= b);
    CHECK(wq.max_abs > 0.99 * b);
    CHECK(wq.std == Approx(b / std::sqrt(3.0)).epsilon(0.03));  // a uniform's std
    const int64_t hidden = model.layer(0)->feed_forward()->hidden();
    const double b_ffn = std::sqrt(6.0 / (128.0 + static_cast<double>(hidden)));
    CHECK(moments(param(model, "layers.0.feed_forward.w2.weight")).max_abs <= b_ffn);
    CHECK(moments(param(model, "layers.0.feed_forward.w2.weight")).max_abs > 0.99 * b_ffn);
    CHECK(moments(param(model, "tok_embeddings.weight")).std == Approx(1.0).epsilon(0.03));
    // The draws differ from PyTorch's default init, which the same seed gives under "pytorch".
    Transformer pytorch(options_with("pytorch"));
    CHECK(moments(param(pytorch, "layers.0.attention.wq.weight")).max_abs <= 1.0 / std::sqrt(128.0));
    CHECK(moments(param(pytorch, "layers.0.attention.wq.weight")).max_abs > 0.99 / std::sqrt(128.0));
}

TEST_CASE("model.init with deepnorm keeps DeepNet's beta on the value, output and feed-forward projections", "[init]") {
    TransformerOptions o = options_with("normal");
    o.norm_placement = "deepnorm";
    Transformer model(o);
    const double beta = std::pow(8.0 * 4.0, -0.25);
    CHECK(moments(param(model, "layers.0.attention.wq.weight")).std == Approx(0.02).epsilon(0.03));
    CHECK(moments(param(model, "layers.0.attention.wv.weight")).std == Approx(0.02 * beta).epsilon(0.03));
    CHECK(moments(param(model, "layers.0.feed_forward.w3.weight")).std == Approx(0.02 * beta).epsilon(0.03));
}

TEST_CASE("model.init, init_std and init_scaled_residual refuse bad values in one line naming the key", "[init]") {
    const std::string dir = nl_test::make_temp_dir("init-errors");
    auto run = [&](const std::string& sets) {
        return nl_test::run_normlab_in(dir, "train '" + std::string(NORMLAB_SOURCE_DIR) +
                                                "/configs/toy_transformer.json' --out run --quiet " + sets);
    };
    for (const auto& [sets, key] : std::vector<std::pair<std::string, std::string>>{
             {"--set model.init=kaiming", "/model/init"},
             {"--set model.init=normal --set model.init_std=0", "/model/init_std"},
             {"--set model.init_scaled_residual=true", "/model/init_scaled_residual"}}) {
        const nl_test::CliRun r = run(sets);
        INFO(r.output);
        CHECK(r.status == 2);
        CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
        CHECK_THAT(r.output, Catch::Contains(key));
        CHECK_FALSE(nl_test::file_exists(dir + "/run/config.json"));
    }
    // A good one trains.
    const nl_test::CliRun ok = run("--set model.init=xavier --set model.init_scaled_residual=true --set train.steps=3 "
                                   "--set optim.warmup_steps=1 --set train.eval_every=0");
    INFO(ok.output);
    CHECK(ok.status == 0);
}

TEST_CASE("a checkpoint written before model.init and train.dtype existed resumes under their defaults only",
          "[init][train]") {
    const std::string dir = nl_test::make_temp_dir("init-resume");
    nlohmann::json config = {
        {"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 3}, {"symbols", 5}, {"eval_sequences", 4}}},
        {"model", {{"dim", 8}, {"n_layers", 1}, {"n_heads", 2}, {"multiple_of", 8}, {"max_seq_len", 8}}},
        {"train", {{"steps", 4}, {"batch_size", 2}}},
        {"optim", {{"warmup_steps", 1}}}};
    const TrainConfig current = read_train_config(config, "now.json");
    // The config as an older normlab resolved it: without the keys added since.
    nlohmann::json old = current.resolved;
    for (const char* key : {"init", "init_std", "init_scaled_residual"}) old["model"].erase(key);
    old["train"].erase("dtype");
    TransformerOptions options = current.model;
    options.vocab_size = 6;
    Transformer model(options);
    const std::string path = dir + "/step_00000002.safetensors";
    save_checkpoint(path, model, nullptr, nullptr, 2, {{"config", old.dump()}});
    CHECK_NOTHROW(check_checkpoint_matches(path, current));
    nlohmann::json other = config;
    other["model"]["init"] = "normal";
    REQUIRE_THROWS_WITH(check_checkpoint_matches(path, read_train_config(other, "other.json")),
                        Catch::Contains("/model/init is absent in the checkpoint, \"normal\" in other.json"));
    other = config;
    other["train"]["dtype"] = "f64";
    REQUIRE_THROWS_WITH(check_checkpoint_matches(path, read_train_config(other, "other.json")),
                        Catch::Contains("/train/dtype"));
}
