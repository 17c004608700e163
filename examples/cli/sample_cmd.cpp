// `normlab sample CHECKPOINT`: the command line of the sample job (jobs/sample.h): the samples on
// stdout, one per line (a model trained on token files prints its ids, "17 4 255 ..."), then the
// speed on stderr.
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "core/error.h"
#include "examples/cli/commands.h"
#include "jobs/sample.h"

namespace nl::cli {

namespace {

// "sample: N tokens in S s, R tokens/s (KV cache, window T)" on stderr.
void report_speed(const GenerateStats& stats, const GenerateOptions& options) {
    std::fflush(stdout);  // after the samples, also when both streams go to one pipe
    fmt::print(stderr, "sample: {} tokens in {:.3f} s, {:.0f} tokens/s ({}, window {})\n", stats.new_tokens,
               stats.seconds, stats.seconds > 0 ? static_cast<double>(stats.new_tokens) / stats.seconds : 0.0,
               options.kv_cache ? "KV cache" : "no cache: whole window per token", options.context);
}

void run(const SampleJob& job) {
    const SampleResult result = run_sample(job);
    if (!result.note.empty()) fmt::print(stderr, "sample: {}\n", result.note);
    if (result.problems.empty()) {
        fmt::print("{}\n", result.text);
    } else {
        for (const SampledProblem& p : result.problems)
            fmt::print("{} -> {}{}\n", p.problem, p.answer, p.correct ? "  ok" : "  WRONG (expected " + p.expected + ")");
        fmt::print("{}/{} correct (step {}, {})\n", result.correct, result.problems.size(), result.step,
                   result.checkpoint);
    }
    report_speed(result.stats, result.options);
}

}  // namespace

void register_sample(CLI::App& app) {
    auto job = std::make_shared<SampleJob>();
    auto temperature = std::make_shared<double>(0.0);
    CLI::App* cmd = app.add_subcommand("sample", "Generate sequences or text from a train checkpoint");
    cmd->add_option("checkpoint", job->checkpoint, "A checkpoint file, or a run directory (its latest checkpoint)")
        ->required();
    cmd->add_option("--num", job->num, "Synthetic tasks: how many random problems to answer (default 10)");
    cmd->add_option("--max-new-tokens", job->max_new_tokens,
                    "Text: characters to generate; token data: ids to generate (default 200)");
    cmd->add_option("--prompt", job->prompt,
                    "Text: the text to continue (default: the vocab's first character); token data (data.source "
                    "\"tokens\"): ids separated by spaces, \"17 4 255\" (default: \"0\")");
    CLI::Option* temperature_option = cmd->add_option(
        "--temperature", *temperature,
        "0: greedy; > 0: sample from softmax(logits / T) (default: greedy for tasks, 0.8 for text and token data)");
    cmd->add_option("--seed", job->seed, "Seed for the problems and the sampling (default 0)");
    auto no_kv_cache = std::make_shared<bool>(false);
    cmd->add_flag("--no-kv-cache", *no_kv_cache,
                  "Recompute the whole window for every token instead of caching keys and values (same tokens, "
                  "slower; the window is the trained sequence length, see docs/generation.md)");
    cmd->callback([job, temperature, temperature_option, no_kv_cache] {
        if (temperature_option->count() > 0) job->temperature = *temperature;
        job->kv_cache = !*no_kv_cache;
        run(*job);
    });
}

}  // namespace nl::cli
