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
    double temperature = -1.0;  // unset: greedy for synthetic tasks, 0.8 for text
    uint64_t seed = 0;
    bool no_kv_cache = false;
};

// "sample: N tokens in S s, R tokens/s (KV cache, window T)" on stderr.
void report_speed(const GenerateStats& stats, const GenerateOptions& options) {
    std::fflush(stdout);  // after the samples, also when both streams go to one pipe
    fmt::print(stderr, "sample: {} tokens in {:.3f} s, {:.0f} tokens/s ({}, window {})\n", stats.new_tokens,
               stats.seconds, stats.seconds > 0 ? static_cast<double>(stats.new_tokens) / stats.seconds : 0.0,
               options.kv_cache ? "KV cache" : "no cache: whole window per token", options.context);
}

void run_sample(const SampleFlags& flags) {
    // A run directory means its latest checkpoint.
    std::string path = flags.checkpoint;
    if (fs::is_directory(path)) {
        path = latest_checkpoint(flags.checkpoint);
        NL_REQUIRE(!path.empty(), "sample: ", flags.checkpoint, ": no checkpoints/step_*.safetensors in this directory");
    }
    NL_REQUIRE(fs::exists(path), "sample: ", path, ": no such checkpoint file");
    CheckpointInfo info = read_checkpoint_info(path);
    auto config_entry = info.metadata.find("config");
    NL_REQUIRE(config_entry != info.metadata.end(), "sample: ", path,
               ": not a normlab train checkpoint (no config in its metadata)");
    TrainConfig config = read_train_config(nlohmann::json::parse(config_entry->second), path + " (config)");

    std::unique_ptr<SyntheticTask> task;
    std::unique_ptr<TextVocab> vocab;
    if (config.data.source == "text") {
        auto vocab_entry = info.metadata.find("vocab");
        NL_REQUIRE(vocab_entry != info.metadata.end(), "sample: ", path, ": text checkpoint without a vocab");
        vocab = std::make_unique<TextVocab>(nlohmann::json::parse(vocab_entry->second));
        config.model.vocab_size = vocab->size();
    } else {
        task = std::make_unique<SyntheticTask>(config.data, path + " (config): /data");
        config.model.vocab_size = task->vocab_size();
    }
    Transformer model(config.model);
    load_checkpoint(path, model);
    Generator gen(flags.seed);
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
    cmd->add_option("--temperature", flags->temperature,
                    "0: greedy; > 0: sample from softmax(logits / T) (default: greedy for tasks, 0.8 for text)");
    cmd->add_option("--seed", flags->seed, "Seed for the problems and the sampling (default 0)");
    cmd->add_flag("--no-kv-cache", flags->no_kv_cache,
                  "Recompute the whole window for every token instead of caching keys and values (same tokens, "
                  "slower; the window is the trained sequence length, see docs/generation.md)");
    cmd->callback([flags] {
        NL_REQUIRE(flags->num >= 1, "sample: --num must be >= 1, found ", flags->num);
        NL_REQUIRE(flags->max_new_tokens >= 0, "sample: --max-new-tokens must be >= 0, found ", flags->max_new_tokens);
        run_sample(*flags);
    });
}

}  // namespace nl::cli
