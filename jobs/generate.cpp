// Windowed generation with a KV cache (the window rule is in generate.h).
#include "jobs/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include <fmt/core.h>

#include "core/error.h"

namespace nl {

std::vector<int64_t> pick_next(const Var& logits, double temperature, Generator& gen) {
    Tensor last = logits.data().select(1, logits.size(1) - 1).to(DType::F64).contiguous();  // (B, V)
    const int64_t B = last.size(0), V = last.size(1);
    const double* z = last.data<double>();
    std::vector<int64_t> next(B);
    for (int64_t b = 0; b < B; ++b) {
        const double* row = z + b * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; ++v)
            if (row[v] > row[best]) best = v;
        next[b] = best;
        if (temperature <= 0) continue;
        std::vector<double> p(V);
        double total = 0;
        for (int64_t v = 0; v < V; ++v) total += p[v] = std::exp((row[v] - row[best]) / temperature);
        double u = 0;
        gen.fill_uniform(&u, 1);
        u *= total;
        for (int64_t v = 0; v < V; ++v) {
            if ((u -= p[v]) < 0 || v == V - 1) {
                next[b] = v;
                break;
            }
        }
    }
    return next;
}

namespace {

// tokens[b][from, to) of every row as one (B, to - from) i64 batch.
Tensor columns(const std::vector<std::vector<int64_t>>& tokens, int64_t from, int64_t to) {
    std::vector<int64_t> ids;  // (B, to - from)
    for (const auto& row : tokens) ids.insert(ids.end(), row.begin() + from, row.begin() + to);
    return from_vector(ids, {static_cast<int64_t>(tokens.size()), to - from});
}

}  // namespace

int64_t trained_context(const CheckpointInfo& info, const TrainConfig& config, const std::string& path,
                        std::string* note) {
    auto entry = info.metadata.find(kTrainedSeqLenKey);
    if (entry == info.metadata.end()) {
        const int64_t from_config = data_seq_len(config.data);
        if (note != nullptr)
            *note = fmt::format("{} does not record its trained sequence length; using its config's: {}", path,
                                from_config);
        return from_config;
    }
    char* end = nullptr;
    const long long value = std::strtoll(entry->second.c_str(), &end, 10);
    NL_REQUIRE(!entry->second.empty() && *end == '\0' && value >= 1 && value <= config.model.max_seq_len, "sample: ",
               path, ": metadata '", kTrainedSeqLenKey, "' should be an integer in [1, ", config.model.max_seq_len,
               "] (max_seq_len), found '", entry->second, "'");
    return value;
}

GenerateStats generate(Transformer& model, std::vector<std::vector<int64_t>>& tokens, int64_t count,
                       const GenerateOptions& options, Generator& gen, std::vector<Tensor>* step_logits) {
    NL_REQUIRE(!tokens.empty() && !tokens[0].empty(), "generate: needs at least one non-empty prompt");
    for (const auto& row : tokens)
        NL_REQUIRE(row.size() == tokens[0].size(), "generate: prompts must have equal lengths, found ", row.size(),
                   " and ", tokens[0].size());
    NL_REQUIRE(options.context >= 1 && options.context <= model.options().max_seq_len,
               "generate: the context must be in [1, ", model.options().max_seq_len, "] (max_seq_len), found ",
               options.context);
    NL_REQUIRE(count >= 0, "generate: count must be >= 0, found ", count);
    NoGradGuard no_grad;
    model.eval();
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t B = static_cast<int64_t>(tokens.size());
    const int64_t keep = (options.context + 1) / 2;  // a slid window restarts from this many tokens
    GenerateStats stats;
    KVCache cache;
    if (options.kv_cache) cache = model.make_cache(B, options.context);

    int64_t length = static_cast<int64_t>(tokens[0].size());
    int64_t window = std::max<int64_t>(0, length - options.context);  // the window is tokens[window, length)
    for (int64_t i = 0; i < count; ++i) {
        if (length - window > options.context) {  // the last token did not fit: slide
            window = length - keep;
            cache.length = 0;
            ++stats.slides;
        }
        Var logits;  // (B, positions fed, V)
        if (options.kv_cache) {
            // Feed what the cache lacks: the whole window after a (re)start, else the newest token.
            const int64_t from = window + cache.length;
            logits = model.forward_cached(columns(tokens, from, length), cache);
            stats.positions_computed += length - from;
        } else {
            logits = model.forward(columns(tokens, window, length));
            stats.positions_computed += length - window;
        }
        stats.max_position = std::max(stats.max_position, length - window - 1);
        if (step_logits) step_logits->push_back(logits.data().select(1, logits.size(1) - 1).to(DType::F32).contiguous());
        std::vector<int64_t> next = pick_next(logits, options.temperature, gen);
        for (int64_t b = 0; b < B; ++b) tokens[b].push_back(next[b]);
        ++length;
        ++stats.new_tokens;
    }
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return stats;
}

}  // namespace nl
