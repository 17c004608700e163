// data.source "tokens": nanoGPT's train.bin / val.bin token files. The reader against files numpy
// wrote the way nanoGPT's prepare.py does (tests/data/tokens/, made by make_tokens.py there), against
// files these tests write (uint16 and uint32, little-endian), the windows it batches (the same code
// as text's, so the same windows from the same ids), each refusal with its message, the config keys,
// and a tiny `normlab train` on token data whose checkpoint `normlab sample` continues as ids.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/error.h"
#include "jobs/data.h"
#include "jobs/sample.h"
#include "jobs/train.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nl_test::TempDir;
using nlohmann::json;

namespace {

// `ids` as `width`-byte little-endian integers, as numpy's tofile writes them on x86 and ARM.
void write_ids(const std::string& path, const std::vector<uint32_t>& ids, int width) {
    std::ofstream out(path, std::ios::binary);
    for (uint32_t id : ids)
        for (int k = 0; k < width; ++k) out.put(static_cast<char>((id >> (8 * k)) & 0xFF));
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
}

// 0, 1, 2, ... (n ids, each below `vocab`): a window's first input tells where it starts.
std::vector<uint32_t> counting(int64_t n, int64_t vocab, int64_t offset = 0) {
    std::vector<uint32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<uint32_t>((offset + i) % vocab));
    return ids;
}

nl::DataOptions token_options(const std::string& dir, int64_t vocab_size, int64_t seq_len, const std::string& dtype = "uint16") {
    nl::DataOptions options;
    options.source = "tokens";
    options.path = dir;
    options.dtype = dtype;
    options.vocab_size = vocab_size;
    options.seq_len = seq_len;
    options.eval_sequences = 5;
    return options;
}

// The message of the nl::Error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const nl::Error& e) {
        return e.what();
    }
    return "";
}

void check_contains(const std::string& message, const std::vector<std::string>& parts) {
    INFO(message);
    REQUIRE_FALSE(message.empty());
    for (const std::string& part : parts) CHECK_THAT(message, Catch::Contains(part));
}

// Each row of `batch` is a window of `ids`: targets are the inputs shifted by one, and the inputs
// are ids[s .. s + T - 1] for some start s. Returns the starts.
std::vector<int64_t> window_starts(const nl::Batch& batch, const std::vector<uint32_t>& ids, int64_t T) {
    const std::vector<int64_t> inputs = batch.inputs.to_vector_as<int64_t>();
    const std::vector<int64_t> targets = batch.targets.to_vector_as<int64_t>();
    const int64_t B = batch.inputs.shape()[0];
    REQUIRE(batch.inputs.shape() == nl::Shape{B, T});
    REQUIRE(batch.targets.shape() == nl::Shape{B, T});
    std::vector<int64_t> starts;
    for (int64_t b = 0; b < B; ++b) {
        // The ids count up from ids[0] (no wrap), so the first input tells the start.
        const int64_t s = inputs[b * T] - static_cast<int64_t>(ids[0]);
        REQUIRE(s >= 0);
        REQUIRE(s + T < static_cast<int64_t>(ids.size()));  // the last target is inside the split
        for (int64_t t = 0; t < T; ++t) {
            CHECK(inputs[b * T + t] == ids[s + t]);
            CHECK(targets[b * T + t] == ids[s + t + 1]);
        }
        starts.push_back(s);
    }
    return starts;
}

json token_config(const std::string& path) {
    return {{"data", {{"source", "tokens"}, {"path", path}, {"vocab_size", 50}, {"seq_len", 8}}}};
}

}  // namespace

TEST_CASE("tokens: read_token_file reads little-endian uint16 and uint32 ids of the exact count", "[data]") {
    TempDir dir("tokens_read");
    // Bytes written by hand: 0x1234 then 0x00FF (uint16); 0x00012345 (uint32, above 16 bits).
    write_bytes(dir / "u16.bin", std::string("\x34\x12\xff\x00", 4));
    CHECK(nl::read_token_file(dir / "u16.bin", 2, 65536, 1) == std::vector<uint32_t>{0x1234, 0xFF});
    write_bytes(dir / "u32.bin", std::string("\x45\x23\x01\x00\x07\x00\x00\x00", 8));
    CHECK(nl::read_token_file(dir / "u32.bin", 4, 1 << 20, 1) == std::vector<uint32_t>{0x12345, 7});

    // More ids than one read chunk (2^18), every value of uint16 included.
    std::vector<uint32_t> many = counting(300000, 65536, 17);
    write_ids(dir / "many.bin", many, 2);
    CHECK(nl::read_token_file(dir / "many.bin", 2, 65536, 1) == many);
    write_ids(dir / "many32.bin", many, 4);
    CHECK(nl::read_token_file(dir / "many32.bin", 4, 65536, 1) == many);

    CHECK(nl::token_dtype_bytes("uint16") == 2);
    CHECK(nl::token_dtype_bytes("uint32") == 4);
    CHECK_THROWS_WITH(nl::token_dtype_bytes("int16"), Catch::Contains("uint16, uint32") && Catch::Contains("int16"));
}

TEST_CASE("tokens: the files nanoGPT's prepare.py writes (tests/data/tokens) read as the ids of their text", "[data]") {
    // make_tokens.py: the first 400 characters of Tiny Shakespeare, encoded with prepare.py's
    // stoi (the sorted characters), 90% train and 10% validation, np.uint16.tofile.
    std::ifstream in(std::string(NORMLAB_SOURCE_DIR) + "/examples/data/tinyshakespeare.txt", std::ios::binary);
    std::string text(400, '\0');
    in.read(text.data(), 400);
    REQUIRE(in.gcount() == 400);
    const std::set<char> chars(text.begin(), text.end());  // ASCII: one byte per character
    for (char c : chars) REQUIRE(static_cast<unsigned char>(c) < 0x80);
    std::vector<uint32_t> ids;
    for (char c : text) ids.push_back(static_cast<uint32_t>(std::distance(chars.begin(), chars.find(c))));
    const std::vector<uint32_t> train(ids.begin(), ids.begin() + 360), val(ids.begin() + 360, ids.end());

    const std::string fixture = std::string(NORMLAB_SOURCE_DIR) + "/tests/data/tokens";
    REQUIRE(chars.size() == 42);  // meta.pkl's vocab_size
    nl::TokenCorpus corpus(token_options(fixture, 42, 16), "fixture");
    CHECK(corpus.train_ids() == train);
    CHECK(corpus.val_ids() == val);
    CHECK(corpus.vocab_size() == 42);
    // One fewer than the characters: the highest id is 41.
    check_contains(error_of([&] { nl::TokenCorpus(token_options(fixture, 41, 16), "fixture"); }),
                   {".bin: id 41 at index", "is outside the vocab", "vocab_size = 41", "fixture/vocab_size"});

    // Without data.vocab_size the error points at meta.pkl, which normlab cannot read.
    json config = token_config(fixture);
    config["data"].erase("vocab_size");
    check_contains(error_of([&] { nl::read_train_config(config, "fixture.json"); }),
                   {"fixture.json: /data/vocab_size", "missing required integer", "meta.pkl", "does not read Python pickles",
                    "set data.vocab_size", "['vocab_size']"});
}

TEST_CASE("tokens: training batches are random windows, evaluation the same evenly spaced windows", "[data]") {
    TempDir dir("tokens_windows");
    for (const std::string dtype : {"uint16", "uint32"}) {
        INFO(dtype);
        const int width = dtype == "uint16" ? 2 : 4;
        // Distinct ids (vocab above the count), and uint32 ids above 16 bits.
        const int64_t vocab = dtype == "uint16" ? 1000 : 200000;
        const std::vector<uint32_t> train = counting(300, vocab, dtype == "uint16" ? 0 : 70000);
        const std::vector<uint32_t> val = counting(40, vocab, 500);
        write_ids(dir / "train.bin", train, width);
        write_ids(dir / "val.bin", val, width);
        const int64_t T = 8;
        nl::TokenCorpus corpus(token_options(dir.path.string(), vocab, T, dtype));
        CHECK(corpus.seq_len() == T);
        CHECK(corpus.train_tokens() == 300);
        CHECK(corpus.val_tokens() == 40);
        CHECK_FALSE(corpus.has_accuracy());

        nl::Generator gen(5), same(5);
        std::set<int64_t> seen;
        for (int i = 0; i < 20; ++i) {
            const nl::Batch batch = corpus.train_batch(16, gen);
            for (int64_t s : window_starts(batch, train, T)) seen.insert(s);
            // The generator is the only randomness: the same seed draws the same batches.
            CHECK(batch.inputs.to_vector_as<int64_t>() == corpus.train_batch(16, same).inputs.to_vector_as<int64_t>());
        }
        CHECK(seen.size() > 100);  // spread over the split's 292 starts
        CHECK(*seen.begin() >= 0);
        CHECK(*seen.rbegin() <= 300 - T - 1);

        // 5 windows of the 40 - 8 = 32 starts, first at 0 and last at 31, in batches of 2.
        const std::vector<nl::Batch> eval = corpus.eval_batches(2);
        REQUIRE(eval.size() == 3);
        std::vector<int64_t> starts;
        for (const nl::Batch& batch : eval)
            for (int64_t s : window_starts(batch, val, T)) starts.push_back(s);
        CHECK(starts == std::vector<int64_t>{0, 7, 15, 23, 31});
        const std::vector<nl::Batch> again = corpus.eval_batches(2);
        for (size_t i = 0; i < eval.size(); ++i)
            CHECK(eval[i].targets.to_vector_as<int64_t>() == again[i].targets.to_vector_as<int64_t>());

        CHECK(corpus.decode({17, 4, 255}) == "17 4 255");
        CHECK(corpus.vocab_metadata() == json{{"source", "tokens"}, {"vocab_size", vocab}});
    }
}

TEST_CASE("tokens: the same ids as token files and as text give the same windows", "[data]") {
    // TextCorpus and TokenCorpus batch through one WindowedCorpus: with text's ids written as
    // token files, the same generator draws the same training and validation windows.
    TempDir dir("tokens_as_text");
    std::string text;
    for (int i = 0; i < 20; ++i) text += "to be or not to be, that is the question; ";
    write_bytes(dir / "text.txt", text);
    nl::DataOptions text_options;
    text_options.source = "text";
    text_options.path = dir / "text.txt";
    text_options.seq_len = 12;
    text_options.eval_sequences = 7;
    nl::TextCorpus corpus(text_options);
    write_ids(dir / "train.bin", corpus.train_ids(), 2);
    write_ids(dir / "val.bin", corpus.val_ids(), 2);
    nl::DataOptions options = token_options(dir.path.string(), corpus.vocab_size(), 12);
    options.eval_sequences = 7;
    nl::TokenCorpus tokens(options);
    nl::Generator a(3), b(3);
    for (int i = 0; i < 4; ++i) {
        const nl::Batch x = corpus.train_batch(8, a), y = tokens.train_batch(8, b);
        CHECK(x.inputs.to_vector_as<int64_t>() == y.inputs.to_vector_as<int64_t>());
        CHECK(x.targets.to_vector_as<int64_t>() == y.targets.to_vector_as<int64_t>());
    }
    const auto x = corpus.eval_batches(3), y = tokens.eval_batches(3);
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) CHECK(x[i].inputs.to_vector_as<int64_t>() == y[i].inputs.to_vector_as<int64_t>());
}

TEST_CASE("tokens: each bad file is refused before training, naming the file and what is wrong", "[data]") {
    TempDir dir("tokens_refused");
    const std::string where = "tok.json: /data";
    const auto make = [&](const nl::DataOptions& options) { return error_of([&] { nl::make_dataset(options, where); }); };
    write_ids(dir / "val.bin", counting(20, 50), 2);

    SECTION("a byte count that is not a whole number of ids") {
        write_bytes(dir / "train.bin", std::string(41, '\0'));
        check_contains(make(token_options(dir.path.string(), 50, 8)),
                       {"train.bin: 41 bytes is not a whole number of uint16 ids (2 bytes each)", "tok.json: /data/dtype"});
        write_ids(dir / "train.bin", counting(20, 50), 2);  // 40 bytes: 10 uint32 ids
        write_bytes(dir / "val.bin", std::string(42, '\0'));
        check_contains(make(token_options(dir.path.string(), 50, 8, "uint32")),
                       {"val.bin: 42 bytes is not a whole number of uint32 ids (4 bytes each)"});
    }
    SECTION("an id at or above vocab_size, by index and byte offset") {
        std::vector<uint32_t> ids = counting(30, 50);
        ids[13] = 50;
        write_ids(dir / "train.bin", ids, 2);
        check_contains(make(token_options(dir.path.string(), 50, 8)),
                       {"train.bin: id 50 at index 13 (byte offset 26) is outside the vocab",
                        "ids must be below vocab_size = 50", "tok.json: /data/vocab_size"});
        ids[13] = 3;
        ids[29] = 70000;
        write_ids(dir / "train.bin", ids, 4);
        write_ids(dir / "val.bin", counting(20, 50), 4);
        check_contains(make(token_options(dir.path.string(), 50, 8, "uint32")),
                       {"train.bin: id 70000 at index 29 (byte offset 116)", "vocab_size = 50"});
        write_ids(dir / "train.bin", counting(30, 50), 4);
        write_ids(dir / "val.bin", {1, 2, 3, 4, 5, 6, 7, 8, 9, 4000000000u}, 4);
        check_contains(make(token_options(dir.path.string(), 50, 8, "uint32")),
                       {"val.bin: id 4000000000 at index 9 (byte offset 36)"});
    }
    SECTION("a missing file or directory, or a file where the directory should be") {
        check_contains(make(token_options(dir.path.string(), 50, 8)),
                       {"train.bin: cannot open token file (does it exist?)", "tok.json: /data/path"});
        write_ids(dir / "train.bin", counting(30, 50), 2);
        fs::remove(dir / "val.bin");
        check_contains(make(token_options(dir.path.string(), 50, 8)), {"val.bin: cannot open token file"});
        check_contains(make(token_options(dir / "nowhere", 50, 8)),
                       {"nowhere: cannot open token directory (does it exist?)", "tok.json: /data/path"});
        check_contains(make(token_options(dir / "train.bin", 50, 8)),
                       {"train.bin: expected a directory holding train.bin and val.bin"});
    }
    SECTION("an empty file, or one too short for a window of seq_len + 1") {
        write_bytes(dir / "train.bin", "");
        check_contains(make(token_options(dir.path.string(), 50, 8)), {"train.bin: token file is empty"});
        write_ids(dir / "train.bin", counting(30, 50), 2);
        write_ids(dir / "val.bin", counting(8, 50), 2);
        check_contains(make(token_options(dir.path.string(), 50, 8)),
                       {"val.bin: token file too short: 8 uint16 ids, a window needs at least seq_len + 1 = 9",
                        "tok.json: /data/seq_len"});
        write_ids(dir / "val.bin", counting(9, 50), 2);  // exactly one window
        CHECK(make(token_options(dir.path.string(), 50, 8)).empty());
    }
}

TEST_CASE("tokens: the config keys, their checks, and other sources' keys refused", "[data][config]") {
    TempDir dir("tokens_config");
    const std::string path = dir.path.string();
    const auto error = [](const json& config) { return error_of([&] { nl::read_train_config(config, "tok.json"); }); };

    const nl::TrainConfig config = nl::read_train_config(token_config(path), "tok.json");
    CHECK(config.data.source == "tokens");
    CHECK(config.data.path == path);
    CHECK(config.data.dtype == "uint16");
    CHECK(config.data.vocab_size == 50);
    CHECK(config.data.seq_len == 8);
    CHECK(nl::data_seq_len(config.data) == 8);
    CHECK(config.resolved["data"] == json{{"source", "tokens"}, {"path", path}, {"dtype", "uint16"}, {"vocab_size", 50},
                                          {"seq_len", 8}, {"eval_sequences", 256}, {"seed", 0}});

    json bad = token_config(path);
    bad["data"]["dtype"] = "int16";
    check_contains(error(bad), {"tok.json: /data/dtype", "expected one of uint16, uint32", "\"int16\""});
    bad = token_config(path);
    bad["data"].erase("vocab_size");  // no meta.pkl in this directory
    check_contains(error(bad), {"tok.json: /data/vocab_size", "missing required integer", "set data.vocab_size"});
    bad["data"]["vocab_sise"] = 50;  // a typo is named as one, with the nearest key
    check_contains(error(bad), {"/data/vocab_sise", "unknown key", "did you mean 'vocab_size'"});
    bad = token_config(path);
    bad["data"]["vocab_size"] = 0;
    check_contains(error(bad), {"/data/vocab_size", "expected an integer in [1, 16777216], got 0"});
    bad = token_config(path);
    bad["data"].erase("path");
    check_contains(error(bad), {"/data/path", "a directory holding train.bin and val.bin"});
    bad = token_config(path);
    bad["data"]["seq_len"] = 300;
    check_contains(error(bad), {"/data/seq_len", "300 positions", "/model/max_seq_len = 256"});

    // A key of another source says which source reads it.
    bad = token_config(path);
    bad["data"]["val_fraction"] = 0.1;
    check_contains(error(bad), {"/data/val_fraction", "applies to source \"text\" only", "source is \"tokens\""});
    bad = token_config(path);
    bad["data"]["symbols"] = 10;
    check_contains(error(bad), {"/data/symbols", "applies to source \"synthetic\" only"});
    json text = {{"data", {{"source", "text"}, {"path", "x.txt"}, {"dtype", "uint16"}}}};
    check_contains(error(text), {"/data/dtype", "applies to source \"tokens\" only", "source is \"text\""});
    json synthetic = {{"data", {{"seq_len", 8}}}};
    check_contains(error(synthetic), {"/data/seq_len", "applies to sources \"text\" and \"tokens\" only"});
    json source = {{"data", {{"source", "bytes"}}}};
    check_contains(error(source), {"/data/source", "synthetic, text, tokens"});
}

TEST_CASE("tokens: train on token files, then sample continues a prompt of ids and prints ids", "[data][train]") {
    TempDir dir("tokens_train");
    fs::create_directories(dir / "data");
    // A repeating pattern a tiny model can start to learn in a few steps; uint32 files.
    write_ids(dir / "data/train.bin", counting(600, 20), 4);
    write_ids(dir / "data/val.bin", counting(100, 20, 3), 4);
    nl::TrainJob job;
    job.config = {{"data", {{"source", "tokens"}, {"path", dir / "data"}, {"dtype", "uint32"}, {"vocab_size", 24},
                            {"seq_len", 16}, {"eval_sequences", 8}}},
                  {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"max_seq_len", 32}}},
                  {"optim", {{"warmup_steps", 1}}},
                  {"train", {{"steps", 6}, {"batch_size", 4}, {"eval_every", 3}}}};
    job.config_name = "tokens";
    job.out = dir / "run";
    const nl::TrainResult trained = nl::run_train(job);
    REQUIRE(trained.complete);
    REQUIRE(trained.history.size() == 6);
    CHECK(trained.summary["val_loss"].get<double>() > 0);
    CHECK_FALSE(trained.summary.contains("val_accuracy"));  // no right answers in token data
    const std::string checkpoint = dir / "run/checkpoints/step_00000006.safetensors";
    const nl::CheckpointInfo info = nl::read_checkpoint_info(checkpoint);
    CHECK(nl::checkpoint_metadata_json(info, checkpoint, "vocab") == json{{"source", "tokens"}, {"vocab_size", 24}});
    CHECK(nl::checkpoint_metadata_json(info, checkpoint, "config")["data"]["vocab_size"] == 24);

    nl::SampleJob sample;
    sample.checkpoint = dir / "run";
    sample.prompt = "1 2  3";
    sample.max_new_tokens = 10;
    sample.seed = 4;
    const nl::SampleResult result = nl::run_sample(sample);
    REQUIRE(result.tokens.size() == 13);
    CHECK(std::vector<int64_t>(result.tokens.begin(), result.tokens.begin() + 3) == std::vector<int64_t>{1, 2, 3});
    std::string expected;
    for (int64_t id : result.tokens) {
        CHECK((id >= 0 && id < 24));
        expected += (expected.empty() ? "" : " ") + std::to_string(id);
    }
    CHECK(result.text == expected);
    CHECK(result.options.temperature == 0.8);
    CHECK(result.options.context == 16);
    CHECK(nl::run_sample(sample).tokens == result.tokens);  // seeded
    sample.prompt = "";
    CHECK(nl::run_sample(sample).tokens.front() == 0);  // the default prompt: id 0

    sample.prompt = "1 x 3";
    CHECK_THROWS_WITH(nl::run_sample(sample), Catch::Contains("prompt: 'x' is not a token id"));
    sample.prompt = "1 24";
    CHECK_THROWS_WITH(nl::run_sample(sample), Catch::Contains("prompt: token id 24 is outside the model's vocab [0, 24)"));
    sample.prompt = "99999999999999999999999";
    CHECK_THROWS_WITH(nl::run_sample(sample), Catch::Contains("token id 99999999999999999999999 is outside"));
    sample.prompt = "   ";
    CHECK_THROWS_WITH(nl::run_sample(sample), Catch::Contains("prompt: no token ids"));
}

TEST_CASE("tokens: `normlab train` reads data.path beside its config, and `normlab sample` prints ids", "[data][train]") {
    TempDir dir("tokens_cli");
    fs::create_directories(dir / "configs/shakespeare");
    fs::create_directories(dir / "elsewhere");
    // The committed nanoGPT files, beside a config that names them by a relative path.
    for (const char* name : {"train.bin", "val.bin"})
        fs::copy_file(std::string(NORMLAB_SOURCE_DIR) + "/tests/data/tokens/" + name, dir / ("configs/shakespeare/" + std::string(name)));
    const json config = {{"data", {{"source", "tokens"}, {"path", "shakespeare"}, {"vocab_size", 42}, {"seq_len", 16},
                                   {"eval_sequences", 4}}},
                         {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"max_seq_len", 16}}},
                         {"optim", {{"warmup_steps", 0}}},
                         {"train", {{"steps", 3}, {"batch_size", 4}, {"eval_every", 0}}}};
    write_bytes(dir / "configs/tok.json", config.dump(2));
    const std::string env = "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ";
    nl_test::CliRun train = nl_test::run_normlab_env(dir / "elsewhere", env, "train ../configs/tok.json --out run --quiet");
    INFO(train.output);
    REQUIRE(train.status == 0);
    const json resolved = json::parse(nl_test::read_text(dir / "elsewhere/run/config.json"));
    CHECK(resolved["data"]["path"] == "../configs/shakespeare");

    nl_test::CliRun sample = nl_test::run_normlab_env(dir / "elsewhere", env, "sample run --prompt '18 27 30' --max-new-tokens 6");
    INFO(sample.output);
    REQUIRE(sample.status == 0);
    const std::string first = sample.output.substr(0, sample.output.find('\n'));
    CHECK(std::regex_match(first, std::regex("18 27 30( [0-9]+){6}")));
    CHECK_THAT(sample.output, Catch::Contains("tokens/s (KV cache, window 16)"));

    nl_test::CliRun bad = nl_test::run_normlab_env(dir / "elsewhere", env, "sample run --prompt '18 42'");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::StartsWith("normlab: error: ") && Catch::Contains("token id 42 is outside the model's vocab [0, 42)"));
}
