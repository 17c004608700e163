// The sample job as library code: loads a `normlab train` checkpoint (or a run directory's latest
// one) with the config and vocab it carries, so neither the config file nor the training text is
// needed, and generates through a KV cache (jobs/generate.h): for a synthetic task, answers to
// random problems checked against the right answer; for text, characters after a prompt; for a
// model trained on token files (no tokenizer), token ids after a prompt of ids ("17 4 255"). Greedy
// at temperature 0, else sampled from softmax(logits / temperature) with a seeded generator. Nothing
// here prints.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobs/data.h"
#include "jobs/generate.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "layers/transformer.h"

namespace nl {

// Bounds of a sample job: the problems and the generated tokens are held in memory.
inline constexpr int64_t kMaxSampleNum = 100'000;
inline constexpr int64_t kMaxNewTokens = 1'000'000;

// A train checkpoint loaded with what it carries.
struct TrainCheckpoint {
    std::string path;                    // the checkpoint file read
    CheckpointInfo info;                 // its step and metadata
    TrainConfig config;                  // the config it was trained with
    std::unique_ptr<Transformer> model;  // its weights, on the CPU
    std::unique_ptr<SyntheticTask> task; // a synthetic task's problems and formatting; or
    std::unique_ptr<TextVocab> vocab;    // a text model's vocabulary; or
    std::unique_ptr<TokenIds> ids;       // a token-file model's ids (written as decimal numbers)
    int64_t context = 0;                 // the window generation uses (trained_context)
    std::string note;                    // a remark for the user ("" for none), e.g. on the window
};

// `checkpoint`: a checkpoint file, or a run directory (its latest checkpoint). nl::Error naming the
// path when it is missing, not a train checkpoint, or its config or vocab does not read.
// `with_weights` false reads only what the file says of itself (config, vocab, context; `model` stays
// null), so a caller can check its input against the model before taking the weights' memory.
TrainCheckpoint load_train_checkpoint(const std::string& checkpoint, bool with_weights = true);

struct SampleJob {
    std::string checkpoint;              // a checkpoint file or a run directory
    int64_t num = 10;                    // synthetic tasks: random problems to answer, 1..kMaxSampleNum
    int64_t max_new_tokens = 200;        // text and tokens: tokens to generate, 0..kMaxNewTokens
    std::string prompt;                  // text: what to continue ("": the vocab's first character);
                                         // tokens: ids separated by spaces, "17 4 255" ("": id 0)
    std::optional<double> temperature;   // unset: greedy for tasks, 0.8 for text and tokens
    int64_t seed = 0;                    // picks the problems and the samples
    bool kv_cache = true;                // false: recompute the whole window for every token
};

struct SampledProblem {
    std::string problem;   // the prompt as readable text
    std::string answer;    // the model's answer
    std::string expected;  // the right answer
    bool correct = false;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SampledProblem, problem, answer, expected, correct)

struct SampleResult {
    std::string checkpoint;                // the file read
    int64_t step = 0;                      // its training step
    std::vector<SampledProblem> problems;  // synthetic tasks
    int64_t correct = 0;
    std::string text;                      // text models: the prompt and its continuation (token-file
                                           // models: its ids, "17 4 255 ...")
    std::vector<int64_t> tokens;           // text and token-file models: their token ids
    GenerateOptions options;               // as used (context, temperature, cache)
    GenerateStats stats;
    std::string note;                      // from load_train_checkpoint
};

SampleResult run_sample(const SampleJob& job);

// The result as Python's normlab.sample reads it: the fields above, with options' context,
// temperature and kv_cache, stats' new_tokens and seconds, and tokens_per_s, at the top level.
nlohmann::json sample_result_json(const SampleResult& result);

}  // namespace nl
