// The convert job (jobs/convert.h).
#include "jobs/convert.h"

#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/ops.h"
#include "jobs/sample.h"
#include "jobs/train_config.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The weights that write into the residual stream, and the axis each one's output runs along:
// the embedding's rows (vocab, dim) are stream vectors (axis 1); a projection's output y = W a,
// W (dim, in), is zero-mean for every a when each column of W is (axis 0).
int64_t stream_axis(const std::string& name) {
    if (name == "tok_embeddings.weight") return 1;
    if (ends_with(name, ".attention.wo.weight") || ends_with(name, ".feed_forward.w2.weight")) return 0;
    return -1;
}

// A LayerNorm's bias: "layers.0.attention_norm.bias", "layers.3.ffn_norm.bias" or "norm.bias".
bool is_norm_bias(const std::string& name) {
    return name == "norm.bias" || ends_with(name, "_norm.bias");
}

}  // namespace

void check_convertible_to_rmsnorm(const TransformerOptions& o) {
    // A post-norm block normalizes x + f(x) and its output is the stream itself: the norm's weight and
    // bias put a mean back into the stream, so no re-centering of the writers makes its input zero-mean.
    // The other placements put a norm's output (peri, output, mix's post blocks, deepnorm) or a scale
    // (depth scaling) on the stream too.
    NL_REQUIRE(o.norm_placement == "pre", "convert: /model/norm_placement is \"", o.norm_placement,
               "\"; the LayerNorm -> RMSNorm conversion is exact only for pre-norm models (\"pre\"), where every "
               "norm reads the residual stream");
    NL_REQUIRE(o.norm_scaling == "none", "convert: /model/norm_scaling is \"", o.norm_scaling,
               "\"; the conversion keeps the norms as they are and covers unscaled pre-norms only");
    NL_REQUIRE(o.norm.type == "layernorm", "convert: /model/norm/type is \"", o.norm.type, "\"",
               o.norm.type == "rmsnorm" ? " (already RMSNorm)" : "",
               "; --to rmsnorm converts a model whose norms are \"layernorm\"");
}

TransformerOptions rmsnorm_options(const TransformerOptions& options) {
    TransformerOptions o = options;
    o.norm.type = "rmsnorm";
    o.norm.eps = options.norm.resolved_eps();  // the LayerNorm's, whatever RMSNorm's default
    o.norm.bias = NormOptions{}.bias;          // what a config without /model/norm/bias reads
    return o;
}

std::unique_ptr<Transformer> convert_to_rmsnorm(const Transformer& model) {
    check_convertible_to_rmsnorm(model.options());
    const NamedTensors state = model.state_dict();
    NL_REQUIRE(!state.empty(), "convert: the model has no parameters");
    const Device device = state.front().second.device();
    NamedTensors converted;
    for (const auto& [name, tensor] : state) {
        if (is_norm_bias(name)) {
            const double largest = max(abs(tensor.to(Device::cpu()).to(DType::F64))).item();
            NL_REQUIRE(largest == 0.0, "convert: ", name, " is nonzero (max |bias| = ", largest,
                       "): an RMSNorm has no bias and normlab's Linears have none to fold it into; only a "
                       "LayerNorm without bias (/model/norm/bias false) converts exactly");
            continue;  // all zeros: LN(x) = RMSNorm(x) without it
        }
        const int64_t axis = stream_axis(name);
        if (axis < 0) {
            converted.push_back({name, tensor});
            continue;
        }
        NL_REQUIRE(tensor.dim() == 2 && tensor.size(axis) == model.options().dim, "convert: ", name,
                   ": expected a 2-D weight with dim = ", model.options().dim, " along axis ", axis, ", found ",
                   shape_str(tensor.shape()));
        // f64, so the re-centered weight is the exact one rounded once to the model's dtype.
        const Tensor w = tensor.to(Device::cpu()).to(DType::F64);
        converted.push_back({name, (w - mean(w, {axis}, true)).to(tensor.dtype())});
    }
    auto out = std::make_unique<Transformer>(rmsnorm_options(model.options()));
    out->to(device);
    out->load_state_dict(converted);  // strict: every name of the RMSNorm model, nothing else
    out->train(model.is_training());
    return out;
}

nlohmann::json rmsnorm_train_config(const nlohmann::json& resolved) {
    nlohmann::json config = resolved;
    NL_REQUIRE(config.contains("model") && config["model"].is_object() && config["model"].contains("norm") &&
                   config["model"]["norm"].is_object(),
               "convert: the checkpoint's config has no /model/norm object");
    nlohmann::json& norm = config["model"]["norm"];
    norm["type"] = "rmsnorm";
    norm.erase("bias");
    return config;
}

ConvertResult run_convert(const std::string& checkpoint, const ConvertOptions& options) {
    NL_REQUIRE(options.to == "rmsnorm", "convert: --to must be rmsnorm, got '", options.to, "'");
    NL_REQUIRE(!options.out.empty(), "convert: no output path");
    std::error_code ec;
    NL_REQUIRE(!fs::is_directory(options.out, ec), options.out, ": is a directory; convert writes a checkpoint file");
    NL_REQUIRE(options.force || !fs::exists(fs::symlink_status(options.out, ec)), options.out,
               ": already exists (--force replaces it)");
    TrainCheckpoint ck = load_train_checkpoint(checkpoint);
    check_convertible_to_rmsnorm(ck.config.model);  // before anything else is done
    NL_REQUIRE(ck.info.metadata.count("config") == 1, "convert: ", ck.path,
               ": not a normlab train checkpoint (no config in its metadata)");
    const std::unique_ptr<Transformer> model = convert_to_rmsnorm(*ck.model);

    // The metadata as it was (vocab, trained_seq_len, the user's), with the converted config, which
    // must read back as the converted model's.
    std::map<std::string, std::string> metadata = ck.info.metadata;
    const nlohmann::json config = rmsnorm_train_config(ck.config.resolved);
    const TrainConfig reread = read_train_config(config, options.out + " (config)");
    NL_REQUIRE(reread.model.norm.type == "rmsnorm" && reread.model.norm_placement == "pre" &&
                   reread.model.norm.resolved_eps() == model->options().norm.resolved_eps(),
               "convert: the converted config does not read back as the converted model (norm ", reread.model.norm.type,
               ", eps ", reread.model.norm.resolved_eps(), ")");
    metadata["config"] = config.dump();
    save_checkpoint(options.out, *model, nullptr, nullptr, ck.info.step, metadata);

    ConvertResult result;
    result.source = ck.path;
    result.step = ck.info.step;
    result.norms = 2 * model->n_layers() + 1;
    result.recentered = 1 + 2 * model->n_layers();
    result.parameters = count_parameters(*model);
    result.out = options.out;
    return result;
}

}  // namespace nl
