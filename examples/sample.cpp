// `normlab sample CHECKPOINT`: loads a `normlab train` checkpoint (or a run directory's latest one)
// and generates: for a synthetic task, answers to random problems (checked against the right answer);
// for text, characters after a prompt. Greedy at temperature 0, else sampled from
// softmax(logits / temperature) with a seeded generator. The checkpoint carries its config and
// vocab, so neither the config file nor the training text is needed. The model sees at most the
// sequence length it was trained on, through a KV cache (examples/generate.h); the speed goes to stderr.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/error.h"
#include "examples/commands.h"
#include "examples/generate.h"
#include "examples/train.h"
#include "layers/checkpoint.h"

namespace fs = std::filesystem;

namespace nl::cli {

namespace {

struct SampleFlags {
    std::string checkpoint;
    int64_t num = 10;
    int64_t max_new_tokens = 200;
    std::string prompt;
    double temperature = -1.0;  // unset (-1): greedy for synthetic tasks, 0.8 for text
    int64_t seed = 0;           // signed, so "-1" is refused rather than wrapped to 2^64 - 1
    bool no_kv_cache = false;
};

// Bounds of the flags: the problems and the generated tokens are held in memory.
constexpr int64_t kMaxSampleNum = 100'000;
constexpr int64_t kMaxNewTokens = 1'000'000;

// "sample: N tokens in S s, R tokens/s (KV cache, window T)" on stderr.
void report_speed(const GenerateStats& stats, const GenerateOptions& options) {
    std::fflush(stdout);  // after the samples, also when both streams go to one pipe
    fmt::print(stderr, "sample: {} tokens in {:.3f} s, {:.0f} tokens/s ({}, window {})\n", stats.new_tokens,
               stats.seconds, stats.seconds > 0 ? static_cast<double>(stats.new_tokens) / stats.seconds : 0.0,
               options.kv_cache ? "KV cache" : "no cache: whole window per token", options.context);
}

void run_sample(const SampleFlags& flags) {
    // A run directory means its latest checkpoint.
    // error_code forms: a symlink loop or an unreadable path is a message, not an exception.
    std::string path = flags.checkpoint;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        path = latest_checkpoint(flags.checkpoint);
        NL_REQUIRE(!path.empty(), "sample: ", flags.checkpoint, ": no checkpoints/step_*.safetensors in this directory");
    }
    NL_REQUIRE(fs::exists(path, ec), "sample: ", path, ": no such checkpoint file",
               ec ? " (" + ec.message() + ")" : std::string());
    CheckpointInfo info = read_checkpoint_info(path);
    auto config_entry = info.metadata.find("config");
    NL_REQUIRE(config_entry != info.metadata.end(), "sample: ", path,
               ": not a normlab train checkpoint (no config in its metadata)");
    TrainConfig config = read_train_config(checkpoint_metadata_json(info, path, "config"), path + " (config)");

    std::unique_ptr<SyntheticTask> task;
    std::unique_ptr<TextVocab> vocab;
    if (config.data.source == "text") {
        auto vocab_entry = info.metadata.find("vocab");
        NL_REQUIRE(vocab_entry != info.metadata.end(), "sample: ", path, ": text checkpoint without a vocab");
        const nlohmann::json codepoints = checkpoint_metadata_json(info, path, "vocab");
        try {
            vocab = std::make_unique<TextVocab>(codepoints);
        } catch (const Error& e) {
            throw Error(path + ": metadata 'vocab': " + e.what());
        }
        config.model.vocab_size = vocab->size();
    } else {
        task = std::make_unique<SyntheticTask>(config.data, path + " (config): /data");
        config.model.vocab_size = task->vocab_size();
    }
    Transformer model(config.model);
    load_checkpoint(path, model);
    Generator gen(static_cast<uint64_t>(flags.seed));
    GenerateOptions options;
    options.context = trained_context(info, config, path);
    options.kv_cache = !flags.no_kv_cache;

    if (task) {
        // Random problems (the seed picks them), answered all at once.
        options.temperature = flags.temperature < 0 ? 0.0 : flags.temperature;
        std::vector<Problem> problems;
        std::vector<std::vector<int64_t>> tokens;
        for (int64_t i = 0; i < flags.num; ++i) {
            problems.push_back(task->make_problem(gen));
            tokens.push_back(problems.back().prompt);
        }
        const GenerateStats stats = generate(model, tokens, task->answer_length(), options, gen);
        int64_t correct = 0;
        for (int64_t i = 0; i < flags.num; ++i) {
            std::vector<int64_t> answer(tokens[i].begin() + task->prompt_length(), tokens[i].end());
            bool right = answer == problems[i].answer;
            correct += right;
            fmt::print("{} -> {}{}\n", task->format_problem(problems[i]), task->format_answer(answer),
                       right ? "  ok" : "  WRONG (expected " + task->format_answer(problems[i].answer) + ")");
        }
        fmt::print("{}/{} correct (step {}, {})\n", correct, flags.num, info.step, path);
        report_speed(stats, options);
        return;
    }
    options.temperature = flags.temperature < 0 ? 0.8 : flags.temperature;
    std::string prompt = flags.prompt.empty() ? vocab->decode({0}) : flags.prompt;
    std::vector<std::vector<int64_t>> tokens = {vocab->encode(prompt)};
    const GenerateStats stats = generate(model, tokens, flags.max_new_tokens, options, gen);
    fmt::print("{}\n", vocab->decode(tokens[0]));
    report_speed(stats, options);
}

}  // namespace

void register_sample(CLI::App& app) {
    auto flags = std::make_shared<SampleFlags>();
    CLI::App* cmd = app.add_subcommand("sample", "Generate sequences or text from a train checkpoint");
    cmd->add_option("checkpoint", flags->checkpoint, "A checkpoint file, or a run directory (its latest checkpoint)")
        ->required();
    cmd->add_option("--num", flags->num, "Synthetic tasks: how many random problems to answer (default 10)");
    cmd->add_option("--max-new-tokens", flags->max_new_tokens, "Text: characters to generate (default 200)");
    cmd->add_option("--prompt", flags->prompt, "Text: the text to continue (default: the vocab's first character)");
    CLI::Option* temperature = cmd->add_option(
        "--temperature", flags->temperature,
        "0: greedy; > 0: sample from softmax(logits / T) (default: greedy for tasks, 0.8 for text)");
    cmd->add_option("--seed", flags->seed, "Seed for the problems and the sampling (default 0)");
    cmd->add_flag("--no-kv-cache", flags->no_kv_cache,
                  "Recompute the whole window for every token instead of caching keys and values (same tokens, "
                  "slower; the window is the trained sequence length, see docs/generation.md)");
    cmd->callback([flags, temperature] {
        NL_REQUIRE(flags->num >= 1 && flags->num <= kMaxSampleNum, "sample: --num must be in [1, ", kMaxSampleNum,
                   "], found ", flags->num);
        NL_REQUIRE(flags->max_new_tokens >= 0 && flags->max_new_tokens <= kMaxNewTokens,
                   "sample: --max-new-tokens must be in [0, ", kMaxNewTokens, "], found ", flags->max_new_tokens);
        NL_REQUIRE(temperature->count() == 0 || (std::isfinite(flags->temperature) && flags->temperature >= 0),
                   "sample: --temperature must be a finite number >= 0, found ", flags->temperature);
        NL_REQUIRE(flags->seed >= 0, "sample: --seed must be >= 0, found ", flags->seed);
        run_sample(*flags);
    });
}

}  // namespace nl::cli
