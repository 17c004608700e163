// `normlab export CHECKPOINT --to hf DIR | --to gguf FILE`: the command line of the export job
// (jobs/export.h): a model transformers or llama.cpp loads, and one line saying what was written.
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "examples/cli/commands.h"
#include "jobs/export.h"

namespace nl::cli {

void register_export(CLI::App& app) {
    struct Args {
        std::string checkpoint;
        std::vector<std::string> to;
        std::string dtype = "f32";
        bool force = false;
    };
    auto args = std::make_shared<Args>();
    CLI::App* cmd = app.add_subcommand(
        "export", "Write a checkpoint as a transformers directory (LlamaForCausalLM, Qwen3ForCausalLM or "
        "Olmo2ForCausalLM) or a llama.cpp GGUF file");
    cmd->add_option("checkpoint", args->checkpoint,
                    "A checkpoint file, a run directory (its latest checkpoint), a transformers directory or a GGUF file")
        ->required();
    cmd->add_option("--to", args->to, "hf DIR (transformers) or gguf FILE (llama.cpp)")->expected(2)->required();
    cmd->add_option("--dtype", args->dtype, "The tensors' dtype: f32 (default), f16 or bf16");
    cmd->add_flag("--force", args->force, "Replace an existing output");
    cmd->callback([args] {
        ExportOptions options;
        options.to = args->to.at(0);
        options.out = args->to.at(1);
        NL_REQUIRE(args->dtype == "f32" || args->dtype == "f16" || args->dtype == "bf16",
                   "export: --dtype must be f32, f16 or bf16, got '", args->dtype, "'");
        options.dtype = dtype_from_name(args->dtype);
        options.force = args->force;
        const ExportResult r = run_export(args->checkpoint, options);
        fmt::print("export: {} (step {}) -> {} ({}, {} parameters in {}{})\n", r.source, r.step, options.out,
                   options.to == "hf" ? "transformers " + r.architecture : "GGUF, llama.cpp's llama", r.parameters,
                   args->dtype, r.tokenizer ? ", with its character tokenizer" : "");
    });
}

}  // namespace nl::cli
