// Export to and import from transformers and llama.cpp (jobs/interop.h, docs/interop.md).
#include "jobs/interop.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/core.h>

#include "core/error.h"
#include "core/gguf.h"
#include "core/json_parse.h"
#include "core/safetensors.h"
#include "jobs/config.h"
#include "jobs/data.h"
#include "jobs/run_dir.h"
#include "jobs/train_config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace nl {

const std::vector<WeightName> kWeightNames = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", "token_embd.weight", false},
    {"norm.weight", "model.norm.weight", "output_norm.weight", false},
    {"output.weight", "lm_head.weight", "output.weight", false},
    {"attention.wq.weight", "self_attn.q_proj.weight", "attn_q.weight", true},
    {"attention.wk.weight", "self_attn.k_proj.weight", "attn_k.weight", true},
    {"attention.wv.weight", "self_attn.v_proj.weight", "attn_v.weight", true},
    {"attention.wo.weight", "self_attn.o_proj.weight", "attn_output.weight", true},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", "ffn_gate.weight", true},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", "ffn_down.weight", true},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", "ffn_up.weight", true},
    {"attention_norm.weight", "input_layernorm.weight", "attn_norm.weight", true},
    {"ffn_norm.weight", "post_attention_layernorm.weight", "ffn_norm.weight", true},
};

const char* hf_class_name(HfArch arch) {
    return arch == HfArch::Llama ? "LlamaForCausalLM" : arch == HfArch::Qwen3 ? "Qwen3ForCausalLM" : "Olmo2ForCausalLM";
}
const char* hf_model_type(HfArch arch) { return arch == HfArch::Llama ? "llama" : arch == HfArch::Qwen3 ? "qwen3" : "olmo2"; }

const std::vector<WeightName>& hf_weight_names(HfArch arch) {
    static const std::vector<WeightName> qk_norms = {
        {"attention.q_norm.weight", "self_attn.q_norm.weight", "", true},
        {"attention.k_norm.weight", "self_attn.k_norm.weight", "", true},
    };
    static const std::vector<WeightName> qwen3 = [] {
        std::vector<WeightName> names = kWeightNames;
        names.insert(names.end(), qk_norms.begin(), qk_norms.end());
        return names;
    }();
    static const std::vector<WeightName> olmo2 = [] {
        std::vector<WeightName> names;
        for (const WeightName& w : kWeightNames)
            if (std::strcmp(w.normlab, "attention_norm.weight") != 0 && std::strcmp(w.normlab, "ffn_norm.weight") != 0)
                names.push_back(w);
        names.insert(names.end(), qk_norms.begin(), qk_norms.end());
        names.push_back({"attention_out_norm.weight", "post_attention_layernorm.weight", "", true});
        names.push_back({"ffn_out_norm.weight", "post_feedforward_layernorm.weight", "", true});
        return names;
    }();
    return arch == HfArch::Llama ? kWeightNames : arch == HfArch::Qwen3 ? qwen3 : olmo2;
}

namespace {

constexpr const char* kHfLayerPrefix = "model.layers.";
constexpr const char* kGgufLayerPrefix = "blk.";
constexpr const char* kNormlabLayerPrefix = "layers.";

enum class Naming { Normlab, Hf, Gguf };

const char* name_of(const WeightName& w, Naming naming) {
    return naming == Naming::Normlab ? w.normlab : naming == Naming::Hf ? w.hf : w.gguf;
}
const char* layer_prefix(Naming naming) {
    return naming == Naming::Normlab ? kNormlabLayerPrefix : naming == Naming::Hf ? kHfLayerPrefix : kGgufLayerPrefix;
}

// "<prefix><i>.<kind>" -> (i, kind); false when `name` is not of that form.
bool split_layer_name(const std::string& name, const std::string& prefix, int64_t& layer, std::string& kind) {
    if (name.compare(0, prefix.size(), prefix) != 0) return false;
    size_t pos = prefix.size(), end = pos;
    while (end < name.size() && end - pos < 7 && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == pos || end >= name.size() || name[end] != '.') return false;
    if (name[pos] == '0' && end - pos > 1) return false;  // "01" is not a layer index
    layer = std::stoll(name.substr(pos, end - pos));
    kind = name.substr(end + 1);
    return true;
}

// A name from one naming to another under `table`; "" when `name` is not in it (or has no name in
// `to`).
std::string translate(const std::string& name, Naming from, Naming to, const std::vector<WeightName>& table = kWeightNames) {
    int64_t layer = 0;
    std::string kind;
    const bool per_layer = split_layer_name(name, layer_prefix(from), layer, kind);
    for (const WeightName& w : table) {
        if (w.per_layer != per_layer) continue;
        if ((per_layer ? kind : name) != name_of(w, from)) continue;
        if (*name_of(w, to) == '\0') return "";
        return per_layer ? layer_prefix(to) + std::to_string(layer) + "." + name_of(w, to) : std::string(name_of(w, to));
    }
    return "";
}

std::string translate_or_throw(const std::string& name, Naming from, Naming to, const std::vector<WeightName>& table,
                               const char* table_name) {
    std::string out = translate(name, from, to, table);
    NL_REQUIRE(!out.empty(), "interop: the weight '", name, "' has no name in the ", table_name, " weight table");
    return out;
}

// Every parameter of a Transformer with `o` and its shape, in the model's order (normlab names):
// the order of Attention's, TransformerBlock's and Transformer's register_module calls.
std::vector<std::pair<std::string, Shape>> expected_weights(const TransformerOptions& o) {
    const int64_t D = o.dim, V = o.vocab_size, hd = o.head_size();
    const int64_t kv = o.n_kv_heads > 0 ? o.n_kv_heads : o.n_heads;
    const int64_t F = swiglu_hidden_dim(o.ffn_hidden_dim > 0 ? o.ffn_hidden_dim : 4 * D, o.multiple_of);
    std::vector<std::pair<std::string, Shape>> out = {{"tok_embeddings.weight", {V, D}}};
    for (int64_t i = 0; i < o.n_layers; ++i) {
        const std::string p = "layers." + std::to_string(i) + ".";
        const NormPlacement& placement = norm_placement(o.block_placement(i));
        out.push_back({p + "attention.wq.weight", {o.n_heads * hd, D}});
        out.push_back({p + "attention.wk.weight", {kv * hd, D}});
        out.push_back({p + "attention.wv.weight", {kv * hd, D}});
        out.push_back({p + "attention.wo.weight", {D, o.n_heads * hd}});
        if (o.qk_norm != "none") {
            out.push_back({p + "attention.q_norm.weight", {o.qk_norm == "head" ? hd : o.n_heads * hd}});
            out.push_back({p + "attention.k_norm.weight", {o.qk_norm == "head" ? hd : kv * hd}});
        }
        out.push_back({p + "feed_forward.w1.weight", {F, D}});
        out.push_back({p + "feed_forward.w2.weight", {D, F}});
        out.push_back({p + "feed_forward.w3.weight", {F, D}});
        if (placement.input_norms || placement.sum_norms) {
            out.push_back({p + "attention_norm.weight", {D}});
            out.push_back({p + "ffn_norm.weight", {D}});
        }
        if (placement.output_norms) {
            out.push_back({p + "attention_out_norm.weight", {D}});
            out.push_back({p + "ffn_out_norm.weight", {D}});
        }
    }
    out.push_back({"norm.weight", {D}});
    out.push_back({"output.weight", {V, D}});
    return out;
}

}  // namespace

double model_weight_bytes(const TransformerOptions& o) {
    double total = 0;
    for (const auto& [name, shape] : expected_weights(o)) {
        double n = 1;
        for (int64_t d : shape) n *= double(d);
        total += 4.0 * n;
    }
    return total;
}

namespace {

// The number of heads whose RoPE layout a weight carries in its rows (its elements for a 1-D
// QK-norm weight): wq and a full q_norm n_heads, wk and a full k_norm n_kv_heads, a per-head q_norm
// or k_norm one (its head_dim vector); 0 for every other weight, which RoPE does not touch.
int64_t rope_heads(const std::string& normlab_name, const TransformerOptions& o) {
    const auto ends_with = [&](const char* suffix) {
        const size_t n = std::strlen(suffix);
        return normlab_name.size() >= n && normlab_name.compare(normlab_name.size() - n, n, suffix) == 0;
    };
    const int64_t kv = o.n_kv_heads > 0 ? o.n_kv_heads : o.n_heads;
    if (ends_with(".attention.wq.weight")) return o.n_heads;
    if (ends_with(".attention.wk.weight")) return kv;
    if (ends_with(".attention.q_norm.weight")) return o.qk_norm == "head" ? 1 : o.n_heads;
    if (ends_with(".attention.k_norm.weight")) return o.qk_norm == "head" ? 1 : kv;
    return 0;
}

// `weight` with its RoPE rows (rope_heads) moved to transformers' half split or back; a 1-D QK-norm
// weight is permuted as a column of rows.
Tensor permute_for_hf(const Tensor& weight, const std::string& normlab_name, const TransformerOptions& o, bool to_hf) {
    const int64_t heads = rope_heads(normlab_name, o);
    if (heads == 0) return weight;
    if (weight.dim() == 1)
        return permute_rope_rows(weight.reshape({weight.numel(), 1}), heads, to_hf).reshape({weight.numel()});
    return permute_rope_rows(weight, heads, to_hf);
}

// Where the weights a loader reads go, one at a time under normlab's name, each f32 and contiguous
// with its own storage: into a NamedTensors, or copied into a model's parameter and dropped, so a
// model loads holding one converted weight beside its own at a time.
using WeightSink = std::function<void(const std::string& name, const Tensor& weight)>;
// Called by a loader once it knows the architecture, before it reads a weight: the sink for the
// weights, or an empty one for the architecture and vocabulary only. So a model can be built from
// the file's options and filled in one reading of the file.
using SinkFor = std::function<WeightSink(const TransformerOptions& options)>;

// Weights read under another naming (transformers' under `hf_names`), translated, checked against
// the architecture (every one present once, with its shape, of a float dtype), converted to f32 and
// given to `sink` in the model's order.
void collect_weights(const std::vector<std::pair<std::string, Tensor>>& found, Naming naming,
                     const std::vector<WeightName>& hf_names, const char* arch_name, const TransformerOptions& options,
                     bool tied, const std::string& where, const WeightSink& sink) {
    const std::vector<std::pair<std::string, Shape>> expected = expected_weights(options);
    const std::vector<WeightName>& table = naming == Naming::Hf ? hf_names : kWeightNames;
    std::map<std::string, Tensor> by_name;
    for (const auto& [name, tensor] : found) {
        // Old transformers checkpoints carry RoPE's inverse frequencies: computed, not learned.
        if (naming == Naming::Hf && name.size() > 20 && name.compare(name.size() - 20, 20, "rotary_emb.inv_freq") == 0)
            continue;
        const std::string ours = translate(name, naming, Naming::Normlab, table);
        NL_REQUIRE(!ours.empty(), where, ": unexpected tensor '", name, "' (not a ", arch_name, " weight)");
        NL_REQUIRE(by_name.count(ours) == 0, where, ": tensor '", name, "' appears twice");
        by_name.emplace(ours, tensor);
    }
    if (tied && by_name.count("output.weight") == 0 && by_name.count("tok_embeddings.weight") == 1)
        by_name.emplace("output.weight", by_name.at("tok_embeddings.weight"));
    std::set<std::string> wanted;
    for (const auto& [name, shape] : expected) {
        wanted.insert(name);
        const std::string theirs = translate(name, Naming::Normlab, naming, table);
        auto it = by_name.find(name);
        NL_REQUIRE(it != by_name.end(), where, ": missing tensor '", theirs, "'");
        const Tensor& t = it->second;
        NL_REQUIRE(t.shape() == shape, where, ": tensor '", theirs, "': expected shape ", shape_str(shape),
                   " for this architecture, found ", shape_str(t.shape()));
        NL_REQUIRE(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16, where, ": tensor '",
                   theirs, "': expected F32, F16 or BF16, found ", dtype_name(t.dtype()));
        Tensor weight = t.to(DType::F32).contiguous();
        // Own storage: not the file's memory map, and tied copies are separate.
        if (weight.data_ptr() == t.data_ptr()) weight = weight.clone();
        if (naming == Naming::Hf) weight = permute_for_hf(weight, name, options, false);
        sink(name, weight);
    }
    for (const auto& [name, tensor] : by_name)
        NL_REQUIRE(wanted.count(name) == 1, where, ": unexpected tensor '", translate(name, Naming::Normlab, naming, table),
                   "' (the architecture has ", options.n_layers, " layers)");
}

// ---- JSON reading with named paths ----

std::string json_kind(const json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
    if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
    if (v.is_number()) return v.dump();
    if (v.is_string()) return "a string";
    if (v.is_array()) return "an array";
    return "an object";
}

struct JsonFields {
    const json& object;
    std::string where;

    [[noreturn]] void fail(const std::string& key, const std::string& what) const {
        throw Error(where + ": /" + key + ": " + what);
    }
    bool has(const std::string& key) const { return object.contains(key) && !object.at(key).is_null(); }
    int64_t integer(const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> fallback = std::nullopt) const {
        if (!has(key)) {
            if (fallback) return *fallback;
            fail(key, "missing (expected an integer)");
        }
        const json& v = object.at(key);
        if (!v.is_number_integer() && !v.is_number_unsigned())
            fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, json_kind(v)));
        if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
            fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, v.dump()));
        const int64_t n = v.get<int64_t>();
        if (n < lo || n > hi) fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, n));
        return n;
    }
    double real(const std::string& key, double lo, double hi, double fallback) const {
        if (!has(key)) return fallback;
        const json& v = object.at(key);
        if (!v.is_number()) fail(key, fmt::format("expected a number in [{}, {}], got {}", lo, hi, json_kind(v)));
        const double x = v.get<double>();
        if (!(x >= lo && x <= hi)) fail(key, fmt::format("expected a number in [{}, {}], got {}", lo, hi, x));
        return x;
    }
    bool boolean(const std::string& key, bool fallback) const {
        if (!has(key)) return fallback;
        const json& v = object.at(key);
        if (!v.is_boolean()) fail(key, "expected true or false, got " + json_kind(v));
        return v.get<bool>();
    }
    std::string string(const std::string& key, const std::string& fallback) const {
        if (!has(key)) return fallback;
        const json& v = object.at(key);
        if (!v.is_string()) fail(key, "expected a string, got " + json_kind(v));
        return v.get<std::string>();
    }
};

// ---- paths ----

// A file that must be a regular file, not a link (strangers' directories).
void require_plain_file(const fs::path& path, const std::string& what) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    NL_REQUIRE(!ec && fs::exists(st), path.string(), ": no such file (", what, ")");
    NL_REQUIRE(!fs::is_symlink(st), path.string(), ": is a symbolic link; ", what, " must be a plain file");
    NL_REQUIRE(fs::is_regular_file(st), path.string(), ": not a regular file (", what, ")");
}

// A shard named by model.safetensors.index.json: a plain file name inside the directory.
fs::path shard_path(const fs::path& dir, const std::string& shard, const std::string& where) {
    const bool plain = !shard.empty() && shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos &&
                       shard != "." && shard != ".." && shard.find('\0') == std::string::npos;
    NL_REQUIRE(plain, where, ": shard '", shard, "' is not a file name inside the model directory (no '/', '..' or absolute paths)");
    return dir / shard;
}

bool starts_with_gguf_magic(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

// ---- tokenizers ----

// One codepoint of `text`, or -1 when it is not exactly one (valid UTF-8) codepoint.
int64_t single_codepoint(const std::string& text) {
    try {
        const std::vector<uint32_t> cps = decode_utf8(text, "token");
        return cps.size() == 1 ? int64_t(cps[0]) : -1;
    } catch (const Error&) {
        return -1;
    }
}

constexpr uint32_t kSpmSpace = 0x2581;  // '▁', SentencePiece's space

// The characters of a tokenizer.json that is one character per token (the form export writes: a
// BPE model without merges or added tokens); empty for any other tokenizer.
std::vector<uint32_t> hf_char_vocab(const fs::path& dir, int64_t vocab_size) {
    const fs::path file = dir / "tokenizer.json";
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) return {};
    const json tok = load_json_file(file.string());
    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) return {};
    const json& model = tok["model"];
    if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object()) return {};
    if (model.contains("merges") && !(model["merges"].is_array() && model["merges"].empty())) return {};
    if (tok.contains("added_tokens") && !(tok["added_tokens"].is_array() && tok["added_tokens"].empty())) return {};
    for (const char* key : {"normalizer", "pre_tokenizer"})
        if (tok.contains(key) && !tok[key].is_null()) return {};
    const json& vocab = model["vocab"];
    if (int64_t(vocab.size()) != vocab_size) return {};
    std::vector<int64_t> chars(size_t(vocab_size), -1);
    for (const auto& [text, id] : vocab.items()) {
        if (!id.is_number_integer()) return {};
        const int64_t i = id.get<int64_t>(), cp = single_codepoint(text);
        if (i < 0 || i >= vocab_size || cp < 0 || chars[size_t(i)] != -1) return {};
        chars[size_t(i)] = cp;
    }
    return std::vector<uint32_t>(chars.begin(), chars.end());
}

std::vector<uint32_t> gguf_char_vocab(const GgufFile& file, int64_t vocab_size) {
    const GgufValue* model = file.find("tokenizer.ggml.model");
    const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
    if (!model || model->type != GgufType::STRING || model->text != "llama" || !tokens ||
        tokens->type != GgufType::ARRAY || tokens->element != GgufType::STRING ||
        int64_t(tokens->texts.size()) != vocab_size)
        return {};
    std::vector<uint32_t> chars;
    std::set<uint32_t> seen;
    for (const std::string& t : tokens->texts) {
        int64_t cp = single_codepoint(t);
        if (cp == kSpmSpace) cp = ' ';
        if (cp < 0 || !seen.insert(uint32_t(cp)).second) return {};
        chars.push_back(uint32_t(cp));
    }
    return chars;
}

// ---- reading ----

PretrainedModel load_hf(const fs::path& dir, const SinkFor& sink_for) {
    PretrainedModel out;
    out.path = dir.string();
    out.format = "hf";
    const fs::path config_path = dir / "config.json";
    require_plain_file(config_path, "a transformers model's config.json");
    const HfConfig config = read_hf_config(load_json_file(config_path.string()), config_path.string());
    out.options = config.options;
    out.char_vocab = hf_char_vocab(dir, out.options.vocab_size);
    const WeightSink sink = sink_for ? sink_for(out.options) : WeightSink();
    if (!sink) return out;

    // The files are memory-mapped: their tensors are views of the page cache until converted.
    std::vector<std::pair<std::string, Tensor>> found;
    const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(fs::symlink_status(single, ec))) {
        require_plain_file(single, "model.safetensors");
        found = map_safetensors(single.string()).tensors;
    } else {
        NL_REQUIRE(fs::exists(fs::symlink_status(index, ec)), out.path,
                   ": neither model.safetensors nor model.safetensors.index.json (only safetensors weights are read)");
        require_plain_file(index, "model.safetensors.index.json");
        const json idx = load_json_file(index.string());
        const std::string where = index.string();
        NL_REQUIRE(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(), where,
                   ": /weight_map: expected an object {tensor name: shard file}");
        std::map<std::string, std::string> weight_map;  // tensor -> shard
        std::set<std::string> shards;
        for (const auto& [name, shard] : idx["weight_map"].items()) {
            NL_REQUIRE(shard.is_string(), where, ": /weight_map/", name, ": expected a shard file name, got ", json_kind(shard));
            shard_path(dir, shard.get<std::string>(), where + ": /weight_map/" + name);
            weight_map[name] = shard.get<std::string>();
            shards.insert(shard.get<std::string>());
        }
        std::set<std::string> seen;
        for (const std::string& shard : shards) {
            const fs::path file = shard_path(dir, shard, where);
            require_plain_file(file, "a shard named by " + where);
            SafeTensorsFile st = map_safetensors(file.string());
            for (auto& [name, tensor] : st.tensors) {
                auto it = weight_map.find(name);
                NL_REQUIRE(it != weight_map.end(), file.string(), ": tensor '", name, "' is not in ", where, "'s weight_map");
                NL_REQUIRE(it->second == shard, file.string(), ": tensor '", name, "' is mapped to '", it->second,
                           "' by ", where);
                NL_REQUIRE(seen.insert(name).second, out.path, ": tensor '", name, "' appears in two shards");
                found.push_back({name, tensor});
            }
        }
        for (const auto& [name, shard] : weight_map)
            NL_REQUIRE(seen.count(name) == 1, where, ": tensor '", name, "' is mapped to '", shard, "', which does not hold it");
    }
    collect_weights(found, Naming::Hf, hf_weight_names(config.arch), hf_class_name(config.arch), out.options, config.tied,
                    out.path, sink);
    return out;
}

// GGUF stores eps and RoPE's base as FLOAT32: 1e-6 comes back as 9.99999997e-07. The shortest
// decimal that rounds to the same float is the number that was written (1e-06), so a model
// exported and read back has the options it had.
double shortest_decimal(double stored_as_float) {
    const float f = static_cast<float>(stored_as_float);
    if (!std::isfinite(f) || double(f) != stored_as_float) return stored_as_float;  // a FLOAT64 value: as it is
    return std::stod(fmt::format("{}", f));
}

uint64_t gguf_uint(const GgufFile& f, const std::string& key, uint64_t lo, uint64_t hi) {
    const uint64_t v = f.uint_at(key);
    NL_REQUIRE(v >= lo && v <= hi, f.path, ": metadata '", key, "': expected an integer in [", lo, ", ", hi, "], got ", v);
    return v;
}

PretrainedModel load_gguf_model(const std::string& path, const SinkFor& sink_for) {
    require_plain_file(path, "a GGUF model");
    const GgufFile file = load_gguf(path);
    PretrainedModel out;
    out.path = path;
    out.format = "gguf";
    const std::string arch = file.string_at("general.architecture");
    NL_REQUIRE(arch == "llama", path, ": metadata 'general.architecture': expected \"llama\", found \"", arch, "\"");
    TransformerOptions& o = out.options;
    o.dim = int64_t(gguf_uint(file, "llama.embedding_length", 2, kMaxModelDim));
    o.n_layers = int64_t(gguf_uint(file, "llama.block_count", 0, kMaxLayers));
    o.n_heads = int64_t(gguf_uint(file, "llama.attention.head_count", 1, kMaxModelDim));
    o.n_kv_heads = file.find("llama.attention.head_count_kv")
                       ? int64_t(gguf_uint(file, "llama.attention.head_count_kv", 1, kMaxModelDim))
                       : o.n_heads;
    const int64_t hidden = int64_t(gguf_uint(file, "llama.feed_forward_length", 1, 4 * kMaxModelDim));
    o.multiple_of = 1;
    o.ffn_hidden_dim = (3 * hidden + 1) / 2;
    o.max_seq_len = int64_t(gguf_uint(file, "llama.context_length", 1, 1 << 20));
    o.norm.type = "rmsnorm";
    o.norm.eps = shortest_decimal(file.real_at("llama.attention.layer_norm_rms_epsilon"));
    NL_REQUIRE(*o.norm.eps >= 0 && *o.norm.eps <= 1, path, ": metadata 'llama.attention.layer_norm_rms_epsilon': expected [0, 1], got ",
               *o.norm.eps);
    o.rope_theta = file.find("llama.rope.freq_base") ? shortest_decimal(file.real_at("llama.rope.freq_base")) : kDefaultRopeTheta;
    NL_REQUIRE(std::isfinite(o.rope_theta) && o.rope_theta > 0, path, ": metadata 'llama.rope.freq_base': expected > 0, got ",
               o.rope_theta);
    // llama.cpp's head size: llama.attention.key_length (= value_length), else embedding_length / head_count.
    if (file.find("llama.attention.key_length")) {
        const int64_t key_length = int64_t(gguf_uint(file, "llama.attention.key_length", 2, kMaxModelDim));
        NL_REQUIRE(!file.find("llama.attention.value_length") ||
                       int64_t(file.uint_at("llama.attention.value_length")) == key_length,
                   path, ": metadata 'llama.attention.value_length' ", file.uint_at("llama.attention.value_length"),
                   ": normlab's values have the keys' head size, llama.attention.key_length ", key_length);
        NL_REQUIRE(key_length % 2 == 0, path, ": metadata 'llama.attention.key_length': expected an even head size ",
                   "(RoPE rotates pairs), found ", key_length);
        if (o.dim % o.n_heads != 0 || key_length != o.dim / o.n_heads) o.head_dim = key_length;
    }
    NL_REQUIRE(o.head_dim > 0 || (o.dim % o.n_heads == 0 && (o.dim / o.n_heads) % 2 == 0), path,
               ": metadata: llama.embedding_length ", o.dim, " is not an even head size times llama.attention.head_count ",
               o.n_heads, " (and there is no llama.attention.key_length)");
    NL_REQUIRE(o.n_heads % o.n_kv_heads == 0, path, ": metadata 'llama.attention.head_count_kv' ", o.n_kv_heads,
               " does not divide llama.attention.head_count ", o.n_heads);
    if (file.find("llama.rope.dimension_count")) {
        const uint64_t rope_dims = file.uint_at("llama.rope.dimension_count");
        NL_REQUIRE(int64_t(rope_dims) == o.head_size(), path, ": metadata 'llama.rope.dimension_count': normlab rotates ",
                   "whole heads (", o.head_size(), " dims), found ", rope_dims);
    }
    NL_REQUIRE(!file.find("llama.rope.scaling.type") || file.string_at("llama.rope.scaling.type") == "none", path,
               ": metadata 'llama.rope.scaling.type': RoPE scaling is not supported, found \"",
               file.string_at("llama.rope.scaling.type"), "\"");
    if (file.find("llama.vocab_size")) {
        o.vocab_size = int64_t(gguf_uint(file, "llama.vocab_size", 1, kMaxTokenVocab));
    } else {
        NL_REQUIRE(file.contains_tensor("token_embd.weight"), path, ": neither metadata 'llama.vocab_size' nor tensor 'token_embd.weight'");
        o.vocab_size = file.tensor("token_embd.weight").shape().at(0);
    }
    o.validate();
    out.char_vocab = gguf_char_vocab(file, o.vocab_size);
    const WeightSink sink = sink_for ? sink_for(o) : WeightSink();
    if (sink) {
        const bool tied = !file.contains_tensor("output.weight");  // llama.cpp reuses token_embd then
        collect_weights(file.tensors, Naming::Gguf, kWeightNames, "LLaMA", o, tied, path, sink);
    }
    return out;
}

// ---- writing ----

// The path beside `out` that export writes first: "<out>.tmp.<pid>".
std::string temp_beside(const std::string& out) { return out + ".tmp." + std::to_string(::getpid()); }

// Replaces `out` by `tmp` (a file or directory): `out` must not exist unless `force`.
void move_into_place(const std::string& tmp, const std::string& out, bool force) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(out, ec))) {
        NL_REQUIRE(force, out, ": already exists (--force replaces it)");
        fs::remove_all(out, ec);
        NL_REQUIRE(!ec, out, ": cannot remove it to replace it: ", ec.message());
    }
    fs::rename(tmp, out, ec);
    NL_REQUIRE(!ec, out, ": cannot rename the export into place: ", ec.message());
}

std::string to_utf8(uint32_t cp) { return encode_utf8({cp}); }

// A character tokenizer transformers' AutoTokenizer loads (tokenizers' JSON): token i is the i-th
// character; no merges, so every character is its own token; no special tokens.
json hf_tokenizer_json(const std::vector<uint32_t>& chars) {
    json vocab = json::object();
    for (size_t i = 0; i < chars.size(); ++i) vocab[to_utf8(chars[i])] = i;
    return json{{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", json::array()},
                {"normalizer", nullptr},
                {"pre_tokenizer", nullptr},
                {"post_processor", nullptr},
                {"decoder", {{"type", "Fuse"}}},
                {"model",
                 {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", json::array()}}}};
}

json hf_tokenizer_config_json(const TransformerOptions& o) {
    return json{{"tokenizer_class", "PreTrainedTokenizerFast"},
                {"model_max_length", o.max_seq_len},
                {"clean_up_tokenization_spaces", false},
                {"added_tokens_decoder", json::object()}};
}

NamedTensors exported_tensors(const Transformer& model, DType dtype, bool hf) {
    const TransformerOptions& o = model.options();
    const HfArch arch = hf ? hf_architecture(o) : HfArch::Llama;
    NamedTensors out;
    for (const auto& [name, tensor] : model.state_dict()) {
        Tensor t = tensor.to(Device::cpu()).contiguous();
        if (hf) t = permute_for_hf(t, name, o, true);
        // llama.cpp keeps 1-D tensors (the norms) in f32, as its converter writes them.
        const DType want = (!hf && t.dim() == 1) ? DType::F32 : dtype;
        out.push_back({hf ? hf_weight_name(name, arch) : gguf_weight_name(name), t.to(want).contiguous()});
    }
    return out;
}

void write_text(const fs::path& path, const std::string& text) { write_file_atomic(path.string(), text); }

void export_hf(const Transformer& model, const std::vector<uint32_t>& chars, const ExportOptions& e) {
    const TransformerOptions& o = model.options();
    const std::string tmp = temp_beside(e.out);
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directory(tmp, ec);
    NL_REQUIRE(!ec, tmp, ": cannot create the export directory: ", ec.message());
    try {
        const fs::path dir(tmp);
        write_text(dir / "config.json", hf_config_json(o, e.dtype).dump(2) + "\n");
        // Greedy by default, as `normlab sample --temperature 0`; no bos/eos: normlab's models have no
        // special tokens.
        write_text(dir / "generation_config.json", json{{"_from_model_config", true}, {"do_sample", false}}.dump(2) + "\n");
        save_safetensors((dir / "model.safetensors").string(), exported_tensors(model, e.dtype, true), {{"format", "pt"}});
        if (!chars.empty()) {
            write_text(dir / "tokenizer.json", hf_tokenizer_json(chars).dump(2) + "\n");
            write_text(dir / "tokenizer_config.json", hf_tokenizer_config_json(o).dump(2) + "\n");
        }
        move_into_place(tmp, e.out, e.force);
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

void export_gguf(const Transformer& model, const std::vector<uint32_t>& chars, const ExportOptions& e) {
    const TransformerOptions& o = model.options();
    const int64_t kv = o.n_kv_heads > 0 ? o.n_kv_heads : o.n_heads;
    const int64_t ffn = swiglu_hidden_dim(o.ffn_hidden_dim > 0 ? o.ffn_hidden_dim : 4 * o.dim, o.multiple_of);
    const uint32_t file_type = e.dtype == DType::F32 ? 0 : e.dtype == DType::F16 ? 1 : 32;  // llama_ftype ALL_F32, MOSTLY_F16, MOSTLY_BF16
    GgufMetadata m = {
        {"general.architecture", GgufValue::string("llama")},
        {"general.name", GgufValue::string("normlab")},
        {"general.file_type", GgufValue::u32(file_type)},
        {"llama.vocab_size", GgufValue::u32(uint32_t(o.vocab_size))},
        {"llama.context_length", GgufValue::u32(uint32_t(o.max_seq_len))},
        {"llama.embedding_length", GgufValue::u32(uint32_t(o.dim))},
        {"llama.block_count", GgufValue::u32(uint32_t(o.n_layers))},
        {"llama.feed_forward_length", GgufValue::u32(uint32_t(ffn))},
        {"llama.attention.head_count", GgufValue::u32(uint32_t(o.n_heads))},
        {"llama.attention.head_count_kv", GgufValue::u32(uint32_t(kv))},
        {"llama.rope.dimension_count", GgufValue::u32(uint32_t(o.head_size()))},
        {"llama.rope.freq_base", GgufValue::f32(float(o.rope_theta))},
        {"llama.attention.layer_norm_rms_epsilon", GgufValue::f32(float(o.norm.resolved_eps()))},
    };
    if (o.head_dim > 0) {  // a head size of its own (model.head_dim): llama.cpp's key and value lengths
        m.push_back({"llama.attention.key_length", GgufValue::u32(uint32_t(o.head_dim))});
        m.push_back({"llama.attention.value_length", GgufValue::u32(uint32_t(o.head_dim))});
    }
    if (!chars.empty()) {
        // SentencePiece ("llama") vocabulary of the characters, space written as U+2581 as
        // SentencePiece does; no merges happen (every token is one character, every score 0).
        std::vector<std::string> tokens;
        for (uint32_t cp : chars) {
            NL_REQUIRE(cp != kSpmSpace, "export: the vocabulary holds U+2581, which llama.cpp's vocabulary uses for the space");
            tokens.push_back(to_utf8(cp == ' ' ? kSpmSpace : cp));
        }
        m.push_back({"tokenizer.ggml.model", GgufValue::string("llama")});
        m.push_back({"tokenizer.ggml.tokens", GgufValue::string_array(tokens)});
        m.push_back({"tokenizer.ggml.scores", GgufValue::f32_array(std::vector<double>(chars.size(), 0.0))});
        m.push_back({"tokenizer.ggml.token_type", GgufValue::i32_array(std::vector<int64_t>(chars.size(), 1))});
        m.push_back({"tokenizer.ggml.add_bos_token", GgufValue::boolean(false)});
        m.push_back({"tokenizer.ggml.add_eos_token", GgufValue::boolean(false)});
        m.push_back({"tokenizer.ggml.add_space_prefix", GgufValue::boolean(false)});
    } else {
        // Token ids without text: llama.cpp's vocabulary type "none".
        m.push_back({"tokenizer.ggml.model", GgufValue::string("none")});
    }
    save_gguf(e.out + "", m, exported_tensors(model, e.dtype, false));
}

}  // namespace

std::string hf_weight_name(const std::string& normlab_name, HfArch arch) {
    return translate_or_throw(normlab_name, Naming::Normlab, Naming::Hf, hf_weight_names(arch), hf_class_name(arch));
}
std::string gguf_weight_name(const std::string& normlab_name) {
    return translate_or_throw(normlab_name, Naming::Normlab, Naming::Gguf, kWeightNames, "LLaMA");
}

Tensor permute_rope_rows(const Tensor& weight, int64_t n_heads, bool to_half_split) {
    NL_REQUIRE(weight.dim() == 2 && n_heads > 0 && weight.shape()[0] % n_heads == 0 && (weight.shape()[0] / n_heads) % 2 == 0,
               "permute_rope_rows: expected (n_heads * even head_dim, dim) with n_heads = ", n_heads, ", got ",
               shape_str(weight.shape()));
    const Tensor in = weight.to(Device::cpu()).contiguous();
    Tensor out = Tensor::empty(in.shape(), in.dtype());
    const int64_t hd = in.shape()[0] / n_heads, half = hd / 2;
    const size_t row_bytes = size_t(in.shape()[1]) * dtype_size(in.dtype());
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j) {
                const int64_t interleaved = h * hd + 2 * i + j, split = h * hd + j * half + i;
                const int64_t from = to_half_split ? interleaved : split, to = to_half_split ? split : interleaved;
                std::memcpy(dst + size_t(to) * row_bytes, src + size_t(from) * row_bytes, row_bytes);
            }
    return out;
}

namespace {

// What each transformers class is, for the refusals.
constexpr const char* kHfClasses = "LLaMA: pre; Qwen3: pre with qk_norm head; OLMo 2: output with qk_norm full";

// The option of `o` no class holds, as "model.<key> <value>", with what the classes have instead;
// empty when every option is held.
std::pair<std::string, std::string> unexportable_option(const TransformerOptions& o) {
    if (o.norm.type != "rmsnorm")
        return {fmt::format("model.norm.type \"{}\"", o.norm.type), "RMSNorm only"};
    if (!o.norm.elementwise_affine)
        return {"model.norm.elementwise_affine false", "RMSNorm always with a learned weight"};
    if (o.norm_scaling != "none")
        return {fmt::format("model.norm_scaling \"{}\"", o.norm_scaling), "no LayerNorm Scaling"};
    if (o.logit_softcap != 0.0) return {fmt::format("model.logit_softcap {}", o.logit_softcap), "no soft-capping"};
    if (o.attn_softcap != 0.0) return {fmt::format("model.attn_softcap {}", o.attn_softcap), "no soft-capping"};
    return {"", ""};
}

}  // namespace

HfArch hf_architecture(const TransformerOptions& o) {
    const auto [option, held] = unexportable_option(o);
    NL_REQUIRE(option.empty(), "export --to hf: ", option, " has no Hugging Face architecture (LLaMA, Qwen3 and OLMo 2: ",
               held, ")");
    NL_REQUIRE(norm_placement(o.norm_placement).hf_export, "export --to hf: model.norm_placement \"",
               o.norm_placement, "\" has no Hugging Face architecture (", kHfClasses, ")");
    if (o.norm_placement == "pre" && o.qk_norm == "none") return HfArch::Llama;
    if (o.norm_placement == "pre" && o.qk_norm == "head") return HfArch::Qwen3;
    if (o.norm_placement == "output" && o.qk_norm == "full") {
        NL_REQUIRE(o.head_dim == 0 || (o.dim % o.n_heads == 0 && o.head_dim == o.dim / o.n_heads),
                   "export --to hf: model.head_dim ", o.head_dim, " has no form in Olmo2ForCausalLM (its heads are dim / "
                   "n_heads); LLaMA and Qwen3 hold it");
        return HfArch::Olmo2;
    }
    throw Error(fmt::format("export --to hf: model.qk_norm \"{}\" with model.norm_placement \"{}\" has no Hugging Face "
                            "architecture ({})",
                            o.qk_norm, o.norm_placement, kHfClasses));
}

void check_exportable(const TransformerOptions& o, const std::string& to) {
    NL_REQUIRE(to == "hf" || to == "gguf", "export: --to must be hf or gguf, got '", to, "'");
    if (to == "hf") {
        hf_architecture(o);
        return;
    }
    // llama.cpp's "llama" is LlamaForCausalLM.
    std::string option = unexportable_option(o).first;
    if (option.empty() && !norm_placement(o.norm_placement).gguf_export)
        option = fmt::format("model.norm_placement \"{}\"", o.norm_placement);
    if (option.empty() && o.qk_norm != "none") option = fmt::format("model.qk_norm \"{}\"", o.qk_norm);
    NL_REQUIRE(option.empty(), "export --to gguf: ", option, " has no form in llama.cpp's \"llama\" (pre-norm RMSNorm with a "
               "learned weight, no QK-norm, no soft-capping, no LayerNorm Scaling)");
}

json hf_config_json(const TransformerOptions& o, DType dtype) {
    const HfArch arch = hf_architecture(o);
    const int64_t kv = o.n_kv_heads > 0 ? o.n_kv_heads : o.n_heads;
    const int64_t ffn = swiglu_hidden_dim(o.ffn_hidden_dim > 0 ? o.ffn_hidden_dim : 4 * o.dim, o.multiple_of);
    const char* torch_dtype = dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "bfloat16";
    json config = {{"architectures", {hf_class_name(arch)}},
                   {"model_type", hf_model_type(arch)},
                   {"vocab_size", o.vocab_size},
                   {"hidden_size", o.dim},
                   {"intermediate_size", ffn},
                   {"num_hidden_layers", o.n_layers},
                   {"num_attention_heads", o.n_heads},
                   {"num_key_value_heads", kv},
                   {"hidden_act", "silu"},
                   {"max_position_embeddings", o.max_seq_len},
                   {"rms_norm_eps", o.norm.resolved_eps()},
                   {"rope_theta", o.rope_theta},
                   {"rope_scaling", nullptr},
                   {"attention_bias", false},
                   {"attention_dropout", 0.0},
                   {"tie_word_embeddings", false},
                   {"use_cache", true},
                   {"bos_token_id", nullptr},
                   {"eos_token_id", nullptr},
                   {"pad_token_id", nullptr},
                   {"dtype", torch_dtype}};
    if (arch != HfArch::Olmo2) config["head_dim"] = o.head_size();  // OLMo 2's is always hidden / heads
    if (arch == HfArch::Llama) {
        config["mlp_bias"] = false;
        config["pretraining_tp"] = 1;
    }
    if (arch == HfArch::Qwen3) {
        // Every layer full attention: no sliding window.
        config["use_sliding_window"] = false;
        config["sliding_window"] = nullptr;
        config["layer_types"] = std::vector<std::string>(size_t(o.n_layers), "full_attention");
    }
    return config;
}

HfConfig read_hf_config(const json& config, const std::string& where) {
    NL_REQUIRE(config.is_object(), where, ": expected a JSON object (a transformers config.json), got ", json_kind(config));
    const JsonFields f{config, where};
    const std::string model_type = f.string("model_type", "");
    HfConfig out;
    if (model_type == "llama") {
        out.arch = HfArch::Llama;
    } else if (model_type == "qwen3") {
        out.arch = HfArch::Qwen3;
    } else if (model_type == "olmo2") {
        out.arch = HfArch::Olmo2;
    } else {
        f.fail("model_type", "expected \"llama\" (LlamaForCausalLM), \"qwen3\" (Qwen3ForCausalLM) or \"olmo2\" "
                             "(Olmo2ForCausalLM), got \"" + model_type + "\"");
    }
    const std::string class_name = hf_class_name(out.arch);
    if (f.has("architectures")) {
        const json& a = config["architectures"];
        if (!a.is_array() || a.size() != 1 || !a[0].is_string() || a[0].get<std::string>() != class_name)
            f.fail("architectures", "expected [\"" + class_name + "\"] (model_type \"" + model_type + "\"), got " + brief_json(a));
    }
    TransformerOptions& o = out.options;
    o.norm_placement = out.arch == HfArch::Olmo2 ? "output" : "pre";
    o.qk_norm = out.arch == HfArch::Llama ? "none" : out.arch == HfArch::Qwen3 ? "head" : "full";
    o.vocab_size = f.integer("vocab_size", 1, kMaxTokenVocab);
    o.dim = f.integer("hidden_size", 2, kMaxModelDim);
    o.n_layers = f.integer("num_hidden_layers", 0, kMaxLayers);
    o.n_heads = f.integer("num_attention_heads", 1, kMaxModelDim);
    // Qwen3Config's head_dim defaults to 128, the others' to hidden_size / num_attention_heads; OLMo 2's
    // attention has no head_dim of its own.
    const bool divides = o.dim % o.n_heads == 0;
    if (out.arch != HfArch::Qwen3 && !f.has("head_dim") && !divides)
        f.fail("num_attention_heads", fmt::format("expected a divisor of hidden_size = {} (there is no head_dim), got {}",
                                                  o.dim, o.n_heads));
    o.n_kv_heads = f.integer("num_key_value_heads", 1, o.n_heads, o.n_heads);
    if (o.n_heads % o.n_kv_heads != 0)
        f.fail("num_key_value_heads", fmt::format("expected a divisor of num_attention_heads = {}, got {}", o.n_heads, o.n_kv_heads));
    const int64_t head_dim = f.integer("head_dim", 1, kMaxModelDim, out.arch == HfArch::Qwen3 ? 128 : o.dim / o.n_heads);
    if (head_dim % 2 != 0)
        f.fail("head_dim", fmt::format("expected an even head size (RoPE rotates pairs), got {}{}", head_dim,
                                       f.has("head_dim") ? "" : " (absent: hidden_size / num_attention_heads)"));
    if (out.arch == HfArch::Olmo2 && (!divides || head_dim != o.dim / o.n_heads))
        f.fail("head_dim", fmt::format("Olmo2ForCausalLM's heads are hidden_size / num_attention_heads = {} / {}, got {}",
                                       o.dim, o.n_heads, head_dim));
    if (!divides || head_dim != o.dim / o.n_heads) o.head_dim = head_dim;  // else the default, as a normlab config has it
    const int64_t hidden = f.integer("intermediate_size", 1, 4 * kMaxModelDim);
    o.multiple_of = 1;
    o.ffn_hidden_dim = (3 * hidden + 1) / 2;
    // The defaults are each config class's.
    o.max_seq_len = f.integer("max_position_embeddings", 1, 1 << 20, out.arch == HfArch::Qwen3 ? 32768 : 2048);
    o.norm.type = "rmsnorm";
    o.norm.eps = f.real("rms_norm_eps", 0.0, 1.0, out.arch == HfArch::Olmo2 ? 1e-5 : 1e-6);
    // transformers 5 keeps RoPE's settings in rope_parameters; earlier versions at the top level.
    o.rope_theta = f.real("rope_theta", 1e-9, 1e300, kDefaultRopeTheta);
    if (f.has("rope_parameters")) {
        const json& rp = config["rope_parameters"];
        if (!rp.is_object()) f.fail("rope_parameters", "expected an object, got " + json_kind(rp));
        const JsonFields r{rp, where + ": /rope_parameters"};
        const std::string type = r.string("rope_type", "default");
        if (type != "default") r.fail("rope_type", "only \"default\" RoPE is supported, got \"" + type + "\"");
        o.rope_theta = r.real("rope_theta", 1e-9, 1e300, o.rope_theta);
    }
    if (f.has("rope_scaling")) f.fail("rope_scaling", "RoPE scaling is not supported, got " + brief_json(config["rope_scaling"]));
    if (f.string("hidden_act", "silu") != "silu") f.fail("hidden_act", "expected \"silu\" (SwiGLU), got \"" + f.string("hidden_act", "") + "\"");
    if (f.boolean("attention_bias", false)) f.fail("attention_bias", "normlab's attention has no biases, got true");
    if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "normlab's feed-forward has no biases, got true");
    if (f.real("attention_dropout", 0.0, 1.0, 0.0) != 0.0) f.fail("attention_dropout", "normlab has no dropout; expected 0");
    if (f.integer("pretraining_tp", 1, 1 << 20, 1) != 1) f.fail("pretraining_tp", "expected 1");
    // Qwen3's sliding window (use_sliding_window, or a layer_types entry other than full attention):
    // normlab's attention sees every earlier position.
    if (f.boolean("use_sliding_window", false))
        f.fail("use_sliding_window", "normlab's attention has no sliding window (every layer sees every earlier position), got true");
    if (f.has("layer_types")) {
        const json& types = config["layer_types"];
        if (!types.is_array()) f.fail("layer_types", "expected an array of \"full_attention\", got " + json_kind(types));
        for (const json& t : types)
            if (!t.is_string() || t.get<std::string>() != "full_attention")
                f.fail("layer_types", "normlab's attention is \"full_attention\" in every layer (no sliding window), got " +
                                          brief_json(t));
    }
    out.tied = f.boolean("tie_word_embeddings", false);
    o.validate();
    return out;
}

bool is_pretrained_model(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        return fs::exists(fs::path(path) / "config.json", ec) &&
               (fs::exists(fs::path(path) / "model.safetensors", ec) ||
                fs::exists(fs::path(path) / "model.safetensors.index.json", ec));
    return fs::is_regular_file(path, ec) && starts_with_gguf_magic(path);
}

namespace {

PretrainedModel read_pretrained(const std::string& path, const SinkFor& sink_for) {
    std::error_code ec;
    NL_REQUIRE(fs::exists(path, ec), path, ": no such file or directory (expected a transformers model directory or a GGUF file)");
    if (fs::is_directory(path, ec)) {
        NL_REQUIRE(fs::exists(fs::path(path) / "config.json", ec), path,
                   ": a directory without config.json (expected a transformers model directory)");
        return load_hf(path, sink_for);
    }
    NL_REQUIRE(starts_with_gguf_magic(path), path, ": neither a directory nor a GGUF file (no 'GGUF' magic)");
    return load_gguf_model(path, sink_for);
}

}  // namespace

PretrainedModel load_pretrained(const std::string& path, bool with_weights) {
    if (!with_weights) return read_pretrained(path, {});
    NamedTensors weights;
    const WeightSink keep = [&](const std::string& name, const Tensor& weight) { weights.push_back({name, weight}); };
    PretrainedModel out = read_pretrained(path, [&](const TransformerOptions& options) {
        require_memory(model_weight_bytes(options), path + ": the model's weights (f32)");
        return keep;
    });
    out.weights = std::move(weights);
    return out;
}

PretrainedModel load_pretrained_into(const std::string& path, std::unique_ptr<Transformer>& model) {
    std::map<std::string, Tensor> params;  // the model's parameters by name, once it is built
    const WeightSink copy = [&](const std::string& name, const Tensor& weight) {
        auto it = params.find(name);
        NL_REQUIRE(it != params.end() && it->second.shape() == weight.shape(), path, ": weight '", name,
                   "' does not fit the model (", it == params.end() ? "no such parameter" : shape_str(it->second.shape()), ")");
        it->second.copy_(weight);
    };
    return read_pretrained(path, [&](const TransformerOptions& options) {
        require_memory(model_weight_bytes(options), path + ": the model's weights (f32)");
        model = std::make_unique<Transformer>(options);
        for (const auto& [name, param] : model->named_parameters()) params.emplace(name, param.data());
        return copy;
    });
}

void adopt_pretrained_architecture(TrainConfig& config, const json& given_model, const PretrainedModel& pretrained) {
    const TransformerOptions& p = pretrained.options;
    TransformerOptions& m = config.model;
    const json given = given_model.is_object() ? given_model : json::object();
    const json given_norm = given.contains("norm") && given["norm"].is_object() ? given["norm"] : json::object();
    std::vector<std::string> differences;
    const auto differ = [&](const std::string& key, const std::string& ours, const std::string& theirs) {
        differences.push_back(fmt::format("/model/{} is {} here, {} in the file", key, ours, theirs));
    };
    const auto check_int = [&](const char* key, int64_t ours, int64_t theirs) {
        if (given.contains(key) && ours != theirs) differ(key, std::to_string(ours), std::to_string(theirs));
    };
    check_int("dim", m.dim, p.dim);
    check_int("n_layers", m.n_layers, p.n_layers);
    check_int("n_heads", m.n_heads, p.n_heads);
    check_int("n_kv_heads", m.n_kv_heads, p.n_kv_heads);
    if (given.contains("head_dim") && m.head_size() != p.head_size())
        differ("head_dim", std::to_string(m.head_size()), std::to_string(p.head_size()));
    check_int("vocab_size", config.model_vocab_size, p.vocab_size);
    // The feed-forward width is what the weights fix; multiple_of and ffn_hidden_dim only reach it.
    if (given.contains("multiple_of") || given.contains("ffn_hidden_dim")) {
        const int64_t ours = swiglu_hidden_dim(m.ffn_hidden_dim > 0 ? m.ffn_hidden_dim : 4 * m.dim, m.multiple_of);
        const int64_t theirs = swiglu_hidden_dim(p.ffn_hidden_dim, p.multiple_of);
        if (ours != theirs)
            differ("ffn_hidden_dim", fmt::format("a feed-forward width of {} (with multiple_of {})", ours, m.multiple_of),
                   std::to_string(theirs));
    }
    if (given_norm.contains("type") && m.norm.type != p.norm.type) differ("norm/type", "\"" + m.norm.type + "\"", "\"rmsnorm\"");
    if (given_norm.contains("eps") && m.norm.resolved_eps() != p.norm.resolved_eps())
        differ("norm/eps", fmt::format("{}", m.norm.resolved_eps()), fmt::format("{}", p.norm.resolved_eps()));
    if (given_norm.contains("elementwise_affine") && !m.norm.elementwise_affine) differ("norm/elementwise_affine", "false", "true");
    if ((given.contains("pre_norm") || given.contains("norm_placement")) && m.norm_placement != p.norm_placement)
        differ("norm_placement", "\"" + m.norm_placement + "\"", "\"" + p.norm_placement + "\"");
    if (given.contains("qk_norm") && m.qk_norm != p.qk_norm) differ("qk_norm", "\"" + m.qk_norm + "\"", "\"" + p.qk_norm + "\"");
    if (given.contains("rope_theta") && m.rope_theta != p.rope_theta)
        differ("rope_theta", fmt::format("{}", m.rope_theta), fmt::format("{}", p.rope_theta));
    if (given.contains("max_seq_len") && m.max_seq_len > p.max_seq_len)
        differ("max_seq_len", std::to_string(m.max_seq_len), fmt::format("a context of {}", p.max_seq_len));
    if (!differences.empty()) {
        std::string all;
        for (const std::string& d : differences) all += (all.empty() ? "" : "; ") + d;
        throw Error(fmt::format("{}: /model/init_from {}: the config's architecture differs from the file's: {}", config.file,
                                pretrained.path, all));
    }
    const int64_t max_seq_len = given.contains("max_seq_len") ? m.max_seq_len : p.max_seq_len;
    const bool fused_attention = m.fused_attention, fused_swiglu = m.fused_swiglu, fused_norm = m.norm.fused;
    const uint64_t seed = m.seed;
    const DType dtype = m.dtype;  // /train/dtype: the file's weights are widened to it
    m = p;
    m.dtype = dtype;
    m.max_seq_len = max_seq_len;
    m.fused_attention = fused_attention;
    m.fused_swiglu = fused_swiglu;
    m.norm.fused = fused_norm;
    m.seed = seed;
    config.model_vocab_size = p.vocab_size;
    json& r = config.resolved["model"];
    r["dim"] = m.dim;
    r["n_layers"] = m.n_layers;
    r["n_heads"] = m.n_heads;
    r["n_kv_heads"] = m.n_kv_heads;
    if (m.head_dim > 0) r["head_dim"] = m.head_dim;
    else r.erase("head_dim");
    r["multiple_of"] = m.multiple_of;
    r["ffn_hidden_dim"] = m.ffn_hidden_dim;
    r["vocab_size"] = p.vocab_size;
    r["norm"]["type"] = "rmsnorm";
    r["norm"]["eps"] = m.norm.resolved_eps();
    r["norm"]["elementwise_affine"] = true;
    r["norm_placement"] = m.norm_placement;
    r.erase("pre_norm");
    r["qk_norm"] = m.qk_norm;
    r["rope_theta"] = m.rope_theta;
    r["max_seq_len"] = m.max_seq_len;
    const int64_t T = data_seq_len(config.data);
    NL_REQUIRE(T <= m.max_seq_len, config.file, ": ", config.data.source == "synthetic" ? "/data/length" : "/data/seq_len",
               ": sequences need ", T, " positions, above the context of /model/init_from ", pretrained.path, ": ", m.max_seq_len);
}

void check_pretrained_vocab(const TrainConfig& config, const Dataset& data, const PretrainedModel& pretrained) {
    const std::string where = config.file + ": /model/init_from " + pretrained.path;
    if (const auto* text = dynamic_cast<const TextCorpus*>(&data)) {
        NL_REQUIRE(!pretrained.char_vocab.empty(), where, ": text data needs a character tokenizer in the file (one character per token), "
                   "and this model's vocabulary is not one; use data.source \"tokens\" with its token ids");
        NL_REQUIRE(pretrained.char_vocab == text->vocab(), where, ": the file's ", pretrained.char_vocab.size(),
                   " characters are not the text's ", text->vocab().size(), " (", config.data.path,
                   "): the ids would mean other characters");
        return;
    }
    NL_REQUIRE(data.vocab_size() <= pretrained.options.vocab_size, where, ": the data's ids go up to ", data.vocab_size() - 1,
               ", beyond the file's vocab_size ", pretrained.options.vocab_size);
}

void export_model(const Transformer& model, const std::vector<uint32_t>& chars, const ExportOptions& e) {
    check_exportable(model.options(), e.to);
    NL_REQUIRE(e.dtype == DType::F32 || e.dtype == DType::F16 || e.dtype == DType::BF16,
               "export: --dtype must be f32, f16 or bf16, got ", dtype_name(e.dtype));
    NL_REQUIRE(!e.out.empty(), "export: no output path");
    std::error_code ec;
    NL_REQUIRE(e.force || !fs::exists(fs::symlink_status(e.out, ec)), e.out, ": already exists (--force replaces it)");
    if (e.to == "hf") {
        export_hf(model, chars, e);
    } else {
        NL_REQUIRE(!fs::is_directory(e.out, ec), e.out, ": is a directory; --to gguf writes a file");
        export_gguf(model, chars, e);
    }
}

}  // namespace nl
