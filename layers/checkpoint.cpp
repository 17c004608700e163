// Checkpoints as one safetensors file: model tensors under their PyTorch names, optimizer state
// under "optim.", scalars in __metadata__ (layout and keys in checkpoint.h).
#include "layers/checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "core/safetensors.h"

namespace nl {

namespace {

constexpr const char* kFormat = "checkpoint-v1";
const std::string kMeta = "normlab.";

std::string format_double(double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);  // 17 digits: every double round-trips
    return buf;
}

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

const std::string& meta_at(const SafeTensorsFile& file, const std::string& key) {
    auto it = file.metadata.find(key);
    NL_REQUIRE(it != file.metadata.end(), "load_checkpoint: ", file.path, ": metadata key '", key, "' is missing");
    return it->second;
}

double parse_double(const SafeTensorsFile& file, const std::string& key) {
    const std::string& text = meta_at(file, key);
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    NL_REQUIRE(!text.empty() && end == text.c_str() + text.size(), "load_checkpoint: ", file.path,
               ": metadata '", key, "' should be a number, found '", text, "'");
    return value;
}

// A count (step numbers): decimal digits only, at most INT64_MAX. strtoll alone would accept
// " 12", "+12" and "-3", and saturate silently on overflow.
int64_t parse_count(const SafeTensorsFile& file, const std::string& key) {
    const std::string& text = meta_at(file, key);
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    NL_REQUIRE(digits && errno != ERANGE && end == text.c_str() + text.size(), "load_checkpoint: ", file.path,
               ": metadata '", key, "' should be a non-negative integer below 2^63, found '", text, "'");
    return value;
}

uint64_t parse_uint(const SafeTensorsFile& file, const std::string& key) {
    const std::string& text = meta_at(file, key);
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
    const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    NL_REQUIRE(digits && errno != ERANGE && end == text.c_str() + text.size(), "load_checkpoint: ",
               file.path, ": metadata '", key, "' should be an unsigned 64-bit integer, found '", text, "'");
    return value;
}

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "'" : ", '") + item + "'";
    return out;
}

}  // namespace

CheckpointInfo checkpoint_info(const SafeTensorsFile& file) {
    CheckpointInfo info;
    auto format = file.metadata.find(kMeta + "format");
    if (format == file.metadata.end()) {
        // A plain state_dict file (e.g. saved by PyTorch): weights only.
        info.metadata = file.metadata;
        return info;
    }
    NL_REQUIRE(format->second == kFormat, "load_checkpoint: ", file.path, ": unknown checkpoint format '",
               format->second, "' (expected '", kFormat, "')");
    info.step = parse_count(file, kMeta + "step");
    info.has_optimizer = file.metadata.count(kMeta + "optim.type") > 0;
    info.has_rng = file.metadata.count(kMeta + "rng.seed") > 0;
    if (info.has_rng) {
        info.rng_seed = parse_uint(file, kMeta + "rng.seed");
        info.rng_offset = parse_uint(file, kMeta + "rng.offset");
    }
    for (const auto& [key, value] : file.metadata)
        if (!starts_with(key, kMeta)) info.metadata[key] = value;
    return info;
}

void save_checkpoint(const std::string& path, const Module& model, const StatefulOptimizer* optimizer,
                     const Generator* rng, int64_t step, const std::map<std::string, std::string>& metadata) {
    NL_REQUIRE(step >= 0, "save_checkpoint: step must be >= 0, found ", step);
    std::map<std::string, std::string> meta;
    for (const auto& [key, value] : metadata) {
        NL_REQUIRE(!starts_with(key, kMeta), "save_checkpoint: metadata key '", key,
                   "' uses the reserved prefix '", kMeta, "'");
        meta[key] = value;
    }
    meta[kMeta + "format"] = kFormat;
    meta[kMeta + "step"] = std::to_string(step);

    NamedTensors tensors = model.state_dict();
    for (const auto& [name, tensor] : tensors) {
        NL_REQUIRE(!starts_with(name, kCheckpointOptimPrefix), "save_checkpoint: model key '", name,
                   "' collides with the optimizer prefix '", kCheckpointOptimPrefix, "'");
    }
    if (optimizer != nullptr) {
        const OptimizerState state = optimizer->state_dict();
        meta[kMeta + "optim.type"] = state.type;
        meta[kMeta + "optim.step"] = std::to_string(state.step);
        for (const auto& [key, value] : state.hyper) {
            NL_CHECK(key != "type" && key != "step", "hyperparameter name clashes: ", key);
            meta[kMeta + "optim." + key] = format_double(value);
        }
        for (const auto& [name, tensor] : state.tensors)
            tensors.emplace_back(std::string(kCheckpointOptimPrefix) + name, tensor);
    }
    if (rng != nullptr) {
        meta[kMeta + "rng.seed"] = std::to_string(rng->seed());
        meta[kMeta + "rng.offset"] = std::to_string(rng->offset());
    }
    save_safetensors(path, tensors, meta);
}

CheckpointInfo read_checkpoint_info(const std::string& path) { return checkpoint_info(load_safetensors(path)); }

namespace {

// Checks the file's model tensors (in_file, by name) against the model's own (expected): the same
// names, each with the model's shape and dtype. Throws nl::Error naming the first difference.
void check_model_tensors(const std::string& path, const std::string& model_type, const NamedTensors& expected,
                         const std::map<std::string, const Tensor*>& in_file) {
    std::set<std::string> expected_names;
    std::vector<std::string> missing;
    for (const auto& [name, tensor] : expected) {
        expected_names.insert(name);
        auto it = in_file.find(name);
        if (it == in_file.end()) {
            missing.push_back(name);
            continue;
        }
        const Tensor& found = *it->second;
        NL_REQUIRE(found.shape() == tensor.shape(), "load_checkpoint: ", path, ": '", name, "' has shape ",
                   shape_str(found.shape()), " in the file, but the model's is ", shape_str(tensor.shape()));
        NL_REQUIRE(found.dtype() == tensor.dtype(), "load_checkpoint: ", path, ": '", name, "' has dtype ",
                   dtype_name(found.dtype()), " in the file, but the model's is ", dtype_name(tensor.dtype()));
    }
    std::vector<std::string> unexpected;
    for (const auto& [name, tensor] : in_file)
        if (!expected_names.count(name)) unexpected.push_back(name);
    NL_REQUIRE(missing.empty(), "load_checkpoint: ", path, ": missing key(s) ", join(missing),
               " that the model (", model_type, ") has");
    NL_REQUIRE(unexpected.empty(), "load_checkpoint: ", path, ": unexpected key(s) ", join(unexpected),
               " that the model (", model_type, ") does not have");
}

// The optimizer state the file holds: type, step and hyperparameters from the metadata, with the
// tensors found under the optimizer prefix (optim_tensors, the prefix taken off).
OptimizerState optimizer_state_in(const SafeTensorsFile& file, NamedTensors optim_tensors) {
    OptimizerState state;
    state.type = meta_at(file, kMeta + "optim.type");
    state.step = parse_count(file, kMeta + "optim.step");
    const std::string prefix = kMeta + "optim.";
    for (const auto& [key, value] : file.metadata) {
        if (!starts_with(key, prefix)) continue;
        const std::string name = key.substr(prefix.size());
        if (name == "type" || name == "step") continue;
        state.hyper[name] = parse_double(file, key);
    }
    state.tensors = std::move(optim_tensors);
    return state;
}

}  // namespace

CheckpointInfo load_checkpoint(const std::string& path, Module& model, StatefulOptimizer* optimizer,
                               Generator* rng) {
    const SafeTensorsFile file = load_safetensors(path);
    const CheckpointInfo info = checkpoint_info(file);

    // ---- validate the model part completely before changing anything ----
    std::map<std::string, const Tensor*> in_file;
    NamedTensors optim_tensors;
    for (const auto& [name, tensor] : file.tensors) {
        if (starts_with(name, kCheckpointOptimPrefix)) {
            optim_tensors.emplace_back(name.substr(std::string(kCheckpointOptimPrefix).size()), tensor);
            continue;
        }
        in_file[name] = &tensor;
    }
    const NamedTensors expected = model.state_dict();
    check_model_tensors(path, model.type_name(), expected, in_file);
    NL_REQUIRE(rng == nullptr || info.has_rng, "load_checkpoint: ", path,
               ": a generator state was requested but the file holds none");

    // ---- the optimizer validates its own state and changes nothing when it throws ----
    if (optimizer != nullptr) {
        NL_REQUIRE(info.has_optimizer, "load_checkpoint: ", path,
                   ": an optimizer state was requested but the file holds none");
        const OptimizerState state = optimizer_state_in(file, std::move(optim_tensors));
        try {
            optimizer->load_state_dict(state);
        } catch (const Error& e) {
            throw Error("load_checkpoint: " + path + ": " + e.what());
        }
    }
    NamedTensors entries;
    for (const auto& [name, tensor] : expected) entries.emplace_back(name, *in_file.at(name));
    model.load_state_dict(entries, true);
    if (rng != nullptr) rng->set_state(info.rng_seed, info.rng_offset);
    return info;
}

}  // namespace nl
