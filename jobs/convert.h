// The convert job as library code: a pre-norm LayerNorm transformer rewritten, exactly, as the
// pre-norm RMSNorm transformer that computes the same function (Jiang et al. 2023, "Pre-RMSNorm and
// Pre-CRMSNorm Transformers: Equivalent and Efficient Pre-LN Transformers", arXiv 2305.14858), and
// written as a train checkpoint that `normlab sample` and `normlab export` read. Nothing here prints.
//
// Why it is exact: in a pre-norm model every LayerNorm reads the residual stream x, and
// LN(x) = LN(x - mean(x)). Everything that writes into the stream (the token embedding, each block's
// attention.wo and feed_forward.w2) is re-centered so the stream is zero-mean per token for any input;
// for a zero-mean x, var(x) = mean(x^2), so LN(x) = x / sqrt(mean(x^2) + eps) * w = RMSNorm(x) with
// the same eps and weight (docs/norms.md: "LayerNorm -> RMSNorm, exactly").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "layers/transformer.h"

namespace nl {

// nl::Error naming the config key and its value when `options` is not a model the conversion
// covers: only a pre-norm (/model/pre_norm true) model whose norms are all "layernorm" is. The one
// place that decides which norm placements convert.
void check_convertible_to_rmsnorm(const TransformerOptions& options);

// The converted model's options: norm.type "rmsnorm" with the LayerNorm's eps made explicit and its
// bias option back at its default (an RMSNorm has no bias); everything else as in `options`.
TransformerOptions rmsnorm_options(const TransformerOptions& options);

// A new model (on `model`'s device, in its dtype) computing the same function as `model` with RMSNorms
// for its LayerNorms: tok_embeddings.weight (vocab, dim) minus each row's mean over dim;
// layers.<i>.attention.wo.weight and layers.<i>.feed_forward.w2.weight (dim, in) minus each column's
// mean over dim (the output axis); the norms' weights as they are. Computed in f64, cast back once.
// `model` is not changed. nl::Error from check_convertible_to_rmsnorm, or naming the tensor when a
// LayerNorm has a nonzero bias (an RMSNorm has none, and normlab's Linears have no bias to fold it
// into); an all-zero bias is dropped.
std::unique_ptr<Transformer> convert_to_rmsnorm(const Transformer& model);

// A train checkpoint's resolved config (its "config" metadata) for the converted model:
// /model/norm/type "rmsnorm", /model/norm/bias removed, the rest unchanged.
nlohmann::json rmsnorm_train_config(const nlohmann::json& resolved);

struct ConvertOptions {
    std::string to = "rmsnorm";  // the target norm; only "rmsnorm"
    std::string out;             // the checkpoint file to write
    bool force = false;          // replace an existing `out`
};

struct ConvertResult {
    std::string source;        // the checkpoint file read
    int64_t step = 0;          // its training step, which the converted checkpoint keeps
    int64_t norms = 0;         // LayerNorms made RMSNorms
    int64_t recentered = 0;    // weights re-centered: the embedding and each block's wo and w2
    int64_t parameters = 0;    // elements written
    std::string out;           // the checkpoint written: ConvertOptions::out
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ConvertResult, source, step, norms, recentered, parameters, out)

// `checkpoint` (a train checkpoint file, or a run directory: its latest checkpoint) converted and
// written to options.out as a train checkpoint: the converted weights, the step, and the metadata
// with the config from rmsnorm_train_config (the vocab and trained_seq_len as they were). No
// optimizer state: the optimizer's moments belong to the LayerNorm model, so the file samples and
// exports, and training from it starts afresh. Written atomically (temp file + rename). nl::Error
// when the checkpoint is missing or not a train checkpoint, the model does not convert, `to` is not
// "rmsnorm", or `out` exists (without force) or is a directory.
ConvertResult run_convert(const std::string& checkpoint, const ConvertOptions& options);

}  // namespace nl
