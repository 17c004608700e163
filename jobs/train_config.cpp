// The train job's config schema and its checkpoints' metadata (jobs/train_config.h).
#include "jobs/train_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/config.h"

namespace fs = std::filesystem;

namespace nl {

// ---- the config reader (its keys: jobs/config_schema.cpp) ----

int64_t data_seq_len(const DataOptions& data) {
    if (data.source == "text" || data.source == "tokens") return data.seq_len;
    // prompt + answer tokens, minus one: the last token is only ever a target (see data.h)
    int64_t sequence = data.task == "add" ? 3 * data.length + 3 : 2 * data.length + 1;
    return sequence - 1;
}

// data.vocab_size is required for token files; nanoGPT keeps it in meta.pkl (a Python pickle, which
// normlab does not read), or, for GPT-2's tokenizer, in no file at all.
[[noreturn]] static void fail_missing_vocab_size(const ConfigReader& reader, const std::string& path) {
    std::error_code ec;
    const std::string meta = (fs::path(path) / "meta.pkl").string();
    if (!path.empty() && fs::exists(meta, ec))
        reader.fail("vocab_size",
                    fmt::format("missing required integer for source \"tokens\": {} holds it, but normlab does not read "
                                "Python pickles; set data.vocab_size to what python3 -c \"import pickle; print(pickle.load("
                                "open('{}', 'rb'))['vocab_size'])\" prints",
                                meta, meta));
    reader.fail("vocab_size", "missing required integer for source \"tokens\": set data.vocab_size to the number of "
                              "token ids (every id in train.bin and val.bin is below it; nanoGPT uses 50304 for GPT-2's "
                              "tokenizer, and writes meta.pkl's vocab_size for its character-level data)");
}

static DataOptions read_data(ConfigReader reader, uint64_t seed) {
    DataOptions data;
    data.source = reader.get_string("source");
    if (data.source == "synthetic") {
        data.task = reader.get_string("task");
        data.length = reader.get_int("length");
        data.symbols = reader.get_int("symbols");
    } else if (data.source == "text") {
        data.path = reader.get_string("path", "");
        if (data.path.empty()) reader.fail("path", "a text file is required for source \"text\"");
        data.val_fraction = reader.get_double("val_fraction");
        data.seq_len = reader.get_int("seq_len");
    } else {
        data.path = reader.get_string("path", "");
        if (data.path.empty())
            reader.fail("path", "a directory holding train.bin and val.bin (nanoGPT's data/<name>/) is required for "
                                "source \"tokens\"");
        data.dtype = reader.get_string("dtype");
        // Required, but read as optional here so that a misspelt key is reported as one (finish, below).
        data.vocab_size = reader.get_optional_int("vocab_size").value_or(0);
        data.seq_len = reader.get_int("seq_len");
    }
    data.eval_sequences = reader.get_int("eval_sequences");
    data.seed = static_cast<uint64_t>(reader.get_int("seed", static_cast<int64_t>(seed)));
    reader.finish();
    if (data.source == "tokens" && data.vocab_size == 0) fail_missing_vocab_size(reader, data.path);
    return data;
}

static TransformerOptions read_model(ConfigReader reader, uint64_t seed, TrainConfig& config) {
    TransformerOptions model;
    // A transformers directory or GGUF file to start from (jobs/interop.h); the train job reads it.
    config.init_from = reader.get_string("init_from");
    config.model_vocab_size = reader.get_int("vocab_size");
    // Upper bounds (the schema's): far above a toy model, low enough that no size product below can
    // overflow (the memory a config needs is checked against the machine before training, see run_train).
    model.dim = reader.get_int("dim");
    model.n_layers = reader.get_int("n_layers");
    model.n_heads = reader.get_int("n_heads");
    // model.head_dim: absent is dim / n_heads (and config.json leaves it out, as before the key existed).
    model.head_dim = reader.get_optional_int("head_dim").value_or(0);
    if (model.head_dim > 0) {
        if (model.head_dim % 2 != 0)
            reader.fail("head_dim", fmt::format("expected an even head size (RoPE rotates pairs), got {}", model.head_dim));
    } else {
        if (model.dim % model.n_heads != 0)
            reader.fail("n_heads", fmt::format("expected a positive integer dividing dim={} (or set /model/head_dim), "
                                               "got {}", model.dim, model.n_heads));
        if ((model.dim / model.n_heads) % 2 != 0)
            reader.fail("n_heads", fmt::format("expected an even head size (RoPE rotates pairs), got dim / n_heads = "
                                               "{} / {} = {}", model.dim, model.n_heads, model.dim / model.n_heads));
    }
    model.n_kv_heads = reader.get_int("n_kv_heads", model.n_heads);
    if (model.n_heads % model.n_kv_heads != 0)
        reader.fail("n_kv_heads", fmt::format("expected a positive integer dividing n_heads={}, got {}",
                                              model.n_heads, model.n_kv_heads));
    model.multiple_of = reader.get_int("multiple_of");
    model.ffn_hidden_dim = reader.get_int("ffn_hidden_dim");
    ConfigReader norm = reader.child("norm");
    model.alpha_init_attention = norm.get_double("alpha_init_attention", norm.get_double("alpha_init"));
    model.norm = read_norm_options(norm, true);
    model.norm_placement = reader.get_string("norm_placement");
    if (const std::optional<bool> pre_norm = reader.get_optional_bool("pre_norm")) {  // the older name of pre and post
        const std::string placement = *pre_norm ? "pre" : "post";
        if (reader.has("norm_placement") && model.norm_placement != placement)
            reader.fail("pre_norm", fmt::format("says \"{}\", but /model/norm_placement says \"{}\" (pre_norm is the "
                                                "older name of norm_placement pre or post: give one)",
                                                placement, model.norm_placement));
        model.norm_placement = placement;
        reader.set_resolved("norm_placement", placement);
    }
    const NormPlacement& placement = norm_placement(model.norm_placement);
    if (placement.mixed) model.mix_fraction = reader.get_double("mix_fraction");
    model.norm_scaling = reader.get_string("norm_scaling");
    if (model.norm_scaling == "depth" && !placement.input_norms && !placement.mixed)
        reader.fail("norm_scaling", fmt::format("\"depth\" scales the pre-norms' outputs, which norm_placement \"{}\" "
                                                "does not have ({} do)",
                                                model.norm_placement, depth_scalable_placements()));
    if (placement.scaled_residual && model.n_layers == 0)
        reader.fail("norm_placement", "\"" + model.norm_placement + "\" needs n_layers > 0 (alpha = (2 n_layers)^(1/4)), "
                    "found n_layers 0");
    model.qk_norm = reader.get_string("qk_norm");
    if (model.qk_norm != "none" && model.norm.type != "rmsnorm" && model.norm.type != "layernorm")
        reader.fail("qk_norm", fmt::format("\"{}\" needs /model/norm/type rmsnorm or layernorm, found \"{}\"",
                                           model.qk_norm, model.norm.type));
    model.logit_softcap = reader.get_double("logit_softcap");
    model.attn_softcap = reader.get_double("attn_softcap");
    model.rope_theta = reader.get_double("rope_theta");
    model.max_seq_len = reader.get_int("max_seq_len");
    model.fused_attention = reader.get_bool("fused_attention");
    model.fused_swiglu = reader.get_bool("fused_swiglu");
    model.init = reader.get_string("init");
    model.init_std = reader.get_double("init_std");
    model.init_scaled_residual = reader.get_bool("init_scaled_residual");
    if (model.init_scaled_residual && model.init == "pytorch")
        reader.fail("init_scaled_residual", "scales the draws of /model/init \"normal\" or \"xavier\", found init "
                                            "\"pytorch\" (PyTorch's default init has no such rule)");
    model.seed = seed;
    reader.finish();
    return model;
}

static OptimConfig read_optim(ConfigReader reader) {
    OptimConfig optim;
    optim.lr = reader.get_double("lr");
    optim.min_lr = reader.get_double("min_lr");
    if (optim.min_lr > optim.lr)
        reader.fail("min_lr", fmt::format("expected a number <= /optim/lr = {}, got {}", optim.lr, optim.min_lr));
    optim.warmup_steps = reader.get_int("warmup_steps");
    optim.weight_decay = reader.get_double("weight_decay");
    optim.beta1 = reader.get_double("beta1");
    optim.beta2 = reader.get_double("beta2");
    optim.eps = reader.get_double("eps");
    optim.grad_clip = reader.get_double("grad_clip");
    optim.decay = reader.get_string("decay");
    optim.weight_decay_mode = reader.get_string("weight_decay_mode");
    reader.finish();
    return optim;
}

static LoopConfig read_loop(ConfigReader reader) {
    LoopConfig loop;
    loop.steps = reader.get_int("steps");
    loop.batch_size = reader.get_int("batch_size");
    loop.eval_every = reader.get_int("eval_every");
    loop.checkpoint_every = reader.get_int("checkpoint_every");
    loop.log_every = reader.get_int("log_every");
    loop.autocast = reader.get_string("autocast");
    loop.dtype = reader.get_string("dtype");
    if (loop.dtype == "f64" && loop.autocast != "none")
        reader.fail("dtype", fmt::format("\"f64\" trains without autocast, found /train/autocast \"{}\" (autocast "
                                         "casts an f32 model's matmuls; drop one of the two)", loop.autocast));
    loop.save_initial = reader.get_bool("save_initial");
    loop.save_batches = reader.get_bool("save_batches");
    loop.z_loss = reader.get_double("z_loss");
    loop.probe_every = reader.get_int("probe_every");
    loop.sharpness_every = reader.get_int("sharpness_every");
    loop.sharpness_iters = reader.get_int("sharpness_iters");
    loop.grad_shards = reader.get_int("grad_shards");
    loop.bucket_kb = reader.get_int("bucket_kb");
    loop.overlap_comm = reader.get_bool("overlap_comm");
    loop.threads = reader.get_int("threads");
    if (loop.dtype == "f64" && loop.grad_shards > 1)
        reader.fail("dtype", fmt::format("\"f64\" runs on one process with one gradient shard, found "
                                         "/train/grad_shards {}", loop.grad_shards));
    reader.finish();
    return loop;
}

TrainConfig read_train_config(const nlohmann::json& root, const std::string& file) {
    ConfigReader reader(root, file, config_schema("train"));
    TrainConfig config;
    config.file = file;
    config.seed = static_cast<uint64_t>(reader.get_int("seed"));
    config.device = read_device(reader);
    config.data = read_data(reader.child("data"), config.seed);
    config.model = read_model(reader.child("model"), config.seed, config);
    config.optim = read_optim(reader.child("optim"));
    config.train = read_loop(reader.child("train"));
    reader.finish();
    config.model.dtype = config.train.dtype == "f64" ? DType::F64 : DType::F32;
    if (config.model.dtype == DType::F64 && !config.device.is_cpu())
        throw Error(fmt::format("{}: /train/dtype: \"f64\" trains on the CPU, found /device \"{}\"", file,
                                config.device.str()));
    if (config.train.save_batches) {
        const double bytes = 2.0 * 8.0 * double(config.train.steps) * double(config.train.batch_size) *
                             double(data_seq_len(config.data));
        if (bytes > kMaxSavedBatchesBytes)
            throw Error(fmt::format("{}: /train/save_batches: the batches of {} steps x {} x {} tokens take {:.1f} MiB "
                                    "(int64 inputs and targets), above the {:.0f} MiB a run may save; lower "
                                    "/train/steps or /train/batch_size",
                                    file, config.train.steps, config.train.batch_size, data_seq_len(config.data),
                                    bytes / (1024.0 * 1024.0), kMaxSavedBatchesBytes / (1024.0 * 1024.0)));
    }

    if (config.optim.warmup_steps >= config.train.steps)
        throw Error(fmt::format("{}: /optim/warmup_steps: expected fewer than /train/steps = {}, got {}", file,
                                config.train.steps, config.optim.warmup_steps));
    const int64_t T = data_seq_len(config.data);
    if (T > config.model.max_seq_len) {
        std::string key = config.data.source == "synthetic" ? "/data/length" : "/data/seq_len";
        throw Error(fmt::format("{}: {}: sequences need {} positions, above the model's context "
                                "/model/max_seq_len = {}",
                                file, key, T, config.model.max_seq_len));
    }
    config.resolved = reader.resolved();
    return config;
}

double parameter_weight_decay(const OptimConfig& optim, int64_t dims) {
    if (optim.decay == "matrices" && dims < 2) return 0.0;
    if (optim.weight_decay_mode == "independent") return optim.lr > 0.0 ? optim.weight_decay / optim.lr : 0.0;
    return optim.weight_decay;
}

int64_t model_vocab_size(const TrainConfig& config, int64_t data_vocab) {
    if (config.model_vocab_size == 0) return data_vocab;
    NL_REQUIRE(config.model_vocab_size >= data_vocab, config.file, ": /model/vocab_size: expected at least the data's vocab size ",
               data_vocab, ", got ", config.model_vocab_size);
    return config.model_vocab_size;
}

double estimated_train_bytes(const TrainConfig& config, int64_t vocab_size) {
    // In double: the sizes are bounded, but their products need not fit an int64. A lower bound of
    // what a step holds (4 bytes an element, 8 in f64), so a config that fits is never refused.
    const TransformerOptions& m = config.model;
    const double e = config.model.dtype == DType::F64 ? 8.0 : 4.0;  // bytes per element
    const double D = double(m.dim), L = double(m.n_layers), V = double(vocab_size), H = double(m.n_heads);
    const double head = double(m.head_size());
    const double q_dim = head * H, kv_dim = head * double(m.n_kv_heads);
    const double ffn_in = m.ffn_hidden_dim > 0 ? double(m.ffn_hidden_dim) : 4.0 * D;
    const double ffn = double(m.multiple_of) * std::ceil(std::floor(2.0 * ffn_in / 3.0) / double(m.multiple_of));
    const double params = 2.0 * V * D + L * (2.0 * D * q_dim + 2.0 * D * kv_dim + 3.0 * D * ffn + 4.0 * D) + 2.0 * D;
    const double B = double(config.train.batch_size), T = double(data_seq_len(config.data));
    const double evals = double(config.data.eval_sequences) * (T + 1.0);
    const double tokens = 8.0 * 2.0 * evals;                       // held-out ids and targets, i64
    const double weights = 4.0 * e * params;                       // weights, grads, AdamW's two moments
    const double saved = e * B * T * (L * (8.0 * D + 3.0 * ffn) + 3.0 * V) +  // activations for backward
                         e * 2.0 * B * H * T * T * L;                          // attention scores, softmax
    return tokens + weights + saved;
}

nlohmann::json checkpoint_metadata_json(const CheckpointInfo& info, const std::string& path, const std::string& key) {
    auto it = info.metadata.find(key);
    NL_REQUIRE(it != info.metadata.end(), path, ": not a normlab train checkpoint (no ", key, " in its metadata)");
    return parse_json(it->second, path + ": metadata '" + key + "'");
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
    return fmt::format("{}/checkpoints/step_{:08}.safetensors", run_dir, step);
}

std::string latest_checkpoint(const std::string& run_dir) {
    std::error_code ec;
    std::string best;
    int64_t best_step = -1;
    static const std::regex pattern("step_([0-9]{8})\\.safetensors");
    for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints", ec)) {
        std::smatch match;
        std::string name = entry.path().filename().string();
        if (!std::regex_match(name, match, pattern)) continue;
        int64_t step = std::stoll(match[1].str());
        if (step > best_step) best_step = step, best = entry.path().string();
    }
    return best;
}

// The parts of a config a checkpoint's tensors and batches depend on: /seed, /model and /data.
void check_checkpoint_matches(const std::string& path, const TrainConfig& config) {
    CheckpointInfo info = read_checkpoint_info(path);
    nlohmann::json saved = checkpoint_metadata_json(info, path, "config");
    // A step past the end would resume a run that is already complete, and write its summary again.
    NL_REQUIRE(info.step <= config.train.steps, path, ": checkpoint is at step ", info.step,
               ", beyond /train/steps = ", config.train.steps, " in ", config.file);
    // A key the checkpoint's config lacks and this config holds at its default is a key added to
    // normlab after the checkpoint was written (model.init, train.dtype, ...): the run used that default.
    const ConfigSchema& schema = config_schema("train");
    auto added_at_default = [&](const std::string& pointer, const nlohmann::json& value) {
        std::string dotted = pointer.substr(1);
        std::replace(dotted.begin(), dotted.end(), '/', '.');
        const ConfigKey* key = schema.find(dotted);
        return key != nullptr && !key->default_value.is_null() && key->default_value == value;
    };
    for (const char* section : {"/seed", "/model", "/data", "/train/dtype"}) {
        nlohmann::json::json_pointer pointer(section);
        const bool absent = !saved.contains(pointer);
        nlohmann::json a = absent ? nlohmann::json() : saved[pointer];
        const nlohmann::json& b = config.resolved[pointer];
        if (a == b || (absent && added_at_default(section, b))) continue;
        for (const auto& change : nlohmann::json::diff(a, b)) {
            const std::string key = std::string(section) + change["path"].get<std::string>();
            nlohmann::json::json_pointer p(change["path"].get<std::string>());
            if (change["op"] == "add" && added_at_default(key, b[p])) continue;
            // Name the first differing key.
            const std::string was = a.contains(p) ? brief_json(a[p]) : "absent";
            const std::string now = b.contains(p) ? brief_json(b[p]) : "absent";
            throw Error(fmt::format("{}: checkpoint does not match the config: {} is {} in the checkpoint, {} in {}",
                                    path, key, was, now, config.file));
        }
    }
}

// A resumed run keeps metrics.csv rows up to the checkpoint's step (rows written after it, by the
// interrupted run, are recomputed).

}  // namespace nl
