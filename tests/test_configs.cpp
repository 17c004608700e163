// The shipped configs work from a fresh clone as they are: every configs/*.json (found by listing the
// folder, so a config added later is covered too) runs for a few steps with nothing overridden but
// its step or epoch count, from a working directory outside the repository, and leaves its job's
// outputs. Relative paths written in a config file are read beside the config; paths given with
// --set are read from the working directory.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "jobs/config_schema.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using nl_test::CliRun;
using nl_test::read_text;
using nl_test::shell_arg;
using nl_test::TempDir;

namespace {

CliRun run_in(const fs::path& dir, const std::string& args) {
    return nl_test::run_normlab_env(dir.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ", args);
}

json read_json(const fs::path& path) {
    INFO("reading " << path.string());
    REQUIRE(fs::exists(path));
    return json::parse(read_text(path.string()));
}

size_t count_lines(const fs::path& path) {
    const std::string text = read_text(path.string());
    return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// The length of a list-valued key, or `fallback` (the job's documented default's length) when absent.
size_t list_size(const json& config, const std::string& key, size_t fallback) {
    if (!config.contains(key)) return fallback;
    return config[key].is_array() ? config[key].size() : 1;
}

// Which job reads a config: the job its "$schema" names ("../docs/schema/train.schema.json": "train",
// "bench_norms": "bench norms"), else told by the keys only that job has; "" when none matches.
std::string job_of(const json& config) {
    if (config.contains("$schema") && config["$schema"].is_string()) {
        std::string job = fs::path(config["$schema"].get<std::string>()).filename().string();
        job = job.substr(0, job.find('.'));
        return job == "bench_norms" ? "bench norms" : job;
    }
    for (const char* key : {"large_shapes", "reps", "impls", "passes"})
        if (config.contains(key)) return "bench norms";
    for (const char* key : {"norms", "depths", "lrs", "epochs"})
        if (config.contains(key)) return "stability";
    for (const char* key : {"model", "train", "data", "optim"})
        if (config.contains(key)) return "train";
    return "";
}

void write_text(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary);
    out << text;
}

// A few hundred characters of text: enough windows for a tiny character model.
std::string small_corpus() {
    std::string text;
    for (int i = 0; i < 12; ++i) text += "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind.\n";
    return text;
}

// A tiny character-level train config reading `path` (as written in the file).
json text_config(const std::string& path) {
    return json{{"data", {{"source", "text"}, {"path", path}, {"seq_len", 16}, {"eval_sequences", 4}}},
                {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"max_seq_len", 16}}},
                {"optim", {{"warmup_steps", 0}}},
                {"train", {{"steps", 2}, {"batch_size", 4}, {"eval_every", 0}, {"log_every", 1}}}};
}

// Every configs/*.json, sorted by name.
std::vector<fs::path> shipped_configs() {
    const fs::path folder = fs::path(NORMLAB_SOURCE_DIR) / "configs";
    std::vector<fs::path> configs;
    for (const auto& entry : fs::directory_iterator(folder))
        if (entry.path().extension() == ".json") configs.push_back(entry.path());
    std::sort(configs.begin(), configs.end());
    return configs;
}

// The shipped configs `job` reads.
std::vector<fs::path> shipped_configs_of(const std::string& job) {
    std::vector<fs::path> found;
    for (const fs::path& path : shipped_configs())
        if (job_of(read_json(path)) == job) found.push_back(path);
    return found;
}

// Runs `normlab <job> <config> <args>` in a scratch folder (nothing may depend on starting in the
// repository) with the run directory "run" in it; requires exit code 0.
struct ShippedRun {
    TempDir dir{"shipped_config"};
    fs::path run() const { return dir.path / "run"; }
};

void run_shipped(const ShippedRun& where, const std::string& job, const fs::path& config, const std::string& args) {
    CliRun result = run_in(where.dir.path, job + " " + shell_arg(config.string()) + " --out run " + args);
    INFO(config.filename().string() << " (" << job << "):\n" << result.output);
    REQUIRE(result.status == 0);
}

}  // namespace

TEST_CASE("every shipped config is read by a job these tests run", "[configs]") {
    const std::vector<fs::path> configs = shipped_configs();
    REQUIRE(configs.size() >= 5);  // toy_transformer, char_text, stability, stability_sweep, bench_norms
    for (const fs::path& path : configs) {
        INFO(path.filename().string() << ": tell its job apart in job_of() (tests/test_configs.cpp)");
        CHECK_FALSE(job_of(read_json(path)).empty());
    }
}

TEST_CASE("every shipped config names its job's JSON Schema, which exists and is the schema normlab prints",
          "[configs]") {
    for (const fs::path& path : shipped_configs()) {
        INFO(path.filename().string());
        const json config = read_json(path);
        REQUIRE(config.contains("$schema"));
        const fs::path schema = path.parent_path() / config["$schema"].get<std::string>();
        REQUIRE(fs::exists(schema));
        std::string job = schema.filename().string();
        job = job.substr(0, job.find('.'));
        INFO("regenerate with: build/normlab config --write-schemas docs/schema");
        CHECK(nl::json_schema(nl::config_schema(job)) == read_json(schema));
    }
}

TEST_CASE("every shipped train config trains for 3 steps as shipped and writes its run directory", "[configs]") {
    const std::vector<fs::path> configs = shipped_configs_of("train");
    REQUIRE(configs.size() >= 2);
    for (const fs::path& config : configs) {
        DYNAMIC_SECTION(config.filename().string()) {
            // Step counts only: 3 optimizer steps, and a warmup shorter than them (the schedule
            // requires warmup_steps < steps).
            ShippedRun shipped;
            run_shipped(shipped, "train", config, "--quiet --set train.steps=3 --set optim.warmup_steps=1");
            const fs::path run = shipped.run();
            const json summary = read_json(run / "summary.json");
            CHECK(summary["steps"] == 3);
            CHECK(std::isfinite(summary["val_loss"].get<double>()));
            CHECK(count_lines(run / "metrics.csv") == 1 + 3);  // header + one row per step
            CHECK(fs::exists(run / "checkpoints" / "step_00000003.safetensors"));
            const json resolved = read_json(run / "config.json");
            CHECK(resolved["train"]["steps"] == 3);
            if (resolved["data"]["source"] == "text") {
                // The shipped text is found from the scratch folder: it was read beside the config.
                const fs::path text = fs::path(resolved["data"]["path"].get<std::string>());
                CHECK(fs::exists(text.is_absolute() ? text : shipped.dir.path / text));
            }
        }
    }
}

TEST_CASE("every shipped stability config runs one epoch as shipped and writes every run's curve", "[configs]") {
    const std::vector<fs::path> configs = shipped_configs_of("stability");
    REQUIRE(configs.size() >= 2);
    for (const fs::path& config_path : configs) {
        DYNAMIC_SECTION(config_path.filename().string()) {
            ShippedRun shipped;
            run_shipped(shipped, "stability", config_path, "--quiet --set epochs=1");
            const fs::path run = shipped.run();
            const json config = read_json(config_path);
            const size_t runs = list_size(config, "norms", 2) * list_size(config, "depths", 1) *
                                list_size(config, "lrs", 1) * list_size(config, "seeds", 1);
            CHECK(read_json(run / "summary.json")["runs"].size() == runs);
            CHECK(count_lines(run / "runs.csv") == 1 + runs);
            size_t curves = 0;
            for (const auto& entry : fs::directory_iterator(run / "curves")) curves += entry.path().extension() == ".csv";
            CHECK(curves == runs);
            CHECK(fs::exists(run / "config.json"));
        }
    }
}

TEST_CASE("every shipped sweep config runs 2 steps per run as shipped and writes every run's record", "[configs]") {
    const std::vector<fs::path> configs = shipped_configs_of("sweep");
    REQUIRE(!configs.empty());
    for (const fs::path& config : configs) {
        ShippedRun where;
        // Every run as shipped but for its length and its held-out set (evaluated before and after
        // training): the grid and the seeds are what is checked.
        run_shipped(where, "sweep", config,
                    "--quiet --jobs 2 --set base.train.steps=2 --set base.optim.warmup_steps=1 "
                    "--set base.data.eval_sequences=4");
        const json shipped = read_json(config);
        size_t runs = list_size(shipped, "seeds", 1);
        for (const auto& item : shipped["grid"].items()) runs *= item.value().size();
        CHECK(count_lines(where.run() / "runs.csv") == runs + 1);
        for (size_t i = 0; i < runs; ++i) CHECK(fs::exists(where.run() / "runs" / std::to_string(i) / "result.json"));
        CHECK(fs::exists(where.run() / "summary.json"));
    }
}

TEST_CASE("every shipped bench norms config runs one rep per case as shipped and writes every case", "[configs]") {
    const std::vector<fs::path> configs = shipped_configs_of("bench norms");
    REQUIRE(configs.size() >= 1);
    for (const fs::path& config_path : configs) {
        DYNAMIC_SECTION(config_path.filename().string()) {
            ShippedRun shipped;
            run_shipped(shipped, "bench norms", config_path, "--set reps=1 --set large_reps=1");
            // One CSV row per case: every shape x norm x implementation x pass x dtype.
            const json config = read_json(config_path);
            const size_t shapes = list_size(config, "hidden", 5) * list_size(config, "batch", 3) +
                                  list_size(config, "large_shapes", 2);
            const size_t cases = shapes * list_size(config, "norms", 2) * list_size(config, "impls", 4) *
                                 list_size(config, "passes", 2) * list_size(config, "dtypes", 1);
            CHECK(count_lines(shipped.run() / "bench_norms.csv") == 1 + cases);
        }
    }
}

TEST_CASE("a relative path in a config file is read beside the config, and one given with --set from the "
          "working directory", "[configs]") {
    TempDir dir("config_paths");
    const fs::path configs = dir.path / "configs";
    const fs::path cwd = dir.path / "elsewhere";  // where the program runs: not the config's folder
    fs::create_directories(cwd);
    write_text(configs / "corpus.txt", small_corpus());
    write_text(configs / "text.json", text_config("corpus.txt").dump(2));

    SECTION("train: data.path from the file") {
        CliRun result = run_in(cwd, "train ../configs/text.json --out run --quiet");
        INFO(result.output);
        REQUIRE(result.status == 0);
        // The resolved config records the path as opened, relative to the working directory.
        CHECK(read_json(cwd / "run" / "config.json")["data"]["path"] == "../configs/corpus.txt");
    }
    SECTION("train: data.path from --set is relative to the working directory") {
        write_text(cwd / "mine.txt", small_corpus());
        CliRun result = run_in(cwd, "train ../configs/text.json --out run --quiet --set data.path=mine.txt");
        INFO(result.output);
        REQUIRE(result.status == 0);
        CHECK(read_json(cwd / "run" / "config.json")["data"]["path"] == "mine.txt");
    }
    SECTION("train: an absolute path in the file is kept") {
        const std::string absolute = (configs / "corpus.txt").string();
        write_text(configs / "absolute.json", text_config(absolute).dump(2));
        CliRun result = run_in(cwd, "train ../configs/absolute.json --out run --quiet");
        INFO(result.output);
        REQUIRE(result.status == 0);
        CHECK(read_json(cwd / "run" / "config.json")["data"]["path"] == absolute);
    }
    SECTION("train: a missing file is named as resolved, with the JSON path") {
        write_text(configs / "missing.json", text_config("nothere.txt").dump(2));
        CliRun result = run_in(cwd, "train ../configs/missing.json --out run --quiet");
        CHECK(result.status == 2);
        CHECK_THAT(result.output, Catch::Contains("../configs/nothere.txt: cannot open text file") &&
                                      Catch::Contains("/data/path"));
        CHECK_FALSE(fs::exists(cwd / "run"));
    }
    SECTION("stability: data_from from the file") {
        fs::copy_file(fs::path(NORMLAB_SOURCE_DIR) / "tests/reference/fixtures/stability_data.safetensors",
                      configs / "data.safetensors");
        write_text(configs / "stability.json",
                   json{{"data_from", "data.safetensors"}, {"epochs", 1}, {"plots", false}}.dump(2));
        CliRun result = run_in(cwd, "stability ../configs/stability.json --out run --quiet");
        INFO(result.output);
        REQUIRE(result.status == 0);
        CHECK(read_json(cwd / "run" / "config.json")["data_from"] == "../configs/data.safetensors");
    }
}
