// The sample job (jobs/sample.h).
#include "jobs/sample.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "jobs/interop.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

std::string resolve_checkpoint_path(const std::string& checkpoint) {
    // A run directory means its latest checkpoint.
    // error_code forms: a symlink loop or an unreadable path is a message, not an exception.
    std::string path = checkpoint;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        path = latest_checkpoint(checkpoint);
        NL_REQUIRE(!path.empty(), checkpoint, ": no model in this directory (a run directory has "
                   "checkpoints/step_*.safetensors, a transformers one config.json and model.safetensors)");
    }
    NL_REQUIRE(fs::exists(path, ec), path, ": no such checkpoint file",
               ec ? " (" + ec.message() + ")" : std::string());
    return path;
}

void check_job(const SampleJob& job) {
    NL_REQUIRE(job.num >= 1 && job.num <= kMaxSampleNum, "sample: --num must be in [1, ", kMaxSampleNum, "], found ",
               job.num);
    NL_REQUIRE(job.max_new_tokens >= 0 && job.max_new_tokens <= kMaxNewTokens, "sample: --max-new-tokens must be in [0, ",
               kMaxNewTokens, "], found ", job.max_new_tokens);
    NL_REQUIRE(!job.temperature || (std::isfinite(*job.temperature) && *job.temperature >= 0),
               "sample: --temperature must be a finite number >= 0, found ", job.temperature.value_or(0.0));
    NL_REQUIRE(job.seed >= 0, "sample: --seed must be >= 0, found ", job.seed);
}

// Random problems (the seed picks them), answered all at once.
void answer_problems(TrainCheckpoint& ck, const SampleJob& job, Generator& gen, SampleResult& result) {
    const SyntheticTask& task = *ck.task;
    std::vector<Problem> problems;
    std::vector<std::vector<int64_t>> tokens;
    for (int64_t i = 0; i < job.num; ++i) {
        problems.push_back(task.make_problem(gen));
        tokens.push_back(problems.back().prompt);
    }
    result.stats = generate(*ck.model, tokens, task.answer_length(), result.options, gen);
    for (int64_t i = 0; i < job.num; ++i) {
        std::vector<int64_t> answer(tokens[i].begin() + task.prompt_length(), tokens[i].end());
        SampledProblem p{task.format_problem(problems[i]), task.format_answer(answer),
                         task.format_answer(problems[i].answer), answer == problems[i].answer};
        result.correct += p.correct;
        result.problems.push_back(std::move(p));
    }
}

}  // namespace

namespace {

// A transformers directory or GGUF file as a checkpoint at step 0: its architecture as the config,
// its character tokenizer as a text vocab (else its ids are written as numbers), its whole context.
TrainCheckpoint pretrained_checkpoint(const std::string& path, bool with_weights) {
    TrainCheckpoint ck;
    // With weights, one reading of the file builds the model and fills it.
    const PretrainedModel pretrained = with_weights ? load_pretrained_into(path, ck.model) : load_pretrained(path, false);
    ck.path = path;
    ck.config.file = path;
    ck.config.model = pretrained.options;
    if (!pretrained.char_vocab.empty()) {
        ck.config.data.source = "text";
        ck.vocab = std::make_unique<TextVocab>(nlohmann::json(pretrained.char_vocab));
        ck.info.metadata["vocab"] = nlohmann::json(pretrained.char_vocab).dump();  // as a text checkpoint holds it
    } else {
        ck.config.data.source = "tokens";
        ck.config.data.vocab_size = pretrained.options.vocab_size;
        ck.ids = std::make_unique<TokenIds>(pretrained.options.vocab_size);
    }
    ck.context = pretrained.options.max_seq_len;
    return ck;
}

}  // namespace

TrainCheckpoint load_train_checkpoint(const std::string& checkpoint, bool with_weights) {
    if (is_pretrained_model(checkpoint)) return pretrained_checkpoint(checkpoint, with_weights);
    TrainCheckpoint ck;
    ck.path = resolve_checkpoint_path(checkpoint);
    const std::string& path = ck.path;
    ck.info = read_checkpoint_info(path);
    NL_REQUIRE(ck.info.metadata.count("config") == 1, path,
               ": not a normlab train checkpoint (no config in its metadata)");
    ck.config = read_train_config(checkpoint_metadata_json(ck.info, path, "config"), path + " (config)");
    if (ck.config.data.source == "text") {
        NL_REQUIRE(ck.info.metadata.count("vocab") == 1, path, ": text checkpoint without a vocab");
        const nlohmann::json codepoints = checkpoint_metadata_json(ck.info, path, "vocab");
        try {
            ck.vocab = std::make_unique<TextVocab>(codepoints);
        } catch (const Error& e) {
            throw Error(path + ": metadata 'vocab': " + e.what());
        }
        ck.config.model.vocab_size = model_vocab_size(ck.config, ck.vocab->size());
    } else if (ck.config.data.source == "tokens") {
        // The config names the vocab size; the metadata, when there, must agree with it.
        ck.ids = std::make_unique<TokenIds>(ck.config.data.vocab_size);
        if (ck.info.metadata.count("vocab") == 1) {
            const nlohmann::json metadata = checkpoint_metadata_json(ck.info, path, "vocab");
            int64_t saved = 0;
            try {
                saved = TokenIds::from_metadata(metadata).size();
            } catch (const Error& e) {
                throw Error(path + ": metadata 'vocab': " + e.what());
            }
            NL_REQUIRE(saved == ck.ids->size(), path, ": metadata 'vocab': vocab_size ", saved,
                       " differs from its config's /data/vocab_size = ", ck.ids->size());
        }
        ck.config.model.vocab_size = model_vocab_size(ck.config, ck.ids->size());
    } else {
        ck.task = std::make_unique<SyntheticTask>(ck.config.data, path + " (config): /data");
        ck.config.model.vocab_size = model_vocab_size(ck.config, ck.task->vocab_size());
    }
    ck.context = trained_context(ck.info, ck.config, path, &ck.note);
    if (!with_weights) return ck;
    ck.model = std::make_unique<Transformer>(ck.config.model);
    load_checkpoint(path, *ck.model);
    return ck;
}

SampleResult run_sample(const SampleJob& job) {
    check_job(job);
    TrainCheckpoint ck = load_train_checkpoint(job.checkpoint);
    SampleResult result;
    result.checkpoint = ck.path;
    result.step = ck.info.step;
    result.note = ck.note;
    result.options.context = ck.context;
    result.options.kv_cache = job.kv_cache;
    Generator gen(static_cast<uint64_t>(job.seed));
    if (ck.task) {
        result.options.temperature = job.temperature.value_or(0.0);
        answer_problems(ck, job, gen, result);
        return result;
    }
    result.options.temperature = job.temperature.value_or(0.8);
    std::vector<std::vector<int64_t>> tokens(1);
    if (ck.ids) {
        tokens[0] = job.prompt.empty() ? std::vector<int64_t>{0} : ck.ids->encode(job.prompt);
    } else {
        tokens[0] = ck.vocab->encode(job.prompt.empty() ? ck.vocab->decode({0}) : job.prompt);
    }
    result.stats = generate(*ck.model, tokens, job.max_new_tokens, result.options, gen);
    result.tokens = tokens[0];
    result.text = ck.ids ? ck.ids->decode(tokens[0]) : ck.vocab->decode(tokens[0]);
    return result;
}

nlohmann::json sample_result_json(const SampleResult& r) {
    return {{"checkpoint", r.checkpoint},
            {"step", r.step},
            {"problems", r.problems},
            {"correct", r.correct},
            {"text", r.text},
            {"tokens", r.tokens},
            {"context", r.options.context},
            {"temperature", r.options.temperature},
            {"kv_cache", r.options.kv_cache},
            {"new_tokens", r.stats.new_tokens},
            {"seconds", r.stats.seconds},
            {"tokens_per_s", r.stats.seconds > 0 ? static_cast<double>(r.stats.new_tokens) / r.stats.seconds : 0.0},
            {"note", r.note}};
}

}  // namespace nl
