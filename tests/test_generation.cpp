// Generation (jobs/generate.h): the KV cache computes what the whole-window recompute does
// (same tokens, logits within 1e-5), generation never feeds a position past the trained length,
// and `normlab train` records that length in its checkpoints.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "cli_test_util.h"
#include "core/ops.h"
#include "jobs/generate.h"
#include "layers/checkpoint.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

using namespace nl;

namespace {

// A small model with every attention feature the cache touches: several layers, GQA (4 query
// heads reading 2 kv heads), RoPE, and a context far longer than the windows used here.
TransformerOptions small_model(bool pre_norm) {
    TransformerOptions o;
    o.vocab_size = 13;
    o.dim = 32;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.multiple_of = 16;
    o.norm_placement = pre_norm ? "pre" : "post";
    o.norm.type = pre_norm ? "rmsnorm" : "layernorm";
    o.max_seq_len = 40;
    o.seed = 7;
    return o;
}

std::vector<std::vector<int64_t>> prompts() { return {{1, 5, 2, 9, 3}, {4, 4, 0, 12, 7}}; }

}  // namespace

TEST_CASE("Transformer::forward_cached, one token at a time, gives forward's logits", "[generation]") {
    for (bool pre_norm : {true, false}) {
        INFO("pre_norm " << pre_norm);
        Transformer model(small_model(pre_norm));
        model.eval();
        NoGradGuard no_grad;
        const int64_t B = 2, T = 11;
        std::vector<int64_t> ids;  // (B, T)
        for (int64_t i = 0; i < B * T; ++i) ids.push_back((i * 7 + 3) % 13);
        const Tensor all = from_vector(ids, {B, T});
        const Tensor full = model.forward(all).data();  // (B, T, V)

        // A prefix of 4 positions at once, then one position at a time.
        KVCache cache = model.make_cache(B, T);
        std::vector<Tensor> pieces = {model.forward_cached(all.narrow(1, 0, 4).contiguous(), cache).data()};
        for (int64_t t = 4; t < T; ++t) pieces.push_back(model.forward_cached(all.narrow(1, t, 1).contiguous(), cache).data());
        CHECK(cache.length == T);
        const Tensor cached = cat(pieces, 1);  // (B, T, V)
        REQUIRE(cached.shape() == full.shape());
        CHECK(max_abs_diff(cached, full) < 1e-5);
        CHECK(max_abs_diff(full, zeros_like(full)) > 0.1);  // real logits, not an empty comparison

        // The cache's capacity is a hard limit, named in the error.
        REQUIRE_THROWS_WITH(model.forward_cached(all.narrow(1, 0, 1).contiguous(), cache),
                            Catch::Contains("KV cache full") && Catch::Contains("capacity 11"));
    }
}

TEST_CASE("the KV cache is for inference only and its capacity fits the model", "[generation]") {
    Transformer model(small_model(true));
    KVCache cache = model.make_cache(1, 8);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2}, {1, 2});
    REQUIRE_THROWS_WITH(model.forward_cached(ids, cache), Catch::Contains("NoGradGuard"));
    REQUIRE_THROWS_WITH(model.make_cache(1, 41), Catch::Contains("[1, 40]") && Catch::Contains("found 41"));
}

TEST_CASE("generation with the KV cache gives the whole-window recompute's tokens and logits", "[generation]") {
    // 40 new tokens through a window of 12: the window slides several times, so the cache is rebuilt
    // at position 0 and refilled one position at a time, on both greedy and sampled paths.
    for (double temperature : {0.0, 0.9}) {
        for (bool pre_norm : {true, false}) {
            INFO("temperature " << temperature << ", pre_norm " << pre_norm);
            Transformer model(small_model(pre_norm));
            GenerateOptions options;
            options.context = 12;
            options.temperature = temperature;

            auto with_cache = prompts();
            std::vector<Tensor> logits_cached;
            Generator gen_a(5);
            options.kv_cache = true;
            const GenerateStats a = generate(model, with_cache, 40, options, gen_a, &logits_cached);

            auto recompute = prompts();
            std::vector<Tensor> logits_full;
            Generator gen_b(5);
            options.kv_cache = false;
            const GenerateStats b = generate(model, recompute, 40, options, gen_b, &logits_full);

            CHECK(with_cache == recompute);
            REQUIRE(logits_cached.size() == 40);
            REQUIRE(logits_full.size() == 40);
            double worst = 0;
            for (size_t i = 0; i < logits_full.size(); ++i) {
                REQUIRE(logits_cached[i].shape() == Shape{2, 13});
                worst = std::max(worst, max_abs_diff(logits_cached[i], logits_full[i]));
            }
            CHECK(worst < 1e-5);
            CHECK(a.slides == b.slides);
            CHECK(a.slides >= 4);
            // The work: one position per token with the cache, the whole window without.
            CHECK(a.positions_computed < b.positions_computed / 3);
        }
    }
}

TEST_CASE("a sample longer than the window stays in the trained range", "[generation]") {
    Transformer model(small_model(true));
    for (int64_t context : {1, 2, 7, 8}) {
        INFO("context " << context);
        GenerateOptions options;
        options.context = context;
        for (bool kv_cache : {true, false}) {
            options.kv_cache = kv_cache;
            auto tokens = prompts();  // 5 tokens: longer than some windows, cropped to the last `context`
            Generator gen(1);
            const GenerateStats stats = generate(model, tokens, 30, options, gen);
            CHECK(stats.new_tokens == 30);
            CHECK(tokens[0].size() == 35);
            CHECK(stats.max_position == context - 1);  // reached, never passed
            CHECK(stats.slides > 0);
        }
    }
    GenerateOptions too_long;
    too_long.context = 41;
    auto tokens = prompts();
    Generator gen(1);
    REQUIRE_THROWS_WITH(generate(model, tokens, 1, too_long, gen),
                        Catch::Contains("[1, 40]") && Catch::Contains("found 41"));
}

TEST_CASE("train records the trained sequence length in its checkpoints, and sample uses it", "[generation]") {
    nl_test::TempDir dir("generation_test");
    const std::string config = std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json";
    // reverse of length 3: sequences of 7 tokens, 6 model positions; max_seq_len stays 64.
    nl_test::CliRun run = nl_test::run_normlab_env(
        dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ",
        "train " + nl_test::shell_arg(config) +
            " --out run --quiet --set train.steps=3 --set optim.warmup_steps=1 --set train.batch_size=8 "
            "--set data.eval_sequences=16 --set data.task=reverse --set data.length=3");
    INFO(run.output);
    REQUIRE(run.status == 0);
    const std::string checkpoint = latest_checkpoint(dir / "run");
    REQUIRE(!checkpoint.empty());
    CheckpointInfo info = read_checkpoint_info(checkpoint);
    REQUIRE(info.metadata.count(kTrainedSeqLenKey) == 1);
    CHECK(info.metadata.at(kTrainedSeqLenKey) == "6");
    const TrainConfig config_read =
        read_train_config(nlohmann::json::parse(info.metadata.at("config")), checkpoint);
    CHECK(config_read.model.max_seq_len == 64);
    CHECK(trained_context(info, config_read, checkpoint) == 6);

    // A checkpoint without the key (written before it existed) falls back to its config's /data.
    info.metadata.erase(kTrainedSeqLenKey);
    CHECK(trained_context(info, config_read, checkpoint) == 6);
    info.metadata[kTrainedSeqLenKey] = "65";
    REQUIRE_THROWS_WITH(trained_context(info, config_read, checkpoint),
                        Catch::Contains("trained_seq_len") && Catch::Contains("found '65'"));

    nl_test::CliRun sample = nl_test::run_normlab_in(dir.path.string(), "sample run --num 3 --temperature 0");
    INFO(sample.output);
    REQUIRE(sample.status == 0);
    CHECK_THAT(sample.output, Catch::Contains("tokens/s (KV cache, window 6)"));
    nl_test::CliRun no_cache = nl_test::run_normlab_in(dir.path.string(), "sample run --num 3 --temperature 0 --no-kv-cache");
    INFO(no_cache.output);
    REQUIRE(no_cache.status == 0);
    CHECK_THAT(no_cache.output, Catch::Contains("tokens/s (no cache: whole window per token, window 6)"));
    // The same answers either way: the lines before "k/3 correct" (the speed line comes after it).
    CHECK(no_cache.output.substr(0, no_cache.output.find("correct")) ==
          sample.output.substr(0, sample.output.find("correct")));
    CHECK_THAT(sample.output, Catch::StartsWith("reverse "));
}
