// The analyze job as library code: a trained model under the microscope, forward passes only. Over
// the first N windows of a token stream (each window an independent sequence at positions 0..T-1)
// it measures what the normalization literature asks of pretrained models: per block the largest
// activation of the residual stream and its channel (massive activations, Sun et al. 2024), the
// channels' kurtosis (outlier features, He et al. 2024; Bondarenko et al. 2023), per query head the
// attention on the first token (attention sinks, Xiao et al. 2023) and the attention's entropy, and
// the loss with the block skipped (which blocks could be dropped: the depth findings behind
// LayerNorm Scaling, Sun et al. 2025); and every norm's weight. The model is a normlab checkpoint or
// run directory, a transformers directory (LLaMA, Qwen3, OLMo 2) or a GGUF file. docs/analyze.md.
//
// Window w of the stream is tokens [w (T + 1), (w + 1)(T + 1)): the model reads its first T and is
// scored on its last T (the window shifted by one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/transformer.h"

namespace nl {

// Bounds of an analyze job: windows are run one at a time, so these bound its time, not its memory.
inline constexpr int64_t kMaxAnalyzeWindows = 100'000;
inline constexpr int64_t kDefaultAnalyzeSeqLen = 512;  // the default T, where the model's context allows

struct AnalyzeOptions {
    std::string model;        // a normlab checkpoint or run directory, a transformers directory or a GGUF file
    std::string tokens;       // a directory holding val.bin (nanoGPT's token files); or
    std::string text;         // a UTF-8 text file, for a model with a character tokenizer normlab reads
    std::string token_dtype;  // val.bin's ids: "uint16" or "uint32"; "": <tokens>/meta.json's "dtype"
                              // where it exists, else uint16 for a vocabulary of at most 65,536 ids, else uint32
    int64_t windows = 8;      // N, 1..kMaxAnalyzeWindows
    int64_t seq_len = 0;      // T; 0: the model's context (its trained sequence length), at most kDefaultAnalyzeSeqLen
    std::string dtype = "f32";  // the model's dtype while it runs: f32, bf16 or f64
    bool convert_check = false;  // also the exact LayerNorm -> RMSNorm conversion's logit difference
    std::string out;          // the directory to write (analysis.json, plots.gp, PNGs); "": write nothing
    bool force = false;       // replace an existing `out`
};

// What was measured of the windows' ids (N, T + 1) by `model`: the object analysis.json holds from
// "loss" on (loss, layers, norms; convert_check where asked), every field documented in
// docs/analyze.md. `converted`, when not null, is the model's RMSNorm conversion (convert_check).
nlohmann::json analyze_windows(Transformer& model, const std::vector<std::vector<int64_t>>& windows,
                               Transformer* converted = nullptr);

struct AnalyzeResult {
    nlohmann::json analysis;  // analysis.json's object
    std::string out;          // the directory written ("" when none)
    std::string plots;        // the PNGs drawn, or why none
};

// Checks everything it can before it takes memory (the options, `out`, the model's architecture, the
// token files' length and ids against the vocabulary), then loads the model and analyzes it.
// nl::Error for a user mistake, naming the file, option or key. `out` is written atomically: the
// directory appears whole or not at all.
AnalyzeResult run_analyze(const AnalyzeOptions& options);

}  // namespace nl
