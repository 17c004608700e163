// The jobs as library calls (jobs/): a TrainSession stepped by hand computes what run_train does, the
// callbacks see every step and can stop a run so that resuming it gives the same bits, an in-memory
// config is validated like a file, a failed step leaves error.txt; run_sample and run_stability
// return what they write.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "jobs/sample.h"
#include "jobs/stability.h"
#include "jobs/train.h"
#include "tests/test_util.h"

using nl_test::TempDir;

namespace {

// A small reverse task that trains in a fraction of a second.
nlohmann::json small_config() {
    return {{"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 4}, {"eval_sequences", 32}}},
            {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"max_seq_len", 16}}},
            {"optim", {{"warmup_steps", 2}}},
            {"train", {{"steps", 12}, {"batch_size", 8}, {"eval_every", 4}}}};
}

nl::TrainJob small_job(const std::string& out) {
    nl::TrainJob job;
    job.config = small_config();
    job.config_name = "small";
    job.out = out;
    return job;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace

TEST_CASE("jobs: a TrainSession stepped by hand writes what run_train writes, bit for bit", "[jobs]") {
    TempDir dir("jobs_session");
    const nl::TrainResult whole = nl::run_train(small_job(dir / "whole"));
    REQUIRE(whole.complete);
    REQUIRE(whole.history.size() == 12);

    nl::TrainSession session(small_job(dir / "stepped"));
    CHECK(session.step() == 0);
    CHECK(session.end_step() == 12);
    CHECK(session.run_dir() == dir / "stepped");
    CHECK(session.dataset().vocab_size() == 11);
    std::vector<nl::TrainStep> steps;
    while (!session.done()) steps.push_back(session.run_step());
    REQUIRE_THROWS_WITH(session.run_step(), Catch::Contains("no step left"));
    const nl::TrainResult stepped = session.finish();
    REQUIRE(stepped.complete);
    for (size_t i = 0; i < steps.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(steps[i].train_loss == whole.history[i].train_loss);  // the same bits
        CHECK(steps[i].grad_norm == whole.history[i].grad_norm);
        CHECK(steps[i].evaluated == ((i + 1) % 4 == 0));
    }
    CHECK(stepped.summary["val_loss"] == whole.summary["val_loss"]);
    CHECK(stepped.summary["config"] == "small");
    // metrics.csv: every column but the two timings (tokens_per_s, elapsed_s) is equal.
    auto without_timings = [](const std::string& text) {
        std::string out, line;
        std::istringstream in(text);
        while (std::getline(in, line)) {
            std::istringstream cells(line);
            std::string cell;
            for (int column = 0; column < 7 && std::getline(cells, cell, ','); ++column) out += cell + ",";
            out += "\n";
        }
        return out;
    };
    CHECK(without_timings(read_file(dir / "stepped/metrics.csv")) == without_timings(read_file(dir / "whole/metrics.csv")));
    CHECK(std::filesystem::exists(dir / "stepped/summary.json"));
}

TEST_CASE("jobs: callbacks see every step, and should_stop leaves a checkpoint that resume continues to the same bits",
          "[jobs]") {
    TempDir dir("jobs_callbacks");
    const nl::TrainResult whole = nl::run_train(small_job(dir / "whole"));

    int started = 0;
    std::vector<int64_t> seen;
    nl::TrainCallbacks callbacks;
    callbacks.on_start = [&](const nl::TrainSession& s) {
        ++started;
        CHECK(s.description().find("parameters, reverse data, vocab 11") != std::string::npos);
    };
    callbacks.on_step = [&](const nl::TrainStep& step) { seen.push_back(step.step); };
    callbacks.should_stop = [&] { return seen.size() == 7; };  // as a KeyboardInterrupt between steps would
    const nl::TrainResult stopped = nl::run_train(small_job(dir / "run"), callbacks);
    CHECK(started == 1);
    CHECK(seen == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
    CHECK_FALSE(stopped.complete);
    CHECK(stopped.last_step == 7);
    CHECK(stopped.summary.is_null());
    CHECK(std::filesystem::exists(dir / "run/checkpoints/step_00000007.safetensors"));
    CHECK_FALSE(std::filesystem::exists(dir / "run/summary.json"));
    CHECK_FALSE(std::filesystem::exists(dir / "run/error.txt"));

    nl::TrainJob resume = small_job(dir / "run");
    resume.resume = true;
    const nl::TrainResult resumed = nl::run_train(resume);
    REQUIRE(resumed.complete);
    REQUIRE(resumed.history.size() == 5);
    CHECK(resumed.history.front().step == 8);
    CHECK(resumed.summary["resumed_from_step"] == 7);
    CHECK(resumed.summary["final_train_loss"] == whole.summary["final_train_loss"]);
    CHECK(resumed.summary["val_loss"] == whole.summary["val_loss"]);
}

TEST_CASE("jobs: an in-memory config is checked like a file, named by config_name, before anything is written",
          "[jobs]") {
    TempDir dir("jobs_bad_config");
    nl::TrainJob job = small_job(dir / "run");
    job.config["model"]["dimm"] = 32;
    REQUIRE_THROWS_AS(nl::TrainSession(job), nl::Error);
    REQUIRE_THROWS_WITH(nl::TrainSession(job), Catch::StartsWith("small: /model/dimm: unknown key (did you mean 'dim'?"));
    CHECK_FALSE(std::filesystem::exists(dir / "run"));

    job = small_job(dir / "run");
    job.overrides = {"train.steps=0"};
    REQUIRE_THROWS_WITH(nl::run_train(job), Catch::StartsWith("small: /train/steps:"));
    CHECK_FALSE(std::filesystem::exists(dir / "run"));
}

TEST_CASE("jobs: a step that fails leaves error.txt, not a summary", "[jobs]") {
    TempDir dir("jobs_fault");
    setenv("NORMLAB_TEST_FAULT", "0:3:throw", 1);  // rank 0 throws at step 3 (jobs/train.cpp's test hook)
    CHECK_THROWS_WITH(nl::run_train(small_job(dir / "run")), Catch::Contains("fails at step 3"));
    unsetenv("NORMLAB_TEST_FAULT");
    CHECK_THAT(read_file(dir / "run/error.txt"), Catch::Contains("fails at step 3"));
    CHECK_FALSE(std::filesystem::exists(dir / "run/summary.json"));
}

TEST_CASE("jobs: run_sample answers problems from a run directory and returns them", "[jobs]") {
    TempDir dir("jobs_sample");
    nl::TrainJob job = small_job(dir / "run");
    nl::run_train(job);
    nl::SampleJob sample;
    sample.checkpoint = dir / "run";
    sample.num = 5;
    const nl::SampleResult result = nl::run_sample(sample);
    CHECK(result.step == 12);
    CHECK(result.checkpoint == dir / "run/checkpoints/step_00000012.safetensors");
    REQUIRE(result.problems.size() == 5);
    int64_t correct = 0;
    for (const nl::SampledProblem& p : result.problems) correct += p.correct == (p.answer == p.expected);
    CHECK(correct == 5);  // each verdict agrees with its answer
    CHECK(result.options.temperature == 0.0);
    CHECK(result.options.context == 8);  // the trained T: 2 * 4 + 1 - 1
    CHECK(result.stats.new_tokens == 4);  // each row's answer: the 4 reversed symbols
    sample.num = 0;
    CHECK_THROWS_WITH(nl::run_sample(sample), Catch::Contains("--num must be in [1, "));
}

TEST_CASE("jobs: run_stability returns the curves and summary it writes", "[jobs][stability]") {
    TempDir dir("jobs_stability");
    nl::StabilityJob job;
    job.config = {{"norms", {"rmsnorm", "layernorm"}}, {"epochs", 4}, {"samples", 32}, {"in_features", 8},
                  {"hidden", 16}, {"out_features", 2}, {"seeds", {1, 2}}, {"plots", false}};
    job.out = dir / "run";
    int64_t epochs_seen = 0;
    std::string header;
    nl::StabilityCallbacks callbacks;
    callbacks.on_start = [&](const nl::StabilityStart& s) {
        header = s.description;
        CHECK(s.total == 4 * 2 * 4);  // 4 runs x (run + perturbed copy) x 4 epochs
    };
    callbacks.on_epoch = [&](const nl::StabilityEpoch& e) { epochs_seen += e.diverged_epoch == 0; };
    const nl::StabilityResult result = nl::run_stability(job, callbacks);
    CHECK_THAT(header, Catch::StartsWith("4 runs (2 norms x 1 depths x 1 lrs x 2 seeds), 4 epochs, f32 on cpu"));
    REQUIRE(result.runs.size() == 4);
    for (const nl::StabilityRun& run : result.runs) {
        CHECK(run.losses.size() == 4);
        CHECK(run.perturbed_losses.size() == 4);
        CHECK(run.grad_norms.size() == 4);
    }
    CHECK(result.runs[0].id == "rmsnorm_d2_lr0.001_s1");
    CHECK(epochs_seen == 4 * 2 * 4);
    std::ifstream summary_file(dir / "run/summary.json");
    CHECK(nlohmann::json::parse(summary_file) == result.summary);
    CHECK(result.summary["runs"][0]["final_loss"].get<double>() == result.runs[0].losses.back());
    CHECK_THAT(result.table, Catch::Contains("rmsnorm") && Catch::Contains("layernorm"));
    CHECK(std::filesystem::exists(dir / "run/curves/rmsnorm_d2_lr0.001_s1.csv"));
}
