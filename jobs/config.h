// Validated JSON configs: every read names the file and the JSON path, checks the type and range,
// fills the documented default when a key is absent, and records the resolved value; unknown keys
// are errors that suggest the nearest known key. Also `--set a.b=value` overrides.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "jobs/config_schema.h"
#include "layers/norms.h"

namespace nl {

using json = nlohmann::json;

// Config files above this size are refused before they are read.
inline constexpr uint64_t kMaxConfigBytes = 16u << 20;

// Reads `path` as JSON; a missing, unreadable or oversized file, malformed JSON, a number out of
// range or nesting deeper than kMaxJsonDepth (core/json_parse.h) is an nl::Error naming the file
// (and the byte offset of a parse error).
json load_json_file(const std::string& path);

// Applies one "a.b.c=value" override to `root`; the value is parsed as JSON when it parses
// (numbers, true/false, [..]) and taken as a string otherwise. Intermediate objects are created.
// "a.b.c=null" removes the key (nothing when it is absent), so the job reads its default: the key
// is restored to its default, or absent where that is its default.
// Nesting deeper than kMaxJsonDepth or a number out of range (1e400) is an nl::Error.
void apply_override(json& root, const std::string& assignment);

// A relative path written in a config file names a file beside that config, wherever the program
// runs from: each string at `pointers` ("/data/path") that is a relative path becomes
// "<config file's folder>/<path>" (lexically normalized). Call it after load_json_file and before
// the --set overrides: a path typed on the command line is relative to the working directory, as
// the shell that completed it assumed. Absolute and empty paths, and absent keys, are left alone
// (the job's reader reports a wrong type).
void resolve_paths_beside_config(json& root, const std::string& config_file,
                                 const std::vector<std::string>& pointers);

// One JSON object of a config being read against the job's schema (jobs/config_schema.h): each
// getter names a key of this object, whose type, bounds, choices and default the schema declares.
// Child readers share the file name, the schema and the set of resolved values.
class ConfigReader {
public:
    // The reader of the whole config `object` (read from `file`) of the job `schema` describes.
    ConfigReader(const json& object, std::string file, const ConfigSchema& schema);

    // Each getter: the value at key, or the schema's default when absent, type- and range-checked
    // against the schema. The overloads with `fallback` are for keys whose default is computed from
    // other keys (the schema's default is null there: /model/n_kv_heads defaults to n_heads).
    int64_t get_int(const std::string& key);
    int64_t get_int(const std::string& key, int64_t fallback);
    double get_double(const std::string& key);
    double get_double(const std::string& key, double fallback);
    bool get_bool(const std::string& key);
    std::string get_string(const std::string& key);
    std::string get_string(const std::string& key, const std::string& fallback);
    std::vector<double> get_double_list(const std::string& key);
    std::vector<int64_t> get_int_list(const std::string& key);
    std::vector<std::string> get_string_list(const std::string& key);
    // A key with no default: its value when present (checked, and recorded as resolved), else none.
    std::optional<int64_t> get_optional_int(const std::string& key);
    std::optional<double> get_optional_double(const std::string& key);
    std::optional<bool> get_optional_bool(const std::string& key);
    // An Object or PathOrObject key: its value as given (an object, or for PathOrObject a string),
    // recorded as resolved; null when absent. The job checks what is inside.
    json get_json(const std::string& key);
    // A nested object (an empty one when absent); its keys are checked by its own finish().
    ConfigReader child(const std::string& key);
    bool has(const std::string& key) const;

    // Throws for the first key given where it does not apply ("<file>: <path>/<key>: applies to
    // source \"text\" only (this config's source is \"tokens\")"), then for the first key that no getter
    // read: "<file>: <path>/<key>: unknown key (did you mean '<nearest>'?; known keys: ...)". Call after
    // reading every key of this object. The root object may also hold "$schema" (a string naming
    // the JSON Schema an editor checks the file with), which is not read.
    void finish() const;

    // An error about `key` in this object: "<file>: <path>/<key>: <message>".
    [[noreturn]] void fail(const std::string& key, const std::string& message) const;
    std::string where(const std::string& key) const;  // "<file>: <path>/<key>"

    // The config as resolved so far (defaults filled in), shared by all readers of one file.
    const json& resolved() const { return *resolved_; }
    // Records `value` as the resolved value of `key` here: a value another key decided
    // (/model/pre_norm decides /model/norm_placement).
    void set_resolved(const std::string& key, const json& value) { resolved_here()[key] = value; }

private:
    ConfigReader(const json& object, std::string file, std::string path, const ConfigSchema& schema);
    const ConfigKey& spec(const std::string& key, std::initializer_list<ConfigType> types) const;
    const json* value_at(const std::string& key);  // marks the key known; null when absent
    json& resolved_here();
    void check_number(const ConfigKey& spec, double x, const std::string& what, const std::string& shown) const;
    void check_choice(const ConfigKey& spec, const std::string& value) const;
    std::string dotted(const std::string& key) const;  // the schema's path of a key here: "model.norm.eps"

    json object_;
    std::string file_;
    std::string path_;  // JSON pointer of this object, "" for the root
    const ConfigSchema* schema_;
    std::shared_ptr<json> resolved_;
    std::set<std::string> known_;
};

// The norm object that train's /model/norm and stability's /norm share (jobs/config_schema.cpp):
// `with_type` (train) reads /type too, and an absent eps is the type's default, recorded as resolved;
// without it (stability, which sweeps the types of its /norms list) a /type is an error naming
// /norms, and an absent eps stays unset (each type's own default).
NormOptions read_norm_options(ConfigReader reader, bool with_type);

// The device named by `key`: "cpu" (the default), "cuda" (GPU 0) or "cuda:N"; anything else is an
// nl::Error "<file>: <path>/<key>: expected ..., got ...". Only the form is checked here (a
// checkpoint's config names the device it trained on, and may be read where that GPU is absent).
Device read_device(ConfigReader& reader, const std::string& key = "device");

// Before a job starts work on `device`: an nl::Error "<where>: ..." when it is a GPU and this build
// has no CUDA backend, the machine has no usable CUDA device, or it has fewer GPUs than the index.
// `where` names the setting, e.g. "configs/x.json: /device".
void require_device_available(Device device, const std::string& where);

// The memory this machine can give a job now: /proc/meminfo's MemAvailable (the free pages when it is
// absent); 0 when unknown.
uint64_t available_memory_bytes();

// Refuses a job before it allocates: an nl::Error "<what> needs about 5.3 TiB of memory, but 12.1 GiB
// is available" when `bytes` (an estimate, computed in double so it cannot overflow) exceeds the
// available memory. `what` names the config keys that set the size. Nothing is checked when the
// available memory is unknown.
void require_memory(double bytes, const std::string& what);

// "12.1 GiB", "512 B": a byte count for messages.
std::string format_bytes(double bytes);

// Levenshtein distance, for "did you mean" suggestions.
int64_t edit_distance(const std::string& a, const std::string& b);

}  // namespace nl
