// Validated JSON config reading (see config.h).
#include "jobs/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/core.h>

#include "core/error.h"
#include "core/json_parse.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl {

json load_json_file(const std::string& path) {
    // stat first: a directory, a FIFO or a symlink loop gets its own message, and the size is known
    // before the text is read into memory.
    struct stat st {};
    NL_REQUIRE(::stat(path.c_str(), &st) == 0, path, ": cannot open config file: ", std::strerror(errno));
    NL_REQUIRE(S_ISREG(st.st_mode), path, ": cannot read config file: not a regular file");
    NL_REQUIRE(static_cast<uint64_t>(st.st_size) <= kMaxConfigBytes, path, ": config file is ", st.st_size,
               " bytes, above the limit of ", kMaxConfigBytes, " bytes");
    std::ifstream in(path, std::ios::binary);
    NL_REQUIRE(in.good(), path, ": cannot open config file: ", std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    NL_REQUIRE(!in.bad(), path, ": cannot read config file: ", std::strerror(errno));
    return parse_json(text.str(), path);
}

void apply_override(json& root, const std::string& assignment) {
    size_t eq = assignment.find('=');
    NL_REQUIRE(eq != std::string::npos && eq > 0, "--set: expected key.path=value, got '", assignment, "'");
    NL_REQUIRE(root.is_object(), "--set: the config is not a JSON object (found ", root.type_name(), ")");
    std::string key_path = assignment.substr(0, eq);
    std::string text = assignment.substr(eq + 1);
    const std::string where = "--set " + key_path;
    check_json_depth(text, where);
    json value;
    try {
        value = json::parse(text);
    } catch (const json::parse_error&) {
        value = text;  // a bare word is a string: --set model.norm=rmsnorm
    } catch (const json::exception& e) {
        throw Error(detail::concat(where, ": invalid value '", text, "': ", e.what()));  // e.g. 1e400
    }
    json* node = &root;
    std::stringstream parts(key_path);
    std::string part;
    std::vector<std::string> keys;
    while (std::getline(parts, part, '.')) {
        NL_REQUIRE(!part.empty(), "--set: empty key in '", key_path, "'");
        keys.push_back(part);
    }
    NL_REQUIRE(!keys.empty() && key_path.back() != '.', "--set: empty key in '", key_path, "'");
    if (value.is_null()) {
        // Remove the key: the job then reads its default (or its absence). Objects on the way that
        // do not exist mean the key is absent already.
        for (size_t i = 0; i + 1 < keys.size(); ++i) {
            auto next = node->find(keys[i]);
            if (next == node->end()) return;
            NL_REQUIRE(next->is_object(), "--set ", key_path, ": '", keys[i], "' is not an object");
            node = &*next;
        }
        node->erase(keys.back());
        return;
    }
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
        json& next = (*node)[keys[i]];
        if (next.is_null()) next = json::object();
        NL_REQUIRE(next.is_object(), "--set ", key_path, ": '", keys[i], "' is not an object");
        node = &next;
    }
    (*node)[keys.back()] = value;
}

void resolve_paths_beside_config(json& root, const std::string& config_file,
                                 const std::vector<std::string>& pointers) {
    const std::filesystem::path folder = std::filesystem::path(config_file).parent_path();
    for (const std::string& pointer : pointers) {
        const json::json_pointer at(pointer);
        if (!root.is_object() || !root.contains(at) || !root.at(at).is_string()) continue;
        const std::filesystem::path path = root.at(at).get<std::string>();
        if (path.empty() || path.is_absolute()) continue;
        root.at(at) = (folder / path).lexically_normal().string();
    }
}

uint64_t available_memory_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? uint64_t(pages) * uint64_t(page_size) : 0;
}

std::string format_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 6) bytes /= 1024.0, ++unit;
    char text[64];
    std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
    return text;
}

void require_memory(double bytes, const std::string& what) {
    const uint64_t available = available_memory_bytes();
    if (available == 0) return;
    NL_REQUIRE(bytes <= static_cast<double>(available), what, " needs about ", format_bytes(bytes),
               " of memory, but ", format_bytes(static_cast<double>(available)), " is available");
}

int64_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<int64_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
    for (size_t i = 1; i <= a.size(); ++i) {
        int64_t diagonal = row[0];
        row[0] = static_cast<int64_t>(i);
        for (size_t j = 1; j <= b.size(); ++j) {
            int64_t above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

ConfigReader::ConfigReader(const json& object, std::string file, const ConfigSchema& schema)
    : ConfigReader(object, std::move(file), "", schema) {}

ConfigReader::ConfigReader(const json& object, std::string file, std::string path, const ConfigSchema& schema)
    : object_(object), file_(std::move(file)), path_(std::move(path)), schema_(&schema),
      resolved_(std::make_shared<json>(json::object())) {
    // A config that is just `null` (or an empty --set target) is a mistake, not "all defaults".
    NL_REQUIRE(object_.is_object(), file_, ": ", path_.empty() ? "/" : path_,
               ": expected a JSON object, got ", object_.type_name());
}

std::string ConfigReader::where(const std::string& key) const { return file_ + ": " + path_ + "/" + key; }

void ConfigReader::fail(const std::string& key, const std::string& message) const {
    throw Error(where(key) + ": " + message);
}

bool ConfigReader::has(const std::string& key) const { return object_.contains(key); }

std::string ConfigReader::dotted(const std::string& key) const {
    std::string out = path_.empty() ? key : path_.substr(1) + "/" + key;
    std::replace(out.begin(), out.end(), '/', '.');
    return out;
}

const ConfigKey& ConfigReader::spec(const std::string& key, std::initializer_list<ConfigType> types) const {
    const std::string dotted = this->dotted(key);
    const ConfigKey& k = schema_->key(dotted);
    // A getter of the wrong type for the declared key is a mistake in the reader, caught by its tests.
    NL_REQUIRE(std::find(types.begin(), types.end(), k.type) != types.end(), "the ", schema_->job,
               " config schema declares '", dotted, "' with another type than its reader reads");
    return k;
}

const json* ConfigReader::value_at(const std::string& key) {
    known_.insert(key);
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
}

json& ConfigReader::resolved_here() {
    return (*resolved_)[json::json_pointer(path_)];
}

void ConfigReader::check_number(const ConfigKey& k, double x, const std::string& what, const std::string& shown) const {
    if (std::isfinite(x) && k.in_range(x)) return;
    // A JSON file cannot hold an infinity, but a config built in code can; no key takes one.
    const std::string range = k.range_text();
    fail(k.name(), (std::isfinite(x) ? what : "expected a finite number") + (range.empty() ? "" : " " + range) +
                       ", got " + shown);
}

namespace {

// The integer a JSON value holds, or none (a float with a fraction, an unsigned above INT64_MAX, ...).
std::optional<int64_t> integer_of(const json& value) {
    if (value.is_number_unsigned()) {
        // Above INT64_MAX it would wrap in get<int64_t>() and be reported as a negative.
        if (value.get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
        return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>() &&
        std::abs(value.get<double>()) < 9e15)
        return static_cast<int64_t>(value.get<double>());
    return std::nullopt;
}

std::string join_choices(const std::vector<std::string>& choices) {
    std::string out;
    for (const std::string& choice : choices) out += (out.empty() ? "" : ", ") + choice;
    return out;
}

// A value's JSON default as the getter's type (the schema's literals are checked by the tests).
const json& default_of(const ConfigKey& k) {
    NL_REQUIRE(!k.default_value.is_null(), "the config schema gives '", k.path,
               "' no default, so its reader must pass one");
    return k.default_value;
}

}  // namespace

void ConfigReader::check_choice(const ConfigKey& k, const std::string& value) const {
    if (k.choices.empty() || std::find(k.choices.begin(), k.choices.end(), value) != k.choices.end()) return;
    fail(k.name(), "expected one of " + join_choices(k.choices) + ", got \"" + value + "\"");
}

int64_t ConfigReader::get_int(const std::string& key) {
    return get_int(key, default_of(spec(key, {ConfigType::Integer})).get<int64_t>());
}

int64_t ConfigReader::get_int(const std::string& key, int64_t fallback) {
    const ConfigKey& k = spec(key, {ConfigType::Integer});
    const json* value = value_at(key);
    int64_t result = fallback;
    if (value) {
        const std::optional<int64_t> integer = integer_of(*value);
        if (!integer) fail(key, "expected an integer, got " + brief_json(*value));
        result = *integer;
    }
    check_number(k, static_cast<double>(result), "expected an integer", std::to_string(result));
    resolved_here()[key] = result;
    return result;
}

std::optional<int64_t> ConfigReader::get_optional_int(const std::string& key) {
    spec(key, {ConfigType::Integer});
    if (!has(key)) {
        value_at(key);  // known, for "did you mean"
        return std::nullopt;
    }
    return get_int(key, 0);
}

double ConfigReader::get_double(const std::string& key) {
    return get_double(key, default_of(spec(key, {ConfigType::Number})).get<double>());
}

double ConfigReader::get_double(const std::string& key, double fallback) {
    const ConfigKey& k = spec(key, {ConfigType::Number});
    const json* value = value_at(key);
    double result = fallback;
    if (value) {
        if (!value->is_number()) fail(key, "expected a number, got " + brief_json(*value));
        result = value->get<double>();
    }
    check_number(k, result, "expected a number", fmt::format("{}", result));
    resolved_here()[key] = result;
    return result;
}

std::optional<double> ConfigReader::get_optional_double(const std::string& key) {
    spec(key, {ConfigType::Number});
    if (!has(key)) {
        value_at(key);
        return std::nullopt;
    }
    return get_double(key, 0.0);
}

std::optional<bool> ConfigReader::get_optional_bool(const std::string& key) {
    spec(key, {ConfigType::Boolean});
    if (!has(key)) {
        value_at(key);
        return std::nullopt;
    }
    return get_bool(key);
}

bool ConfigReader::get_bool(const std::string& key) {
    const ConfigKey& k = spec(key, {ConfigType::Boolean});
    const json* value = value_at(key);
    if (value && !value->is_boolean()) fail(key, "expected true or false, got " + brief_json(*value));
    const bool result = value ? value->get<bool>() : default_of(k).get<bool>();
    resolved_here()[key] = result;
    return result;
}

std::string ConfigReader::get_string(const std::string& key) {
    return get_string(key, default_of(spec(key, {ConfigType::String, ConfigType::Path, ConfigType::Device}))
                               .get<std::string>());
}

std::string ConfigReader::get_string(const std::string& key, const std::string& fallback) {
    const ConfigKey& k = spec(key, {ConfigType::String, ConfigType::Path, ConfigType::Device});
    const json* value = value_at(key);
    std::string result = fallback;
    if (value) {
        if (!value->is_string()) fail(key, "expected a string, got " + brief_json(*value));
        result = value->get<std::string>();
    }
    check_choice(k, result);
    resolved_here()[key] = result;
    return result;
}

std::vector<double> ConfigReader::get_double_list(const std::string& key) {
    const ConfigKey& k = spec(key, {ConfigType::NumberList});
    const json* value = value_at(key);
    std::vector<double> result = default_of(k).get<std::vector<double>>();
    if (value) {
        // A single number is accepted as a one-element list.
        json list = value->is_array() ? *value : json::array({*value});
        result.clear();
        for (size_t i = 0; i < list.size(); ++i) {
            if (!list[i].is_number())
                fail(key, "expected a number or a list of numbers, got " + brief_json(*value));
            const double x = list[i].get<double>();
            check_number(k, x, "element " + std::to_string(i) + ": expected a number", fmt::format("{}", x));
            result.push_back(x);
        }
        if (result.empty()) fail(key, "expected a non-empty list");
    }
    resolved_here()[key] = result;
    return result;
}

json ConfigReader::get_json(const std::string& key) {
    const ConfigKey& k = spec(key, {ConfigType::Object, ConfigType::PathOrObject});
    const json* value = value_at(key);
    if (!value) return json();
    if (k.type == ConfigType::Object && !value->is_object()) fail(key, "expected an object, got " + brief_json(*value));
    if (k.type == ConfigType::PathOrObject && !value->is_object() && !value->is_string())
        fail(key, "expected a path or an object, got " + brief_json(*value));
    resolved_here()[key] = *value;
    return *value;
}

std::vector<int64_t> ConfigReader::get_int_list(const std::string& key) {
    const ConfigKey& k = spec(key, {ConfigType::IntegerList});
    const json* value = value_at(key);
    std::vector<int64_t> result = default_of(k).get<std::vector<int64_t>>();
    if (value) {
        json list = value->is_array() ? *value : json::array({*value});
        result.clear();
        for (size_t i = 0; i < list.size(); ++i) {
            const std::optional<int64_t> x = list[i].is_number_integer() ? integer_of(list[i]) : std::nullopt;
            if (!x) fail(key, "expected an integer or a list of integers, got " + brief_json(*value));
            check_number(k, static_cast<double>(*x), "element " + std::to_string(i) + ": expected an integer",
                         std::to_string(*x));
            result.push_back(*x);
        }
        if (result.empty()) fail(key, "expected a non-empty list");
    }
    resolved_here()[key] = result;
    return result;
}

std::vector<std::string> ConfigReader::get_string_list(const std::string& key) {
    const ConfigKey& k = spec(key, {ConfigType::StringList});
    const json* value = value_at(key);
    std::vector<std::string> result = default_of(k).get<std::vector<std::string>>();
    if (value) {
        json list = value->is_array() ? *value : json::array({*value});
        result.clear();
        for (const json& item : list) {
            if (!item.is_string()) fail(key, "expected a string or a list of strings, got " + brief_json(*value));
            result.push_back(item.get<std::string>());
            check_choice(k, result.back());
        }
        if (result.empty()) fail(key, "expected a non-empty list");
    }
    resolved_here()[key] = result;
    return result;
}

ConfigReader ConfigReader::child(const std::string& key) {
    const json* value = value_at(key);
    if (value && !value->is_object()) fail(key, "expected an object, got " + brief_json(*value));
    ConfigReader reader(value ? *value : json::object(), file_, path_ + "/" + key, *schema_);
    reader.resolved_ = resolved_;
    reader.resolved_here() = json::object();
    return reader;
}

void ConfigReader::finish() const {
    const std::string prefix = dotted("");  // "model.norm." ("" at the root)
    // A key of another case (data.val_fraction in a tokens config) is a likelier mistake than a typo,
    // so it gets its own message before the unknown keys.
    const json& resolved = (*resolved_)[json::json_pointer(path_)];
    for (auto it = object_.begin(); it != object_.end(); ++it) {
        const ConfigKey* k = schema_->find(prefix + it.key());
        if (k == nullptr || k->when_key.empty()) continue;
        const json& when = resolved.contains(k->when_key) ? resolved[k->when_key] : default_of(schema_->key(prefix + k->when_key));
        const std::string actual = when.is_string() ? when.get<std::string>() : when.dump();
        if (std::find(k->when_values.begin(), k->when_values.end(), actual) != k->when_values.end()) continue;
        std::string names = "\"" + k->when_values[0] + "\"";
        for (size_t i = 1; i < k->when_values.size(); ++i)
            names += (i + 1 == k->when_values.size() ? " and \"" : ", \"") + k->when_values[i] + "\"";
        fail(it.key(), "applies to " + k->when_key + (k->when_values.size() > 1 ? "s " : " ") + names +
                           " only (this config's " + k->when_key + " is \"" + actual + "\")");
    }
    for (auto it = object_.begin(); it != object_.end(); ++it) {
        if (known_.count(it.key())) continue;
        if (path_.empty() && it.key() == "$schema") {
            // The JSON Schema an editor checks this file with (docs/configs.md); not normlab's to read.
            if (!it.value().is_string()) fail(it.key(), "expected a string (the JSON Schema this file follows), got " + brief_json(it.value()));
            continue;
        }
        std::string nearest;
        int64_t best = INT64_MAX;
        for (const std::string& name : known_) {
            int64_t distance = edit_distance(it.key(), name);
            if (distance < best) best = distance, nearest = name;
        }
        std::string hint = nearest.empty() ? "" : " (did you mean '" + nearest + "'?)";
        std::vector<std::string> names(known_.begin(), known_.end());
        fail(it.key(), "unknown key" + hint + "; known keys: " + join_choices(names));
    }
}

Device read_device(ConfigReader& reader, const std::string& key) {
    const std::string name = reader.get_string(key);
    try {
        return device_from_name(name);
    } catch (const Error&) {
        reader.fail(key, "expected \"cpu\", \"cuda\" or \"cuda:N\" (N a GPU index), got \"" + name + "\"");
    }
}

NormOptions read_norm_options(ConfigReader reader, bool with_type) {
    NormOptions norm;
    if (with_type) {
        norm.type = reader.get_string("type");
        NormOptions type_defaults;
        type_defaults.type = norm.type;
        norm.eps = reader.get_double("eps", type_defaults.resolved_eps());
    } else {
        if (reader.has("type"))
            reader.fail("type", "the norm types of this job are the list /norms (each run builds one of them); "
                                "/norm holds the options they share");
        norm.eps = reader.get_optional_double("eps");
    }
    norm.fused = reader.get_bool("fused");
    norm.elementwise_affine = reader.get_bool("elementwise_affine");
    norm.bias = reader.get_bool("bias");
    norm.p = reader.get_double("p");
    norm.alpha = reader.get_double("alpha");
    norm.alpha_init = reader.get_double("alpha_init");
    reader.finish();
    return norm;
}

void require_device_available(Device device, const std::string& where) {
    if (device.is_cpu()) return;
    const std::string name = "\"" + device.str() + "\"";
#ifdef NORMLAB_HAVE_CUDA
    const int count = cuda_device_count();
    NL_REQUIRE(count > 0, where, ": ", name, " asks for a GPU, but this machine has no usable CUDA device ",
               "(no driver or no GPU); use \"cpu\"");
    NL_REQUIRE(device.index < count, where, ": ", name, " asks for GPU ", device.index, ", but this machine has ",
               count, count == 1 ? " CUDA device (cuda:0)" : " CUDA devices (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
#else
    throw Error(detail::concat(where, ": ", name, " asks for a GPU, but this normlab was built without the CUDA ",
                               "backend (rebuild where the CUDA toolkit is found, or with -DNORMLAB_CUDA=ON); use \"cpu\""));
#endif
}

}  // namespace nl
