// Generation from a trained Transformer, as `normlab sample` does it: the model sees a window of at
// most the sequence length it was trained on (positions it has never seen are never fed), and a KV
// cache makes each new token cost one position instead of the whole window.
//
// The window: the last `context` tokens of the prompt, then every generated token appended. When
// appending would make it longer than `context`, it slides: it restarts from its last
// ceil(context / 2) tokens at position 0 (RoPE positions restart with it, so every position stays
// in the trained range 0..context-1), the cache is recomputed over them, and tokens are again added
// one position at a time. Without the cache the same windows are recomputed whole for every token,
// so both paths see the same tokens at the same positions and pick the same tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/rng.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "layers/transformer.h"

namespace nl {

struct GenerateOptions {
    int64_t context = 0;       // the window, in tokens: the trained sequence length (<= max_seq_len)
    double temperature = 0.0;  // 0: greedy (argmax); > 0: sample from softmax(logits / temperature)
    bool kv_cache = true;      // false: recompute the whole window for every token
};

struct GenerateStats {
    int64_t new_tokens = 0;
    int64_t positions_computed = 0;  // model positions run, summed over forward calls (the work)
    int64_t max_position = -1;       // the highest position fed to the model; always < context
    int64_t slides = 0;              // times the window restarted
    double seconds = 0.0;
};

// The window for a checkpoint: the sequence length the model was trained on, which train records in
// its metadata (kTrainedSeqLenKey). A checkpoint that does not record it (written before it was)
// falls back to its stored config's /data (data_seq_len), and `note`, when given, says so.
int64_t trained_context(const CheckpointInfo& info, const TrainConfig& config, const std::string& path,
                        std::string* note = nullptr);

// The next token of each row from the logits (B, T, V) at the last position: argmax at temperature
// 0, else a draw from softmax(logits / temperature) (computed in f64).
std::vector<int64_t> pick_next(const Var& logits, double temperature, Generator& gen);

// Extends every row of `tokens` (B non-empty rows of equal length) by `count` tokens. When
// `step_logits` is not null, the logits the model gave for each new token are appended to it (one
// (B, V) f32 tensor per token), so tests can compare the two paths.
GenerateStats generate(Transformer& model, std::vector<std::vector<int64_t>>& tokens, int64_t count,
                       const GenerateOptions& options, Generator& gen, std::vector<Tensor>* step_logits = nullptr);

}  // namespace nl
