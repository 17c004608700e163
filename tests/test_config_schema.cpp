// The config schema (jobs/config_schema.h) is the one declaration of every job's keys: the readers
// read exactly its keys and take its defaults, each default passes its own checks, docs/configs.md's
// tables and docs/schema/*.schema.json are what it generates, `normlab config` prints it, and
// `--set key=null` removes a key so its default applies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "jobs/config.h"
#include "jobs/config_schema.h"
#include "jobs/train_config.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using nl_test::read_text;
using nl_test::shell_arg;

namespace {

const std::string kSource = NORMLAB_SOURCE_DIR;

// The dotted paths of a resolved config's values (objects descended into): "model.norm.eps", ...
void leaf_paths(const json& value, const std::string& prefix, std::set<std::string>& out) {
    for (auto it = value.begin(); it != value.end(); ++it) {
        const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (it.value().is_object())
            leaf_paths(it.value(), path, out);
        else
            out.insert(path);
    }
}

// The train keys that apply where data.source is `source`.
// The keys a config of `source` resolves, with every other key at its default: those without a
// condition, and those whose condition holds (on data.source, or on a sibling's default value).
// model.pre_norm, the older spelling of norm_placement, is read only where given.
std::set<std::string> train_keys_for(const std::string& source) {
    const nl::ConfigSchema& schema = nl::config_schema("train");
    std::set<std::string> out;
    for (const nl::ConfigKey& k : schema.keys) {
        // Resolved only where given: pre_norm (the older name of norm_placement) and head_dim (absent:
        // dim / n_heads, and config.json without it, as runs made before the key have it).
        if (k.path == "model.pre_norm" || k.path == "model.head_dim") continue;
        std::string actual = source;
        if (!k.when_key.empty() && k.when_key != "source") {
            const std::string sibling = k.parent() + "." + k.when_key;
            actual = schema.key(sibling).default_value.get<std::string>();
        }
        if (k.when_key.empty() || std::count(k.when_values.begin(), k.when_values.end(), actual)) out.insert(k.path);
    }
    return out;
}

std::string error_of(const json& config) {
    try {
        nl::read_train_config(config, "x.json");
    } catch (const nl::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("config schema: every default passes its own key's type, bounds and choices", "[config]") {
    for (const std::string& job : nl::config_jobs()) {
        const nl::ConfigSchema& schema = nl::config_schema(job);
        REQUIRE(schema.keys.size() >= 5);  // the sweep's: base, grid, seeds, diverge_factor, plots
        std::set<std::string> paths;
        for (const nl::ConfigKey& k : schema.keys) {
            INFO(job << ": " << k.path);
            CHECK(paths.insert(k.path).second);  // declared once
            CHECK_FALSE(k.meaning.empty());
            // A key without a fixed default says in words what happens.
            CHECK((!k.default_value.is_null() || !k.default_text.empty()));
            if (k.default_value.is_null()) continue;
            std::vector<json> values;
            switch (k.type) {
                case nl::ConfigType::Integer: CHECK(k.default_value.is_number_integer()); values = {k.default_value}; break;
                case nl::ConfigType::Number: CHECK(k.default_value.is_number()); values = {k.default_value}; break;
                case nl::ConfigType::Boolean: CHECK(k.default_value.is_boolean()); break;
                case nl::ConfigType::String:
                case nl::ConfigType::Path:
                case nl::ConfigType::Device: CHECK(k.default_value.is_string()); values = {k.default_value}; break;
                case nl::ConfigType::IntegerList:
                case nl::ConfigType::NumberList:
                case nl::ConfigType::StringList:
                    REQUIRE(k.default_value.is_array());
                    CHECK_FALSE(k.default_value.empty());
                    values.assign(k.default_value.begin(), k.default_value.end());
                    break;
                case nl::ConfigType::Object: CHECK(k.default_value.is_object()); break;
                case nl::ConfigType::PathOrObject:
                    CHECK((k.default_value.is_string() || k.default_value.is_object()));
                    break;
            }
            for (const json& v : values) {
                if (v.is_number()) CHECK(k.in_range(v.get<double>()));
                if (v.is_string() && !k.choices.empty())
                    CHECK(std::count(k.choices.begin(), k.choices.end(), v.get<std::string>()) == 1);
            }
        }
    }
}

TEST_CASE("config schema: the train reader reads exactly the schema's keys, for each data source", "[config]") {
    const json data_of[] = {
        {{"source", "synthetic"}},
        {{"source", "text"}, {"path", "corpus.txt"}},
        {{"source", "tokens"}, {"path", "tokens"}, {"vocab_size", 100}},
    };
    for (const json& data : data_of) {
        const std::string source = data["source"];
        INFO("data.source = " << source);
        const nl::TrainConfig config = nl::read_train_config(json{{"data", data}}, "x.json");
        std::set<std::string> resolved;
        leaf_paths(config.resolved, "", resolved);
        CHECK(resolved == train_keys_for(source));
    }
}

TEST_CASE("config schema: an absent key takes the schema's default, which is the options struct's", "[config]") {
    const nl::TrainConfig config = nl::read_train_config(json::object(), "x.json");
    const json defaults = nl::config_defaults(nl::config_schema("train"));
    std::set<std::string> fixed;
    leaf_paths(defaults, "", fixed);
    REQUIRE(fixed.size() >= 40);
    for (const std::string& path : fixed) {
        INFO(path);
        const json::json_pointer at(nl::config_schema("train").key(path).pointer());
        CHECK(config.resolved.at(at) == defaults.at(at));
    }
    // And what the job runs with is that default, read from the structs the library's users build.
    CHECK(config.model.dim == nl::TransformerOptions{}.dim);
    CHECK(config.model.norm.p == nl::NormOptions{}.p);
    CHECK(config.optim.beta2 == nl::OptimConfig{}.beta2);
    CHECK(config.train.steps == nl::LoopConfig{}.steps);
    CHECK(config.data.task == nl::DataOptions{}.task);
    // The keys without a fixed default: computed from another key.
    CHECK(config.model.n_kv_heads == config.model.n_heads);
    CHECK(config.data.seed == config.seed);
    CHECK(config.resolved["model"]["norm"]["eps"] == 1e-5);  // rmsnorm's own default
}

TEST_CASE("config schema: the reader checks each key against the schema's bounds and choices, naming them",
          "[config]") {
    CHECK_THAT(error_of({{"model", {{"dim", 1}}}}), Catch::Contains("x.json: /model/dim: expected an integer in [2, 65536], got 1"));
    CHECK_THAT(error_of({{"model", {{"norm", {{"p", 0}}}}}}), Catch::Contains("/model/norm/p: expected a number in (0, 1], got 0"));
    CHECK_THAT(error_of({{"optim", {{"beta1", 1.0}}}}), Catch::Contains("/optim/beta1: expected a number in [0, 1), got 1"));
    CHECK_THAT(error_of({{"optim", {{"lr", 0.001}, {"min_lr", 0.01}}}}),
               Catch::Contains("/optim/min_lr: expected a number <= /optim/lr = 0.001, got 0.01"));
    CHECK_THAT(error_of({{"model", {{"norm", {{"type", "batchnorm"}}}}}}),
               Catch::Contains("/model/norm/type: expected one of layernorm, rmsnorm"));
    CHECK_THAT(error_of({{"train", {{"autocast", "fp8"}}}}),
               Catch::Contains("/train/autocast: expected one of none, bf16, got \"fp8\""));
    CHECK_THAT(error_of({{"data", {{"val_fraction", 0.2}}}}),
               Catch::Contains("/data/val_fraction: applies to source \"text\" only (this config's source is \"synthetic\")"));
    CHECK_THAT(error_of({{"data", {{"source", "text"}, {"path", "a.txt"}, {"task", "copy"}}}}),
               Catch::Contains("/data/task: applies to source \"synthetic\" only (this config's source is \"text\")"));
}

TEST_CASE("config schema: \"$schema\" names the file's JSON Schema at the top level only", "[config]") {
    const json with_schema = {{"$schema", "../docs/schema/train.schema.json"}, {"model", {{"dim", 32}}}};
    const nl::TrainConfig config = nl::read_train_config(with_schema, "x.json");
    CHECK(config.model.dim == 32);
    CHECK_FALSE(config.resolved.contains("$schema"));
    CHECK_THAT(error_of({{"$schema", 3}}), Catch::Contains("x.json: /$schema: expected a string"));
    CHECK_THAT(error_of({{"model", {{"$schema", "x"}}}}), Catch::Contains("/model/$schema: unknown key"));
}

TEST_CASE("config schema: the JSON Schema nests the objects, refuses unknown keys and states each key",
          "[config]") {
    const json s = nl::json_schema(nl::config_schema("train"));
    CHECK(s["$schema"] == "https://json-schema.org/draft/2020-12/schema");
    CHECK(s["type"] == "object");
    CHECK(s["additionalProperties"] == false);
    CHECK(s["properties"]["$schema"]["type"] == "string");
    const json& model = s["properties"]["model"];
    CHECK(model["additionalProperties"] == false);
    const json& dim = model["properties"]["dim"];
    CHECK(dim["type"] == "integer");
    CHECK(dim["minimum"] == 2);
    CHECK(dim["maximum"] == 65536);
    CHECK(dim["default"] == 64);
    const json& norm = model["properties"]["norm"];
    CHECK(norm["additionalProperties"] == false);
    CHECK(norm["properties"]["p"]["exclusiveMinimum"] == 0.0);
    CHECK(norm["properties"]["p"]["maximum"] == 1.0);
    CHECK(norm["properties"]["type"]["enum"] == json(nl::norm_types()));
    CHECK_FALSE(norm["properties"]["eps"].contains("default"));  // the type's own, said in words
    // Descriptions are plain text for an editor's tooltip: links as paths, no backticks.
    CHECK(norm["properties"]["eps"]["description"] ==
          "added to the variance / mean square (default: the type's own default, 1e-5 for every type (docs/norms.md))");
    CHECK(norm["properties"]["bias"]["description"] == "norms with a bias (layernorm, hybridnorm): learn it");
    // The source-specific keys: one if/then per key that refuses it elsewhere, one more where required.
    const json& data = s["properties"]["data"];
    const json& rules = data["allOf"];
    REQUIRE(rules.is_array());
    const json refuse_task = {{"if", {{"properties", {{"source", {{"not", {{"enum", {"synthetic"}}}}}}}}, {"required", {"source"}}}},
                              {"then", {{"not", {{"required", {"task"}}}}}}};
    CHECK(std::find(rules.begin(), rules.end(), refuse_task) != rules.end());
    const json require_path = {{"if", {{"properties", {{"source", {{"enum", {"text", "tokens"}}}}}}, {"required", {"source"}}}},
                               {"then", {{"required", {"path"}}}}};
    CHECK(std::find(rules.begin(), rules.end(), require_path) != rules.end());
    // A list key accepts one value or a non-empty list.
    const json lrs = nl::json_schema(nl::config_schema("stability"))["properties"]["lrs"];
    CHECK(lrs["anyOf"][1]["type"] == "array");
    CHECK(lrs["anyOf"][1]["minItems"] == 1);
    CHECK(lrs["default"] == json::array({0.001}));
}

TEST_CASE("config schema: docs/configs.md's tables are the ones the schema generates", "[config]") {
    const std::string path = kSource + "/docs/configs.md";
    const std::string text = read_text(path);
    for (const std::string& job : nl::config_jobs())
        CHECK_THAT(text, Catch::Contains("<!-- generated by `normlab config --markdown " + job + "`"));
    INFO("regenerate with: build/normlab config --update-docs docs/configs.md");
    CHECK(nl::update_generated_config_tables(text, path) == text);
    // The generated rows carry the schema: a key, its type text and its default.
    CHECK_THAT(text, Catch::Contains("| `model.dim` | int in [2, 65536] | 64 | model width |"));
}

TEST_CASE("config schema: a generated table that is not closed or names no job is an error naming the file",
          "[config]") {
    const std::string open = "<!-- generated by `normlab config --markdown train`: do not edit -->\n| stale |\n";
    REQUIRE_THROWS_WITH(nl::update_generated_config_tables(open, "f.md"), Catch::Contains("f.md: the generated table of 'train' has no closing"));
    const std::string unknown = "<!-- generated by `normlab config --markdown nope`: do not edit -->\n<!-- end of generated table -->";
    REQUIRE_THROWS_WITH(nl::update_generated_config_tables(unknown, "f.md"), Catch::Contains("no config schema for job 'nope'"));
    const std::string stale = "a\n<!-- generated by `normlab config --markdown bench_norms`: do not edit -->\n| stale |\n"
                              "<!-- end of generated table -->\nb\n";
    const std::string fresh = nl::update_generated_config_tables(stale, "f.md");
    CHECK_THAT(fresh, !Catch::Contains("| stale |"));
    CHECK_THAT(fresh, Catch::StartsWith("a\n<!-- generated") && Catch::EndsWith("<!-- end of generated table -->\nb\n"));
    CHECK_THAT(fresh, Catch::Contains("| `reps` | int in [1, 100000] | 100 |"));
}

TEST_CASE("config: --set key=null removes the key, so the job reads its default", "[config]") {
    json config = {{"data", {{"source", "text"}, {"val_fraction", 0.2}}}, {"seed", 3}};
    nl::apply_override(config, "data.val_fraction=null");
    CHECK(config == json{{"data", {{"source", "text"}}}, {"seed", 3}});
    nl::apply_override(config, "data.val_fraction=null");  // absent already: nothing changes
    nl::apply_override(config, "optim.lr=null");           // no /optim: nothing made
    CHECK(config == json{{"data", {{"source", "text"}}}, {"seed", 3}});
    nl::apply_override(config, "seed=null");
    CHECK(config == json{{"data", {{"source", "text"}}}});
    REQUIRE_THROWS_WITH(nl::apply_override(config, "data.source.x=null"), Catch::Contains("'source' is not an object"));
}

TEST_CASE("config: a text config trains on token files with --set data.source=tokens and data.val_fraction=null",
          "[config]") {
    const std::string dir = nl_test::make_temp_dir("set-null");
    const std::string base = "train " + shell_arg(kSource + "/configs/char_text.json") +
                             " --set data.source=tokens --set data.path=" + shell_arg(kSource + "/tests/data/tokens") +
                             " --set data.vocab_size=42 --set data.seq_len=16 --set data.eval_sequences=2"
                             " --set model.dim=16 --set model.n_layers=1 --set model.n_heads=2 --set model.max_seq_len=16"
                             " --set train.steps=2 --set train.batch_size=2 --set optim.warmup_steps=0 --set train.eval_every=0"
                             " --set train.checkpoint_every=0 --quiet";
    // Without the null the text key is refused, naming the source it belongs to.
    const nl_test::CliRun refused = nl_test::run_normlab_in(dir, base + " --out run1");
    INFO(refused.output);
    CHECK(refused.status == 2);
    CHECK_THAT(refused.output, Catch::Contains("/data/val_fraction: applies to source \"text\" only"));
    CHECK_FALSE(fs::exists(dir + "/run1"));

    const nl_test::CliRun ran = nl_test::run_normlab_in(dir, base + " --set data.val_fraction=null --out run2");
    INFO(ran.output);
    REQUIRE(ran.status == 0);
    const json resolved = json::parse(read_text(dir + "/run2/config.json"));
    CHECK(resolved["data"]["source"] == "tokens");
    CHECK_FALSE(resolved["data"].contains("val_fraction"));
    CHECK(resolved["data"]["vocab_size"] == 42);
    // Restoring a key to its default: the shipped 1e-6 eps back to rmsnorm's own 1e-5.
    const nl_test::CliRun restored = nl_test::run_normlab_in(dir, base + " --set data.val_fraction=null --set model.norm.eps=null --out run3");
    REQUIRE(restored.status == 0);
    CHECK(json::parse(read_text(dir + "/run3/config.json"))["model"]["norm"]["eps"] == 1e-5);
}

TEST_CASE("config: normlab config prints the schema, the tables and the defaults, and rewrites stale docs",
          "[config][cli]") {
    const std::string dir = nl_test::make_temp_dir("config-cmd");
    for (const std::string& job : nl::config_jobs()) {
        INFO(job);
        const nl_test::CliRun schema = nl_test::run_normlab_in(dir, "config --schema " + job);
        REQUIRE(schema.status == 0);
        CHECK(json::parse(schema.output) == nl::json_schema(nl::config_schema(job)));
        const nl_test::CliRun table = nl_test::run_normlab_in(dir, "config --markdown " + job);
        REQUIRE(table.status == 0);
        CHECK(table.output == nl::config_markdown_table(nl::config_schema(job)));
        const nl_test::CliRun defaults = nl_test::run_normlab_in(dir, "config --defaults " + job);
        REQUIRE(defaults.status == 0);
        CHECK(json::parse(defaults.output) == nl::config_defaults(nl::config_schema(job)));
    }
    const nl_test::CliRun unknown = nl_test::run_normlab_in(dir, "config --schema sweeep");
    CHECK(unknown.status == 2);
    CHECK_THAT(unknown.output, Catch::Contains("normlab: error: no config schema for job 'sweeep' (the jobs that read a "
                                               "config: train, stability, sweep, bench_norms)"));

    // --update-docs rewrites a stale table in place and leaves the prose; --write-schemas writes every job's.
    std::ofstream(dir + "/doc.md") << "intro\n<!-- generated by `normlab config --markdown stability`: do not edit -->\n"
                                      "| old |\n<!-- end of generated table -->\noutro\n";
    const nl_test::CliRun updated = nl_test::run_normlab_in(dir, "config --update-docs doc.md");
    REQUIRE(updated.status == 0);
    CHECK_THAT(updated.output, Catch::Contains("doc.md: tables rewritten"));
    const std::string doc = read_text(dir + "/doc.md");
    CHECK_THAT(doc, Catch::StartsWith("intro\n") && Catch::EndsWith("outro\n") && !Catch::Contains("| old |"));
    CHECK_THAT(nl_test::run_normlab_in(dir, "config --update-docs doc.md").output, Catch::Contains("up to date"));
    fs::create_directories(dir + "/schemas");
    REQUIRE(nl_test::run_normlab_in(dir, "config --write-schemas schemas").status == 0);
    for (const std::string& job : nl::config_jobs())
        CHECK(json::parse(read_text(dir + "/schemas/" + job + ".schema.json")) == nl::json_schema(nl::config_schema(job)));
    const nl_test::CliRun no_dir = nl_test::run_normlab_in(dir, "config --write-schemas no_such_dir");
    CHECK(no_dir.status == 2);
    CHECK_THAT(no_dir.output, Catch::Contains("normlab: error: no_such_dir: expected an existing directory"));
    const nl_test::CliRun no_file = nl_test::run_normlab_in(dir, "config --update-docs no_such.md");
    CHECK(no_file.status == 2);
    CHECK_THAT(no_file.output, Catch::Contains("normlab: error: no_such.md: cannot open (expected a markdown file"));
    // A file whose generated table is not closed is refused by name, and left as it was.
    std::ofstream(dir + "/open.md") << "<!-- generated by `normlab config --markdown train`: do not edit -->\n| old |\n";
    const nl_test::CliRun open = nl_test::run_normlab_in(dir, "config --update-docs open.md");
    CHECK(open.status == 2);
    CHECK_THAT(open.output, Catch::Contains("open.md: the generated table of 'train' has no closing"));
    CHECK_THAT(read_text(dir + "/open.md"), Catch::EndsWith("| old |\n"));
}
