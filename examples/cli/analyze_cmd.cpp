// `normlab analyze MODEL --tokens DIR --out OUTDIR`: the command line of the analyze job
// (jobs/analyze.h): a table by block on stdout, analysis.json and the PNGs in OUTDIR.
#include <cmath>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "examples/cli/commands.h"
#include "jobs/analyze.h"

namespace nl::cli {

namespace {

double mean_of(const nlohmann::json& values) {
    double sum = 0.0;
    for (const auto& v : values) sum += v.is_null() ? 0.0 : v.get<double>();
    return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

void print(const AnalyzeResult& r) {
    const nlohmann::json& a = r.analysis;
    const nlohmann::json& arch = a["architecture"];
    fmt::print("analyze: {} ({}, {} blocks, {} parameters, {}): {} windows of {} tokens from {}\n",
               a["model"].get<std::string>(), a["format"].get<std::string>(), arch["n_layers"].get<int64_t>(),
               arch["parameters"].get<int64_t>(), a["dtype"].get<std::string>(), a["windows"].get<int64_t>(),
               a["seq_len"].get<int64_t>(), a["tokens"].get<std::string>());
    fmt::print("loss {:.6f} nats\n", a["loss"].get<double>());
    fmt::print("{:>5} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}\n", "block", "act_max", "channel", "kurtosis",
               "sink", "entropy", "drop_delta");
    for (const auto& l : a["layers"])
        fmt::print("{:>5} {:>12.4g} {:>8} {:>10.4g} {:>10.4f} {:>10.4f} {:>+12.5f}\n", l["layer"].get<int64_t>(),
                   l["act_max"].get<double>(), l["act_max_channel"].get<int64_t>(), l["act_kurtosis"].get<double>(),
                   mean_of(l["attn_sink"]), mean_of(l["attn_entropy"]), l["drop_delta_loss"].get<double>());
    fmt::print("(sink and entropy: mean over query heads; analysis.json has each head)\n");
    if (a.contains("convert_check")) {
        const auto& c = a["convert_check"];
        fmt::print("convert check: LayerNorm -> RMSNorm, max |logit difference| {:.3g} (max |logit| {:.4g}), loss "
                   "difference {:.3g}\n",
                   c["max_abs_logit_diff"].get<double>(), c["max_abs_logit"].get<double>(), c["loss_diff"].get<double>());
    }
    if (!r.out.empty())
        fmt::print("analyze: analysis.json, plots.gp ({}) -> {} ({:.1f} s)\n", r.plots, r.out, a["seconds"].get<double>());
}

}  // namespace

void register_analyze(CLI::App& app) {
    auto o = std::make_shared<AnalyzeOptions>();
    CLI::App* cmd = app.add_subcommand(
        "analyze", "Measure a trained model over held-out windows: massive activations, outlier channels, attention "
        "sinks, the loss without each block, the norms' weights (docs/analyze.md)");
    cmd->add_option("model", o->model,
                    "A checkpoint file, a run directory (its latest checkpoint), a transformers directory "
                    "(LlamaForCausalLM, Qwen3ForCausalLM, Olmo2ForCausalLM) or a GGUF file")
        ->required();
    cmd->add_option("--tokens", o->tokens, "A directory holding val.bin (nanoGPT token files): the windows' ids");
    cmd->add_option("--text", o->text, "A UTF-8 text file instead, for a model with a character tokenizer");
    cmd->add_option("--token-dtype", o->token_dtype,
                    "val.bin's ids: uint16 or uint32 (default: DIR/meta.json's dtype, else uint16 up to 65,536 ids)");
    cmd->add_option("--windows", o->windows, "N: windows analyzed, each an independent sequence (default 8)");
    cmd->add_option("--seq-len", o->seq_len, "T: positions per window (default: the model's context, at most 512)");
    cmd->add_option("--dtype", o->dtype, "The model's dtype while it runs: f32 (default), bf16 or f64");
    cmd->add_flag("--convert-check", o->convert_check,
                  "Also report the logits' difference after the exact LayerNorm -> RMSNorm conversion (pre-norm "
                  "LayerNorm models)");
    cmd->add_option("--out", o->out, "The directory to write: analysis.json, plots.gp and the PNGs")->required();
    cmd->add_flag("--force", o->force, "Replace an existing --out");
    cmd->callback([o] { print(run_analyze(*o)); });
}

}  // namespace nl::cli
