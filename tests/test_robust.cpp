// Hostile and clumsy input, one test case per class of failure: JSON nested deep enough to overflow
// the stack, size arithmetic that overflows, sizes too large for the machine, exceptions that used
// to escape without a file name, bad values that used to be accepted, safetensors headers with very
// many entries, and run directories under a full disk, a second process and a killed run. Each is
// a clean nl::Error (or one error line and exit code 2 from the program) naming what was expected
// and what was found.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/shape.h"
#include "jobs/config.h"
#include "jobs/data.h"
#include "jobs/run_dir.h"
#include "jobs/train.h"
#include "layers/checkpoint.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Contains;
using nl_test::TempDir;

namespace {

using Run = nl_test::CliRun;

Run run_in(const TempDir& dir, const std::string& args, const std::string& prefix = "") {
    return nl_test::run_normlab_env(dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive " + prefix, args);
}

// An expected error: exit code 2, exactly one line, containing every part.
void check_error(const Run& run, const std::vector<std::string>& parts) {
    INFO(run.output);
    CHECK(run.status == 2);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK_THAT(run.output, Catch::StartsWith("normlab: error: "));
    for (const std::string& part : parts) CHECK_THAT(run.output, Contains(part));
}

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    REQUIRE(out.good());
}

// A safetensors file from raw parts: the 8-byte little-endian header length, the header, the data.
void write_safetensors_raw(const fs::path& path, const std::string& header, const std::string& data = "") {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xFF);
    write_bytes(path, bytes + header + data);
}

std::string nested_array(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string config_path(const std::string& name) { return std::string(NORMLAB_SOURCE_DIR) + "/configs/" + name; }

// A checkpoint-like file: no tensors, normlab's format keys and the given metadata.
void write_checkpoint_metadata(const fs::path& path, std::map<std::string, std::string> metadata) {
    metadata.emplace("normlab.format", "checkpoint-v1");
    metadata.emplace("normlab.step", "1");
    nl::save_safetensors(path.string(), {}, metadata);
}

const std::string kShort =
    " --quiet --set train.steps=12 --set optim.warmup_steps=3 --set train.eval_every=6 "
    "--set train.batch_size=16 --set data.eval_sequences=64";

}  // namespace

TEST_CASE("JSON nested deeper than 64 levels is refused before parsing, wherever JSON is read", "[robust]") {
    TempDir dir("robust_deep");
    // The limit itself: 64 levels parse, 65 do not; brackets inside strings do not count.
    CHECK(nl::parse_json(nested_array(64), "x").is_array());
    CHECK_THROWS_WITH(nl::parse_json(nested_array(65), "where.json"),
                      Contains("where.json") && Contains("nested deeper than 64 levels") && Contains("byte 64"));
    CHECK(nl::parse_json("[\"" + std::string(1000, '[') + "\\\"{\"]", "x")[0].get<std::string>().size() == 1002);
    // Deep enough to overflow the stack of a recursive parser, copy or dump.
    CHECK_THROWS_WITH(nl::parse_json(nested_array(200000), "x"), Contains("nested deeper than 64 levels"));

    // A config file.
    write_bytes(dir.path / "deep.json", "{\"x\": " + nested_array(200000) + "}");
    CHECK_THROWS_WITH(nl::load_json_file((dir.path / "deep.json").string()),
                      Contains("deep.json") && Contains("nested deeper than 64 levels"));
    // A --set value.
    nl::json root = nl::json::object();
    CHECK_THROWS_WITH(nl::apply_override(root, "seed=" + nested_array(65536)),
                      Contains("--set seed") && Contains("nested deeper than 64 levels"));
    // A safetensors header whose dtype is deeply nested.
    const std::string deep_header = "{\"w\": {\"dtype\": " + nested_array(100000) +
                                    ", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    write_safetensors_raw(dir.path / "deep.safetensors", deep_header, std::string(4, '\0'));
    CHECK_THROWS_WITH(nl::load_safetensors((dir.path / "deep.safetensors").string()),
                      Contains("deep.safetensors") && Contains("nested deeper than 64 levels"));
    // A checkpoint's stored config, through the program (`sample` reads it first).
    write_checkpoint_metadata(dir.path / "deep_config.safetensors", {{"config", "{\"seed\": " + nested_array(100000) + "}"}});
    const nl::CheckpointInfo info = nl::read_checkpoint_info((dir.path / "deep_config.safetensors").string());
    CHECK_THROWS_WITH(nl::checkpoint_metadata_json(info, "ck.safetensors", "config"),
                      Contains("ck.safetensors: metadata 'config'") && Contains("nested deeper than 64 levels"));
    check_error(run_in(dir, "sample deep_config.safetensors"),
                {"deep_config.safetensors: metadata 'config'", "nested deeper than 64 levels"});
    // And a deep config file through the program.
    check_error(run_in(dir, "train deep.json --out run"), {"deep.json", "nested deeper than 64 levels"});
    CHECK_FALSE(fs::exists(dir.path / "run"));
}

TEST_CASE("size arithmetic that overflows int64 is an nl::Error naming the shape", "[robust]") {
    CHECK(nl::shape_numel({2, 3, 4}) == 24);
    CHECK(nl::shape_numel({0, int64_t(1) << 62, 4}) == 0);  // empty: the product never overflows
    CHECK_THROWS_WITH(nl::shape_numel({int64_t(1) << 62, 4}),
                      Contains("[4611686018427387904, 4]") && Contains("overflows"));
    CHECK(nl::contiguous_strides({2, 3, 4}) == nl::Shape{12, 4, 1});
    CHECK(nl::contiguous_strides({int64_t(1) << 62, 1}) == nl::Shape{1, 1});  // only products of later dims count
    CHECK_THROWS_WITH(nl::contiguous_strides({0, int64_t(1) << 32, int64_t(1) << 32}),
                      Contains("[0, 4294967296, 4294967296]") && Contains("strides overflow"));
    // The allocation is never reached with a wrapped size.
    CHECK_THROWS_WITH(nl::Tensor::empty({4611686018427387905, 2}, nl::DType::F32), Contains("overflows"));

    // A safetensors entry with zero elements whose strides overflow.
    TempDir dir("robust_overflow");
    write_safetensors_raw(dir.path / "wide.safetensors",
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]}}");
    CHECK_THROWS_WITH(nl::load_safetensors((dir.path / "wide.safetensors").string()),
                      Contains("wide.safetensors") && Contains("tensor 'w'") && Contains("strides overflow"));
}

TEST_CASE("normlab refuses sizes too large for the machine before allocating or making a run directory",
          "[robust][cli]") {
    TempDir dir("robust_huge");
    const std::string stability = "stability '" + config_path("stability.json") + "' --out run --quiet";
    const std::string train = "train '" + config_path("toy_transformer.json") + "' --out run --quiet";

    // Each key's bound, named with the value found.
    check_error(run_in(dir, stability + " --set hidden=4611686018427387905"),
                {"/hidden", "in [1, 65536]", "4611686018427387905"});
    check_error(run_in(dir, stability + " --set samples=1e12"), {"/samples", "1000000000000"});
    check_error(run_in(dir, train + " --set model.dim=1e9"), {"/model/dim", "in [2, 65536]", "1000000000"});
    check_error(run_in(dir, train + " --set model.n_layers=1e9"), {"/model/n_layers", "1000000000"});
    check_error(run_in(dir, train + " --set train.batch_size=1e12"), {"/train/batch_size", "1000000000000"});
    check_error(run_in(dir, train + " --set model.multiple_of=4611686018427387904"),
                {"/model/multiple_of", "4611686018427387904"});
    // Sizes within every bound whose product is more than any machine holds: the memory they need.
    check_error(run_in(dir, train + " --set model.dim=65536 --set model.n_layers=1024"),
                {"/model", "needs about", "TiB of memory", "is available"});
    check_error(run_in(dir, stability + " --set samples=16777216 --set hidden=65536"),
                {"/samples", "needs about", "of memory", "is available"});
    CHECK_FALSE(fs::exists(dir.path / "run"));
    // sample's counts.
    check_error(run_in(dir, "sample none.safetensors --num 1000000"), {"--num", "[1, 100000]", "1000000"});
    check_error(run_in(dir, "sample none.safetensors --max-new-tokens 10000000"), {"--max-new-tokens", "10000000"});
    check_error(run_in(dir, "sample none.safetensors --num 1e23"), {"--num"});
}

TEST_CASE("JSON, file system and number errors are one line naming the file, not an escaped exception",
          "[robust][cli]") {
    TempDir dir("robust_escape");
    const std::string train = "train '" + config_path("toy_transformer.json") + "' --out run";

    // A number too large for a double, in a file and in --set.
    write_bytes(dir.path / "big.json", R"({"seed": 1e400})");
    CHECK_THROWS_WITH(nl::load_json_file((dir.path / "big.json").string()),
                      Contains("big.json") && Contains("1e400"));
    check_error(run_in(dir, "train big.json --out run"), {"big.json", "1e400"});
    check_error(run_in(dir, train + " --set seed=1e400"), {"--set seed", "1e400"});
    // An unsigned integer above INT64_MAX is reported as found, not wrapped to a negative.
    check_error(run_in(dir, train + " --set seed=18446744073709551615"), {"/seed", "18446744073709551615"});

    // A symlink loop as the config and as the checkpoint.
    fs::create_symlink("loop.json", dir.path / "loop.json");
    check_error(run_in(dir, "train loop.json --out run"), {"loop.json", "symbolic links"});
    check_error(run_in(dir, "sample loop.json"), {"loop.json"});
    CHECK_FALSE(fs::exists(dir.path / "run"));

    // A checkpoint whose config or vocab metadata is not JSON.
    write_checkpoint_metadata(dir.path / "bad_config.safetensors", {{"config", "{not json"}});
    check_error(run_in(dir, "sample bad_config.safetensors"),
                {"bad_config.safetensors: metadata 'config'", "malformed JSON"});
    const std::string text_config = R"({"data": {"source": "text", "path": "x.txt"}})";
    write_checkpoint_metadata(dir.path / "bad_vocab.safetensors", {{"config", text_config}, {"vocab", "[97, 98"}});
    check_error(run_in(dir, "sample bad_vocab.safetensors"),
                {"bad_vocab.safetensors: metadata 'vocab'", "malformed JSON"});
    // ... or whose vocab is JSON but not a vocab.
    write_checkpoint_metadata(dir.path / "dup_vocab.safetensors", {{"config", text_config}, {"vocab", "[97, 97]"}});
    check_error(run_in(dir, "sample dup_vocab.safetensors"),
                {"dup_vocab.safetensors: metadata 'vocab'", "increasing order without duplicates", "97 after 97"});
}

TEST_CASE("bad values that used to be accepted are refused", "[robust]") {
    TempDir dir("robust_values");
    // sample's flags (checked before the checkpoint is opened).
    check_error(run_in(dir, "sample none.safetensors --temperature nan"), {"--temperature", "finite", "nan"});
    check_error(run_in(dir, "sample none.safetensors --temperature inf"), {"--temperature", "finite", "inf"});
    check_error(run_in(dir, "sample none.safetensors --temperature -1"), {"--temperature", ">= 0", "-1"});
    check_error(run_in(dir, "sample none.safetensors --seed -1"), {"--seed", ">= 0", "-1"});
    Run no_file = run_in(dir, "sample none.safetensors --temperature 0.5 --seed 3");
    check_error(no_file, {"none.safetensors", "no such checkpoint file"});  // valid flags get as far as the file

    // A config that is just null.
    write_bytes(dir.path / "null.json", "null");
    check_error(run_in(dir, "train null.json --out run"), {"null.json", "expected a JSON object, got null"});
    CHECK_THROWS_WITH(nl::read_train_config(nl::json(nullptr), "c.json"),
                      Contains("c.json") && Contains("expected a JSON object, got null"));

    // A safetensors header padded with NUL bytes (the format pads with spaces only).
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    const std::string padding((8 - header.size() % 8) % 8 + 8, '\0');
    write_safetensors_raw(dir.path / "nul.safetensors", header + padding, std::string(4, '\0'));
    CHECK_THROWS_WITH(nl::load_safetensors((dir.path / "nul.safetensors").string()),
                      Contains("nul.safetensors") && Contains("NUL byte at offset " + std::to_string(header.size())));
    write_safetensors_raw(dir.path / "spaces.safetensors", header + std::string(padding.size(), ' '),
                          std::string(4, '\0'));
    CHECK(nl::load_safetensors((dir.path / "spaces.safetensors").string()).at("w").shape() == nl::Shape{1});

    // A text vocab: Unicode scalar values, increasing, no duplicates.
    CHECK(nl::TextVocab(nl::json{97, 98, 0x10FFFF}).decode({0, 1}) == "ab");
    CHECK_THROWS_WITH(nl::TextVocab(nl::json{97, 0x110000}), Contains("entry 1") && Contains("1114112"));
    CHECK_THROWS_WITH(nl::TextVocab(nl::json{0xD800}), Contains("entry 0") && Contains("surrogate"));
    CHECK_THROWS_WITH(nl::TextVocab(nl::json{97, 97}), Contains("entry 1") && Contains("97 after 97"));
    CHECK_THROWS_WITH(nl::TextVocab(nl::json{98, 97}), Contains("entry 1") && Contains("97 after 98"));

    // normlab.step: a decimal count, no sign, no overflow.
    for (const std::string& step : {std::string("99999999999999999999"), std::string("-1"), std::string("+5"),
                                    std::string(" 5"), std::string("")}) {
        INFO("step '" << step << "'");
        const fs::path file = dir.path / "step.safetensors";
        nl::save_safetensors(file.string(), {}, {{"normlab.format", "checkpoint-v1"}, {"normlab.step", step}});
        CHECK_THROWS_WITH(nl::read_checkpoint_info(file.string()),
                          Contains("step.safetensors") && Contains("'normlab.step'") && Contains("'" + step + "'"));
    }
    nl::save_safetensors((dir.path / "ok.safetensors").string(), {},
                         {{"normlab.format", "checkpoint-v1"}, {"normlab.step", "9223372036854775807"}});
    CHECK(nl::read_checkpoint_info((dir.path / "ok.safetensors").string()).step == INT64_MAX);
}

TEST_CASE("resume: a torn metrics.csv line is recomputed, a checkpoint beyond train.steps is refused",
          "[robust][cli]") {
    TempDir dir("robust_resume");
    const std::string train = "train '" + config_path("toy_transformer.json") + "' --out run" + kShort +
                              " --set train.checkpoint_every=6";
    REQUIRE(run_in(dir, train + " --stop-after 6").status == 0);
    // A crash mid-row leaves a line that is not a row.
    { std::ofstream(dir.path / "run/metrics.csv", std::ios::app) << "7,0.00\xff garbage\n"; }

    // The checkpoint (step 6) is past the end of a 4-step run: refused, the run marked failed.
    check_error(run_in(dir, train + " --resume --set train.steps=4 --set optim.warmup_steps=1"),
                {"step_00000006.safetensors", "step 6", "beyond /train/steps = 4"});
    CHECK(fs::exists(dir.path / "run/error.txt"));
    CHECK_FALSE(fs::exists(dir.path / "run/summary.json"));

    Run resumed = run_in(dir, train + " --resume");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    const std::string metrics = nl_test::read_text((dir.path / "run/metrics.csv").string());
    CHECK(metrics.find("garbage") == std::string::npos);
    CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 13);  // header + steps 1..12, each once
    CHECK(fs::exists(dir.path / "run/summary.json"));
    CHECK_FALSE(fs::exists(dir.path / "run/error.txt"));
}

TEST_CASE("safetensors headers parse in linear time, with at most 100000 tensors", "[robust]") {
    TempDir dir("robust_entries");
    auto header_of = [](int count) {
        std::string header = "{";
        for (int i = 0; i < count; ++i)
            header += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
        return header + "}";
    };
    write_safetensors_raw(dir.path / "many.safetensors", header_of(100000));
    const auto start = std::chrono::steady_clock::now();
    const nl::SafeTensorsFile file = nl::load_safetensors((dir.path / "many.safetensors").string());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(file.tensors.size() == 100000);
    CHECK(file.contains("t99999"));
    // Quadratic insertion took minutes for this header; linear parsing takes well under a second
    // (the bound leaves room for a sanitizer build on a loaded machine).
    CHECK(seconds < 30.0);

    write_safetensors_raw(dir.path / "too_many.safetensors", header_of(100001));
    CHECK_THROWS_WITH(nl::load_safetensors((dir.path / "too_many.safetensors").string()),
                      Contains("too_many.safetensors") && Contains("more than 100000 tensors"));
}

TEST_CASE("run directories: checked writes, error.txt over a failed run, one process at a time, no stale "
          "temporary files", "[robust]") {
    TempDir dir("robust_rundir");
    const std::string out = (dir.path / "run").string();

    SECTION("a CSV row that does not reach the disk is an error") {
        CHECK_THROWS_WITH(nl::CsvWriter("/dev/full", {"step", "loss"}), Contains("/dev/full") && Contains("write failed"));
    }
    SECTION("error.txt is written, and a failure to write it does not throw") {
        {
            nl::RunDir run = nl::RunDir::create("c.json", out, false);
            CHECK(run.write_error("boom"));
            CHECK(nl_test::read_text(out + "/error.txt") == "boom\n");
        }
        nl::RunDir run = nl::RunDir::create("c.json", out, true);
        fs::remove_all(out);
        CHECK_FALSE(run.write_error("boom"));
    }
    SECTION("a second user of the directory is refused while the first holds it") {
        {
            nl::RunDir first = nl::RunDir::create("c.json", out, false);
            CHECK_THROWS_WITH(nl::RunDir::create("c.json", out, true),
                              Contains(out) && Contains("in use by another normlab process"));
            CHECK_THROWS_WITH(nl::RunDir::create("c.json", out, false, true), Contains("in use"));
        }
        CHECK_NOTHROW(nl::RunDir::create("c.json", out, true));  // released with the first
    }
    SECTION("temporary files of a killed run are removed on the next start, other files kept") {
        fs::create_directories(out + "/checkpoints");
        for (const char* name : {"checkpoints/step_00000006.safetensors.tmp.4242", "metrics.csv.tmp.77",
                                 "checkpoints/step_00000006.safetensors", "notes.tmp.txt", "metrics.csv"})
            write_bytes(out + "/" + name, "x");
        nl::RunDir run = nl::RunDir::create("c.json", out, false, true);
        CHECK_FALSE(fs::exists(out + "/checkpoints/step_00000006.safetensors.tmp.4242"));
        CHECK_FALSE(fs::exists(out + "/metrics.csv.tmp.77"));
        CHECK(fs::exists(out + "/checkpoints/step_00000006.safetensors"));
        CHECK(fs::exists(out + "/notes.tmp.txt"));
        CHECK(fs::exists(out + "/metrics.csv"));
    }
    SECTION("through the program: a locked directory, and a metrics.csv that cannot be written") {
        const std::string train = "train '" + config_path("toy_transformer.json") + "' --out run" + kShort;
        fs::create_directories(out);
        // flock(1) holds the run directory's lock while normlab starts.
        check_error(run_in(dir, train, "flock run/.lock "), {"run", "in use by another normlab process"});
        // A disk that is full for metrics.csv (a link to /dev/full): the run fails, error.txt says why,
        // and no summary.json claims it complete.
        fs::create_symlink("/dev/full", out + "/metrics.csv");
        check_error(run_in(dir, train + " --force"), {"metrics.csv", "write failed"});
        CHECK_THAT(nl_test::read_text(out + "/error.txt"), Contains("metrics.csv"));
        CHECK_FALSE(fs::exists(out + "/summary.json"));
    }
}
