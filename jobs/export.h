// The export job as library code: a train checkpoint (or a run directory's latest one, or a model
// transformers or llama.cpp made) written for transformers or llama.cpp (jobs/interop.h), with the
// character tokenizer of a text model. Nothing here prints.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "jobs/interop.h"

namespace nl {

struct ExportResult {
    std::string source;       // the checkpoint file (or model) read
    int64_t step = 0;         // its training step
    int64_t parameters = 0;   // elements written
    bool tokenizer = false;   // a character tokenizer was written
    std::string architecture;  // "LlamaForCausalLM", "Qwen3ForCausalLM", "Olmo2ForCausalLM" or "llama" (GGUF)
    std::string out;           // what was written: ExportOptions::out
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ExportResult, source, step, parameters, tokenizer, architecture, out)

// `checkpoint` as load_train_checkpoint (jobs/sample.h) reads it; nl::Error when it is missing, the
// model cannot be represented (check_exportable), or `options` are wrong.
ExportResult run_export(const std::string& checkpoint, const ExportOptions& options);

}  // namespace nl
