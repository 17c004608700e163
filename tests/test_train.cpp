// `normlab train` and `normlab sample` end to end: the built binary (NORMLAB_BINARY) runs in a
// temporary directory on short runs (step overrides) of every shipped config; checks the run
// directory, bit-identical determinism and resume, the synthetic tasks' answers, and each bad
// input's one-line error with exit code 2 and no run directory left looking complete.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using Run = nl_test::CliRun;
using nl_test::read_text;
using nl_test::TempDir;

// Two threads, as CTest runs the suite; passive waiting because OpenMP threads that spin while the
// machine is busy (a parallel build, other tests) slow these tiny runs down some 30x.
Run run_in(const TempDir& dir, const std::string& args) {
    return nl_test::run_normlab_env(dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ", args);
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

std::string config(const std::string& name) { return std::string(NORMLAB_SOURCE_DIR) + "/configs/" + name; }

// A short run of the default config: small enough to take well under a second.
const std::string kShort =
    " --quiet --set train.steps=12 --set optim.warmup_steps=3 --set train.eval_every=6 "
    "--set train.batch_size=16 --set data.eval_sequences=64";

// metrics.csv as rows of cells (header first).
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
    std::vector<std::vector<std::string>> rows;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        std::vector<std::string> cells;
        std::stringstream parts(line);
        std::string cell;
        while (std::getline(parts, cell, ',')) cells.push_back(cell);
        if (!line.empty() && line.back() == ',') cells.push_back("");
        rows.push_back(cells);
    }
    return rows;
}

// One column of metrics.csv by name (header removed).
std::vector<std::string> column(const std::string& csv_path, const std::string& name) {
    auto rows = read_csv(csv_path);
    REQUIRE(!rows.empty());
    auto it = std::find(rows[0].begin(), rows[0].end(), name);
    REQUIRE(it != rows[0].end());
    size_t index = static_cast<size_t>(it - rows[0].begin());
    std::vector<std::string> values;
    for (size_t r = 1; r < rows.size(); ++r) values.push_back(index < rows[r].size() ? rows[r][index] : "");
    return values;
}

// A small UTF-8 text with multi-byte characters.
std::string sample_text() {
    std::string text;
    for (int i = 0; i < 40; ++i) text += "To be, or not to be: that is the question. Café naïve — ½ ";
    return text;
}

// An expected error: exit code 2, exactly one line, containing every part.
void check_error(const Run& run, const std::vector<std::string>& parts) {
    INFO(run.output);
    CHECK(run.status == 2);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    CHECK_THAT(run.output, Catch::StartsWith("normlab: error: "));
    for (const std::string& part : parts) CHECK_THAT(run.output, Catch::Contains(part));
}

}  // namespace

TEST_CASE("train runs the default config and writes a complete run directory", "[train]") {
    TempDir dir("train_test");
    Run run = run_in(dir, "train '" + config("toy_transformer.json") + "' --out run" + kShort +
                              " --set train.checkpoint_every=6");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const char* name : {"config.json", "metrics.csv", "summary.json", "checkpoints/step_00000006.safetensors",
                             "checkpoints/step_00000012.safetensors"})
        CHECK(fs::exists(dir / ("run/" + std::string(name))));
    CHECK_FALSE(fs::exists(dir / "run/error.txt"));

    // The resolved config has the overrides and the defaults filled in.
    auto resolved = nlohmann::json::parse(read_text(dir / "run/config.json"));
    CHECK(resolved["train"]["steps"] == 12);
    CHECK(resolved["model"]["norm"]["eps"] == 1e-6);  // the shipped config's explicit eps, kept
    CHECK(resolved["data"]["task"] == "reverse");

    auto rows = read_csv(dir / "run/metrics.csv");
    REQUIRE(rows.size() == 13);  // header + 12 steps
    CHECK(rows[0][0] == "step");
    auto val_loss = column(dir / "run/metrics.csv", "val_loss");
    CHECK(val_loss[5] != "");  // evaluated at steps 6 and 12 only
    CHECK(val_loss[4] == "");
    CHECK(val_loss[11] != "");

    auto summary = nlohmann::json::parse(read_text(dir / "run/summary.json"));
    CHECK(summary["steps"] == 12);
    CHECK(summary["tokens_per_s"].get<double>() > 0);
    // The summary's accuracy is the last evaluation's (step 12 in metrics.csv), a whole number of the
    // 64 held-out sequences.
    const double accuracy = summary["val_accuracy"].get<double>();
    CHECK(accuracy == std::stod(column(dir / "run/metrics.csv", "val_accuracy").back()));
    CHECK(accuracy * 64 == std::round(accuracy * 64));
    CHECK(summary["val_loss"].get<double>() == std::stod(column(dir / "run/metrics.csv", "val_loss").back()));
    CHECK(summary["val_loss"].get<double>() > 0.0);
    // The loss moves from the uniform guess (log 11 = 2.40 over 11 tokens) downward.
    auto train_loss = column(dir / "run/metrics.csv", "train_loss");
    CHECK(std::stod(train_loss.front()) == Approx(std::log(11.0)).margin(0.5));
    CHECK(std::stod(train_loss.back()) < std::stod(train_loss.front()));

    // Nothing is overwritten without --force; with it the run is redone.
    Run again = run_in(dir, "train '" + config("toy_transformer.json") + "' --out run" + kShort);
    check_error(again, {"run", "already exists", "--force"});
    Run forced = run_in(dir, "train '" + config("toy_transformer.json") + "' --out run --force" + kShort);
    CHECK(forced.status == 0);
    CHECK_FALSE(fs::exists(dir / "run/checkpoints/step_00000006.safetensors"));  // old checkpoints cleared
}

TEST_CASE("train runs the text config on a temporary file and sample continues a prompt", "[train]") {
    TempDir dir("train_test");
    write_text(dir / "tiny.txt", sample_text());
    Run run = run_in(dir, "train '" + config("char_text.json") +
                              "' --out run --quiet --set data.path=tiny.txt --set train.steps=4 "
                              "--set optim.warmup_steps=1 --set train.batch_size=4 --set data.eval_sequences=8");
    INFO(run.output);
    REQUIRE(run.status == 0);
    auto summary = nlohmann::json::parse(read_text(dir / "run/summary.json"));
    CHECK(summary["val_loss"].get<double>() > 0);
    CHECK_FALSE(summary.contains("val_accuracy"));  // no right answers in text
    CHECK(column(dir / "run/metrics.csv", "val_accuracy").back() == "");

    Run sample = run_in(dir, "sample run --prompt 'Café' --max-new-tokens 20 --seed 3");
    INFO(sample.output);
    REQUIRE(sample.status == 0);
    CHECK_THAT(sample.output, Catch::StartsWith("Café"));
    Run same = run_in(dir, "sample run --prompt 'Café' --max-new-tokens 20 --seed 3");
    // Seeded: the same text (the first line; the speed line after it varies).
    CHECK(same.output.substr(0, same.output.find('\n')) == sample.output.substr(0, sample.output.find('\n')));
    CHECK_THAT(sample.output, Catch::Contains("tokens/s (KV cache, window 64)"));

    Run unknown_char = run_in(dir, "sample run --prompt 'Zebra'");
    check_error(unknown_char, {"'Z'", "not in the model's vocabulary"});
}

TEST_CASE("train is deterministic: same config and seed give bit-identical losses", "[train]") {
    TempDir dir("train_test");
    const std::string args = "train '" + config("toy_transformer.json") + "'" + kShort;
    REQUIRE(run_in(dir, args + " --out a").status == 0);
    REQUIRE(run_in(dir, args + " --out b").status == 0);
    REQUIRE(run_in(dir, args + " --out c --set seed=1").status == 0);
    for (const char* name : {"train_loss", "grad_norm", "val_loss", "val_accuracy"})
        CHECK(column(dir / "a/metrics.csv", name) == column(dir / "b/metrics.csv", name));
    CHECK(column(dir / "a/metrics.csv", "train_loss") != column(dir / "c/metrics.csv", "train_loss"));
}

TEST_CASE("train --resume continues bit-identically to an uninterrupted run", "[train]") {
    TempDir dir("train_test");
    const std::string args =
        "train '" + config("toy_transformer.json") + "'" + kShort + " --set train.checkpoint_every=6";
    REQUIRE(run_in(dir, args + " --out full").status == 0);

    // Stopped after step 7: the checkpoint at 6 is the latest one, and the row for step 7 must be
    // recomputed by the resumed run (it is dropped from metrics.csv).
    Run stopped = run_in(dir, args + " --out part --stop-after 7");
    REQUIRE(stopped.status == 0);
    CHECK_FALSE(fs::exists(dir / "part/summary.json"));  // not complete
    CHECK(fs::exists(dir / "part/checkpoints/step_00000007.safetensors"));
    fs::remove(dir / "part/checkpoints/step_00000007.safetensors");
    CHECK(read_csv(dir / "part/metrics.csv").size() == 8);

    Run resumed = run_in(dir, args + " --out part --resume");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(fs::exists(dir / "part/summary.json"));
    CHECK(nlohmann::json::parse(read_text(dir / "part/summary.json"))["resumed_from_step"] == 6);
    for (const char* name : {"step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy"}) {
        INFO(name);
        CHECK(column(dir / "full/metrics.csv", name) == column(dir / "part/metrics.csv", name));
    }
    // The final weights too: the two checkpoints hold the same bytes.
    CHECK(read_text(dir / "full/checkpoints/step_00000012.safetensors") ==
          read_text(dir / "part/checkpoints/step_00000012.safetensors"));
}

TEST_CASE("the synthetic tasks' answers are right, and sample checks a trained model's", "[train]") {
    TempDir dir("train_test");
    // add: "a+b=" -> the sum; reverse, sort, copy: the symbols rearranged.
    for (const std::string task : {"add", "reverse", "sort", "copy"}) {
        INFO(task);
        std::string out = "run_" + task;
        Run run = run_in(dir, "train '" + config("toy_transformer.json") + "' --out " + out + kShort +
                                  " --set data.task=" + task + " --set data.length=3");
        REQUIRE(run.status == 0);
        Run sample = run_in(dir, "sample " + out + " --num 12 --temperature 0");
        INFO(sample.output);
        REQUIRE(sample.status == 0);
        CHECK_THAT(sample.output, Catch::Contains("/12 correct"));
        // Each line: "<problem> -> <answer>  ok" or "... WRONG (expected <answer>)": the expected
        // answer (or the model's, when ok) must be the task's right answer.
        std::stringstream lines(sample.output);
        std::string line;
        int checked = 0;
        static const std::regex add_line(R"((\d+)\+(\d+)= -> (\d+)  (ok|WRONG \(expected (\d+)\)))");
        static const std::regex seq_line(R"((\w+) ([\d ]+) -> ([\d ]+?)  (ok|WRONG \(expected ([\d ]+)\)))");
        std::smatch m;
        while (std::getline(lines, line)) {
            if (task == "add" && std::regex_match(line, m, add_line)) {
                std::string right = m[4] == "ok" ? m[3].str() : m[5].str();
                CHECK(m[1].str().size() == 3);
                CHECK(std::stoi(right) == std::stoi(m[1]) + std::stoi(m[2]));
                CHECK(right.size() == 4);  // length + 1 digits
                ++checked;
            } else if (task != "add" && std::regex_match(line, m, seq_line)) {
                CHECK(m[1] == task);
                std::vector<std::string> x, right;
                std::stringstream xs(m[2].str()), rs(m[4] == "ok" ? m[3].str() : m[5].str());
                for (std::string s; xs >> s;) x.push_back(s);
                for (std::string s; rs >> s;) right.push_back(s);
                if (task == "reverse") std::reverse(x.begin(), x.end());
                if (task == "sort") std::sort(x.begin(), x.end());
                CHECK(right == x);
                ++checked;
            }
        }
        CHECK(checked == 12);
    }
}

TEST_CASE("train: bad input is one error line, exit code 2, no complete run directory", "[train]") {
    TempDir dir("train_test");
    const std::string toy = "'" + config("toy_transformer.json") + "'";

    SECTION("missing config") {
        check_error(run_in(dir, "train nope.json --out run"), {"nope.json", "cannot open config file"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("malformed config") {
        write_text(dir / "bad.json", "{\"model\": {\"dim\": 64,, }}");
        check_error(run_in(dir, "train bad.json --out run"), {"bad.json", "malformed JSON"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("unknown key, nearest known key suggested") {
        write_text(dir / "typo.json", R"({"model": {"dimm": 64}})");
        check_error(run_in(dir, "train typo.json --out run"), {"typo.json", "/model/dimm", "did you mean 'dim'"});
        check_error(run_in(dir, "train " + toy + " --out run --set optim.learning_rate=0.1"),
                    {"/optim/learning_rate", "unknown key", "did you mean"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("wrong types and ranges name the JSON path") {
        check_error(run_in(dir, "train " + toy + " --out run --set model.n_heads=5"),
                    {"toy_transformer.json", "/model/n_heads", "dividing dim=64", "got 5"});
        check_error(run_in(dir, "train " + toy + " --out run --set train.steps=ten"),
                    {"/train/steps", "expected an integer", "\"ten\""});
        check_error(run_in(dir, "train " + toy + " --out run --set data.task=multiply"),
                    {"/data/task", "copy, reverse, sort, add", "multiply"});
        check_error(run_in(dir, "train " + toy + " --out run --set data.path=x.txt"),
                    {"/data/path", "applies to sources \"text\" and \"tokens\" only"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("nonexistent and empty text files") {
        check_error(run_in(dir, "train '" + config("char_text.json") + "' --out run --set data.path=missing.txt"),
                    {"missing.txt", "cannot open text file", "/data/path"});
        write_text(dir / "empty.txt", "");
        check_error(run_in(dir, "train '" + config("char_text.json") + "' --out run --set data.path=empty.txt"),
                    {"empty.txt", "empty", "/data/path"});
        write_text(dir / "latin1.txt", "caf\xe9 au lait");
        check_error(run_in(dir, "train '" + config("char_text.json") + "' --out run --set data.path=latin1.txt"),
                    {"latin1.txt", "invalid UTF-8 at byte 3"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("a sequence longer than the model's context") {
        check_error(run_in(dir, "train " + toy + " --out run --set model.max_seq_len=12"),
                    {"toy_transformer.json", "/data/length", "16 positions", "/model/max_seq_len = 12"});
        write_text(dir / "tiny.txt", sample_text());
        check_error(run_in(dir, "train '" + config("char_text.json") +
                                    "' --out run --set data.path=tiny.txt --set data.seq_len=500"),
                    {"/data/seq_len", "500 positions", "/model/max_seq_len = 128"});
        CHECK_FALSE(fs::exists(dir / "run"));
    }
    SECTION("a checkpoint that does not match the config") {
        REQUIRE(run_in(dir, "train " + toy + " --out run" + kShort + " --stop-after 6").status == 0);
        Run mismatch = run_in(dir, "train " + toy + " --out run --resume" + kShort + " --set model.dim=32");
        check_error(mismatch, {"step_00000006.safetensors", "does not match the config", "/model/dim", "64", "32"});
        CHECK_FALSE(fs::exists(dir / "run/summary.json"));
        CHECK(fs::exists(dir / "run/error.txt"));
        Run no_checkpoint = run_in(dir, "train " + toy + " --out other --resume" + kShort);
        check_error(no_checkpoint, {"--resume", "no checkpoint"});
        CHECK_FALSE(fs::exists(dir / "other/summary.json"));
    }
    SECTION("sample: a missing checkpoint") {
        check_error(run_in(dir, "sample nowhere.safetensors"), {"nowhere.safetensors", "no such checkpoint"});
    }
}

// The README's main job, in full (about a minute of CPU): hidden from the default run, run it with
// normlab_tests "[train_full]".
TEST_CASE("the default config reaches >= 99% exact-sequence accuracy in under 5 minutes", "[.][train_full]") {
    TempDir dir("train_test");
    auto start = std::chrono::steady_clock::now();
    Run run = run_in(dir, "train '" + config("toy_transformer.json") + "' --out run --quiet");
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(run.output);
    REQUIRE(run.status == 0);
    auto summary = nlohmann::json::parse(read_text(dir / "run/summary.json"));
    CHECK(summary["val_accuracy"].get<double>() >= 0.99);
    CHECK(seconds < 300.0);
}
